"""anyshape: compile an ONNX model once for a whole range of shapes, run every shape fast.

    import anyshape, numpy as np
    anyshape.compile("bert.onnx", dims={"batch": 1, "sequence": (1, 128)}, out="bert.module")
    model = anyshape.load("bert.module")
    outputs = model.run({"input_ids": ids, "attention_mask": mask, "token_type_ids": types})

`InferenceSession` takes onnxruntime's calls (`run(output_names, input_feed)`,
`get_inputs()`, `get_outputs()`), so code written for onnxruntime switches by one import.
Errors are `InvalidArgument` (a `ValueError`: the caller's input), `ModuleError` (a
module that cannot be loaded), `CompileError`, `MemoryError` (a run too large for the
machine) or `AnyshapeError`.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from anyshape._anyshape import (
    AnyshapeError,
    CompileError,
    InvalidArgument,
    ModuleError,
    __version__,
)
from anyshape import _anyshape

__all__ = [
    "compile",
    "load",
    "Model",
    "TensorInfo",
    "Generation",
    "InferenceSession",
    "AnyshapeError",
    "InvalidArgument",
    "ModuleError",
    "CompileError",
    "__version__",
]

Dim = Union[int, Tuple[int, int], Sequence[int], range]


def _domain(name: str, value: Dim) -> str:
    """A dim's domain in the form the compiler reads: `NAME=8`, `NAME=1..128`, `NAME=1,8,64`."""
    bad = InvalidArgument(
        f"dims[{name!r}]: {value!r} is not a size, a (lowest, highest) range or a list of sizes"
    )
    if isinstance(value, (bool, str, bytes)):
        raise bad
    if isinstance(value, int):
        return f"{name}={value}"
    if isinstance(value, range):
        if value.step != 1:
            return f"{name}=" + ",".join(str(v) for v in value)
        return f"{name}={value.start}..{value.stop - 1}"
    if isinstance(value, tuple) and len(value) == 2:
        lo, hi = value
        return f"{name}={int(lo)}..{int(hi)}"
    try:
        return f"{name}=" + ",".join(str(int(v)) for v in value)
    except (TypeError, ValueError):
        raise bad from None


def compile(
    model: Union[str, os.PathLike],
    dims: Optional[Mapping[str, Dim]] = None,
    *,
    out: Union[str, os.PathLike],
    trials: int = 0,
    records: Optional[Union[str, os.PathLike]] = None,
    resume: bool = False,
    cache: Optional[Union[str, os.PathLike]] = None,
    progress: bool = True,
    precision: str = "f32",
    db: Union[str, os.PathLike, bool] = True,
    queue: Optional[str] = None,
    search: str = "evolutionary",
    winograd: bool = True,
) -> "Model":
    """Compile the ONNX model at `model` into the model module `out` and load it.

    `dims` gives each of the model's dims (the `dim_param`s of its inputs) the values it
    is compiled for: an int, a `(lowest, highest)` range, or a list; a model whose inputs
    have fixed shapes takes none. `trials` is the average number of tuning trials per
    task (0: untuned, in seconds); tuning writes each task's trials under `records`, from
    which `resume=True` continues. `progress` prints a line per step on standard error.
    `precision="bf16"` stores the dense layers' weights as bfloat16 pairs (half the
    bytes) and multiplies them in bfloat16 with f32 sums (on AMX tiles, `tdpbf16ps`,
    where the CPU has AMX-BF16; else AVX512_BF16's `vdpbf16ps`; emulated where the CPU
    lacks both); everything else stays f32, and outputs move by up to ~1e-2 of their
    range. `precision="i8"` runs them on 8-bit integers (weights per output channel,
    activations per row as they run, AVX512_VNNI's `vpdpbusd`; byte by byte without
    it), attention in bf16 where the CPU has bf16 products; outputs move by a few
    1e-2 of their range.
    Tuning records every trial in a tuning database too, and a task starts from the
    database's best earlier run of its workload (this model's or another's with the same
    layers): `db=True` is `tuning.sqlite` in the kernel cache, a path names another,
    `db=False` uses none.
    `queue="redis://HOST:PORT"` measures the candidates on the workers of a work queue
    (`anyshape worker --queue URL` on each measuring machine of this CPU) instead of here.
    `search="trust-region"` tunes with TSCompiler's trust regions around the seeds
    instead of the evolutionary search.
    `winograd=False` computes every convolution over its patches instead of 3 x 3 ones
    of stride 1 by Winograd's F(2x2, 3x3) (2.25x fewer multiply-adds, weights 16/9 the
    size).
    `out` is replaced only if it is absent, empty or a module holding only its own files.
    """
    domains = [_domain(k, v) for k, v in (dims or {}).items()]
    _anyshape.compile(
        os.fspath(model),
        domains,
        os.fspath(out),
        int(trials),
        None if records is None else os.fspath(records),
        bool(resume),
        None if cache is None else os.fspath(cache),
        sys.executable,
        bool(progress),
        str(precision),
        None if isinstance(db, bool) else os.fspath(db),
        db is not False,
        None if queue is None else str(queue),
        str(search),
        bool(winograd),
    )
    return load(out)


