//! What the joint search needs from a device ([`Backend`]), and the one backend every
//! sketch on every device uses ([`SketchBackend`]: C kernels built by the system compiler
//! or CUDA kernels built by NVRTC, run in isolated worker processes).
//!
//! The search is the same everywhere: it evolves micro-kernels in the backend's space,
//! predicts `f_MK · f_occ · f_pad` from the backend's features and adaptation, and has
//! the backend build and measure each round's trials. Tests give it a synthetic backend.
use crate::{Result, SearchSpace, TrialResult, Tunable};
use anyshape_codegen::{
    Adaptation, ContractionKernel, Factors, GpuContractionKernel, PaddingStrategy, Program, Sketch,
};
use anyshape_ir::{Bindings, BoundWorkload, Workload};
use anyshape_measure::queue::{Queue, QueueJob, QueueOutcome};
use anyshape_measure::{render_programs, BuiltLibrary, Candidate, Measurer};
use rand::Rng;
use std::collections::BTreeMap;
use std::time::Instant;

/// One program to measure on one instance.
#[derive(Clone, Debug)]
pub struct Trial<K> {
    /// The micro-kernel.
    pub micro_kernel: K,
    /// The instance.
    pub bindings: Bindings,
    /// Compare the output with the reference.
    pub check: bool,
}

/// A round's trials, with what every program of the round shares.
#[derive(Clone, Copy, Debug)]
pub struct TrialBatch<'t, K> {
    /// The workload.
    pub workload: &'t Workload,
    /// The padding strategy of every program.
    pub strategy: PaddingStrategy,
    /// Per-shape tuning: programs specialized for this instance (else symbolic).
    pub specialize: Option<&'t Bindings>,
    /// The trials.
    pub trials: &'t [Trial<K>],
    /// A vote round's: its micro-kernels are compared with each other on each instance,
    /// so those on one instance are timed side by side, on one machine.
    pub vote: bool,
}

impl<K: Sketch> TrialBatch<'_, K> {
    /// The program of a micro-kernel in the batch: symbolic, so one build serves every
    /// instance; specialized for the instance when tuning per shape.
    pub fn program(&self, mk: K) -> Program<K> {
        match self.specialize {
            Some(b) => Program::specialized(self.workload, mk, self.strategy, b),
            None => Program::symbolic(self.workload, mk, self.strategy),
        }
    }
}

/// A device of the joint search: its micro-kernels, their space, features and
/// adaptation to instances, and how programs are built and measured.
pub trait Backend {
    /// The backend's micro-kernel (its type names the sketch and the device).
    type MicroKernel: Sketch;

    /// The target.
    fn target(&self) -> &<Self::MicroKernel as Sketch>::Target;
    /// A reasonable micro-kernel (what an instance gets before anything ran).
    fn default_kernel(&self) -> Self::MicroKernel;
    /// The micro-kernels the search measures first: the sketch's default (what an
    /// untuned module runs) and its variants' defaults, those the space holds; none to
    /// start at random.
    fn seeds(&self, _w: &Workload) -> Vec<Self::MicroKernel> {
        Vec::new()
    }
    /// Narrow the space to tiles that divide one instance's extents (per-shape tuning).
    fn restrict_to_factors(&mut self, factors: Factors);
    /// Narrow the space to the micro-kernels that run `w` as they are
    /// ([`anyshape_codegen::Sketch::fit`]).
    fn restrict_to_workload(&mut self, _w: &Workload) {}
    /// A micro-kernel drawn from the space.
    fn sample(&self, rng: &mut impl Rng) -> Self::MicroKernel;
    /// A neighbour of `mk` in the space.
    fn mutate(&self, mk: &Self::MicroKernel, rng: &mut impl Rng) -> Self::MicroKernel;
    /// The one-step neighbours of `mk` in the space that the sketch singles out (see
    /// [`Sketch::steps`]); none by default.
    fn steps(&self, _mk: &Self::MicroKernel) -> Vec<Self::MicroKernel> {
        Vec::new()
    }
    /// A child of `a` and `b` in the space.
    fn crossover(
        &self,
        a: &Self::MicroKernel,
        b: &Self::MicroKernel,
        rng: &mut impl Rng,
    ) -> Self::MicroKernel;
    /// The shape-generic feature vector of `mk` (`f_MK`'s input); `representative` is an
    /// instance whose strides stand in for all.
    fn features(
        &self,
        workload: &Workload,
        mk: &Self::MicroKernel,
        strategy: PaddingStrategy,
        representative: &Bindings,
    ) -> Vec<f64>;
    /// Tasks, slots and padding of `mk` on an instance (`f_occ`'s and `f_pad`'s input).
    fn adaptation(
        &self,
        workload: &Workload,
        mk: &Self::MicroKernel,
        bound: &BoundWorkload,
    ) -> Adaptation {
        mk.adaptation(self.target(), workload, bound)
    }
    /// Build the batch's programs and measure every trial, telling `on_result` the
    /// index of each trial as soon as it has its result (a program that fails to build,
    /// crashes, hangs or computes a wrong result fails its trials, not the call);
    /// returns the seconds spent building.
    fn measure(
        &self,
        batch: &TrialBatch<Self::MicroKernel>,
        on_result: &mut dyn FnMut(usize, TrialResult),
    ) -> Result<f64>;
}

