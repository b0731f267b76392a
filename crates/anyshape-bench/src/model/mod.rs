//! `anyshape bench --model M --compare`: a model module raced against onnxruntime,
//! OpenVINO (FP32 and its default precision) and tract on the same `.onnx` (the one it
//! was compiled from, checked by its SHA-256) and the same inputs, over a grid of dim
//! values (generated inputs) or on recorded cases (`.npz` files: [`Case`]). Systems are
//! timed in interleaved rounds (the order rotates each round) and each keeps its minimum
//! latency; every system's outputs are checked against the case's recorded outputs
//! where it has them all, else every peer's against anyshape's. Writes `model.csv`,
//! `model.md` and `model-latency.svg` (`report.rs`).
mod report;

use crate::error::{BenchError, Result};
use crate::out::OutDir;
use crate::peak::{Ceiling, Peak};
use crate::peers::{Anyshape, Case as PeerCase, Peer, PeerKind, PeerOptions, PeerStart, Started};
use crate::report::{paired_speedup, significant};
use crate::Harness;
use anyshape_codegen::Target;
use anyshape_files::Reads;
use anyshape_ir::{Bindings, Precision};
use anyshape_measure::Progress;
use anyshape_runtime::Case;
use anyshape_tensor::{DType, Data, Tensor, TensorSpec};
use report::{write_all, ModelReport};
use std::path::{Path, PathBuf};

/// What `compare_model` measures and where it writes.
pub struct ModelCompareOptions<'a> {
    /// Values of each of the model's dims (every dim named); the instances are their
    /// cross product, on generated inputs. Empty where `cases` are given.
    pub dims: &'a [(String, Vec<i64>)],
    /// Recorded cases (`.npz` files of the model's inputs by name, and of its outputs
    /// where recorded), raced instead of the dims' grid: one instance each, on its
    /// inputs, every system's outputs checked against the recorded ones.
    pub cases: &'a [PathBuf],
    /// Interleaved rounds per instance.
    pub rounds: usize,
    /// Seconds of timed runs per system, instance and round (at least one run).
    pub seconds: f64,
    /// The peers and how they run.
    pub peers: PeerOptions<'a>,
    /// Other compiles of the same model (tuned and untuned, another precision or
    /// range), raced as peers in this process; where given and no peers are named,
    /// they race alone.
    pub against: &'a [PathBuf],
    /// Where the CSV, report and plot go.
    pub out_dir: &'a Path,
}

/// One instance's results: per system, its best latency of each round (seconds) and the
/// largest relative difference of its outputs from the reference (`None`: it failed).
struct Row {
    bindings: Bindings,
    /// The recorded case it ran (its file's name), where it ran one.
    case: Option<String>,
    /// Whether the errors are against the case's recorded outputs (else against
    /// anyshape's, whose own error is then 0).
    recorded: bool,
    /// The useful flops of anyshape's run (its kernels'; see [`run_flops`]).
    flops: Option<f64>,
    error: Vec<Option<f64>>,
    /// Per system, its best of each round (`None` where it was not timed; all `None`
    /// once it failed).
    rounds: Vec<Vec<Option<f64>>>,
}

impl Row {
    /// How the reports name the instance: its case and dims, or its dims.
    fn label(&self) -> String {
        match &self.case {
            Some(c) => format!("{c} ({})", self.bindings),
            None => self.bindings.to_string(),
        }
    }

    /// System `p`'s latency: its minimum over the rounds.
    fn latency(&self, p: usize) -> Option<f64> {
        self.rounds[p].iter().flatten().copied().reduce(f64::min)
    }

    /// The paired speedup of anyshape over system `p` (see [`paired_speedup`]).
    fn paired_speedup(&self, p: usize) -> Option<f64> {
        paired_speedup(&self.rounds[0], &self.rounds[p])
    }
}