class TensorInfo(NamedTuple):
    """A model's input or output: its name, NumPy dtype name, and shape (each dim an int
    or the name, or expression, of a model dim)."""

    name: str
    dtype: str
    shape: List[Union[int, str]]


class Model:
    """A loaded model module: `run` it on NumPy arrays for any value of its dims, in the
    range it was compiled for or past it."""

    def __init__(self, path: Union[str, os.PathLike]):
        self._native = _anyshape.Model(os.fspath(path))
        self.path = os.fspath(path)
        self.inputs: List[TensorInfo] = [TensorInfo(*i) for i in self._native.inputs()]
        self.outputs: List[TensorInfo] = [TensorInfo(*o) for o in self._native.outputs()]
        self.dims: Dict[str, Tuple[int, int]] = {
            name: (lo, hi) for name, lo, hi in self._native.dims()
        }

    def run(
        self, feeds: Mapping[str, Any], out: Optional[Mapping[str, np.ndarray]] = None
    ) -> Dict[str, np.ndarray]:
        """The outputs by name, for `feeds` (every input by name, arrays or anything
        `numpy.asarray` takes; arrays that are C-contiguous and of the input's dtype are
        read in place).

        `out`: arrays to write the outputs into, by output name — typically the last
        run's result, `outs = model.run(feeds, out=outs)` in a loop. An output whose
        array has its shape and dtype (and is C-contiguous and writeable) is copied
        into it and that array returned; the others come back as fresh arrays. Such
        runs keep their outputs and write the next over them, so a large model's
        outputs are not allocated and faulted in anew every run."""
        names = [i.name for i in self.inputs]
        unknown = [k for k in feeds if k not in names]
        if unknown:
            raise InvalidArgument(
                f"the model has no input {', '.join(map(repr, unknown))} (its inputs: {', '.join(names)})"
            )
        arrays = []
        for i in self.inputs:
            if i.name not in feeds:
                raise InvalidArgument(f"input {i.name!r} is not given")
            a = np.asarray(feeds[i.name])
            if a.dtype != np.dtype(i.dtype):
                raise InvalidArgument(f"input {i.name!r} is {a.dtype}, the model takes {i.dtype}")
            arrays.append(np.ascontiguousarray(a))
        into = None
        if out is not None:
            outputs = [o.name for o in self.outputs]
            unknown = [k for k in out if k not in outputs]
            if unknown:
                raise InvalidArgument(
                    f"the model has no output {', '.join(map(repr, unknown))} (its outputs: {', '.join(outputs)})"
                )
            into = [out.get(name) for name in outputs]
            wrong = [n for n, a in zip(outputs, into) if a is not None and not isinstance(a, np.ndarray)]
            if wrong:
                raise InvalidArgument(f"out[{wrong[0]!r}] is not a numpy array")
        outs = self._native.run(arrays, into)
        return {o.name: v for o, v in zip(self.outputs, outs)}

    def generate(
        self,
        prompt_ids: Any,
        max_new_tokens: int = 32,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        seed: int = 0,
        stop_token: Optional[int] = None,
    ) -> "Generation":
        """Generate tokens after `prompt_ids` (int64 `[length]` or `[batch, length]`)
        with a decoder that carries its key/value cache (inputs `input_ids`, optionally
        `attention_mask` and `position_ids`, and `past...` caches; outputs `logits` and
        the `present...` caches): the prompt in one run, then one run per token, each
        feeding the last one's present caches as its past. Greedy unless `do_sample`
        (softmax of the logits over `temperature`, among the `top_k` most likely, drawn
        by a generator seeded with `seed`: the same seed draws the same tokens). A row
        that chose `stop_token` ends there."""
        ids = np.asarray(prompt_ids)
        if ids.dtype != np.int64:
            raise InvalidArgument(f"prompt_ids is {ids.dtype}: token ids are int64")
        if ids.ndim == 1:
            ids = ids[None, :]
        if not do_sample and (temperature != 1.0 or top_k is not None or seed != 0):
            raise InvalidArgument("temperature, top_k and seed choose how do_sample draws: pass do_sample=True")
        tokens, seconds = self._native.generate(
            np.ascontiguousarray(ids),
            int(max_new_tokens),
            float(temperature) if do_sample else None,
            top_k,
            int(seed),
            stop_token,
        )
        return Generation(tokens=tokens, step_seconds=seconds)

    def __repr__(self) -> str:
        return f"anyshape.Model({self.path!r}, dims={self.dims})"


