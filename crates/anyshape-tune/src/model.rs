//! Compiling a model: the ONNX graph imported, fused and lowered to a plan
//! (`anyshape-graph`, `anyshape-plan`), every task of the plan tuned jointly over the
//! model's dims — the tasks' searches sharing one trial budget, given out by the task
//! scheduler (`schedule.rs`), the members of a family sharing their cost model and best
//! candidates (`family.rs`) — then voted and packaged by the compile pipeline (or, with
//! no trials, given its sketch's defaults per instance), each into a module of its own
//! (`task.rs`), and the model module written: `plan.bin`, `tasks/tNN/`, the tuning log
//! `tuning.json` (`curve.rs`) and `model.json` listing them all — replaced whole, as a
//! module is (`output.rs`).
use crate::schedule::schedule;
use crate::task::{default_module, task_run, TaskJob};
use crate::{
    family_of, instance_count, output, PipelineOptions, Result, TuneError, TuneOptions, TuningLog,
};
use crate::{Observer, TUNING_FILE};
use anyshape_abi::{
    sha256_hex, FileEntry, ModelManifest, ModelTask, Source, MODEL_FILE, MODEL_FORMAT, MODEL_PLAN,
};
use anyshape_codegen::{cpu_sketch, CpuTarget};
use anyshape_graph::{fuse_with_attention, infer, lower, onnx, rotate_half, winograd};
use anyshape_ir::{Bindings, Precision, ShapeVar, Workload, CACHE_RESERVE};
use anyshape_measure::Measurer;
use std::path::{Path, PathBuf};

/// How a model is compiled.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Trials per task, on average: the tasks share `trials × tasks`, given out by the
    /// task scheduler; 0: every task gets its sketch's default micro-kernel for each
    /// instance (a quick, untuned module).
    pub trials: usize,
    /// Give every task `trials` (equal shares) instead of scheduling the budget.
    pub equal_shares: bool,
    /// The members of a family share their cost model and best candidates.
    pub families: bool,
    /// Each dim is tuned on at most this many of its values ([`ShapeVar::spread`]);
    /// the dispatch trees cover the rest.
    pub tune_values: usize,
    /// Where each task's records go (`tNN.jsonl`); needed when `trials > 0`.
    pub records: Option<PathBuf>,
    /// Continue the tasks' records.
    pub resume: bool,
    /// Search options (the trial budget is `trials`).
    pub tune: TuneOptions,
    /// What follows each search.
    pub pipeline: PipelineOptions,
    /// What dense layers over constant weights multiply in (see
    /// [`anyshape_graph::fuse`]; attention: `attention_precision`).
    pub precision: Precision,
    /// 3 x 3 convolutions of stride 1 by Winograd's F(2x2, 3x3) or F(4x4, 3x3), by
    /// the dims' smallest values (see [`anyshape_graph::winograd`]); else every
    /// convolution over its patches.
    pub winograd: bool,
}

/// Seconds of timed calls per candidate and instance in a model's compile, beyond its
/// [`MEASURE_REPEATS`] calls: none. A cold call of a layer is steady (its data comes
/// from memory each time), the votes time every candidate where it may win and re-time
/// the close calls; a time floor per measurement made most of a short compile's votes:
/// BERT-base for sequence 1..512 with `--trials 8` (Zen 5) compiled in 54 s against
/// 74 s at 0.01 s and 81 s at 0.01 s with 5 calls, and the modules raced at 1.29x,
/// 1.31x and 1.33x onnxruntime FP32 (the spread of separate races).
pub const MEASURE_SECONDS: f64 = 0.0;

/// Timed calls per candidate and instance in a model's compile (a single workload's
/// tuning takes at least 5, for 0.2 s): the minimum of three cold calls.
pub const MEASURE_REPEATS: usize = 3;

