//! One task of a model's compilation: its job (workload, dims, records, directory),
//! its search run slice by slice as the task scheduler gives out the budget
//! ([`TaskSearch`]), then its votes and module — or, untuned, its sketch's defaults
//! for each instance, dispatched by a tree.
use crate::{
    instances, train_tree, tune_workload, write_module, DatabaseQuality, ModelOptions, ModuleSpec,
    Observer, Offer, Packaged, PipelineOptions, RecordLog, Result, SketchBackend, Specialize,
    StopReason, TimeBreakdown, TuneError, TuneOptions, Tuner, Votes,
};
use anyshape_abi::Vote;
use anyshape_codegen::{CpuTarget, Sketch};
use anyshape_ir::{ShapeVar, Workload};
use anyshape_measure::Measurer;
use std::path::PathBuf;

/// One task to compile.
pub(crate) struct TaskJob<'a> {
    pub(crate) workload: &'a Workload,
    /// The values it is tuned (or given its defaults) at.
    pub(crate) vars: &'a [ShapeVar],
    /// The dims' whole domains (its dispatch covers them).
    pub(crate) dims: &'a [ShapeVar],
    pub(crate) target: &'a CpuTarget,
    pub(crate) measurer: &'a Measurer,
    pub(crate) options: &'a ModelOptions,
    pub(crate) records: Option<PathBuf>,
    pub(crate) dir: PathBuf,
}

/// A task's module with its sketch's default micro-kernel at every instance
/// ([`Sketch::default_for_instance`]), dispatched by a tree trained on them where they
/// differ.
pub(crate) fn default_module<K: Packaged + Sketch<Target = CpuTarget>>(
    job: &TaskJob,
) -> Result<()> {
    let domain = instances(job.workload, job.vars)?;
    let mut micro_kernels: Vec<K> = Vec::new();
    let votes = domain
        .iter()
        .map(|x| {
            let mk = K::default_for_instance(job.target, job.workload, &x.bound);
            let micro_kernel = match micro_kernels.iter().position(|k| *k == mk) {
                Some(i) => i,
                None => {
                    micro_kernels.push(mk);
                    micro_kernels.len() - 1
                }
            };
            Vote {
                bindings: x.bindings.clone(),
                micro_kernel,
                latency_seconds: None,
                measured: false,
            }
        })
        .collect::<Vec<_>>();
    if micro_kernels.is_empty() {
        micro_kernels.push(K::default_for_workload(job.target, job.workload));
    }
    let (tree, tree_accuracy) = train_tree(&job.workload.shape_vars(), &votes);
    let votes = Votes {
        micro_kernels,
        votes,
        latency: Vec::new(),
    };
    write_module(
        &ModuleSpec {
            workload: job.workload,
            shape_vars: job.vars,
            target: job.target,
            strategy: job.options.tune.strategy,
            votes: &votes,
            tree: &tree,
            tree_accuracy,
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
pub(crate) trait TaskSearch {
    /// Search until the records hold `budget` trials; the task's weighted latency then
    /// (seconds) and whether the search stalled.
    fn search_to(&mut self, budget: usize, observer: &mut dyn Observer) -> Result<(f64, bool)>;
    /// Search trials in the records (what the budget counts; votes' not).
    fn trials(&self) -> usize;
    /// Of those, the trials taken from the tuning database.
    fn reused(&self) -> usize;
    /// Samples of its family's other workloads the tuning database gave its cost model.
    fn database_samples(&self) -> usize;
    /// Tuning seconds of the records.
    fn tuning_seconds(&self) -> f64;
    /// Where this process's search time went.
    fn time(&self) -> TimeBreakdown;
    /// What the task offers its family.
    fn offer(&mut self) -> Offer;
    /// Take what the other members of its family offer.
    fn adopt(&mut self, offers: &[&Offer]);
    /// How well the tuning database's samples rank the task's trials (a workload it
    /// had no run of).
    fn database_quality(&mut self) -> Option<DatabaseQuality>;
    /// The votes, the tree and the module (in the task's directory); the trials
    /// measured, votes included.
    fn finish(&mut self, observer: &mut dyn Observer) -> Result<usize>;
}

/// A task's tuner, with its job.
struct TaskRun<'a, K: Packaged> {
    job: TaskJob<'a>,
    tuner: Tuner<SketchBackend<'a, K>>,
}

/// The task's tuner on its records (continued with `--resume`).
pub(crate) fn task_run<'a, K: Packaged + Sketch<Target = CpuTarget> + 'a>(
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
    fn search_to(&mut self, budget: usize, observer: &mut dyn Observer) -> Result<(f64, bool)> {
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
        self.tuner.search_trials()
    }

    fn reused(&self) -> usize {
        self.tuner.resumed().reused
    }

    fn database_samples(&self) -> usize {
        self.tuner.database.len()
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

    fn database_quality(&mut self) -> Option<DatabaseQuality> {
        self.tuner.database_quality()
    }

    fn finish(&mut self, observer: &mut dyn Observer) -> Result<usize> {
        let pipeline = PipelineOptions {
            out: Some(self.job.dir.clone()),
            specialize: Specialize::None,
            whole_dims: Some(self.job.dims.to_vec()),
            ..self.job.options.pipeline.clone()
        };
        let tuned = tune_workload(
            &mut self.tuner,
            self.job.vars,
            self.job.measurer,
            &pipeline,
            observer,
        )?;
        if tuned.module.is_none() {
            return Err(interrupted(self.job.workload, tuned.report.stop));
        }
        Ok(self.tuner.trials())
    }
}
