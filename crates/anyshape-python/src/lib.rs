//! `anyshape._anyshape`, the native module of the Python package (`python/`): compile
//! an ONNX model into a model module, load a model module, run it on NumPy arrays —
//! inputs read in place (C-contiguous arrays of the model's element types), outputs
//! handed to NumPy without a copy, the GIL released while a model compiles or runs —
//! and the measuring worker that `compile` starts (`python -m anyshape._worker`).
//! Errors are Python exceptions by whose fault they are; the Python layer
//! (`python/src/anyshape/__init__.py`) gives the friendly API around this one.
use anyshape_ir::ShapeVar;
use anyshape_measure::queue::Queue;
use anyshape_measure::{Builder, MeasureError, Measurer, Runner, WorkerCommand};
use anyshape_runtime::RuntimeError;
use anyshape_tensor::{DType, Data, Tensor, TensorRef};
use anyshape_tune::{compile_model, ModelOptions, Observer, RoundSummary, Slice, Stage};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyException, PyMemoryError, PyValueError};
use pyo3::prelude::*;
use std::path::PathBuf;

/// Buffers on cache lines, as in the `anyshape` CLI (see
/// [`anyshape_abi::CacheLineAllocator`]): the kernels were tuned on such buffers.
#[global_allocator]
static ALLOCATOR: anyshape_abi::CacheLineAllocator = anyshape_abi::CacheLineAllocator;

pyo3::create_exception!(
    _anyshape,
    AnyshapeError,
    PyException,
    "An anyshape error that is neither the caller's input nor a module's."
);
pyo3::create_exception!(
    _anyshape,
    InvalidArgument,
    PyValueError,
    "The caller's input is wrong: inputs missing or of the wrong type, rank or shape; bad options; an unsupported model."
);
pyo3::create_exception!(
    _anyshape,
    ModuleError,
    AnyshapeError,
    "A module cannot be loaded: not a module, incomplete, damaged, or written by another version or for another CPU."
);
pyo3::create_exception!(
    _anyshape,
    CompileError,
    AnyshapeError,
    "A model could not be compiled (its message says why)."
);

/// A runtime error as the Python exception of whose fault it is.
fn runtime_error(e: RuntimeError) -> PyErr {
    match e {
        RuntimeError::Module(m) => ModuleError::new_err(m.to_string()),
        RuntimeError::Memory(m) => PyMemoryError::new_err(m),
        e @ (RuntimeError::Tensor(_)
        | RuntimeError::Shape(_)
        | RuntimeError::UnknownVar { .. }
        | RuntimeError::BufferCount { .. }
        | RuntimeError::BufferLen { .. }
        | RuntimeError::Decoder(_)
        | RuntimeError::Options(_)) => InvalidArgument::new_err(e.to_string()),
        e => AnyshapeError::new_err(e.to_string()),
    }
}

/// A loaded model module, and the output tensors of its last run given arrays to write
/// into (`run`'s `out`), which the next such run writes over (`Model::run_into`)
/// before copying them into the caller's arrays.
#[pyclass(frozen)]
struct Model {
    inner: anyshape_runtime::Model,
    kept: anyshape_runtime::KeptOutputs,
}

/// A tensor's description as Python sees it: `(name, dtype, shape)` with each dim an
/// `int` or the name (or expression) of a model dim.
type Info = (String, String, Vec<Py<PyAny>>);

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::I64 => "int64",
        DType::Bool => "bool",
    }
}

fn info(py: Python<'_>, s: &anyshape_tensor::TensorSpec) -> PyResult<Info> {
    let shape = s
        .shape
        .iter()
        .map(|e| match e.as_const() {
            Some(c) => Ok(c.into_pyobject(py)?.into_any().unbind()),
            None => Ok(e.to_string().into_pyobject(py)?.into_any().unbind()),
        })
        .collect::<PyResult<_>>()?;
    Ok((s.name.clone(), dtype_name(s.dtype).into(), shape))
}

