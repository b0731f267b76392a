//! Compiling a model: the ONNX graph imported and fused into tasks (`anyshape-graph`),
//! every task tuned jointly over the model's dims — the tasks' searches sharing one
//! trial budget, given out by the task scheduler (`schedule.rs`), the members of a
//! family sharing their cost model and best candidates (`family.rs`) — then voted and
//! packaged by the compile pipeline (or, with no trials, given its sketch's default
//! micro-kernel), each into a module of its own, and the model module written:
//! `model.onnx`, `tasks/tNN/`, `model.json`, and the tuning log `tuning.json`
//! (`curve.rs`) — replaced whole, as a module is (`output.rs`).
use crate::schedule::Scheduler;
use crate::{
    compile, family_of, family_quality, instances, output, write_module, CurvePoint, FamilyQuality,
    ModuleSpec, Observer, Offer, Packaged, PipelineOptions, RecordLog, Result, SketchBackend,
    Specialize, StopReason, TimeBreakdown, TuneError, TuneOptions, Tuner, TuningLog, Votes,
    TUNING_FILE,
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
    /// Trials per task, on average: the tasks share `trials × tasks`, given out by the
    /// task scheduler; 0: every task gets its sketch's default micro-kernel (a quick,
    /// untuned module).
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
}

/// Hears a model's compilation.
pub trait ModelObserver: Observer {
    /// Task `index` of `total` (run `count` times by the model) starts its votes and
    /// module (or, untuned, its module).
    fn task(&mut self, index: usize, total: usize, workload: &str, count: usize);
    /// The task scheduler gives a task a slice of the model's budget.
    fn slice(&mut self, slice: &Slice);
    /// The scheduler is done: `given` trials given out, the model's expected latency
    /// after them (seconds per call).
    fn scheduled(&mut self, given: usize, expected_seconds: f64);
    /// A family of tasks and how well its shared cost model ranks held-out trials.
    fn family(&mut self, quality: &FamilyQuality);
}

/// A slice of a model's trial budget, as the task scheduler gives it out.
#[derive(Clone, Debug)]
pub struct Slice<'a> {
    /// The task (index).
    pub task: usize,
    /// Its workload.
    pub workload: &'a str,
    /// Its search runs until its records hold this many trials.
    pub budget: usize,
    /// The model's trials given out so far, this slice's included.
    pub given: usize,
    /// The model's trial budget.
    pub total: usize,
    /// The model's expected latency before this slice, seconds per call (the tasks with
    /// a measured latency; see `schedule.rs`).
    pub expected_seconds: f64,
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

