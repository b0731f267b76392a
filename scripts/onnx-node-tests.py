#!/usr/bin/env python3
"""ONNX's own operator conformance cases, written out for `anyshape`'s harness.

The `onnx` package generates its node tests in memory
(`onnx.backend.test.case.node.collect_testcases`: a model and input/output tensors per
case, ~1,900 of them). This writes each as the layout onnxruntime's and tract's
harnesses read:

    OUT/<name>/model.onnx
    OUT/<name>/test_data_set_<k>/input_<i>.pb, output_<i>.pb   (TensorProto)
    OUT/<name>/tolerance.json                                 {"rtol": .., "atol": ..}

A case whose inputs or outputs are not plain tensors (sequences, optionals, maps) is
listed in OUT/skipped.txt with the reason instead (out of scope). Prints a count.

    scripts/onnx-node-tests.py OUT
"""
import json
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases


def main():
    # The cases' own NumPy arithmetic warns (overflowing casts, log(0)): expected there.
    warnings.simplefilter("ignore")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    written, skipped = 0, []
    for case in collect_testcases(None):
        if case.model is None or not case.data_sets:
            skipped.append(f"{case.name}\tno model or data")
            continue
        tensors = all(
            isinstance(v, np.ndarray) for inputs, outputs in case.data_sets
            for v in list(inputs) + list(outputs)
        )
        if not tensors:
            skipped.append(f"{case.name}\tsequence, optional or map values")
            continue
        d = os.path.join(out, case.name)
        os.makedirs(d, exist_ok=True)
        onnx.save(case.model, os.path.join(d, "model.onnx"))
        graph = case.model.graph
        for k, (inputs, outputs) in enumerate(case.data_sets):
            s = os.path.join(d, f"test_data_set_{k}")
            os.makedirs(s, exist_ok=True)
            for kind, values, infos in (("input", inputs, graph.input),
                                        ("output", outputs, graph.output)):
                for i, v in enumerate(values):
                    name = infos[i].name if i < len(infos) else f"{kind}_{i}"
                    t = numpy_helper.from_array(np.asarray(v), name)
                    with open(os.path.join(s, f"{kind}_{i}.pb"), "wb") as f:
                        f.write(t.SerializeToString())
        with open(os.path.join(d, "tolerance.json"), "w") as f:
            json.dump({"rtol": case.rtol, "atol": case.atol}, f)
        written += 1
    with open(os.path.join(out, "skipped.txt"), "w") as f:
        f.write("\n".join(skipped) + "\n")
    print(f"{written} cases written to {out}, {len(skipped)} out of scope (skipped.txt); "
          f"onnx {onnx.__version__}")


main()