class Generation(NamedTuple):
    """What `Model.generate` produced: each row's new tokens (a row that stopped is
    shorter) and the seconds of each step (the prompt's first)."""

    tokens: List[List[int]]
    step_seconds: List[float]

    @property
    def time_to_first_token(self) -> float:
        """Seconds of the prompt's step."""
        return self.step_seconds[0] if self.step_seconds else 0.0

    @property
    def tokens_per_second(self) -> Optional[float]:
        """Tokens per second of the steps after the first (None without any)."""
        rest = self.step_seconds[1:]
        return len(rest) * len(self.tokens) / sum(rest) if rest and sum(rest) > 0 else None


def load(path: Union[str, os.PathLike]) -> Model:
    """Load the model module at `path` (from `compile` or `anyshape compile`)."""
    return Model(path)


_ORT_TYPES = {"float32": "tensor(float)", "int64": "tensor(int64)", "bool": "tensor(bool)"}


class NodeArg(NamedTuple):
    """An input or output as onnxruntime describes it."""

    name: str
    shape: List[Union[int, str]]
    type: str


class InferenceSession:
    """A model module behind onnxruntime's `InferenceSession` calls:
    `InferenceSession(path).run(None, {"input_ids": ids})` returns the outputs as a list.
    `path` is a model module (compile the ONNX model first); options onnxruntime takes
    (`sess_options`, `providers`) are accepted and ignored."""

    def __init__(self, path: Union[str, os.PathLike], sess_options: Any = None, providers: Any = None, **_: Any):
        self._model = load(path)

    def get_inputs(self) -> List[NodeArg]:
        return [NodeArg(i.name, i.shape, _ORT_TYPES[i.dtype]) for i in self._model.inputs]

    def get_outputs(self) -> List[NodeArg]:
        return [NodeArg(o.name, o.shape, _ORT_TYPES[o.dtype]) for o in self._model.outputs]

    def run(self, output_names: Optional[Iterable[str]], input_feed: Mapping[str, Any], run_options: Any = None) -> List[np.ndarray]:
        outs = self._model.run(input_feed)
        if output_names is None:
            return [outs[o.name] for o in self._model.outputs]
        missing = [n for n in output_names if n not in outs]
        if missing:
            raise InvalidArgument(f"the model has no output {', '.join(map(repr, missing))}")
        return [outs[n] for n in output_names]