impl Default for ModelOptions {
    /// Untuned (0 trials: every task its sketch's defaults per instance), 3 x 3
    /// convolutions by Winograd's transforms; when tuned,
    /// scheduled with families, each dim tuned on 24 values, candidates timed cold (a
    /// model's weights leave the caches between their layer's calls) for
    /// [`MEASURE_SECONDS`] each, at least [`MEASURE_REPEATS`] calls.
    fn default() -> Self {
        let tune = TuneOptions::default();
        ModelOptions {
            trials: 0,
            equal_shares: false,
            families: true,
            tune_values: 24,
            records: None,
            resume: false,
            tune: TuneOptions {
                measure: anyshape_measure::MeasureOptions {
                    cold: true,
                    min_seconds: MEASURE_SECONDS,
                    min_repeats: MEASURE_REPEATS,
                    ..tune.measure.clone()
                },
                ..tune
            },
            pipeline: PipelineOptions {
                votes: Default::default(),
                out: None,
                reads: Default::default(),
                specialize: crate::Specialize::None,
                check_flops: None,
                dispatch: false,
                whole_dims: None,
            },
            precision: Precision::F32,
            winograd: true,
        }
    }
}

/// A compiled model: its manifest (`model.json`) and, where it was tuned, how
/// (`tuning.json`).
#[derive(Clone, Debug)]
pub struct CompiledModel {
    /// The model module's manifest.
    pub manifest: ModelManifest,
    /// The tuning log; none for an untuned module (`trials` 0).
    pub tuning: Option<TuningLog>,
}

/// The most instances a task's dispatch is chosen at when it is chosen at every value
/// of its dims: an untuned task's defaults ([`task_values`]), a tuned task's votes
/// between its tuned values (`between.rs`).
pub(crate) const EVERY_VALUE_INSTANCES: u64 = 1024;

/// The values of its dims a task's instances take. Tuned, each dim's
/// `tune_values` spread values ([`ShapeVar::spread`]: what a search can measure).
/// Untuned, every value where the task has at most [`EVERY_VALUE_INSTANCES`]: the
/// defaults cost nothing to choose, and the tree then follows their rules at every
/// shape, not by the ranges between spread values (BERT-base's sequence 13 fell
/// between 11 and 15 and missed the 8-row tile that 13-16 rows take); past that (two
/// image dims of 33 values and more), spread values too. (A tuned task's tree learns
/// every value as well, from its votes: `between.rs`.)
fn task_values(vars: Vec<ShapeVar>, options: &ModelOptions) -> Vec<ShapeVar> {
    if options.trials == 0 && instance_count(&vars) <= EVERY_VALUE_INSTANCES {
        return vars;
    }
    vars.iter().map(|d| d.spread(options.tune_values)).collect()
}

/// Check the dims' domains against the model's dims: each named dim exists and none
/// is negative (0 is allowed: a decoder's past is empty at the prompt), every dim of
/// the model has a domain.
fn check_dims(names: &[String], dims: &[ShapeVar]) -> Result<()> {
    for d in dims {
        if !names.contains(&d.name) {
            return Err(TuneError::Options(format!(
                "--dim {}: the model has no dim of that name ({})",
                d.name,
                if names.is_empty() {
                    "it has none: its inputs' shapes are fixed, compile it without --dim"
                        .to_string()
                } else {
                    format!("its dims: {}", names.join(", "))
                }
            )));
        }
        if d.domain.bounds().is_some_and(|(lo, _)| lo < 0) {
            return Err(TuneError::Options(format!(
                "--dim {}: a model dim's values are 0 or more",
                d.name
            )));
        }
    }
    if let Some(n) = names.iter().find(|n| !dims.iter().any(|d| &d.name == *n)) {
        return Err(TuneError::Options(format!(
            "the model's dim `{n}` needs a domain, e.g. --dim {n}=1..128 (or --dim {n}=1 to fix it)"
        )));
    }
    Ok(())
}

