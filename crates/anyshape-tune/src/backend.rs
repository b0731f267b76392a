//! What the joint search needs from a hardware backend ([`Backend`]), and the CPU
//! backend ([`CpuBackend`]); the GPU one is in `gpu.rs`.
//!
//! The search is the same on every backend: it evolves micro-kernels in the backend's
//! space, predicts `f_MK · f_occ · f_pad` from the backend's features and adaptation,
//! and has the backend build and measure each round's trials.
use crate::{Adaptation, Factors, Result, SearchSpace, TrialResult};
use anyshape_codegen::{
    CpuTarget, GemmView, GpuMicroKernel, KernelMode, MicroKernel, PaddingStrategy, Program,
};
use anyshape_ir::{Bindings, BoundWorkload, Workload};
use anyshape_measure::{BuiltLibrary, Candidate, KernelSource, Measurer};
use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::{Debug, Display};
use std::hash::Hash;
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
}

/// A hardware backend of the joint search: its micro-kernels, their space, features and
/// adaptation to instances, and how programs are built and measured.
pub trait Backend {
    /// The backend's micro-kernel (the tile parameters of its sketch).
    type MicroKernel: Copy + Ord + Hash + Debug + Display + Serialize + DeserializeOwned;
    /// The target description that records carry.
    type Target: Clone + PartialEq + Debug + Serialize + DeserializeOwned;

    /// The target.
    fn target(&self) -> &Self::Target;
    /// A reasonable micro-kernel (what an instance gets before anything ran).
    fn default_kernel(&self) -> Self::MicroKernel;
    /// Narrow the space to tiles that divide one instance's extents (per-shape tuning).
    fn restrict_to_factors(&mut self, factors: Factors);
    /// A micro-kernel drawn from the space.
    fn sample(&self, rng: &mut impl Rng) -> Self::MicroKernel;
    /// A neighbour of `mk` in the space.
    fn mutate(&self, mk: &Self::MicroKernel, rng: &mut impl Rng) -> Self::MicroKernel;
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
    fn adaptation(&self, g: &GemmView, mk: &Self::MicroKernel, bound: &BoundWorkload)
        -> Adaptation;
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

/// The CPU backend: C kernels built by the system compiler and run in isolated worker
/// processes.
pub struct CpuBackend<'a> {
    target: CpuTarget,
    space: SearchSpace,
    measurer: &'a Measurer,
}

impl<'a> CpuBackend<'a> {
    /// The backend for `target`, measuring with `measurer`.
    pub fn new(target: &CpuTarget, measurer: &'a Measurer) -> CpuBackend<'a> {
        CpuBackend {
            target: target.clone(),
            space: SearchSpace::new(target),
            measurer,
        }
    }

    /// The program of a micro-kernel in a batch.
    pub fn program(batch: &TrialBatch<MicroKernel>, mk: MicroKernel) -> Program {
        let mut p = Program::symbolic(batch.workload, mk, batch.strategy);
        if let Some(b) = batch.specialize {
            p.mode = KernelMode::Specialized;
            p.bindings = b.clone();
        }
        p
    }
}

impl Backend for CpuBackend<'_> {
    type MicroKernel = MicroKernel;
    type Target = CpuTarget;

    fn target(&self) -> &CpuTarget {
        &self.target
    }

    fn default_kernel(&self) -> MicroKernel {
        MicroKernel::default_for(&self.target)
    }

    fn restrict_to_factors(&mut self, factors: Factors) {
        self.space = SearchSpace::factor_only(&self.target, factors);
    }

    fn sample(&self, rng: &mut impl Rng) -> MicroKernel {
        self.space.sample(rng)
    }

    fn mutate(&self, mk: &MicroKernel, rng: &mut impl Rng) -> MicroKernel {
        self.space.mutate(mk, rng)
    }

    fn crossover(&self, a: &MicroKernel, b: &MicroKernel, rng: &mut impl Rng) -> MicroKernel {
        self.space.crossover(a, b, rng)
    }

    fn features(
        &self,
        workload: &Workload,
        mk: &MicroKernel,
        strategy: PaddingStrategy,
        representative: &Bindings,
    ) -> Vec<f64> {
        crate::extract(workload, mk, strategy, &self.target, representative)
    }

    /// Local padding pads each axis to its register-tile granularity (`mr`, `nr`, `uk`);
    /// a task is one cache tile of M and N of one batch item.
    fn adaptation(&self, g: &GemmView, mk: &MicroKernel, bound: &BoundWorkload) -> Adaptation {
        let e = |a: usize| bound.extents[a].max(0) as f64;
        let up = |x: f64, m: usize| (x / m as f64).ceil() * m as f64;
        let batch: f64 = g.batch.iter().map(|&a| e(a)).product();
        let (m, n, k) = (e(g.m), e(g.n), e(g.k));
        let tasks = batch * (m / mk.mc as f64).ceil() * (n / mk.nc as f64).ceil();
        let padded = up(m, mk.mr) * up(n, mk.nr) * up(k, mk.uk);
        let pad = if padded > 0.0 {
            (m * n * k) / padded
        } else {
            1.0
        };
        Adaptation {
            tasks: tasks.max(1.0),
            slots: self.target.cores as f64,
            pad,
        }
    }

    fn measure(
        &self,
        batch: &TrialBatch<MicroKernel>,
        on_result: &mut dyn FnMut(usize, TrialResult),
    ) -> Result<f64> {
        let t0 = Instant::now();
        let mut sources = Vec::new();
        let mut lower_errors: BTreeMap<String, String> = BTreeMap::new();
        let mut symbols = BTreeMap::new();
        for t in batch.trials {
            if symbols.contains_key(&t.micro_kernel) {
                continue;
            }
            let p = Self::program(batch, t.micro_kernel);
            let symbol = p.symbol(&self.target);
            symbols.insert(t.micro_kernel, symbol.clone());
            match p.c_source(&self.target) {
                Ok(code) => sources.push(KernelSource { symbol, code }),
                Err(e) => {
                    lower_errors.insert(symbol, e.to_string());
                }
            }
        }
        let mut lib = self.measurer.builder.build(&self.target, &sources)?;
        let build_seconds = t0.elapsed().as_secs_f64();
        lib.failed.extend(lower_errors);
        run_built(
            self.measurer,
            &lib,
            batch,
            &|mk| (symbols[mk].clone(), None),
            on_result,
        )?;
        Ok(build_seconds)
    }
}

/// Measure a batch's trials in a built library: trials whose program did not build fail
/// with the compiler's first line, the rest run in the measurer's workers, grouped by
/// instance so a worker reuses inputs and reference between candidates. `kernel` gives a
/// micro-kernel's symbol and, on GPU, what its launch needs.
pub(crate) fn run_built<K: Copy + Ord>(
    measurer: &Measurer,
    lib: &BuiltLibrary,
    batch: &TrialBatch<K>,
    kernel: &dyn Fn(&K) -> (String, Option<GpuMicroKernel>),
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
        .measure_with(&lib.path, &cands, &mut |i, outcome| {
            let (n, cand) = &runnable[i];
            on_result(*n, TrialResult::of(outcome, cand.check));
        })?;
    Ok(())
}
