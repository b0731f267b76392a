"""A Python runtime as a peer of `anyshape bench --model`: onnxruntime, OpenVINO or
PyTorch in a long-lived process that loads one model once (with its dynamic dims) and
answers timing requests, one JSON object per line.

  argv: ENGINE MODEL.onnx THREADS [PRECISION]
        ENGINE: onnxruntime (CPU execution provider, THREADS intra-op threads;
        PRECISION "int8": on the model quantized by its `quantize_dynamic`, 8-bit
        weights per output channel, written to a temporary directory removed at exit),
        openvino (CPU, THREADS inference threads, latency hint; PRECISION "f32" forces
        FP32, absent: its default, BF16 where the CPU has AVX512_BF16 or AMX) or
        pytorch (eager, FP32, THREADS intra-op threads: the model the ONNX was exported
        from, rebuilt by the repository's `models/export.py` — beside the ONNX or a
        directory up — by the ONNX's name, with the same seeded weights)
  first line out: {"ok": true, "version": ..., "precision": "f32" | "bf16" | ...}
                  or {"error": ...}
  in:  {"inputs": "case.npz", "seconds": S, "outputs": "out.npz" | null}
  out: {"times": [seconds per run, ...]} or {"error": ...}
  in:  {"generate": "prompt.npz", "new_tokens": N}
  out: {"tokens": [[id, ...] per row], "times": [seconds per step, ...]} or {"error": ...}

Each timing request runs the model at least once, then until S seconds have passed;
with "outputs", the first run's outputs are written there (keys: the graph's output
names). A generate request runs a decoder with a key/value cache (inputs `input_ids`,
`attention_mask`, `past_key_values.*`; outputs `logits`, `present.*`) greedily from
the `.npz`'s `prompt_ids` [batch, length] for N tokens, as each engine serves it best:
onnxruntime with IO binding (each step's present caches bound as the next step's past
without a copy to NumPy), OpenVINO with the model made stateful (the caches held and
appended inside the request), PyTorch with transformers' own cache (`DynamicCache`,
appended in place). A step's time includes choosing its tokens.
"""
import json
import sys
import time


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def present_name(past):
    """The output that extends cache input `past`: `past_key_values.0.key` ->
    `present.0.key`, `past_0` -> `present_0` (anyshape's `Decoder` pairs them so too)."""
    for prefix in ("past_key_values", "past"):
        if past.startswith(prefix):
            return "present" + past[len(prefix):]
    return None


def greedy(logits):
    """Each row's most likely next token from logits [batch, sequence, vocab]."""
    import numpy as np

    return np.argmax(logits[:, -1, :], axis=-1).astype(np.int64)


def onnxruntime(model, threads, precision):
    """(version, precision, input names, run(feed) -> {output name: array},
    generate(prompt, n) -> (tokens per row, seconds per step))."""
    import numpy as np
    import onnxruntime as ort

    if precision == "int8":
        model = quantized(model)

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]

    def run(feed):
        return dict(zip(names, sess.run(None, feed)))

    def generate(prompt, n):
        rows = prompt.shape[0]
        past = [i for i in sess.get_inputs() if i.name.startswith("past")]
        # A cache's symbolic dims: the batch (first) and the past length (empty).
        cache = {i.name: ort.OrtValue.ortvalue_from_numpy(np.zeros(
            [rows if k == 0 else (d if isinstance(d, int) else 0) for k, d in enumerate(i.shape)],
            np.float32)) for i in past}
        io = sess.io_binding()
        ids, length, tokens, times = prompt, 0, [], []
        for _ in range(n):
            t = time.perf_counter()
            io.clear_binding_inputs()
            io.clear_binding_outputs()
            length += ids.shape[1]
            io.bind_cpu_input("input_ids", ids)
            io.bind_cpu_input("attention_mask", np.ones((rows, length), np.int64))
            for name, v in cache.items():
                io.bind_ortvalue_input(name, v)
            for name in names:
                io.bind_output(name, "cpu")
            sess.run_with_iobinding(io)
            outs = dict(zip(names, io.get_outputs()))
            ids = greedy(outs["logits"].numpy())[:, None]
            cache = {i.name: outs[present_name(i.name)] for i in past}
            times.append(time.perf_counter() - t)
            tokens.append(ids[:, 0])
        return np.stack(tokens, axis=1).tolist(), times

    actual = "int8" if precision == "int8" else "f32"
    return ort.__version__, actual, [i.name for i in sess.get_inputs()], run, generate


def quantized(model):
    """`model` quantized by onnxruntime's dynamic quantization (8-bit weights, one scale
    per output channel; activations quantized at run time), in a temporary directory
    removed when this process exits."""
    import atexit
    import os
    import shutil
    import tempfile

    from onnxruntime.quantization import QuantType, quantize_dynamic

    scratch = tempfile.mkdtemp(prefix="anyshape-ort-int8-")
    atexit.register(shutil.rmtree, scratch, True)
    out = os.path.join(scratch, "model.int8.onnx")
    quantize_dynamic(model, out, weight_type=QuantType.QInt8, per_channel=True)
    return out