/// Compile the model at `source` for the dims' domains into the model module `out`
/// (what [`output`] allows: never over what the command reads — the model and its
/// external data included — nor over a directory holding files anyshape did not
/// write). A model without symbolic dims takes no `dims`.
pub fn compile_model(
    source: &Path,
    dims: &[ShapeVar],
    target: &CpuTarget,
    measurer: &Measurer,
    options: &ModelOptions,
    out: &Path,
    observer: &mut dyn ModelObserver,
) -> Result<CompiledModel> {
    let bytes = anyshape_files::read(
        source,
        onnx::MAX_MODEL_BYTES,
        "an ONNX model (models over 2 GiB keep their weights in external data files)",
    )?;
    let model_dir = source.parent().unwrap_or(Path::new("."));
    let graph = onnx::decode(&bytes, Some(model_dir)).map_err(graph_error)?;
    let mut reads = options.pipeline.reads.clone();
    reads.file(source);
    for f in &graph.external {
        reads.file(&model_dir.join(f));
    }
    let facts = infer(&graph).map_err(graph_error)?;
    let names = graph.dim_names();
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
        if d.domain.bounds().is_some_and(|(lo, _)| lo < 1) {
            return Err(TuneError::Options(format!(
                "--dim {}: a model dim's values start at 1 (a tensor with an empty axis has nothing to compute)",
                d.name
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
    let others: Vec<&Path> = options.records.iter().map(|p| p.as_path()).collect();
    output::check_out_dir(out, "--out", &reads, &others)?;
    let fusion = fuse(&graph, &facts);
    let tasks = fusion.tasks();
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
    let jobs: Vec<(Workload, Vec<ShapeVar>)> = tasks
        .iter()
        .map(|t| {
            let w = Workload::parse(&t.workload)?;
            let vars = dims
                .iter()
                .filter(|d| w.shape_vars().contains(&d.name))
                .map(|d| d.spread(options.tune_values))
                .collect();
            Ok((w, vars))
        })
        .collect::<Result<_>>()?;
    let job = |i: usize| TaskJob {
        workload: &jobs[i].0,
        vars: &jobs[i].1,
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
        for (i, t) in tasks.iter().enumerate() {
            observer.task(i, tasks.len(), &t.workload, t.count);
            cpu_sketch!(jobs[i].0.class, default_module(&job(i)))?;
        }
    } else {
        let mut runs = (0..tasks.len())
            .map(|i| cpu_sketch!(jobs[i].0.class, task_run(job(i))))
            .collect::<Result<Vec<_>>>()?;
        let families: Vec<String> = jobs.iter().map(|(w, _)| family_of(w)).collect();
        let log = schedule(&mut runs, &tasks, &families, options, observer)?;
        for q in &log.families {
            observer.family(q);
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
            workload: t.workload.clone(),
            count: t.count,
            module: format!("tasks/t{i:02}"),
            trials,
        })
        .collect();
    let src = tmp.join(MODEL_SOURCE);
    std::fs::write(&src, &bytes).map_err(io(&src))?;
    // The model's external data travels with it, at the same places beside it.
    for f in &graph.external {
        let (from, to) = (model_dir.join(f), tmp.join(f));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::copy(&from, &to).map_err(io(&from))?;
    }
    if let Some(log) = &tuning {
        let json = serde_json::to_string_pretty(log).expect("tuning logs serialize");
        let path = tmp.join(TUNING_FILE);
        std::fs::write(&path, json).map_err(io(&path))?;
    }
    let mut files = std::collections::BTreeMap::new();
    for name in output::files_under(&tmp).map_err(io(&tmp))? {
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
        dims: dims.to_vec(),
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

/// The tasks' searches, as the task scheduler gives out the model's budget; the
/// families' offers moved between their members before every slice. Returns the tuning
/// log.
fn schedule(
    runs: &mut [Box<dyn TaskSearch + '_>],
    tasks: &[anyshape_graph::Task],
    families: &[String],
    options: &ModelOptions,
    observer: &mut dyn ModelObserver,
) -> Result<TuningLog> {
    let start = std::time::Instant::now();
    let counts: Vec<usize> = tasks.iter().map(|t| t.count).collect();
    let held: Vec<usize> = runs.iter().map(|r| r.trials()).collect();
    let resumed_seconds: f64 = runs.iter().map(|r| r.tuning_seconds()).sum();
    // A quarter of a task's average share a slice: the first slices measure every
    // task, the rest go where they cut the model's latency most (or round the tasks).
    let slice = (options.trials / 4).max(1);
    let total = options.trials * tasks.len();
    let mut scheduler = Scheduler::new(&counts, &held, slice, total);
    if options.equal_shares {
        scheduler = scheduler.equal_shares();
    }
    if options.families {
        // A family's first member gets a whole first slice, the later ones one foreseen
        // micro-kernel measured on the instances a search round gives each kernel.
        let first: Vec<usize> = (0..tasks.len())
            .map(|j| match families[..j].contains(&families[j]) {
                true => options.tune.instances_per_kernel,
                false => slice,
            })
            .collect();
        scheduler = scheduler.first_slices(&first);
    }
    // A resumed run's members offer what their records hold from the start.
    let mut offers: Vec<Option<Offer>> = runs
        .iter_mut()
        .zip(&held)
        .map(|(r, &n)| (options.families && n > 0).then(|| r.offer()))
        .collect();
    let mut curve = Vec::new();
    while let Some(a) = scheduler.next_slice() {
        observer.slice(&Slice {
            task: a.task,
            workload: &tasks[a.task].workload,
            budget: a.budget,
            given: scheduler.given(),
            total,
            expected_seconds: scheduler.expected_latency(),
        });
        if options.families {
            let others: Vec<&Offer> = (0..runs.len())
                .filter(|&j| j != a.task && families[j] == families[a.task])
                .filter_map(|j| offers[j].as_ref())
                .collect();
            runs[a.task].adopt(&others);
        }
        let (latency, stalled) = runs[a.task].search_to(a.budget, observer)?;
        scheduler.record(a.task, latency, stalled);
        if options.families {
            offers[a.task] = Some(runs[a.task].offer());
        }
        curve.push(CurvePoint {
            seconds: resumed_seconds + start.elapsed().as_secs_f64(),
            trials: runs.iter().map(|r| r.trials()).sum(),
            expected_seconds: scheduler
                .measured_all()
                .then(|| scheduler.expected_latency()),
        });
    }
    observer.scheduled(scheduler.given(), scheduler.expected_latency());
    let mut time = TimeBreakdown::default();
    for r in runs.iter() {
        time += r.time();
    }
    let mut names: Vec<&String> = families.iter().collect();
    names.sort();
    names.dedup();
    let mut qualities = Vec::new();
    for name in names {
        let members: Vec<usize> = (0..runs.len()).filter(|&j| &families[j] == name).collect();
        if members.len() > 1 {
            let samples: Vec<_> = members.iter().map(|&j| runs[j].offer().samples).collect();
            qualities.push(family_quality(name, &members, &samples));
        }
    }
    Ok(TuningLog {
        mode: format!(
            "{}{}",
            if options.equal_shares {
                "equal shares"
            } else {
                "scheduler"
            },
            if options.families { " + families" } else { "" }
        ),
        trials_per_task: options.trials,
        tasks: tasks.len(),
        curve,
        time,
        wall_seconds: start.elapsed().as_secs_f64(),
        new_trials: runs.iter().map(|r| r.trials()).sum::<usize>() - held.iter().sum::<usize>(),
        families: qualities,
    })
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

/// A task's module with its sketch's default micro-kernel for every instance.
fn default_module<K: Packaged + Sketch<Target = CpuTarget>>(job: &TaskJob) -> Result<()> {
    let domain = instances(job.workload, job.vars)?;
    let votes = Votes {
        micro_kernels: vec![K::default_for(job.target)],
        votes: domain
            .iter()
            .map(|x| Vote {
                bindings: x.bindings.clone(),
                micro_kernel: 0,
                latency_seconds: None,
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
            reads: &job.options.pipeline.reads,
        },
        &job.measurer.builder,
        &job.dir,
    )?;
    Ok(())
}

/// A task's search, run slice by slice, and its votes and module after; whatever its
/// sketch.
trait TaskSearch {
    /// Search until the records hold `budget` trials; the task's weighted latency then
    /// (seconds) and whether the search stalled.
    fn search_to(&mut self, budget: usize, observer: &mut dyn ModelObserver)
        -> Result<(f64, bool)>;
    /// Trials in the records.
    fn trials(&self) -> usize;
    /// Tuning seconds of the records.
    fn tuning_seconds(&self) -> f64;
    /// Where this process's search time went.
    fn time(&self) -> TimeBreakdown;
    /// What the task offers its family.
    fn offer(&mut self) -> Offer;
    /// Take what the other members of its family offer.
    fn adopt(&mut self, offers: &[&Offer]);
    /// The votes, the tree and the module (in the task's directory); the trials
    /// measured, votes included.
    fn finish(&mut self, observer: &mut dyn ModelObserver) -> Result<usize>;
}

/// A task's tuner, with its job.
struct TaskRun<'a, K: Packaged> {
    job: TaskJob<'a>,
    tuner: Tuner<SketchBackend<'a, K>>,
}

/// The task's tuner on its records (continued with `--resume`).
fn task_run<'a, K: Packaged + Sketch<Target = CpuTarget> + 'a>(
    job: TaskJob<'a>,
) -> Result<Box<dyn TaskSearch + 'a>> {
    let records = job.records.as_ref().expect("checked by compile_model");
    let (log, previous) = RecordLog::open(records, job.options.resume)?;
    let backend = SketchBackend::<K>::new(job.target, job.measurer);
    let tuner = Tuner::with_backend(
        backend,
        job.workload,
        instances(job.workload, job.vars)?,
        TuneOptions {
            trials: 0,
            ..job.options.tune.clone()
        },
        log,
        previous,
    )?;
    Ok(Box::new(TaskRun { job, tuner }))
}

/// The stop of a search the user interrupted, as the error that ends the compile.
fn interrupted(workload: &Workload, stop: StopReason) -> TuneError {
    TuneError::Environment(format!(
        "tuning {workload} stopped before its module was written ({stop}); run again with --resume"
    ))
}

impl<K: Packaged + Sketch<Target = CpuTarget>> TaskSearch for TaskRun<'_, K> {
    fn search_to(
        &mut self,
        budget: usize,
        observer: &mut dyn ModelObserver,
    ) -> Result<(f64, bool)> {
        self.tuner.set_budget(budget);
        let obs = std::cell::RefCell::new(observer);
        let report = self
            .tuner
            .run(&mut |s| obs.borrow_mut().round(s), &mut |n| {
                obs.borrow_mut().trials(n)
            })?;
        if report.stop == StopReason::Interrupted {
            return Err(interrupted(self.job.workload, report.stop));
        }
        let weight: f64 = report.best.iter().map(|b| b.weight).sum();
        let latency = report
            .best
            .iter()
            .map(|b| b.weight * b.latency_seconds)
            .sum::<f64>()
            / weight.max(f64::MIN_POSITIVE);
        Ok((latency, report.stop == StopReason::Stalled))
    }

    fn trials(&self) -> usize {
        self.tuner.trials()
    }

    fn tuning_seconds(&self) -> f64 {
        self.tuner.tuning_seconds().0
    }

    fn time(&self) -> TimeBreakdown {
        self.tuner.time
    }

    fn offer(&mut self) -> Offer {
        self.tuner.offer()
    }

    fn adopt(&mut self, offers: &[&Offer]) {
        self.tuner.adopt(offers)
    }

    fn finish(&mut self, observer: &mut dyn ModelObserver) -> Result<usize> {
        let pipeline = PipelineOptions {
            out: Some(self.job.dir.clone()),
            specialize: Specialize::None,
            ..self.job.options.pipeline.clone()
        };
        let compiled = compile(
            &mut self.tuner,
            self.job.vars,
            self.job.measurer,
            &pipeline,
            observer,
        )?;
        if compiled.module.is_none() {
            return Err(interrupted(self.job.workload, compiled.report.stop));
        }
        Ok(self.tuner.trials())
    }
}

fn graph_error(e: anyshape_graph::GraphError) -> TuneError {
    TuneError::Model(e)
}
