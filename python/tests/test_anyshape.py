"""The Python package end to end: compile the tiny BERT the repository ships, run it in
its compiled range and past it against onnxruntime's recorded outputs, through the
package's API and through the onnxruntime-style `InferenceSession`; bad input raises."""
import json
import pathlib

import numpy as np
import pytest

import anyshape

MODELS = pathlib.Path(__file__).resolve().parents[2] / "models"
CASES = ["s1", "s37", "s128", "b3s17"]  # sequence 128 and batch 3 lie past the range


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    out = tmp_path_factory.mktemp("modules") / "bert.module"
    return anyshape.compile(
        MODELS / "bert_tiny.ts.onnx",
        dims={"batch": (1, 2), "sequence": range(1, 65)},
        out=out,
        progress=False,
    )


def recorded(case):
    with np.load(MODELS / f"bert_tiny.ts.{case}.npz") as f:
        return {k: f[k] for k in f.files}


def relative_error(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.isfinite(got).all()
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("case", CASES)
def test_outputs_match_onnxruntime(bert, case):
    data = recorded(case)
    feeds = {i.name: data[i.name] for i in bert.inputs}
    outs = bert.run(feeds)
    assert list(outs) == [o.name for o in bert.outputs]
    for name, got in outs.items():
        assert relative_error(got, data[name]) <= 1e-4, name


def test_outputs_written_into_the_last_runs_arrays(bert):
    # A loop passing each run's outputs back: every answer a plain run's for its own
    # inputs (the same shape twice with other token ids: stale outputs would show),
    # the arrays of the same shape written in place (the same objects), the others
    # fresh.
    outs = None
    steps = [("s37", False), ("s37", True), ("b3s17", False), ("s1", False), ("s1", True)]
    for case, reversed_ids in steps:
        data = recorded(case)
        feeds = {i.name: data[i.name] for i in bert.inputs}
        if reversed_ids:
            feeds["input_ids"] = np.ascontiguousarray(feeds["input_ids"][:, ::-1] + 1) % 50
        want = bert.run(feeds)
        last = outs
        outs = bert.run(feeds, out=outs)
        for name, got in outs.items():
            assert np.array_equal(got, want[name]), (case, name)
            same_shape = last is not None and last[name].shape == got.shape
            assert (last is not None and got is last[name]) == same_shape, (case, name)
    # An array that cannot take its output (read-only, another dtype) is left alone.
    frozen = np.zeros_like(outs["last_hidden_state"])
    frozen.flags.writeable = False
    other = np.zeros(outs["pooler_output"].shape, np.float64)
    again = bert.run(feeds, out={"last_hidden_state": frozen, "pooler_output": other})
    assert again["last_hidden_state"] is not frozen and not frozen.any()
    assert again["pooler_output"] is not other and not other.any()
    with pytest.raises(anyshape.InvalidArgument, match="no output 'logits'"):
        bert.run(feeds, out={"logits": frozen})
    with pytest.raises(anyshape.InvalidArgument, match="not a numpy array"):
        bert.run(feeds, out={"pooler_output": [0.0]})


def test_inputs_outputs_and_dims_are_described(bert):
    assert [i.name for i in bert.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i.dtype == "int64" and i.shape == ["batch", "sequence"] for i in bert.inputs)
    assert bert.outputs[0] == anyshape.TensorInfo("last_hidden_state", "float32", ["batch", "sequence", 64])
    assert bert.dims == {"batch": (1, 2), "sequence": (1, 64)}
    assert "bert.module" in repr(bert)


def test_inference_session_takes_onnxruntime_calls(bert):
    sess = anyshape.InferenceSession(bert.path, providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == [i.name for i in bert.inputs]
    assert sess.get_inputs()[0].type == "tensor(int64)"
    data = recorded("s37")
    feeds = {i.name: data[i.name] for i in sess.get_inputs()}
    hidden, pooled = sess.run(None, feeds)
    assert relative_error(hidden, data["last_hidden_state"]) <= 1e-4
    (pooled_only,) = sess.run(["pooler_output"], feeds)
    np.testing.assert_array_equal(pooled_only, pooled)
    with pytest.raises(anyshape.InvalidArgument):
        sess.run(["logits"], feeds)


def test_arrays_of_any_layout_are_taken(bert):
    data = recorded("s37")
    feeds = {i.name: np.asfortranarray(data[i.name]) for i in bert.inputs}
    feeds["input_ids"] = feeds["input_ids"].tolist()  # lists too
    outs = bert.run(feeds)
    assert relative_error(outs["pooler_output"], data["pooler_output"]) <= 1e-4


def test_bad_input_raises(bert):
    data = recorded("s37")
    feeds = {i.name: data[i.name] for i in bert.inputs}
    with pytest.raises(anyshape.InvalidArgument, match="not given"):
        bert.run({k: v for k, v in feeds.items() if k != "attention_mask"})
    with pytest.raises(anyshape.InvalidArgument, match="int32"):
        bert.run({**feeds, "input_ids": feeds["input_ids"].astype(np.int32)})
    with pytest.raises(anyshape.InvalidArgument, match="rank"):
        bert.run({**feeds, "input_ids": feeds["input_ids"][0]})
    with pytest.raises(anyshape.InvalidArgument, match="no input"):
        bert.run({**feeds, "input_idz": feeds["input_ids"]})
    with pytest.raises(ValueError):  # InvalidArgument is a ValueError
        bert.run({**feeds, "token_type_ids": feeds["token_type_ids"][:, :5]})
    ids = feeds["input_ids"].copy()
    ids[0, 0] = 10**6
    with pytest.raises(anyshape.InvalidArgument, match="out of range"):
        bert.run({**feeds, "input_ids": ids})


def test_modules_and_options_are_checked(tmp_path):
    with pytest.raises(anyshape.ModuleError, match="not an anyshape module"):
        anyshape.load(tmp_path)
    with pytest.raises(anyshape.InvalidArgument, match="needs a domain"):
        anyshape.compile(MODELS / "bert_tiny.ts.onnx", dims={"batch": 1}, out=tmp_path / "m", progress=False)
    with pytest.raises(anyshape.InvalidArgument, match="no dim"):
        anyshape.compile(MODELS / "bert_tiny.ts.onnx", dims={"batch": 1, "sequence": 8, "height": 2}, out=tmp_path / "m", progress=False)
    with pytest.raises(anyshape.InvalidArgument):
        anyshape.compile(MODELS / "bert_tiny.ts.onnx", dims={"batch": "many"}, out=tmp_path / "m", progress=False)
    with pytest.raises(anyshape.InvalidArgument, match="unknown precision `f16`"):
        anyshape.compile(MODELS / "bert_tiny.ts.onnx", dims={"batch": 1, "sequence": 8}, out=tmp_path / "m", progress=False, precision="f16")
    with pytest.raises(anyshape.InvalidArgument, match="unknown search"):
        anyshape.compile(MODELS / "bert_tiny.ts.onnx", dims={"batch": 1, "sequence": 8}, out=tmp_path / "m", progress=False, search="annealing")
    # A work queue that is not a Redis URL is the caller's mistake; one that does not
    # answer is the environment's.
    with pytest.raises(anyshape.InvalidArgument, match="--queue"):
        anyshape.compile(MODELS / "bert_tiny.ts.onnx", dims={"batch": 1, "sequence": 8}, out=tmp_path / "m", progress=False, trials=1, records=tmp_path / "r", queue="http://example.com")
    with pytest.raises(anyshape.CompileError, match="work queue"):
        anyshape.compile(MODELS / "bert_tiny.ts.onnx", dims={"batch": 1, "sequence": 8}, out=tmp_path / "m", progress=False, trials=1, records=tmp_path / "r", queue="redis://127.0.0.1:1")
    assert not (tmp_path / "m").exists()


# Rounded to bfloat16, or quantized to 8 bits: within the precision's bound, yet not
# the f32 result.
@pytest.mark.parametrize("precision,bound", [("bf16", 2e-2), ("i8", 1e-1)])
def test_lower_precisions_match_onnxruntime_within_their_bounds(tmp_path, precision, bound):
    model = anyshape.compile(
        MODELS / "bert_tiny.ts.onnx",
        dims={"batch": (1, 2), "sequence": range(1, 65)},
        out=tmp_path / f"{precision}.module",
        progress=False,
        precision=precision,
    )
    for case in CASES:
        data = recorded(case)
        outs = model.run({i.name: data[i.name] for i in model.inputs})
        for name, got in outs.items():
            error = relative_error(got, data[name])
            assert 1e-5 < error <= bound, (case, name, error)


@pytest.mark.parametrize("winograd", [True, False])
def test_convolutions_match_onnxruntime_either_way(tmp_path, winograd):
    # A ResNet's 3 x 3 convolutions by Winograd's transforms (the default) or over
    # their patches: the same answers, in the range and past it.
    model = anyshape.compile(
        MODELS / "resnet_tiny.ts.onnx",
        dims={"batch": (1, 2), "height": (32, 96), "width": (32, 96)},
        out=tmp_path / "resnet.module",
        progress=False,
        winograd=winograd,
    )
    for case in ["i64", "b2i96", "i97"]:
        with np.load(MODELS / f"resnet_tiny.ts.{case}.npz") as f:
            data = {k: f[k] for k in f.files}
        outs = model.run({i.name: data[i.name] for i in model.inputs})
        for name, got in outs.items():
            assert relative_error(got, data[name]) <= 1e-4, (case, name)


def test_tuning_runs_the_worker(tmp_path):
    def tune(records, db):
        return anyshape.compile(
            MODELS / "bert_tiny.ts.onnx",
            dims={"batch": 1, "sequence": (1, 4)},
            out=tmp_path / "tuned.module",
            trials=1,
            records=tmp_path / records,
            progress=False,
            db=db,
        )

    model = tune("records", tmp_path / "tuning.sqlite")
    assert sorted(p.name for p in (tmp_path / "records").iterdir())[0] == "t00.jsonl"
    data = recorded("s1")
    outs = model.run({i.name: data[i.name] for i in model.inputs})
    assert relative_error(outs["last_hidden_state"], data["last_hidden_state"]) <= 1e-4
    # A second compile starts from the first's trials in the tuning database: its
    # records hold them, marked reused; db=False uses none.
    tune("again", tmp_path / "tuning.sqlite")
    first = (tmp_path / "records" / "t00.jsonl").read_text().splitlines()
    again = [json.loads(line) for line in (tmp_path / "again" / "t00.jsonl").read_text().splitlines()]
    assert len(again) == len(first) and all(r["reused"] for r in again)
    tune("alone", False)
    alone = [json.loads(line) for line in (tmp_path / "alone" / "t00.jsonl").read_text().splitlines()]
    assert alone and not any(r.get("reused") for r in alone)
    with pytest.raises(anyshape.InvalidArgument, match="not an SQLite file"):
        tune("mine", tmp_path / "records" / "t00.jsonl")


@pytest.fixture(scope="module")
def gpt2_past(tmp_path_factory):
    out = tmp_path_factory.mktemp("modules") / "gpt2_past.module"
    return anyshape.compile(
        MODELS / "gpt2_tiny_past.ts.onnx",
        dims={"batch": 1, "sequence": (1, 64), "past_sequence": (0, 128)},
        out=out,
        progress=False,
    )


@pytest.mark.parametrize("prompt", [1, 37, 200])  # 200 lies past the range
def test_generate_gives_onnxruntime_tokens(gpt2_past, prompt):
    with np.load(MODELS / f"gpt2_tiny_past.ts.gen_p{prompt}.npz") as f:
        ids, want = f["prompt_ids"], f["generated_ids"]
    g = gpt2_past.generate(ids, max_new_tokens=64)
    assert g.tokens == want.tolist()
    assert len(g.step_seconds) == 64 and g.time_to_first_token > 0 and g.tokens_per_second > 0
    # A 1-D prompt is one row.
    assert gpt2_past.generate(ids[0], max_new_tokens=3).tokens == [want[0, :3].tolist()]


def test_generate_samples_by_seed_and_checks_its_input(gpt2_past, bert):
    ids = np.arange(5, dtype=np.int64)
    a = gpt2_past.generate(ids, 16, do_sample=True, seed=7, top_k=50)
    assert a.tokens == gpt2_past.generate(ids, 16, do_sample=True, seed=7, top_k=50).tokens
    assert a.tokens != gpt2_past.generate(ids, 16, do_sample=True, seed=8, top_k=50).tokens
    stop = a.tokens[0][3]
    first = a.tokens[0].index(stop)
    stopped = gpt2_past.generate(ids, 16, do_sample=True, seed=7, top_k=50, stop_token=stop)
    assert stopped.tokens == [a.tokens[0][: first + 1]]
    with pytest.raises(anyshape.InvalidArgument, match="int64"):
        gpt2_past.generate(ids.astype(np.int32), 4)
    with pytest.raises(anyshape.InvalidArgument, match="do_sample"):
        gpt2_past.generate(ids, 4, seed=3)
    with pytest.raises(anyshape.InvalidArgument, match="temperature"):
        gpt2_past.generate(ids, 4, do_sample=True, temperature=-1.0)
    with pytest.raises(anyshape.InvalidArgument, match="max new tokens is 0"):
        gpt2_past.generate(ids, 0)
    with pytest.raises(anyshape.InvalidArgument, match="cannot generate: it has no `logits`"):
        bert.generate(ids, 4)


def test_shapes_known_only_at_run_time(tmp_path):
    """A model whose output extents hang on its inputs' values (`NonZero`'s count, a
    reduction over axes given as an input) compiles once and runs every value through
    the package; its outputs describe those extents as run-time dims."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("NonZero", ["x"], ["nz"]),
            helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
        ],
        "runtime_dims",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("axes", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("nz", TensorProto.INT64, None),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
        ],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    model = anyshape.compile(path, dims={"n": (1, 8)}, out=tmp_path / "m.module", progress=False)
    assert [len(o.shape) for o in model.outputs] == [2, 1]
    assert any(isinstance(d, str) and d.startswith("?") for d in model.outputs[0].shape)
    rng = np.random.default_rng(0)
    for n in (1, 3, 8, 11):
        x = np.where(rng.random((n, 4)) < 0.4, 0.0, rng.standard_normal((n, 4))).astype(np.float32)
        for axis in (0, 1):
            got = model.run({"x": x, "axes": np.array([axis], dtype=np.int64)})
            np.testing.assert_array_equal(got["nz"], np.array(np.nonzero(x), dtype=np.int64))
            np.testing.assert_allclose(got["s"], x.sum(axis=axis), rtol=1e-6, atol=1e-6)
    with pytest.raises(anyshape.InvalidArgument, match="axis 2"):
        model.run({"x": np.zeros((2, 4), np.float32), "axes": np.array([2], dtype=np.int64)})


def test_loops_and_branches_are_inlined(tmp_path):
    """A `for` loop (a Loop of a constant trip count whose body passes its condition
    through) unrolled, and an If whose condition is a constant, compiled for a symbolic
    dim and run against NumPy; a Loop whose trip count is an input is refused."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "fi"], ["xi"]),
            helper.make_node("Add", ["acc_in", "xi"], ["acc_out"]),
            helper.make_node("Identity", ["acc_out"], ["step_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, None),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("step_out", TensorProto.FLOAT, None),
        ],
    )
    branch = lambda name, op: helper.make_graph(  # noqa: E731
        [helper.make_node(op, ["acc"], [name])], name, [], [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)]
    )

    def model(trips_given):
        inits = [helper.make_tensor("yes", TensorProto.BOOL, [], [True])]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])]
        if trips_given:
            inputs.append(helper.make_tensor_value_info("trips", TensorProto.INT64, []))
        else:
            inits.append(helper.make_tensor("trips", TensorProto.INT64, [], [4]))
        inits.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
        nodes = [
            helper.make_node("Mul", ["x", "zero"], ["acc0"]),
            helper.make_node("Loop", ["trips", "yes", "acc0"], ["acc", "steps"], body=body),
            helper.make_node("If", ["yes"], ["y"], then_branch=branch("then_y", "Neg"), else_branch=branch("else_y", "Abs")),
        ]
        outputs = [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("steps", TensorProto.FLOAT, None),
        ]
        g = helper.make_graph(nodes, "loop", inputs, outputs, initializer=inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    onnx.save(model(False), tmp_path / "loop.onnx")
    m = anyshape.compile(tmp_path / "loop.onnx", dims={"n": (1, 8)}, out=tmp_path / "loop.module", progress=False)
    for n in (1, 5, 9):
        x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) - 4
        got = m.run({"x": x})
        steps = np.stack([x * sum(range(t + 1)) for t in range(4)])
        np.testing.assert_allclose(got["steps"], steps, rtol=1e-6)
        np.testing.assert_allclose(got["y"], -steps[-1], rtol=1e-6)
    onnx.save(model(True), tmp_path / "runtime_trips.onnx")
    with pytest.raises(anyshape.InvalidArgument, match="trip count is known only at run time"):
        anyshape.compile(tmp_path / "runtime_trips.onnx", dims={"n": (1, 8)}, out=tmp_path / "r.module", progress=False)
