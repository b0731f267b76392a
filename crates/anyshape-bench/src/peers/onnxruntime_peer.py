"""onnxruntime as a peer of `anyshape bench --model`: a long-lived process that loads
one ONNX model and answers timing requests, one JSON object per line.

  argv: MODEL.onnx THREADS
  first line out: {"ok": true, "version": ...} or {"error": ...}
  in:  {"inputs": "case.npz", "seconds": S, "outputs": "out.npz" | null}
  out: {"times": [seconds per run, ...]} or {"error": ...}

Each request runs the model at least once, then until S seconds have passed; with
"outputs", the first run's outputs are written there (keys: the graph's output names).
"""
import json
import sys
import time


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    try:
        import numpy as np
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = int(sys.argv[2])
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
    except Exception as e:  # no onnxruntime, or it refuses the model
        reply({"error": f"{type(e).__name__}: {e}"})
        return
    reply({"ok": True, "version": ort.__version__})
    names = [o.name for o in sess.get_outputs()]
    for line in sys.stdin:
        try:
            req = json.loads(line)
            arrays = np.load(req["inputs"])
            feed = {i.name: arrays[i.name] for i in sess.get_inputs()}
            times = []
            start = time.perf_counter()
            while not times or time.perf_counter() - start < req["seconds"]:
                t = time.perf_counter()
                outs = sess.run(None, feed)
                times.append(time.perf_counter() - t)
                if req.get("outputs") and len(times) == 1:
                    np.savez(req["outputs"], **dict(zip(names, outs)))
            reply({"times": times})
        except Exception as e:
            reply({"error": f"{type(e).__name__}: {e}"})


main()
