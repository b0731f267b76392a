//! Compiling a model: the ONNX graph imported and fused into tasks (`anyshape-graph`),
//! every task tuned jointly over the model's dims by the compile pipeline (or, with no
//! trials, given its sketch's default micro-kernel), each into a module of its own,
//! and the model module written: `model.onnx`, `tasks/tNN/`, `model.json` — replaced
//! whole, as a module is (`output.rs`).
use crate::{
    compile, instances, output, write_module, ModuleSpec, Observer, Packaged, PipelineOptions,
    RecordLog, Result, SketchBackend, Specialize, TuneError, TuneOptions, Tuner, Votes,
};
use anyshape_abi::{
    sha256_hex, DispatchTree, FileEntry, ModelManifest, ModelTask, Vote, MODEL_FILE, MODEL_FORMAT,
    MODEL_SOURCE,
};
use anyshape_codegen::{cpu_sketch, CpuTarget, Sketch};
use anyshape_graph::{fuse, infer, onnx};
use anyshape_ir::{ShapeVar, Workload};
use anyshape_measure::Measurer;
use std::path::{Path, PathBuf};

/// How a model is compiled.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// Trials for each task's joint search; 0: every task gets its sketch's default
    /// micro-kernel (a quick, untuned module).
    pub trials: usize,
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
}

/// Hears a model's compilation.
pub trait ModelObserver: Observer {
    /// Task `index` of `total` (run `count` times by the model) starts.
    fn task(&mut self, index: usize, total: usize, workload: &str, count: usize);
}

/// Compile the model at `source` for the dims' domains into the model module `out`.
pub fn compile_model(
    source: &Path,
    dims: &[ShapeVar],
    target: &CpuTarget,
    measurer: &Measurer,
    options: &ModelOptions,
    out: &Path,
    observer: &mut dyn ModelObserver,
) -> Result<ModelManifest> {
    let bytes = std::fs::read(source).map_err(|e| TuneError::Io {
        path: source.display().to_string(),
        source: e,
    })?;
    let graph = onnx::decode(&bytes, source.parent()).map_err(graph_error)?;
    let facts = infer(&graph).map_err(graph_error)?;
    let names = graph.dim_names();
    for d in dims {
        if !names.contains(&d.name) {
            return Err(TuneError::Options(format!(
                "--dim {}: the model has no dim of that name (its dims: {})",
                d.name,
                names.join(", ")
            )));
        }
    }
    if let Some(n) = names.iter().find(|n| !dims.iter().any(|d| &d.name == *n)) {
        return Err(TuneError::Options(format!(
            "the model's dim `{n}` needs a domain, e.g. --dim {n}=1..128 (or --dim {n}=1 to fix it)"
        )));
    }
    if options.trials > 0 && options.records.is_none() {
        return Err(TuneError::Options(
            "tuning a model needs --records DIR (each task's trials go there; a killed run resumes from them)".into(),
        ));
    }
    output::clean_leftovers(out);
    output::check_out_dir(
        out,
        &options
            .records
            .iter()
            .map(|p| p.as_path())
            .collect::<Vec<_>>(),
    )?;
    let fusion = fuse(&graph, &facts);
    let tasks = fusion.tasks();
    let tmp = output::temp_dir_for(out);
    let _ = std::fs::remove_dir_all(&tmp);
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source: std::io::Error| TuneError::Io { path, source }
    };
    std::fs::create_dir_all(tmp.join("tasks")).map_err(io(&tmp))?;
    if let Some(r) = &options.records {
        std::fs::create_dir_all(r).map_err(io(r))?;
    }
    let mut entries = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        observer.task(i, tasks.len(), &t.workload, t.count);
        let w = Workload::parse(&t.workload)?;
        let vars: Vec<ShapeVar> = dims
            .iter()
            .filter(|d| w.shape_vars().contains(&d.name))
            .map(|d| d.spread(options.tune_values))
            .collect();
        let module = format!("tasks/t{i:02}");
        let job = TaskJob {
            workload: &w,
            vars: &vars,
            target,
            measurer,
            options,
            records: options
                .records
                .as_ref()
                .map(|r| r.join(format!("t{i:02}.jsonl"))),
            dir: tmp.join(&module),
        };
        let trials = cpu_sketch!(w.class, task_module(&job, &mut *observer))?;
        entries.push(ModelTask {
            workload: t.workload.clone(),
            count: t.count,
            module,
            trials,
        });
    }
    let src = tmp.join(MODEL_SOURCE);
    std::fs::write(&src, &bytes).map_err(io(&src))?;
    let manifest = ModelManifest {
        format: MODEL_FORMAT,
        anyshape: env!("CARGO_PKG_VERSION").to_string(),
        source: FileEntry {
            sha256: sha256_hex(&bytes),
            bytes: bytes.len() as u64,
        },
        dims: dims.to_vec(),
        tasks: entries,
    };
    let json = serde_json::to_string_pretty(&manifest).expect("manifests serialize");
    let mpath = tmp.join(MODEL_FILE);
    std::fs::write(&mpath, json).map_err(io(&mpath))?;
    output::swap_into_place(&tmp, out).map_err(io(out))?;
    Ok(manifest)
}

/// One task to compile.
struct TaskJob<'a> {
    workload: &'a Workload,
    vars: &'a [ShapeVar],
    target: &'a CpuTarget,
    measurer: &'a Measurer,
    options: &'a ModelOptions,
    records: Option<PathBuf>,
    dir: PathBuf,
}

/// Write the task's module with the sketch `K`: tuned by the pipeline, or with the
/// default micro-kernel for every instance; returns the trials measured.
fn task_module<K: Packaged + Sketch<Target = CpuTarget>>(
    job: &TaskJob,
    observer: &mut dyn ModelObserver,
) -> Result<usize> {
    let domain = instances(job.workload, job.vars)?;
    if job.options.trials == 0 {
        let votes = Votes {
            micro_kernels: vec![K::default_for(job.target)],
            votes: domain
                .iter()
                .map(|x| Vote {
                    bindings: x.bindings.clone(),
                    micro_kernel: 0,
                    latency_seconds: 0.0,
                    measured: false,
                })
                .collect(),
        };
        write_module(
            &ModuleSpec {
                workload: job.workload,
                shape_vars: job.vars,
                target: job.target,
                strategy: job.options.tune.strategy,
                votes: &votes,
                tree: &DispatchTree::Leaf { kernel: 0 },
                tree_accuracy: 1.0,
                specialize: &[],
                tuning: None,
            },
            &job.measurer.builder,
            &job.dir,
        )?;
        return Ok(0);
    }
    let records = job.records.as_ref().expect("checked by compile_model");
    let (log, previous) = RecordLog::open(records, job.options.resume)?;
    let backend = SketchBackend::<K>::new(job.target, job.measurer);
    let mut tuner = Tuner::with_backend(
        backend,
        job.workload,
        domain,
        TuneOptions {
            trials: job.options.trials,
            ..job.options.tune.clone()
        },
        log,
        previous,
    )?;
    let pipeline = PipelineOptions {
        out: Some(job.dir.clone()),
        specialize: Specialize::None,
        ..job.options.pipeline.clone()
    };
    let compiled = compile(&mut tuner, job.vars, job.measurer, &pipeline, observer)?;
    if compiled.module.is_none() {
        return Err(TuneError::Environment(format!(
            "tuning {} stopped before its module was written ({}); run again with --resume",
            job.workload, compiled.report.stop
        )));
    }
    Ok(tuner.trials())
}

fn graph_error(e: anyshape_graph::GraphError) -> TuneError {
    TuneError::Model(e)
}