/// What a module's attention multiplies in, its dense layers multiplying in
/// `precision`: in bf16 in a bf16 module; in an i8 one bf16 where `target` multiplies
/// bf16 faster than rounding costs (AVX512_BF16's pairs or AMX's tiles: BERT-base at
/// sequence 512 on Zen 4, attention 55 -> 34 ms of a 194 ms run), else f32 — its
/// operands are activations, which are not quantized; f32 otherwise.
pub(crate) fn attention_precision(precision: Precision, target: &CpuTarget) -> Precision {
    match precision {
        Precision::I8 if target.avx512_bf16 || target.amx => Precision::Bf16,
        Precision::Bf16 => Precision::Bf16,
        Precision::F32 | Precision::I8 => Precision::F32,
    }
}

/// Compile the model at `source` for the dims' domains into the model module `out`
/// (what the `output` module allows: never over what the command reads — the model and its
/// external data included — nor over a directory holding files anyshape did not
/// write). A model without symbolic dims takes no `dims`.
pub fn compile_model(
    source: &Path,
    dims: &[ShapeVar],
    target: &CpuTarget,
    measurer: &Measurer,
    options: &ModelOptions,
    out: &Path,
    observer: &mut dyn Observer,
) -> Result<CompiledModel> {
    let bytes = anyshape_files::read(
        source,
        onnx::MAX_MODEL_BYTES,
        "an ONNX model (models over 2 GiB keep their weights in external data files)",
    )?;
    let model_dir = source.parent().unwrap_or(Path::new("."));
    let graph = onnx::decode(&bytes, Some(model_dir)).map_err(TuneError::Model)?;
    let mut reads = options.pipeline.reads.clone();
    reads.file(source);
    for f in &graph.external {
        reads.file(&model_dir.join(f));
    }
    check_dims(&graph.dim_names(), dims)?;
    if dims.iter().any(|d| d.name == CACHE_RESERVE) {
        return Err(TuneError::Options(format!(
            "--dim {CACHE_RESERVE}: anyshape names a decoder's spare cache rows so; rename the model's dim"
        )));
    }
    if options.trials > 0 && options.records.is_none() {
        return Err(TuneError::Options(
            "tuning a model needs --records DIR (each task's trials go there; a killed run resumes from them)".into(),
        ));
    }
    if let Some(r) = &options.records {
        if r.exists() && !r.is_dir() {
            return Err(TuneError::Options(format!(
                "--records {} is a file: name a directory for the tasks' records (one tNN.jsonl per task)",
                r.display()
            )));
        }
        reads
            .check("--records", r)
            .map_err(|e| TuneError::Output(e.to_string()))?;
    }
    anyshape_files::clean_leftovers(out);
    let others: Vec<&Path> = options
        .records
        .iter()
        .chain(&options.tune.database)
        .map(|p| p.as_path())
        .collect();
    output::check_out_dir(out, "--out", &reads, &others)?;
    if let Some(db) = &options.tune.database {
        reads
            .check("--db", db)
            .map_err(|e| TuneError::Output(e.to_string()))?;
        crate::TuningDb::open(db)?; // a file that is not one is refused before any work
    }
    let mut graph = graph;
    let facts = infer(&graph)
        .and_then(|facts| rotate_half(&mut graph, facts))
        .and_then(|facts| match options.winograd {
            true => {
                // Each dim's smallest value: where the larger Winograd tiles pay.
                let least = Bindings::from_pairs(
                    dims.iter()
                        .filter_map(|d| Some((d.name.as_str(), d.domain.bounds()?.0))),
                );
                winograd(&mut graph, facts, &least)
            }
            false => Ok(facts),
        })
        .map_err(TuneError::Model)?;
    let attention = attention_precision(options.precision, target);
    let fusion = fuse_with_attention(&graph, &facts, options.precision, attention);
    let plan = lower(&graph, &facts, &fusion).map_err(TuneError::Model)?;
    let tasks = &plan.plan().tasks;
    let tmp = anyshape_files::temp_dir(out);
    let _ = std::fs::remove_dir_all(&tmp);
    // A compile that fails leaves nothing of its module behind.
    let removed = RemoveOnDrop(&tmp);
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source: std::io::Error| TuneError::Io { path, source }
    };
    std::fs::create_dir_all(tmp.join("tasks")).map_err(io(&tmp))?;
    if let Some(r) = &options.records {
        std::fs::create_dir_all(r).map_err(io(r))?;
    }
    // The rows a decoder's cache holds past its end are tuned at 0 (a plain run's);
    // kernels read them at run time like any dim.
    let reserve = ShapeVar::parse(&format!("{CACHE_RESERVE}=0")).expect("a valid dim");
    let jobs: Vec<(Workload, Vec<ShapeVar>, Vec<ShapeVar>)> = tasks
        .iter()
        .map(|t| {
            let whole: Vec<ShapeVar> = dims
                .iter()
                .chain([&reserve])
                .filter(|d| t.workload.shape_vars().contains(&d.name))
                .cloned()
                .collect();
            (
                t.workload.clone(),
                task_values(whole.clone(), options),
                whole,
            )
        })
        .collect();
    let job = |i: usize| TaskJob {
        workload: &jobs[i].0,
        vars: &jobs[i].1,
        dims: &jobs[i].2,
        target,
        measurer,
        options,
        records: options
            .records
            .as_ref()
            .map(|r| r.join(format!("t{i:02}.jsonl"))),
        dir: tmp.join(format!("tasks/t{i:02}")),
    };
    let mut trials = vec![0; tasks.len()];
    let mut tuning = None;
    if options.trials == 0 {
        // The tasks' modules are independent: as many as the builder runs compilers at
        // a time, each line printed as its task starts; the first error in task order
        // is the compile's.
        let built = anyshape_measure::each_on_threads(
            tasks.len(),
            measurer.builder.jobs,
            |i| observer.task(i, tasks.len(), &tasks[i].workload, tasks[i].count),
            |i| cpu_sketch!(jobs[i].0.class, default_module(&job(i))),
        );
        built.into_iter().collect::<Result<()>>()?;
    } else {
        let mut runs = (0..tasks.len())
            .map(|i| cpu_sketch!(jobs[i].0.class, task_run(job(i))))
            .collect::<Result<Vec<_>>>()?;
        if let Some(db) = &options.tune.database {
            let reused: Vec<usize> = runs.iter().map(|r| r.reused()).collect();
            observer.reused(db, &reused);
        }
        let families: Vec<String> = jobs.iter().map(|(w, ..)| family_of(w)).collect();
        let log = schedule(&mut runs, tasks, &families, options, observer)?;
        for q in &log.families {
            observer.family(q);
        }
        for q in &log.database {
            observer.unseen(q);
        }
        for (i, t) in tasks.iter().enumerate() {
            observer.task(i, tasks.len(), &t.workload, t.count);
            trials[i] = runs[i].finish(observer)?;
        }
        tuning = Some(log);
    }
    let entries = tasks
        .iter()
        .zip(trials)
        .enumerate()
        .map(|(i, (t, trials))| ModelTask {
            workload: t.workload.to_string(),
            count: t.count,
            module: format!("tasks/t{i:02}"),
            trials,
        })
        .collect();
    let plan_entry = plan.write(&tmp.join(MODEL_PLAN), &reads)?;
    if let Some(log) = &tuning {
        let json = serde_json::to_string_pretty(log).expect("tuning logs serialize");
        let path = tmp.join(TUNING_FILE);
        std::fs::write(&path, json).map_err(io(&path))?;
    }
    let mut files = std::collections::BTreeMap::from([(MODEL_PLAN.to_string(), plan_entry)]);
    for name in output::files_under(&tmp).map_err(io(&tmp))? {
        if name == MODEL_PLAN {
            continue; // hashed as it was written
        }
        let path = tmp.join(&name);
        let content = std::fs::read(&path).map_err(io(&path))?;
        files.insert(
            name,
            FileEntry {
                sha256: sha256_hex(&content),
                bytes: content.len() as u64,
            },
        );
    }
    let mut manifest = ModelManifest {
        format: MODEL_FORMAT,
        anyshape: env!("CARGO_PKG_VERSION").to_string(),
        source: Source {
            path: std::path::absolute(source)
                .unwrap_or_else(|_| source.to_path_buf())
                .display()
                .to_string(),
            file: FileEntry {
                sha256: sha256_hex(&bytes),
                bytes: bytes.len() as u64,
            },
        },
        dims: dims.to_vec(),
        precision: options.precision,
        tasks: entries,
        files,
        checksum: String::new(),
    };
    manifest.seal();
    let mpath = tmp.join(MODEL_FILE);
    std::fs::write(&mpath, manifest.to_json()).map_err(io(&mpath))?;
    // Whatever appeared at `out` meanwhile is checked once more.
    output::check_out_dir(out, "--out", &reads, &others)?;
    anyshape_files::swap_dir(&tmp, out).map_err(io(out))?;
    drop(removed);
    Ok(CompiledModel { manifest, tuning })
}