/// An input array's elements in place: a C-contiguous array of `dtype`.
fn borrow<'a>(
    name: &str,
    array: &'a Bound<'_, PyUntypedArray>,
    dtype: DType,
) -> PyResult<(Vec<usize>, anyshape_tensor::DataRef<'a>)> {
    let shape = array.shape().to_vec();
    let wrong = || {
        InvalidArgument::new_err(format!(
            "input `{name}` is {}, the model takes {}",
            array.dtype(),
            dtype_name(dtype)
        ))
    };
    let not_contiguous = || {
        InvalidArgument::new_err(format!(
            "input `{name}` is not C-contiguous (numpy.ascontiguousarray makes it so)"
        ))
    };
    // SAFETY (all three): the array is alive while the run borrows it (the caller
    // holds it; the GIL is released only around a run that owns its inputs' views),
    // and nothing writes to an input while a run reads it.
    Ok(match dtype {
        DType::F32 => {
            let a = array.cast::<PyArrayDyn<f32>>().map_err(|_| wrong())?;
            let s = unsafe { a.as_slice() }.map_err(|_| not_contiguous())?;
            (shape, anyshape_tensor::DataRef::F32(s))
        }
        DType::I64 => {
            let a = array.cast::<PyArrayDyn<i64>>().map_err(|_| wrong())?;
            let s = unsafe { a.as_slice() }.map_err(|_| not_contiguous())?;
            (shape, anyshape_tensor::DataRef::I64(s))
        }
        DType::Bool => {
            let a = array.cast::<PyArrayDyn<bool>>().map_err(|_| wrong())?;
            let s = unsafe { a.as_slice() }.map_err(|_| not_contiguous())?;
            (shape, anyshape_tensor::DataRef::Bool(s))
        }
    })
}

/// Whether `array` can take output `t`: its shape and element type, C-contiguous and
/// writeable.
fn takes(array: &Bound<'_, PyUntypedArray>, t: Option<&Tensor>) -> bool {
    let Some(t) = t else { return false };
    let writeable = array.getattr("flags").and_then(|f| f.getattr("writeable"));
    array.shape() == t.shape.as_slice()
        && array.is_c_contiguous()
        && writeable.and_then(|w| w.extract::<bool>()).unwrap_or(false)
        && match t.dtype() {
            DType::F32 => array.cast::<PyArrayDyn<f32>>().is_ok(),
            DType::I64 => array.cast::<PyArrayDyn<i64>>().is_ok(),
            DType::Bool => array.cast::<PyArrayDyn<bool>>().is_ok(),
        }
}

/// Copy `t` into `array` (which [`takes`] it).
fn write_into(array: &Bound<'_, PyUntypedArray>, t: &Tensor) -> PyResult<()> {
    fn copy<T: numpy::Element + Copy>(array: &Bound<'_, PyUntypedArray>, v: &[T]) -> PyResult<()> {
        let mut a = array
            .cast::<PyArrayDyn<T>>()?
            .try_readwrite()
            .map_err(|_| AnyshapeError::new_err("an output array is borrowed elsewhere"))?;
        a.as_slice_mut()?.copy_from_slice(v);
        Ok(())
    }
    match &t.data {
        Data::F32(v) => copy(array, v),
        Data::I64(v) => copy(array, v),
        Data::Bool(v) => copy(array, v),
    }
}

/// An output tensor as a NumPy array, its elements moved, not copied.
fn to_numpy(py: Python<'_>, t: Tensor) -> PyResult<Py<PyAny>> {
    let shape = t.shape;
    Ok(match t.data {
        Data::F32(v) => numpy::PyArray1::from_vec(py, v)
            .reshape(shape)?
            .into_any()
            .unbind(),
        Data::I64(v) => numpy::PyArray1::from_vec(py, v)
            .reshape(shape)?
            .into_any()
            .unbind(),
        Data::Bool(v) => numpy::PyArray1::from_vec(py, v)
            .reshape(shape)?
            .into_any()
            .unbind(),
    })
}

