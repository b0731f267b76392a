"""A Python runtime as a peer of `anyshape bench --model`: onnxruntime or OpenVINO in a
long-lived process that loads one ONNX model once (with its dynamic dims) and answers
timing requests, one JSON object per line.

  argv: ENGINE MODEL.onnx THREADS [PRECISION]
        ENGINE: onnxruntime (CPU execution provider, THREADS intra-op threads) or
        openvino (CPU, THREADS inference threads, latency hint; PRECISION "f32" forces
        FP32, absent: its default, BF16 where the CPU has AVX512_BF16 or AMX)
  first line out: {"ok": true, "version": ..., "precision": "f32" | "bf16" | ...}
                  or {"error": ...}
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


def onnxruntime(model, threads, _precision):
    """(version, precision, input names, run(feed) -> {output name: array})."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]

    def run(feed):
        return dict(zip(names, sess.run(None, feed)))

    return ort.__version__, "f32", [i.name for i in sess.get_inputs()], run


def openvino(model, threads, precision):
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = ov.Core().compile_model(model, "CPU", config)
    actual = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    request = compiled.create_infer_request()
    names = [o.get_any_name() for o in compiled.outputs]

    def run(feed):
        # Its fastest path: inputs and outputs shared with NumPy, not copied.
        request.infer(feed, share_inputs=True, share_outputs=True)
        return {n: request.get_output_tensor(i).data for i, n in enumerate(names)}

    version = getattr(ov, "__version__", None) or ov.get_version()
    inputs = [p.get_any_name() for p in compiled.inputs]
    return version.split("-")[0], actual, inputs, run


def main():
    try:
        import numpy as np

        engine = {"onnxruntime": onnxruntime, "openvino": openvino}[sys.argv[1]]
        precision = sys.argv[4] if len(sys.argv) > 4 else None
        version, actual, inputs, run = engine(sys.argv[2], int(sys.argv[3]), precision)
    except Exception as e:  # not installed, or it refuses the model
        reply({"error": f"{type(e).__name__}: {e}"})
        return
    reply({"ok": True, "version": version, "precision": actual})
    for line in sys.stdin:
        try:
            req = json.loads(line)
            arrays = np.load(req["inputs"])
            feed = {name: arrays[name] for name in inputs}
            times = []
            start = time.perf_counter()
            while not times or time.perf_counter() - start < req["seconds"]:
                t = time.perf_counter()
                outs = run(feed)
                times.append(time.perf_counter() - t)
                if req.get("outputs") and len(times) == 1:
                    np.savez(req["outputs"], **outs)
            reply({"times": times})
        except Exception as e:
            reply({"error": f"{type(e).__name__}: {e}"})


main()
