//! The tuning pipeline of one workload, in one function ([`tune_workload`]): workload → joint search → votes
//! → dispatch tree → module. Every front end (the command line's `tune` on any device,
//! the baselines' per-shape tuning) runs it; each stage is announced to an
//! [`Observer`] by name, so progress shows whether or not the output is a terminal.
use crate::{
    accuracy, between, check_best, elect, train_tree, write_module, Backend, BestCheck, ModuleSpec,
    Result, Specialize, Tunable, TuneError, TuneReport, Tuner, VoteOptions, Votes,
};
use anyshape_abi::{DispatchTree, Manifest, TuningInfo};
use anyshape_codegen::{
    AttentionKernel, ContractionKernel, CpuTarget, GpuContractionKernel, RowKernel, Sketch,
};
use anyshape_ir::{ShapeVar, Workload};
use anyshape_measure::Measurer;
use std::path::PathBuf;
use std::time::Instant;

/// A stage of the pipeline.
#[derive(Clone, Debug, PartialEq)]
pub enum Stage {
    /// The joint search starts: instances, trial budget, trials resumed.
    Search {
        /// Instances of the domain.
        instances: usize,
        /// The trial budget.
        budget: usize,
        /// Trials the records hold as it starts (resumed from the file, or run by this
        /// process before, as a model's task scheduler does).
        resumed: usize,
    },
    /// The candidates of the votes are measured on every instance.
    Votes {
        /// Trials the vote round takes at most.
        trials: usize,
        /// The records already end with a vote round (resumed, or reused from the
        /// tuning database): only what it lacks is measured.
        recorded: bool,
    },
    /// The dispatch tree is trained on the votes (and, for a model's task, on the votes
    /// between its tuned values: `between.rs`).
    Tree {
        /// Votes of the tuned instances.
        tuned: usize,
        /// Votes estimated between them.
        between: usize,
    },
    /// The module's kernels are built and the module written.
    Module {
        /// Symbolic kernels (one per chosen micro-kernel).
        symbolic: usize,
        /// Kernels specialized for single instances.
        specialized: usize,
    },
    /// The best kernel of every instance is checked against the reference.
    Check,
}

/// Hears the progress of tuning: the pipeline's stages and rounds, and, compiling a
/// model, its tasks, the task scheduler's slices and the families (those have nothing
/// to say for one workload, so they default to nothing).
pub trait Observer {
    /// A stage starts.
    fn stage(&mut self, stage: &Stage);
    /// A search round ended.
    fn round(&mut self, summary: &crate::RoundSummary);
    /// The records hold `n` trials.
    fn trials(&mut self, n: usize);
    /// Task `index` of `total` (run `count` times by the model) starts its votes and
    /// module (or, untuned, its module).
    fn task(&mut self, _index: usize, _total: usize, _workload: &Workload, _count: usize) {}
    /// The task scheduler gives a task a slice of the model's budget.
    fn slice(&mut self, _slice: &crate::Slice) {}
    /// The scheduler is done: `given` trials given out, the model's expected latency
    /// after them (seconds per call).
    fn scheduled(&mut self, _given: usize, _expected_seconds: f64) {}
    /// A family of tasks and how well its shared cost model ranks held-out trials.
    fn family(&mut self, _quality: &crate::FamilyQuality) {}
    /// A task the tuning database had no run of, and how well its samples of the
    /// task's family ranked the task's trials.
    fn unseen(&mut self, _quality: &crate::DatabaseQuality) {}
    /// The tasks' searches start: each task's trials taken from the tuning database
    /// `database` (earlier runs of its workload; 0 where it had none).
    fn reused(&mut self, _database: &std::path::Path, _trials: &[usize]) {}
}

/// What to do after the search.
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// How votes are taken.
    pub votes: VoteOptions,
    /// Write the module here (votes and the tree are made for it).
    pub out: Option<PathBuf>,
    /// What the command reads: the module never replaces or enters them.
    pub reads: anyshape_files::Reads,
    /// Instances that get specialized kernels in the module.
    pub specialize: Specialize,
    /// Check the best kernel of every instance up to this many FLOPs.
    pub check_flops: Option<f64>,
    /// Vote and train the tree even without a module (to report them).
    pub dispatch: bool,
    /// The dims' whole domains where the search was given some of their values (a
    /// model's tasks): the tree also learns a vote at every value between (up to
    /// 1,024 instances; `between.rs`). `None`: the tuned instances are the domain.
    pub whole_dims: Option<Vec<ShapeVar>>,
}

/// What the pipeline produced.
pub struct Tuned<K> {
    /// The search's report.
    pub report: TuneReport<K>,
    /// The votes, the tree and its training accuracy, where made.
    pub dispatch: Option<(Votes<K>, DispatchTree, f64)>,
    /// Seconds the votes took.
    pub vote_seconds: f64,
    /// The module's manifest and the seconds its build took, where written.
    pub module: Option<(Manifest, f64)>,
    /// The check of the best kernels, where asked for.
    pub check: Option<BestCheck>,
}

/// A sketch whose tuned micro-kernels can be packaged into a module the runtime loads.
pub trait Packaged: Tunable {
    /// Write the module (see [`write_module`]).
    fn write(
        spec: &ModuleSpec<Self>,
        measurer: &Measurer,
        dir: &std::path::Path,
    ) -> Result<Manifest>;
}