/// The useful flops of a run of `model` at `b`: its kernels' ([`Workload::flops`] times
/// the steps that run each task); host steps (layer norms, gathers, masks) are not
/// counted. A plain run's caches have no rows to spare ([`CACHE_RESERVE`] 0). `None`
/// where a task's workload does not bind at `b`.
///
/// [`Workload::flops`]: anyshape_ir::Workload::flops
/// [`CACHE_RESERVE`]: anyshape_ir::CACHE_RESERVE
fn run_flops(model: &anyshape_runtime::Model, b: &Bindings) -> Option<f64> {
    let mut b = b.clone();
    b.update(anyshape_ir::CACHE_RESERVE, 0);
    let b = &b;
    model
        .plan()
        .tasks
        .iter()
        .map(|t| {
            let bound = t.workload.bind(b).ok()?;
            Some(t.workload.flops(&bound) * t.count as f64)
        })
        .sum()
}

/// `n` numbers uniform in [-1, 1) from `state` (xorshift), which moves on.
pub(crate) fn uniform(n: usize, state: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            (*state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Deterministic inputs for one instance: float inputs uniform in [-1, 1) from a fixed
/// generator, integer inputs (token ids, masks, token types) all 1, booleans true —
/// valid for any vocabulary, and what the model computes does not depend on them.
pub(crate) fn inputs(specs: &[TensorSpec], b: &Bindings) -> Result<Vec<(String, Tensor)>> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    specs
        .iter()
        .map(|i| {
            let shape = i
                .shape
                .iter()
                .map(|d| {
                    let v = d.eval(b)?;
                    usize::try_from(v).map_err(|_| {
                        BenchError::Options(format!("{b}: a dim of {} is {v}", i.name))
                    })
                })
                .collect::<Result<Vec<usize>>>()?;
            let n: usize = shape.iter().product();
            let data = match i.dtype {
                DType::F32 => Data::F32(uniform(n, &mut state)),
                DType::I64 => Data::I64(vec![1; n]),
                DType::Bool => Data::Bool(vec![true; n]),
            };
            let t = Tensor::new(shape, data).map_err(|e| BenchError::Options(e.to_string()))?;
            Ok((i.name.clone(), t))
        })
        .collect()
}

/// The largest error of `got` against `want` over the outputs (see
/// [`anyshape_tensor::compare`]): infinite where NaNs or infinities differ, or an
/// output's shape or type does.
pub(crate) fn rel_error(got: &[Tensor], want: &[Tensor]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    got.iter()
        .zip(want)
        .map(|(a, b)| anyshape_tensor::compare(a, b).map_or(f64::INFINITY, |c| c.error()))
        .fold(0.0, f64::max)
}

/// The instances: the cross product of the dims' values, checked against the model's
/// dims (a value is at least 1, or 0 where the dim's domain starts there: a decoder's
/// past).
pub(crate) fn instances(
    model: &[anyshape_ir::ShapeVar],
    dims: &[(String, Vec<i64>)],
) -> Result<Vec<Bindings>> {
    let names: Vec<String> = model.iter().map(|d| d.name.clone()).collect();
    for (d, values) in dims {
        let Some(var) = model.iter().find(|v| v.name == *d) else {
            return Err(BenchError::Options(format!(
                "--dim {d}: the model has no dim of that name (its dims: {})",
                names.join(", ")
            )));
        };
        let least = var.domain.bounds().map_or(1, |(lo, _)| lo.clamp(0, 1));
        if values.is_empty() || values.iter().any(|&v| v < least) {
            return Err(BenchError::Options(format!(
                "--dim {d}: values must be at least {least}"
            )));
        }
    }
    if let Some(missing) = names.iter().find(|n| !dims.iter().any(|(d, _)| d == *n)) {
        return Err(BenchError::Options(format!(
            "give the values of every dim of the model ({}): --dim {missing}=… is missing",
            names.join(", ")
        )));
    }
    let mut out = vec![Vec::<(String, i64)>::new()];
    for (d, values) in dims {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |&v| {
                    let mut p = prefix.clone();
                    p.push((d.clone(), v));
                    p
                })
            })
            .collect();
    }
    Ok(out
        .iter()
        .map(|p| Bindings::from_pairs(p.iter().map(|(d, v)| (d.as_str(), *v))))
        .collect())
}