#[pymethods]
impl Model {
    /// Load the model module in `path` (its manifest, plan and task modules checked).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Model> {
        let inner = py
            .detach(|| anyshape_runtime::Model::load(&path))
            .map_err(runtime_error)?;
        Ok(Model {
            inner,
            kept: Default::default(),
        })
    }

    /// The inputs: `(name, dtype, shape)`, dims as ints or dim names.
    fn inputs(&self, py: Python<'_>) -> PyResult<Vec<Info>> {
        self.inner.inputs().iter().map(|s| info(py, s)).collect()
    }

    /// The outputs: `(name, dtype, shape)`, dims as ints or expressions over the dims.
    fn outputs(&self, py: Python<'_>) -> PyResult<Vec<Info>> {
        self.inner
            .outputs()
            .into_iter()
            .map(|s| info(py, s))
            .collect()
    }

    /// The dims with the ranges they were compiled for: `(name, lowest, highest)`.
    fn dims(&self) -> Vec<(String, i64, i64)> {
        self.inner
            .dims()
            .iter()
            .map(|d| {
                let (lo, hi) = d.domain.bounds().unwrap_or((0, 0));
                (d.name.clone(), lo, hi)
            })
            .collect()
    }

    /// Run on `arrays` (one per input, in the inputs' order: C-contiguous, of the
    /// inputs' element types): the outputs, in order. With `out` (one array or `None`
    /// per output), an output whose array there has its shape and element type and is
    /// C-contiguous and writeable is copied into it and that array returned; the
    /// others are fresh arrays. The outputs of such runs are kept and written over by
    /// the next (no fresh outputs to fault in).
    #[pyo3(signature = (arrays, out=None))]
    fn run(
        &self,
        py: Python<'_>,
        arrays: Vec<Bound<'_, PyUntypedArray>>,
        out: Option<Vec<Option<Bound<'_, PyUntypedArray>>>>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let specs = self.inner.inputs();
        if arrays.len() != specs.len() {
            return Err(InvalidArgument::new_err(format!(
                "{} arrays for the model's {} inputs",
                arrays.len(),
                specs.len()
            )));
        }
        let borrowed = specs
            .iter()
            .zip(&arrays)
            .map(|(s, a)| borrow(&s.name, a, s.dtype))
            .collect::<PyResult<Vec<_>>>()?;
        let given = specs
            .iter()
            .zip(&borrowed)
            .map(|(s, (shape, data))| {
                TensorRef::new(shape, *data)
                    .map(|t| (s.name.as_str(), t))
                    .map_err(|e| InvalidArgument::new_err(e.to_string()))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let inner = &self.inner;
        let count = inner.outputs().len();
        let Some(out) = out else {
            let outs = py.detach(|| inner.run(&given)).map_err(runtime_error)?;
            return outs.into_iter().map(|t| to_numpy(py, t)).collect();
        };
        if out.len() != count {
            return Err(InvalidArgument::new_err(format!(
                "{} arrays to write into for the model's {count} outputs",
                out.len()
            )));
        }
        let mut kept = self.kept.for_run(inner);
        let outs: &mut Vec<Option<Tensor>> = &mut kept;
        py.detach(|| inner.run_into(&given, outs))
            .map_err(runtime_error)?;
        outs.iter_mut()
            .zip(out)
            .map(|(t, array)| {
                let into = array.filter(|a| takes(a, t.as_ref()));
                match (t, into) {
                    (Some(t), Some(a)) => {
                        write_into(&a, t)?;
                        Ok(a.into_any().unbind())
                    }
                    (t, _) => match t.take() {
                        Some(t) => to_numpy(py, t),
                        None => Err(AnyshapeError::new_err(
                            "internal error: a run left an output unwritten",
                        )),
                    },
                }
            })
            .collect()
    }

    /// Generate from `prompt` (int64 `[batch, length]`) with the model as a decoder
    /// carrying its key/value cache: each row's new tokens and the seconds of each
    /// step (the prompt's first). Greedy unless `temperature` is given (then sampled,
    /// over the `top_k` most likely, from a generator seeded with `seed`).
    #[pyo3(signature = (prompt, max_new_tokens, temperature=None, top_k=None, seed=0, stop_token=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: Bound<'_, PyUntypedArray>,
        max_new_tokens: usize,
        temperature: Option<f32>,
        top_k: Option<usize>,
        seed: u64,
        stop_token: Option<i64>,
    ) -> PyResult<(Vec<Vec<i64>>, Vec<f64>)> {
        let (shape, data) = borrow("prompt_ids", &prompt, DType::I64)?;
        let ids = TensorRef::new(&shape, data)
            .map_err(|e| InvalidArgument::new_err(e.to_string()))?
            .to_tensor();
        let options = anyshape_runtime::GenerateOptions {
            max_new_tokens,
            sampling: match temperature {
                Some(temperature) => anyshape_runtime::Sampling::Sample {
                    temperature,
                    top_k,
                    seed,
                },
                None => anyshape_runtime::Sampling::Greedy,
            },
            stop_token,
            keep_logits: false,
        };
        let inner = &self.inner;
        let g = py
            .detach(|| anyshape_runtime::Decoder::of(inner)?.generate(inner, &ids, &options))
            .map_err(runtime_error)?;
        Ok((g.tokens, g.step_seconds))
    }
}