/// CPU sketches: one shared library with the dispatcher.
fn write_cpu<K: Tunable + Sketch<Target = CpuTarget>>(
    spec: &ModuleSpec<K>,
    measurer: &Measurer,
    dir: &std::path::Path,
) -> Result<Manifest> {
    write_module(spec, &measurer.builder, dir)
}

impl Packaged for ContractionKernel {
    fn write(spec: &ModuleSpec<Self>, m: &Measurer, dir: &std::path::Path) -> Result<Manifest> {
        write_cpu(spec, m, dir)
    }
}

impl Packaged for RowKernel {
    fn write(spec: &ModuleSpec<Self>, m: &Measurer, dir: &std::path::Path) -> Result<Manifest> {
        write_cpu(spec, m, dir)
    }
}

impl Packaged for AttentionKernel {
    fn write(spec: &ModuleSpec<Self>, m: &Measurer, dir: &std::path::Path) -> Result<Manifest> {
        write_cpu(spec, m, dir)
    }
}

impl Packaged for GpuContractionKernel {
    fn write(_: &ModuleSpec<Self>, _: &Measurer, _: &std::path::Path) -> Result<Manifest> {
        Err(TuneError::Unsupported(
            "modules of GPU kernels are not built yet (the runtime loads CPU modules); tune without --out, or on the CPU".into(),
        ))
    }
}

/// Run the pipeline on a prepared tuner: the search, then (for a module, or with
/// `dispatch`) the votes and the tree, the module, and the check asked for. An
/// interrupted search ends the pipeline there (the records hold it; a resume goes on).
pub fn tune_workload<B>(
    tuner: &mut Tuner<B>,
    shape_vars: &[ShapeVar],
    measurer: &Measurer,
    options: &PipelineOptions,
    observer: &mut dyn Observer,
) -> Result<Tuned<B::MicroKernel>>
where
    B: Backend,
    B::MicroKernel: Packaged,
{
    observer.stage(&Stage::Search {
        instances: tuner.instances().len(),
        budget: tuner.budget(),
        resumed: tuner.search_trials(),
    });
    let obs = std::cell::RefCell::new(observer);
    let report = tuner.run(&mut |s| obs.borrow_mut().round(s), &mut |n| {
        obs.borrow_mut().trials(n)
    })?;
    let observer = obs.into_inner();
    let mut tuned = Tuned {
        report,
        dispatch: None,
        vote_seconds: 0.0,
        module: None,
        check: None,
    };
    // Asked to stop: the records hold the search; votes and module wait for a resume.
    if tuned.report.stop == crate::StopReason::Interrupted {
        return Ok(tuned);
    }
    if options.out.is_some() || options.dispatch {
        let start = Instant::now();
        observer.stage(&Stage::Votes {
            trials: options.votes.max_kernels * tuner.instances().len(),
            recorded: tuner.vote_round().is_some(),
        });
        let votes = elect(tuner, &options.votes, &mut |n| observer.trials(n))?;
        tuned.vote_seconds = start.elapsed().as_secs_f64();
        // The tree learns the votes between tuned values too, where there are such;
        // its accuracy is on the tuned votes.
        let learned = match &options.whole_dims {
            Some(dims) => between(tuner, &votes, dims, options.votes.tolerance)?,
            None => votes.votes.clone(),
        };
        observer.stage(&Stage::Tree {
            tuned: votes.votes.len(),
            between: learned.len() - votes.votes.len(),
        });
        let (tree, _) = train_tree(&tuner.workload().shape_vars(), &learned);
        let accuracy = accuracy(&tree, &votes.votes);
        if let Some(out) = &options.out {
            let bindings: Vec<_> = votes.votes.iter().map(|v| v.bindings.clone()).collect();
            let weights: Vec<f64> = tuner.instances().iter().map(|x| x.weight).collect();
            let specialize = options.specialize.pick(&bindings, &weights);
            observer.stage(&Stage::Module {
                symbolic: votes.micro_kernels.len(),
                specialized: specialize.len(),
            });
            let (seconds, untimed_trials) = tuner.tuning_seconds();
            let t0 = Instant::now();
            let manifest = B::MicroKernel::write(
                &ModuleSpec {
                    workload: tuner.workload(),
                    shape_vars,
                    target: tuner.target(),
                    strategy: tuner.strategy(),
                    votes: &votes,
                    tree: &tree,
                    tree_accuracy: accuracy,
                    specialize: &specialize,
                    tuning: Some(TuningInfo {
                        seconds,
                        trials: tuner.trials(),
                        resumed_trials: tuned.report.resumed_trials,
                        untimed_trials,
                        reused_trials: tuner.resumed().reused,
                    }),
                    reads: &options.reads,
                },
                measurer,
                out,
            )?;
            tuned.module = Some((manifest, t0.elapsed().as_secs_f64()));
        }
        tuned.dispatch = Some((votes, tree, accuracy));
    }
    if let Some(max_flops) = options.check_flops {
        observer.stage(&Stage::Check);
        tuned.check = Some(check_best(
            tuner.workload(),
            tuner.target(),
            tuner.strategy(),
            &tuned.report,
            measurer,
            max_flops,
        )?);
    }
    Ok(tuned)
}
