"""onnxruntime's own time per layer of ResNet-50 (the PyTorch export's node names), for
comparing with `anyshape run --profile` or step-minima.sh step by step.

    .venv/bin/python benchmarks/results/resnet50.ts/zen3/ort-profile.py MODEL.onnx SIZE

Runs the model 30 times on a random 1 x 3 x SIZE x SIZE image with 2 intra-op threads
and onnxruntime's profiler on, drops each node's first 5 runs, and prints each node's
minimum over the rest (ms), the 25 slowest nodes, the sum, and the sums per block role
(`stageS layer.L`: a bottleneck's L-th convolution, 0 and 2 the 1 x 1, 1 the 3 x 3;
`shortcut`: the projection) — onnxruntime names the stages from 0, printed here from
1 as anyshape's notes count them.
"""
import collections
import json
import os
import re
import sys
import tempfile

import numpy as np
import onnxruntime as ort

model, size = sys.argv[1], int(sys.argv[2])
options = ort.SessionOptions()
options.intra_op_num_threads = 2
options.enable_profiling = True
options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
name = session.get_inputs()[0].name
x = np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)
for _ in range(30):
    session.run(None, {name: x})
profile = session.end_profiling()
with open(profile) as f:
    events = json.load(f)
os.remove(profile)
times = collections.defaultdict(list)
for e in events:
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
        times[e["name"]].append(e["dur"])
rows = sorted(((min(d[5:] or d) / 1000, n) for n, d in times.items()), reverse=True)
for t, n in rows[:25]:
    print("%7.3f %s" % (t, n))
print("%7.3f sum of the per-node minima (ms)" % sum(t for t, _ in rows))
roles = collections.defaultdict(float)
for t, n in rows:
    m = re.search(r"stages\.(\d)/layers\.\d+/(layer/layer\.(\d)|shortcut)", n)
    if m:
        role = "shortcut" if m.group(2) == "shortcut" else "layer.%s" % m.group(3)
        key = "stage%d %s" % (int(m.group(1)) + 1, role)
    else:
        key = ("stem " if "embedder" in n else "") + n.split("/")[-1][:48]
    roles[key] += t
for key in sorted(roles):
    print("%7.3f %s" % (roles[key], key))