/// A CSV header's columns of the dims, in `--dim`'s order.
pub(crate) fn dim_columns(dims: &[(String, Vec<i64>)]) -> String {
    let names: Vec<&str> = dims.iter().map(|(d, _)| d.as_str()).collect();
    names.join(",")
}

/// An instance's cells under [`dim_columns`].
pub(crate) fn dim_cells(dims: &[(String, Vec<i64>)], b: &Bindings) -> String {
    let cells: Vec<String> = dims
        .iter()
        .map(|(d, _)| b.get(d).map_or(String::new(), |v| v.to_string()))
        .collect();
    cells.join(",")
}

/// A recorded case, read: its name, inputs in the model's order, the dims they bind
/// and its recorded outputs in the model's order (where it records them all).
struct Recorded {
    name: String,
    inputs: Vec<(String, Tensor)>,
    bindings: Bindings,
    outputs: Option<Vec<Tensor>>,
}

impl Recorded {
    /// The case at `path`, for `model`: every input given, their dims agreeing.
    fn read(model: &anyshape_runtime::Model, path: &Path) -> Result<Recorded> {
        let case: Case = model.read_case(path)?;
        let given = case.given(model)?;
        let (_, bindings) = anyshape_tensor::bind(model.inputs(), &given)
            .map_err(|e| BenchError::Options(format!("{}: {e}", path.display())))?;
        let inputs = given
            .iter()
            .map(|(n, t)| (n.to_string(), t.to_tensor()))
            .collect();
        Ok(Recorded {
            name: path.file_name().map_or_else(
                || path.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
            inputs,
            bindings,
            outputs: case.recorded_outputs(model),
        })
    }
}

/// The module in `other`, loaded, where it is a compile of `model`'s source model (the
/// same SHA-256): `bench --model --against`.
fn same_model(model: &anyshape_runtime::Model, other: &Path) -> Result<anyshape_runtime::Model> {
    let m = anyshape_runtime::Model::load(other)?;
    if m.manifest().source.file.sha256 != model.manifest().source.file.sha256 {
        return Err(BenchError::Options(format!(
            "--against {}: a compile of another model than {} (their source models' SHA-256 differ)",
            other.display(),
            model.dir().display()
        )));
    }
    Ok(m)
}

/// The ONNX model the module was compiled from: `given`, or where it was then;
/// checked by its SHA-256 (the peers must run the same model).
pub(crate) fn source_model(
    model: &anyshape_runtime::Model,
    given: Option<&Path>,
) -> Result<PathBuf> {
    let s = &model.manifest().source;
    let path = given.map_or_else(|| PathBuf::from(&s.path), Path::to_path_buf);
    let hint = "give the model it was compiled from with --onnx FILE";
    let bytes = anyshape_files::read(&path, 1 << 40, "the source model").map_err(|e| {
        BenchError::Options(format!("the peers need the source model: {e}; {hint}"))
    })?;
    if anyshape_abi::sha256_hex(&bytes) != s.file.sha256 {
        return Err(BenchError::Options(format!(
            "{} is not the model {} was compiled from (its SHA-256 differs); {hint}",
            path.display(),
            model.dir().display()
        )));
    }
    Ok(path)
}

/// Race the model module in `dir` against its peers; returns the summary and the
/// files written.
pub fn compare_model(
    dir: &Path,
    o: &ModelCompareOptions,
    h: &Harness,
    progress: &mut dyn Progress,
) -> Result<(String, Vec<String>)> {
    // The reports' directory is checked before any work.
    let mut reads = Reads::new();
    reads.dir(dir);
    for other in o.against {
        reads.dir(other);
    }
    for case in o.cases {
        reads.file(case);
    }
    if !o.cases.is_empty() && !o.dims.is_empty() {
        return Err(BenchError::Options(
            "race either on generated inputs at the --dim values or on recorded cases (--inputs), not both".into(),
        ));
    }
    let out = OutDir::new(o.out_dir, reads)?;
    let loading = std::time::Instant::now();
    let model = anyshape_runtime::Model::load(dir)?;
    let load_seconds = loading.elapsed().as_secs_f64();
    if o.cases.is_empty() && o.dims.is_empty() {
        let names: Vec<&str> = model.dims().iter().map(|d| d.name.as_str()).collect();
        return Err(BenchError::Options(format!(
            "race on generated inputs at dim values (--dim NAME=VALUES for each of {}) or on recorded cases (--inputs CASE.npz,...)",
            names.join(", ")
        )));
    }
    let others = o
        .against
        .iter()
        .map(|other| same_model(&model, other))
        .collect::<Result<Vec<_>>>()?;
    // By default every peer, onnxruntime's dynamic quantization only against an i8
    // module.
    let every: Vec<PeerKind> = PeerKind::ALL
        .into_iter()
        .filter(|&k| k != PeerKind::OnnxruntimeInt8 || model.manifest().precision == Precision::I8)
        .collect();
    let asked = match (o.peers.peers, others.is_empty()) {
        (Some(named), _) => named,
        (None, true) => &every[..],
        (None, false) => &[],
    };
    // The peers run the model the module was compiled from (none where only modules
    // race).
    let source = match asked.is_empty() {
        true => PathBuf::new(),
        false => source_model(&model, o.peers.onnx)?,
    };
    let specs = model.inputs().to_vec();
    let cases = o
        .cases
        .iter()
        .map(|p| Recorded::read(&model, p))
        .collect::<Result<Vec<_>>>()?;
    let instances = match cases.is_empty() {
        true => instances(model.dims(), o.dims)?,
        false => cases.iter().map(|c| c.bindings.clone()).collect(),
    };
    // The reports' dim columns: the --dim values, or the values the cases bind.
    let dims = match cases.is_empty() {
        true => o.dims.to_vec(),
        false => model
            .dims()
            .iter()
            .map(|d| {
                let mut values: Vec<i64> =
                    instances.iter().filter_map(|b| b.get(&d.name)).collect();
                values.sort_unstable();
                values.dedup();
                (d.name.clone(), values)
            })
            .collect(),
    };
    // The generated inputs (and onnxruntime's outputs) live only as long as the run.
    let scratch = tempfile::Builder::new()
        .prefix("anyshape-bench-model")
        .tempdir()
        .map_err(|e| BenchError::Environment(format!("a temporary directory: {e}")))?;
    let case_dir = scratch.path().to_path_buf();
    progress.note("measuring the FMA peak ...");
    let mut peak = Ceiling::measure(Peak::Fma, &h.target, &h.builder)?;
    // A bf16 module's dense layers run on bf16 tiles (AMX) or pair products, an i8
    // module's on quad products: their peak too.
    let mut peak_precision = match Peak::of_precision(&h.target, model.manifest().precision) {
        Some(kind) => {
            progress.note(&format!("measuring the {} ...", kind.describe()));
            Some(Ceiling::measure(kind, &h.target, &h.builder)?)
        }
        None => None,
    };
    let flops: Vec<Option<f64>> = instances.iter().map(|b| run_flops(&model, b)).collect();
    let outputs: Vec<String> = model.outputs().iter().map(|s| s.name.clone()).collect();
    let labelled = !others.is_empty();
    let mut peers: Vec<Box<dyn Peer>> = vec![Box::new(Anyshape::new(model, labelled))];
    for other in others {
        peers.push(Box::new(Anyshape::new(other, true)));
    }
    let mut unavailable = Vec::new();
    for &kind in asked {
        if kind == PeerKind::Tract {
            match tract(&source, progress) {
                Ok(t) => peers.push(t),
                Err(e) if o.peers.peers.is_some() => return Err(e),
                Err(e) => unavailable.push(e.to_string()),
            }
            continue;
        }
        let start = PeerStart {
            python: o.peers.python,
            torch_python: o.peers.torch_python,
            model: &source,
            threads: o.peers.threads,
            outputs: &outputs,
            scratch: &case_dir,
        };
        match start.python_peer(kind, asked, o.peers.peers.is_some(), progress)? {
            Started::Peer(p) => peers.push(Box::new(p)),
            Started::Skipped => {}
            Started::Unavailable(u) => unavailable.push(u),
        }
    }
    for u in &unavailable {
        progress.note(&format!("warning: {u}"));
    }
    let names: Vec<String> = peers.iter().map(|p| p.name()).collect();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    progress.start("instances", instances.len());
    for (i, b) in instances.iter().enumerate() {
        progress.message(&b.to_string());
        let npz = case_dir.join(format!("case-{i}.npz"));
        let recorded = cases.get(i);
        let tensors = match recorded {
            Some(c) => c.inputs.clone(),
            None => inputs(&specs, b)?,
        };
        anyshape_tensor::npz::write(&npz, &tensors, &Reads::new(), "a case file")
            .map_err(|e| BenchError::Environment(e.to_string()))?;
        let case = PeerCase { tensors, npz };
        let n = peers.len();
        // The first run of each: its outputs, checked against the recorded ones where
        // the case has them all, else against anyshape's.
        let mut want = recorded.and_then(|c| c.outputs.clone());
        let mut row = Row {
            bindings: b.clone(),
            case: recorded.map(|c| c.name.clone()),
            recorded: want.is_some(),
            flops: flops[i],
            error: vec![None; n],
            rounds: vec![vec![None; o.rounds]; n],
        };
        let mut ok = vec![false; n];
        for (p, peer) in peers.iter_mut().enumerate() {
            match peer.time(&case, 0.0, true) {
                Ok((_, Some(outs))) => {
                    let reference = want.get_or_insert(outs.clone());
                    row.error[p] = Some(rel_error(&outs, reference));
                    ok[p] = true;
                }
                Ok((_, None)) => {}
                Err(e) => failures.push(format!("{} at {b}: {e}", names[p])),
            }
        }
        for r in 0..o.rounds {
            for k in 0..n {
                let p = (k + r) % n;
                if !ok[p] {
                    continue;
                }
                match peers[p].time(&case, o.seconds, false) {
                    Ok((times, _)) => {
                        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
                        row.rounds[p][r] = Some(best);
                    }
                    Err(e) => {
                        failures.push(format!("{} at {b}: {e}", names[p]));
                        ok[p] = false;
                        row.rounds[p] = vec![None; o.rounds];
                    }
                }
            }
        }
        let line: Vec<String> = names
            .iter()
            .enumerate()
            .map(|(p, s)| match row.latency(p) {
                Some(l) => format!("{s} {} ms", significant(l * 1e3)),
                None => format!("{s} failed"),
            })
            .collect();
        progress.note(&format!("{}: {}", row.label(), line.join(", ")));
        rows.push(row);
        progress.inc(1);
    }
    progress.finish();
    for f in &failures {
        progress.note(&format!("warning: {f}"));
    }
    progress.note("measuring the peaks again ...");
    for ceiling in std::iter::once(&mut peak).chain(peak_precision.as_mut()) {
        ceiling.remeasure(&h.target, &h.builder)?;
    }
    let report = ModelReport {
        dir,
        target: &h.target.describe(),
        peak: peak.gflops,
        peak_precision: peak_precision.map(|c| (c.kind, c.gflops)),
        load_seconds,
        o,
        dims: &dims,
        names: &names,
        rows: &rows,
        unavailable: &unavailable,
        failures: &failures,
    };
    write_all(&report, &out)
}

/// tract on `source`, in process, where anyshape was built with it.
#[cfg(feature = "tract")]
fn tract(source: &Path, progress: &mut dyn Progress) -> Result<Box<dyn Peer>> {
    let t = crate::peers::Tract::load(source)?;
    if let Some(why) = &t.why_concrete {
        progress.note(&format!(
            "tract cannot optimize the model with symbolic dims ({why}): it is optimized per shape, outside the timed runs"
        ));
    }
    Ok(Box::new(t))
}

/// tract is not built in.
#[cfg(not(feature = "tract"))]
fn tract(_: &Path, _: &mut dyn Progress) -> Result<Box<dyn Peer>> {
    Err(BenchError::Environment(
        "tract: not built in (build anyshape with --features tract; scripts/bench-model.sh does)"
            .into(),
    ))
}
