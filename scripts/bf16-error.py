#!/usr/bin/env python3
"""Where a bf16 model's error comes from: OpenVINO's BF16 error on a model's recorded
cases, and onnxruntime running the model with bfloat16 rounding inserted (a Cast to
bfloat16 and back) at chosen inputs of its contractions.

    .venv/bin/python scripts/bf16-error.py models/full/bert_base.ts.onnx [--round WHAT] [--openvino]

The cases are the `.npz` files beside the model (`<model>.<case>.npz`, inputs and
onnxruntime's FP32 outputs, as `scripts/export-models.sh` writes them). Error: max
|output - recorded| / max |recorded|, per output, as `anyshape run --inputs` prints it.
`--round` takes a comma-separated list of what to round: `weights` (the contractions'
weights only), `dense` (weights and activations of the contractions over weights),
`attention` (both operands of the contractions between activations), `pooler` (a
`Gemm`'s); `all` is the three last. Rounding is to nearest, ties to even, as
anyshape's.
"""
import argparse
import glob
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto


def bf16(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return u.view(np.float32)


def rounded_model(path, what):
    m = onnx.load(path)
    g = m.graph
    weights = {i.name: i for i in g.initializer}
    nodes, count = [], 0

    def through_bf16(name):
        nonlocal count
        count += 1
        mid, out = f"bf16_round_{count}", f"bf16_round_{count}_f32"
        nodes.append(helper.make_node("Cast", [name], [mid], to=TensorProto.BFLOAT16))
        nodes.append(helper.make_node("Cast", [mid], [out], to=TensorProto.FLOAT))
        return out

    for n in g.node:
        if n.op_type in ("MatMul", "Gemm"):
            over_weight = n.input[1] in weights
            kind = ("pooler" if n.op_type == "Gemm" else "dense") if over_weight else "attention"
            if over_weight and (kind in what or "weights" in what):
                w = weights[n.input[1]]
                w.CopyFrom(numpy_helper.from_array(bf16(numpy_helper.to_array(w)), w.name))
                if kind in what:
                    n.input[0] = through_bf16(n.input[0])
            elif kind in what:
                n.input[0] = through_bf16(n.input[0])
                n.input[1] = through_bf16(n.input[1])
        nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    return m.SerializeToString()


def errors(run, cases):
    for case, path in cases:
        data = np.load(path)
        outputs = run(data)
        line = [f"{name} {np.abs(v - data[name]).max() / np.abs(data[name]).max():.2e}" for name, v in outputs]
        print(f"  {case}: " + "  ".join(line))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--round", default="", help="weights, dense, attention, pooler or all")
    p.add_argument("--openvino", action="store_true", help="OpenVINO at its default precision")
    a = p.parse_args()
    stem = a.model[: -len(".onnx")]
    prefix = os.path.basename(stem) + "."
    cases = sorted((os.path.basename(f)[len(prefix):-len(".npz")], f) for f in glob.glob(f"{stem}.*.npz"))
    if not cases:
        raise SystemExit(f"no recorded cases ({stem}.*.npz) beside {a.model}")
    if a.round:
        import onnxruntime as ort
        what = {"dense", "attention", "pooler"} if a.round == "all" else set(a.round.split(","))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        s = ort.InferenceSession(rounded_model(a.model, what), opts)
        names = [i.name for i in s.get_inputs()]
        print(f"onnxruntime, bfloat16 rounding at: {', '.join(sorted(what))}")
        errors(lambda d: zip([o.name for o in s.get_outputs()], s.run(None, {n: d[n] for n in names})), cases)
    if a.openvino:
        import openvino as ov
        core = ov.Core()
        c = core.compile_model(core.read_model(a.model), "CPU", {"INFERENCE_NUM_THREADS": 2})
        print(f"OpenVINO {ov.__version__}, precision {c.get_property('INFERENCE_PRECISION_HINT')}")

        def run(d):
            r = c({i.get_any_name(): d[i.get_any_name()] for i in c.inputs})
            return [(o.get_any_name(), r[o]) for o in c.outputs]

        errors(run, cases)


if __name__ == "__main__":
    main()