/// The backend of sketch `K` on its device: its space bounded by the target, its
/// features, and measurement by the measurer's builder (C or NVRTC, as the device
/// needs) and isolated workers.
pub struct SketchBackend<'a, K: Sketch> {
    target: K::Target,
    space: SearchSpace<K>,
    measurer: &'a Measurer,
}

/// The CPU contraction backend.
pub type CpuBackend<'a> = SketchBackend<'a, ContractionKernel>;
/// The GPU contraction backend.
pub type GpuBackend<'a> = SketchBackend<'a, GpuContractionKernel>;

impl<'a, K: Sketch> SketchBackend<'a, K> {
    /// The backend for `target`, measuring with `measurer`.
    pub fn new(target: &K::Target, measurer: &'a Measurer) -> Self {
        SketchBackend {
            target: target.clone(),
            space: SearchSpace::new(target),
            measurer,
        }
    }
}

impl<K: Tunable> Backend for SketchBackend<'_, K> {
    type MicroKernel = K;

    fn target(&self) -> &K::Target {
        &self.target
    }

    fn default_kernel(&self) -> K {
        self.space.default_kernel()
    }

    fn seeds(&self, w: &Workload) -> Vec<K> {
        let mut seeds: Vec<K> = Vec::new();
        for mk in K::seeds(&self.target, w) {
            let mk = self.space.fit(mk);
            if self.space.contains(&mk) && !seeds.contains(&mk) {
                seeds.push(mk);
            }
        }
        seeds
    }

    fn restrict_to_factors(&mut self, factors: Factors) {
        self.space = self.space.clone().with_factors(factors);
    }

    fn restrict_to_workload(&mut self, w: &Workload) {
        self.space = self.space.clone().for_workload(w);
    }

    fn sample(&self, rng: &mut impl Rng) -> K {
        self.space.sample(rng)
    }

    fn mutate(&self, mk: &K, rng: &mut impl Rng) -> K {
        self.space.mutate(mk, rng)
    }

    fn steps(&self, mk: &K) -> Vec<K> {
        self.space.steps(mk)
    }

    fn crossover(&self, a: &K, b: &K, rng: &mut impl Rng) -> K {
        self.space.crossover(a, b, rng)
    }

    fn features(
        &self,
        workload: &Workload,
        mk: &K,
        strategy: PaddingStrategy,
        representative: &Bindings,
    ) -> Vec<f64> {
        mk.features(workload, strategy, &self.target, representative)
    }

    fn measure(
        &self,
        batch: &TrialBatch<K>,
        on_result: &mut dyn FnMut(usize, TrialResult),
    ) -> Result<f64> {
        let t0 = Instant::now();
        let mut programs: BTreeMap<K, Program<K>> = BTreeMap::new();
        for t in batch.trials {
            programs
                .entry(t.micro_kernel)
                .or_insert_with(|| batch.program(t.micro_kernel));
        }
        if let Some(queue) = &self.measurer.queue {
            return measure_on_queue(queue, self, &programs, batch, on_result);
        }
        let list: Vec<Program<K>> = programs.values().cloned().collect();
        let lib = self.measurer.builder.build_programs(&self.target, &list)?;
        let build_seconds = t0.elapsed().as_secs_f64();
        run_built(
            self.measurer,
            &lib,
            batch,
            &|mk| (programs[mk].symbol(&self.target), mk.launch()),
            on_result,
        )?;
        Ok(build_seconds)
    }
}