def openvino(model, threads, precision):
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    core = ov.Core()
    source = core.read_model(model)
    # The graph's names, from the model as read: compiled, an output may carry more
    # than one (a cache output is also the name of the Concat that makes it) and
    # `get_any_name` may give the other.
    names = [o.get_any_name() for o in source.outputs]
    inputs = [p.get_any_name() for p in source.inputs]
    compiled = core.compile_model(source, "CPU", config)
    actual = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    request = compiled.create_infer_request()

    def run(feed):
        # Its fastest path: inputs and outputs shared with NumPy, not copied.
        request.infer(feed, share_inputs=True, share_outputs=True)
        return {n: request.get_output_tensor(i).data for i, n in enumerate(names)}

    stateful = []

    def generate(prompt, n):
        import numpy as np

        if not stateful:
            stateful.append(stateful_request(ov, model, config))
        req = stateful[0]
        req.reset_state()
        rows = prompt.shape[0]
        ids, length, tokens, times = prompt, 0, [], []
        for _ in range(n):
            t = time.perf_counter()
            length += ids.shape[1]
            req.infer({"input_ids": ids, "attention_mask": np.ones((rows, length), np.int64)},
                      share_inputs=True, share_outputs=True)
            ids = greedy(req.get_tensor("logits").data)[:, None]
            times.append(time.perf_counter() - t)
            tokens.append(ids[:, 0])
        return np.stack(tokens, axis=1).tolist(), times

    version = getattr(ov, "__version__", None) or ov.get_version()
    return version.split("-")[0], actual, inputs, run, generate


def pytorch(model, threads, _precision):
    import importlib.util
    import os

    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    here = os.path.dirname(os.path.abspath(model))
    script = next((p for p in (os.path.join(here, "export.py"), os.path.join(os.path.dirname(here), "export.py"))
                   if os.path.exists(p)), None)
    if script is None:
        raise RuntimeError("it rebuilds the model with the repository's models/export.py, which is not beside the ONNX")
    name = os.path.basename(model).split(".")[0]
    spec = importlib.util.spec_from_file_location("anyshape_export", script)
    export = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(export)
    built = export.build(name)
    wrap = built["wrap"].eval()
    inputs, names = built["inputs"], built["outputs"]

    def run(feed):
        with torch.inference_mode():
            outs = wrap(*[torch.from_numpy(np.ascontiguousarray(feed[n])) for n in inputs])
        return {n: o.numpy() for n, o in zip(names, outs)}

    def generate(prompt, n):
        hf = wrap.model
        rows = prompt.shape[0]
        ids, length, tokens, times = torch.from_numpy(prompt), 0, [], []
        cache = transformers.DynamicCache()
        with torch.inference_mode():
            for _ in range(n):
                t = time.perf_counter()
                length += ids.shape[1]
                out = hf(input_ids=ids, attention_mask=torch.ones(rows, length, dtype=torch.int64),
                         past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                ids = out.logits[:, -1, :].argmax(-1, keepdim=True)
                times.append(time.perf_counter() - t)
                tokens.append(ids[:, 0].numpy())
        return np.stack(tokens, axis=1).tolist(), times

    return torch.__version__.split("+")[0], "f32", inputs, run, generate


def stateful_request(ov, model, config):
    """The decoder made stateful, as OpenVINO serves text generation: each `past…`
    input and its `present…` output become one state variable the request keeps (its
    initial value an empty cache of the prompt's batch), compiled, and a request."""
    import numpy as np
    import openvino.opset13 as op
    from openvino._offline_transformations import apply_make_stateful_transformation

    m = ov.Core().read_model(model)
    names = [p.get_any_name() for p in m.inputs]
    pairs = {name: present_name(name) for name in names if name.startswith("past")}
    apply_make_stateful_transformation(m, pairs)
    batch = op.gather(op.shape_of(m.input("input_ids"), output_type="i64"), op.constant([0]), op.constant(0))
    for node in m.get_ops():
        if node.get_type_name() == "ReadValue":
            dims = [op.constant(np.array([d.min_length], np.int64)) for d in node.get_output_partial_shape(0)]
            dims[0] = batch
            zero = op.constant(0.0, dtype=node.get_output_element_type(0))
            node.set_arguments([op.broadcast(zero, op.concat(dims, axis=0))])
    m.validate_nodes_and_infer_types()
    return ov.Core().compile_model(m, "CPU", config).create_infer_request()


def main():
    try:
        import numpy as np

        engine = {"onnxruntime": onnxruntime, "openvino": openvino, "pytorch": pytorch}[sys.argv[1]]
        precision = sys.argv[4] if len(sys.argv) > 4 else None
        version, actual, inputs, run, generate = engine(sys.argv[2], int(sys.argv[3]), precision)
    except Exception as e:  # not installed, or it refuses the model
        reply({"error": f"{type(e).__name__}: {e}"})
        return
    reply({"ok": True, "version": version, "precision": actual})
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if "generate" in req:
                tokens, times = generate(np.load(req["generate"])["prompt_ids"], req["new_tokens"])
                reply({"tokens": tokens, "times": times})
                continue
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
