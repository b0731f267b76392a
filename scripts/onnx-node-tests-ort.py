#!/usr/bin/env python3
"""onnxruntime on the ONNX conformance cases that scripts/onnx-node-tests.py wrote: the
anchor for anyshape's count (crates/anyshape/tests/conformance.rs), with the same
comparison (|got - want| <= atol + rtol * |want| under each case's tolerance, NaN
matching NaN, shapes and element types equal).

    scripts/onnx-node-tests-ort.py DIR [ANYSHAPE_REPORT.csv]

Prints onnxruntime's pass count over every case and, given anyshape's report (the
CSV the harness writes to ANYSHAPE_CONFORMANCE_REPORT), both counts over the cases in
anyshape's scope (not "out of scope") and the cases each passes that the other does not.
"""
import csv
import glob
import json
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper


def load(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def run(case):
    with open(os.path.join(case, "tolerance.json")) as f:
        tol = json.load(f)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    sess = ort.InferenceSession(os.path.join(case, "model.onnx"), so,
                                providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    for s in sorted(glob.glob(os.path.join(case, "test_data_set_*"))):
        ins = [load(p) for p in sorted(glob.glob(os.path.join(s, "input_*.pb")),
                                       key=lambda p: int(p.rsplit("_", 1)[1][:-3]))]
        outs = [load(p) for p in sorted(glob.glob(os.path.join(s, "output_*.pb")),
                                        key=lambda p: int(p.rsplit("_", 1)[1][:-3]))]
        got = sess.run(None, dict(zip(names, ins)))
        if len(got) != len(outs):
            return False
        for g, w in zip(got, outs):
            g = np.asarray(g)
            if g.shape != w.shape or g.dtype != w.dtype:
                return False
            if w.dtype.kind in "fc":
                if not np.allclose(g, w, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True):
                    return False
            elif not np.array_equal(g, w):
                return False
    return True


def main():
    root = sys.argv[1]
    cases = sorted(d for d in glob.glob(os.path.join(root, "*"))
                   if os.path.isfile(os.path.join(d, "model.onnx")))
    ours = {}
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as f:
            ours = {r["case"]: r["outcome"] for r in csv.DictReader(f)}
    passed = set()
    for case in cases:
        try:
            if run(case):
                passed.add(os.path.basename(case))
        except Exception:
            pass
    print(f"onnxruntime {ort.__version__}: {len(passed)} of {len(cases)} cases pass")
    if ours:
        scope = {c for c, o in ours.items() if o != "out of scope"}
        a = {c for c in scope if ours[c] == "pass"}
        o = passed & scope
        print(f"in anyshape's scope ({len(scope)} cases): anyshape {len(a)}, onnxruntime {len(o)}")
        print(f"anyshape passes, onnxruntime not: {sorted(a - o)}")
        print(f"onnxruntime passes, anyshape not ({len(o - a)}): {sorted(o - a)}")


main()