/// Removes a directory when dropped (a half-built module, when its compile fails);
/// once swapped into place, there is nothing left to remove.
struct RemoveOnDrop<'a>(&'a Path);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::{attention_precision, task_values, ModelOptions};
    use anyshape_codegen::CpuTarget;
    use anyshape_ir::{Precision, ShapeVar};

    /// An i8 module's attention is bf16 only where the CPU multiplies bf16 itself; the
    /// other precisions' attention is theirs.
    #[test]
    fn an_i8_modules_attention_is_bf16_only_where_the_cpu_has_bf16_products() {
        let plain = CpuTarget {
            avx512_bf16: false,
            amx: false,
            ..CpuTarget::detect()
        };
        let pairs = CpuTarget {
            avx512_bf16: true,
            ..plain.clone()
        };
        let tiles = CpuTarget {
            amx: true,
            ..plain.clone()
        };
        assert_eq!(attention_precision(Precision::I8, &plain), Precision::F32);
        assert_eq!(attention_precision(Precision::I8, &pairs), Precision::Bf16);
        assert_eq!(attention_precision(Precision::I8, &tiles), Precision::Bf16);
        for t in [&plain, &pairs] {
            assert_eq!(attention_precision(Precision::F32, t), Precision::F32);
            assert_eq!(attention_precision(Precision::Bf16, t), Precision::Bf16);
        }
    }

    /// Untuned tasks take their defaults at every value up to `EVERY_VALUE_INSTANCES`
    /// instances, spread values past it; tuned ones always at spread values.
    #[test]
    fn untuned_tasks_take_every_value_until_the_instances_grow_too_many() {
        let dims = |texts: &[&str]| -> Vec<ShapeVar> {
            texts.iter().map(|t| ShapeVar::parse(t).unwrap()).collect()
        };
        let sizes =
            |vars: &[ShapeVar]| -> Vec<u64> { vars.iter().map(|d| d.domain.len()).collect() };
        let untuned = ModelOptions::default();
        let tuned = ModelOptions {
            trials: 8,
            ..ModelOptions::default()
        };
        let sequence = dims(&["batch=1", "sequence=1..512"]);
        assert_eq!(sizes(&task_values(sequence.clone(), &untuned)), [1, 512]);
        assert_eq!(sizes(&task_values(sequence, &tuned)), [1, 24]);
        let edge = dims(&["batch=1..2", "sequence=1..512"]);
        assert_eq!(sizes(&task_values(edge, &untuned)), [2, 512]);
        let images = dims(&["height=1..33", "width=1..32"]);
        assert_eq!(sizes(&task_values(images, &untuned)), [24, 24]);
    }
}