/// Reports a compile's progress on standard error, a line per stage, task and slice.
struct Lines;

impl Observer for Lines {
    fn stage(&mut self, stage: &Stage) {
        match stage {
            Stage::Search { budget, .. } => eprintln!("search: a budget of {budget} trials"),
            Stage::Votes { .. } => eprintln!("votes: measuring the candidates on every instance"),
            Stage::Tree { tuned, between } => {
                eprintln!("dispatch tree: training on {tuned} votes and {between} between them")
            }
            Stage::Module { symbolic, .. } => eprintln!("module: building {symbolic} kernels"),
            Stage::Check => eprintln!("check: the best kernels against the reference"),
        }
    }
    fn round(&mut self, s: &RoundSummary) {
        eprintln!(
            "round {}: {}/{} trials, best {:.1} GFLOP/s",
            s.round, s.trials, s.budget, s.best_gflops
        );
    }
    fn trials(&mut self, _: usize) {}
    fn task(&mut self, index: usize, total: usize, w: &anyshape_ir::Workload, count: usize) {
        eprintln!("task {}/{total}: {w} (run {count}x per call)", index + 1);
    }
    fn slice(&mut self, s: &Slice) {
        eprintln!(
            "scheduler: {}/{} trials given; task {} to {} trials",
            s.given,
            s.total,
            s.task + 1,
            s.budget
        );
    }
    fn reused(&mut self, database: &std::path::Path, trials: &[usize]) {
        eprintln!("{}", anyshape_tune::Reuse { database, trials });
    }
}

/// Quiet progress.
struct Quiet;

impl Observer for Quiet {
    fn stage(&mut self, _: &Stage) {}
    fn round(&mut self, _: &RoundSummary) {}
    fn trials(&mut self, _: usize) {}
}

