#!/usr/bin/env python3
"""Load time and peak memory of a model module beside its peers', each in a fresh process.

For every system the parent starts a new Python process that imports the library, loads
the model and runs it once on the given inputs; it measures, from the parent, the time
from process start to "ready to run" (interpreter start, library import and load), and
the child reports the load call alone and the first run. The systems take turns
(interleaved) for --repeat rounds; the report gives medians and minima per system, and
each system's peak resident memory (load and one run on the given inputs; a large case,
e.g. BERT at sequence 512, shows what a run needs): a Python child's own VmHWM, the
binary's rusage maximum (which cannot be below the parent's ~10 MiB it was forked from).
Two more rows frame them: "python + numpy only" (the interpreter's share of every Python
row) and the anyshape binary (`anyshape run --module M --inputs case.npz --seconds 0`,
whose wall time less its first run is start-up, reading the inputs and exit together).

    scripts/load-time.py --module M.module --onnx M.onnx --inputs case.npz [--repeat 5]

Peers: onnxruntime (InferenceSession, 2 intra-op threads) and OpenVINO (compile_model on
CPU, 2 streams' worth of threads: INFERENCE_NUM_THREADS=2), at FP32 and at its default
precision (BF16 where the CPU has AVX512_BF16), each skipped with a line where the package
is missing. The page cache is warm (one untimed load per system first): this is the
start-up a server pays after the first, not a cold disk read.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
t_import = time.perf_counter()
system, path, inputs = sys.argv[1], sys.argv[2], sys.argv[3]
import numpy as np
case = np.load(inputs)
if system == "python":
    load = 0.0
    run = lambda: None
elif system == "anyshape":
    import anyshape
    t0 = time.perf_counter()
    model = anyshape.load(path)
    load = time.perf_counter() - t0
    feeds = {i.name: case[i.name] for i in model.inputs}
    run = lambda: model.run(feeds)
elif system == "onnxruntime":
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    t0 = time.perf_counter()
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    load = time.perf_counter() - t0
    feeds = {i.name: case[i.name] for i in sess.get_inputs()}
    run = lambda: sess.run(None, feeds)
else:
    import openvino as ov
    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": 2}
    if system == "openvino-f32":
        config["INFERENCE_PRECISION_HINT"] = "f32"
    t0 = time.perf_counter()
    compiled = core.compile_model(path, "CPU", config)
    load = time.perf_counter() - t0
    precision = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    request = compiled.create_infer_request()
    feeds = {p.get_any_name(): case[p.get_any_name()] for p in compiled.inputs}
    run = lambda: request.infer(feeds)
print("ready", flush=True)
t1 = time.perf_counter()
run()
first = time.perf_counter() - t1
info = {"load": load, "first": first}
# The peak RSS of this process image alone (VmHWM is per address space, so the
# parent's memory, which a forked child's rusage would count, is not in it).
with open("/proc/self/status") as f:
    info["rss"] = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
if system.startswith("openvino"):
    info["precision"] = precision
print(json.dumps(info), flush=True)
"""


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def available(module):
    # Found, not imported: the parent stays small (a child's rusage counts the memory
    # of the process it was forked from).
    return importlib.util.find_spec(module) is not None


def reap(child):
    """Wait for `child`; its exit status and peak RSS in MiB."""
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, usage.ru_maxrss / 1024


def measure_cli(binary, module, inputs):
    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as err:
        child = subprocess.Popen(
            [binary, "run", "--module", module, "--inputs", inputs, "--seconds", "0"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        out = child.stdout.read()
        code, rss = reap(child)
        wall = time.perf_counter() - start
        if code != 0:
            err.seek(0)
            raise SystemExit(f"anyshape CLI failed:\n{err.read()}")
    # "model  M  (loaded in X ms; first run Y ms; ...)"
    line = next(l for l in out.splitlines() if l.startswith("model "))
    load = float(line.split("loaded in ")[1].split(" ms")[0]) / 1e3
    first = float(line.split("first run ")[1].split(" ms")[0]) / 1e3
    return {"ready": wall - first, "load": load, "first": first, "rss": rss}


def measure(system, path, inputs):
    if system == "anyshape CLI":
        return measure_cli(path[0], path[1], inputs)
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, system, path, inputs],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = child.stdout.readline()
    ready = time.perf_counter() - start
    rest = child.stdout.read()
    code, _ = reap(child)
    if code != 0 or line.strip() != "ready":
        raise SystemExit(f"{system}: the child process failed (exit {code})")
    info = json.loads(rest.strip().splitlines()[-1])
    info["ready"] = ready
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", required=True, help="an anyshape model module")
    ap.add_argument("--onnx", required=True, help="the .onnx the module was compiled from")
    ap.add_argument("--inputs", required=True, help=".npz with the model's inputs by name")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bin", default="target/release/anyshape", help="the anyshape binary")
    args = ap.parse_args()

    # "python" loads nothing: the interpreter's and NumPy's share of every Python row.
    systems = [("python", ""), ("anyshape", args.module)]
    if os.path.exists(args.bin):
        systems.append(("anyshape CLI", (args.bin, args.module)))
    if available("onnxruntime"):
        systems.append(("onnxruntime", args.onnx))
    else:
        print("onnxruntime is not installed: skipped", file=sys.stderr)
    if available("openvino"):
        systems += [("openvino-f32", args.onnx), ("openvino", args.onnx)]
    else:
        print("openvino is not installed: skipped", file=sys.stderr)

    print(f"CPU: {cpu_name()}; {os.cpu_count()} logical CPUs; warm page cache; "
          f"{args.repeat} fresh processes per system, interleaved")
    for system, path in systems:
        measure(system, path, args.inputs)  # warms the page cache
    results = {system: [] for system, _ in systems}
    for _ in range(args.repeat):
        for system, path in systems:
            results[system].append(measure(system, path, args.inputs))

    print(f"{'system':<28} {'start->ready ms':>16} {'(min)':>8} {'load call ms':>13} "
          f"{'first run ms':>13} {'peak RSS MiB':>13}   (medians)")
    base = statistics.median(r["ready"] for r in results["anyshape"])
    for system, _ in systems:
        rs = results[system]
        label = {"python": "python + numpy only", "anyshape": "anyshape (Python)",
                 "anyshape CLI": "anyshape (CLI, wall-first)"}.get(system, system)
        if system.startswith("openvino"):
            label = f"openvino ({rs[0]['precision']})"
        ready = statistics.median(r["ready"] for r in rs)
        print(f"{label:<28} {ready * 1e3:>16.1f} {min(r['ready'] for r in rs) * 1e3:>8.1f} "
              f"{statistics.median(r['load'] for r in rs) * 1e3:>13.1f} "
              f"{statistics.median(r['first'] for r in rs) * 1e3:>13.1f}"
              f"{statistics.median(r['rss'] for r in rs):>14.0f}"
              + ("" if system in ("anyshape", "python", "anyshape CLI")
                 else f"   {ready / base:.1f}x anyshape's"))


if __name__ == "__main__":
    main()