/// Measure a batch's trials on the work queue's workers: one job per micro-kernel (its
/// source, its trials' instances) — in a vote round one per instance instead (its
/// candidates' sources), so that the candidates it compares there are timed side by
/// side on one machine, its inputs and reference made once — each trial's result as
/// its job's comes back (a kernel the worker's compiler rejected fails its trials; one
/// the worker's machine could not build or measure is transient). Returns the
/// workers' build seconds.
fn measure_on_queue<K: Tunable>(
    queue: &Queue,
    backend: &SketchBackend<K>,
    programs: &BTreeMap<K, Program<K>>,
    batch: &TrialBatch<K>,
    on_result: &mut dyn FnMut(usize, TrialResult),
) -> Result<f64> {
    let target = &backend.target;
    let list: Vec<Program<K>> = programs.values().cloned().collect();
    let (sources, unlowered) = render_programs(target, &list);
    let mut jobs: Vec<QueueJob> = Vec::new();
    // Per job, the trial behind each of its candidates.
    let mut trials_of: Vec<Vec<usize>> = Vec::new();
    let mut job_of: BTreeMap<(Option<&Bindings>, Option<K>), usize> = BTreeMap::new();
    for (n, t) in batch.trials.iter().enumerate() {
        let (symbol, gpu) = (
            programs[&t.micro_kernel].symbol(target),
            t.micro_kernel.launch(),
        );
        if let Some(e) = unlowered.get(&symbol) {
            let error = format!("did not compile: {e}");
            on_result(n, TrialResult::Failed { error });
            continue;
        }
        let group = match batch.vote {
            true => (Some(&t.bindings), None),
            false => (None, Some(t.micro_kernel)),
        };
        let j = *job_of.entry(group).or_insert_with(|| {
            jobs.push(QueueJob {
                kernels: Vec::new(),
                candidates: Vec::new(),
            });
            trials_of.push(Vec::new());
            jobs.len() - 1
        });
        if !jobs[j].kernels.iter().any(|k| k.symbol == symbol) {
            let source = sources.iter().find(|s| s.symbol == symbol);
            jobs[j].kernels.extend(source.cloned());
        }
        jobs[j].candidates.push(Candidate {
            symbol,
            workload: batch.workload.clone(),
            bindings: t.bindings.clone(),
            check: t.check,
            gpu,
        });
        trials_of[j].push(n);
    }
    let built = queue.stats().build_seconds;
    queue.measure(
        target,
        &jobs,
        &backend.measurer.runner.options,
        &mut |j, c, outcome| {
            let n = trials_of[j][c];
            let result = match outcome {
                QueueOutcome::Measured(o) => TrialResult::of(&o, jobs[j].candidates[c].check),
                QueueOutcome::Rejected(e) => TrialResult::Failed {
                    error: format!(
                        "did not compile: {}",
                        e.lines().find(|l| !l.trim().is_empty()).unwrap_or(&e)
                    ),
                },
                QueueOutcome::Unavailable(e) => TrialResult::Transient {
                    error: format!("not built: {e}"),
                },
            };
            on_result(n, result);
        },
    )?;
    Ok(queue.stats().build_seconds - built)
}

/// Measure a batch's trials in a built library: trials whose program did not build fail
/// with the compiler's first line (or, where the environment stopped the build, are
/// transient), the rest run in the measurer's workers, grouped by instance so a worker
/// reuses inputs and reference between candidates. `kernel` gives a micro-kernel's
/// symbol and, on GPU, what its launch needs.
pub(crate) fn run_built<K: Copy + Ord>(
    measurer: &Measurer,
    lib: &BuiltLibrary,
    batch: &TrialBatch<K>,
    kernel: &dyn Fn(&K) -> (String, Option<GpuContractionKernel>),
    on_result: &mut dyn FnMut(usize, TrialResult),
) -> Result<()> {
    let mut order: Vec<usize> = (0..batch.trials.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&batch.trials[a], &batch.trials[b]);
        (&ta.bindings, ta.micro_kernel).cmp(&(&tb.bindings, tb.micro_kernel))
    });
    let mut runnable = Vec::new();
    for n in order {
        let t = &batch.trials[n];
        let (symbol, gpu) = kernel(&t.micro_kernel);
        if let Some(e) = lib.failed.get(&symbol) {
            let first = e.lines().find(|l| !l.trim().is_empty()).unwrap_or(e);
            let error = format!("did not compile: {first}");
            on_result(n, TrialResult::Failed { error });
            continue;
        }
        if let Some(e) = lib.unavailable.get(&symbol) {
            let error = format!("not built: {e}");
            on_result(n, TrialResult::Transient { error });
            continue;
        }
        runnable.push((
            n,
            Candidate {
                symbol,
                workload: batch.workload.clone(),
                bindings: t.bindings.clone(),
                check: t.check,
                gpu,
            },
        ));
    }
    let cands: Vec<Candidate> = runnable.iter().map(|r| r.1.clone()).collect();
    measurer
        .runner
        .measure_with(&lib.kernels(), &cands, &mut |i, outcome| {
            let (n, cand) = &runnable[i];
            on_result(*n, TrialResult::of(outcome, cand.check));
        })?;
    Ok(())
}