/// Compile the ONNX model `model` for `dims` (`NAME=DOMAIN` texts) into the model
/// module `out`, tuning each task with `trials` on average (0: untuned, seconds), its
/// dense layers in `precision` (`f32`, `bf16` or `i8`), 3 x 3 convolutions of stride 1 by
/// Winograd's F(2x2, 3x3) or F(4x4, 3x3) (by the images' smallest size) where
/// `winograd`; tuning records its trials in the
/// tuning database `db` too (and starts from its earlier runs), where `use_db`: `db`,
/// else `tuning.sqlite` in the kernel cache. The worker that measures candidates is
/// `python` (the running interpreter) with `-m anyshape._worker`, or with `queue` (a
/// Redis URL) the work queue's workers (`anyshape worker --queue URL`); `search` is
/// `evolutionary` or `trust-region`. Returns the manifest's JSON.
#[pyfunction]
#[pyo3(signature = (model, dims, out, trials, records, resume, cache, python, progress, precision, db, use_db, queue, search, winograd))]
#[allow(clippy::too_many_arguments)]
fn compile(
    py: Python<'_>,
    model: PathBuf,
    dims: Vec<String>,
    out: PathBuf,
    trials: usize,
    records: Option<PathBuf>,
    resume: bool,
    cache: Option<PathBuf>,
    python: PathBuf,
    progress: bool,
    precision: String,
    db: Option<PathBuf>,
    use_db: bool,
    queue: Option<String>,
    search: String,
    winograd: bool,
) -> PyResult<String> {
    let search: anyshape_tune::SearchStrategy = search.parse().map_err(InvalidArgument::new_err)?;
    let precision: anyshape_ir::Precision = precision.parse().map_err(InvalidArgument::new_err)?;
    let dims: Vec<ShapeVar> = dims
        .iter()
        .map(|d| ShapeVar::parse(d))
        .collect::<Result<_, _>>()
        .map_err(|e| InvalidArgument::new_err(e.to_string()))?;
    let cache = cache.unwrap_or_else(Builder::default_cache_dir);
    let defaults = ModelOptions::default();
    let options = ModelOptions {
        trials,
        records,
        resume,
        precision,
        winograd,
        tune: anyshape_tune::TuneOptions {
            search,
            database: (use_db && trials > 0)
                .then(|| db.unwrap_or_else(|| cache.join(anyshape_tune::DATABASE_FILE))),
            ..defaults.tune
        },
        ..defaults
    };
    let measurer = Measurer {
        builder: Builder::new(cache),
        runner: Runner {
            worker: WorkerCommand {
                program: python,
                args: vec!["-m".into(), "anyshape._worker".into()],
            },
            options: options.tune.measure.clone(),
        },
        queue: match queue.filter(|_| trials > 0) {
            None => None,
            Some(url) => Some(py.detach(|| Queue::connect(&url)).map_err(|e| match e {
                MeasureError::QueueUrl(_) => InvalidArgument::new_err(e.to_string()),
                e => CompileError::new_err(e.to_string()),
            })?),
        },
    };
    let target = anyshape_codegen::CpuTarget::detect();
    let compiled = py.detach(|| {
        let mut lines = Lines;
        let mut quiet = Quiet;
        let observer: &mut dyn Observer = if progress { &mut lines } else { &mut quiet };
        compile_model(&model, &dims, &target, &measurer, &options, &out, observer)
    });
    match compiled {
        Ok(c) => Ok(c.manifest.to_json()),
        Err(
            e @ (anyshape_tune::TuneError::Options(_)
            | anyshape_tune::TuneError::Output(_)
            | anyshape_tune::TuneError::Model(_)
            | anyshape_tune::TuneError::Ir(_)),
        ) => Err(InvalidArgument::new_err(e.to_string())),
        Err(e) => Err(CompileError::new_err(e.to_string())),
    }
}

/// Serve one measuring job on standard input and output (what `compile`'s workers run);
/// the exit status.
#[pyfunction]
fn serve_worker(py: Python<'_>) -> i32 {
    py.detach(anyshape_measure::worker::serve)
}

#[pymodule]
fn _anyshape(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(serve_worker, m)?)?;
    m.add("AnyshapeError", m.py().get_type::<AnyshapeError>())?;
    m.add("InvalidArgument", m.py().get_type::<InvalidArgument>())?;
    m.add("ModuleError", m.py().get_type::<ModuleError>())?;
    m.add("CompileError", m.py().get_type::<CompileError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
