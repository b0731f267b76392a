//! A search's options and what it reports: per round, per instance, and at the end
//! (with why it stopped).
use anyshape_codegen::{ContractionKernel, PaddingStrategy};
use anyshape_ir::Bindings;
use anyshape_measure::MeasureOptions;
use serde::{Deserialize, Serialize};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// How the search chooses the micro-kernels it measures after the seeds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SearchStrategy {
    /// DietCode's joint evolutionary search: mutation, crossover and fresh samples of
    /// the best known micro-kernels, the batch chosen by predicted gain (`explore.rs`).
    #[default]
    Evolutionary,
    /// TSCompiler's trust regions around the hardware-aligned seeds, grown on success
    /// and shrunk after failures, a bandit choosing where to sample (`trust_region.rs`).
    TrustRegion,
}

impl std::fmt::Display for SearchStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SearchStrategy::Evolutionary => "evolutionary",
            SearchStrategy::TrustRegion => "trust-region",
        })
    }
}

impl std::str::FromStr for SearchStrategy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "evolutionary" => Ok(SearchStrategy::Evolutionary),
            "trust-region" => Ok(SearchStrategy::TrustRegion),
            _ => Err(format!(
                "unknown search `{s}`: evolutionary or trust-region"
            )),
        }
    }
}

/// Tuning options.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Total search trials (programs measured on an instance), including resumed ones;
    /// the votes' measurements come on top.
    pub trials: usize,
    /// Micro-kernels built and measured per round.
    pub batch: usize,
    /// Instances each new micro-kernel is measured on.
    pub instances_per_kernel: usize,
    /// Fraction of each batch picked at random (exploration).
    pub epsilon: f64,
    /// Random seed.
    pub seed: u64,
    /// Padding strategy of the tuned programs.
    pub strategy: PaddingStrategy,
    /// Timing options.
    pub measure: MeasureOptions,
    /// Check outputs against the reference on instances up to this many FLOPs.
    pub check_flops: f64,
    /// Per-shape tuning (the Ansor-style baseline): a single instance, tiles that divide
    /// its extents only, kernels specialized for it.
    pub per_shape: bool,
    /// How the search chooses what to measure.
    pub search: SearchStrategy,
    /// Share of `trials` kept for the last, exploitation round: the untried
    /// neighbours of the micro-kernels measured best somewhere (see `exploit.rs`).
    pub exploit: f64,
    /// Stop after the current round when this is set (Ctrl-C): the search reports
    /// [`StopReason::Interrupted`] and the records hold every trial so far.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// The tuning database (`database.rs`): every trial is recorded there too, and a
    /// run whose records file holds nothing of its workload starts from the database's
    /// best earlier run of it. None: the records file alone. Per-shape runs never use it.
    pub database: Option<std::path::PathBuf>,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            trials: 256,
            batch: 16,
            instances_per_kernel: 4,
            epsilon: 0.15,
            exploit: 0.125,
            seed: 0,
            strategy: PaddingStrategy::LocalPad,
            measure: MeasureOptions {
                min_repeats: 3,
                max_repeats: 200,
                min_seconds: 0.03,
                timeout_seconds: 10.0,
                interleave: true,
                cold: false,
            },
            check_flops: 4e8,
            per_shape: false,
            search: SearchStrategy::Evolutionary,
            interrupt: None,
            database: None,
        }
    }
}

/// Where tuning wall time went, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeBreakdown {
    /// Compiling kernels.
    pub build: f64,
    /// Running them (worker processes, reference checks).
    pub measure: f64,
    /// Training and querying the cost model.
    pub model: f64,
    /// Evolving candidates and extracting features.
    pub search: f64,
}

impl std::ops::AddAssign for TimeBreakdown {
    fn add_assign(&mut self, o: TimeBreakdown) {
        self.build += o.build;
        self.measure += o.measure;
        self.model += o.model;
        self.search += o.search;
    }
}

/// What one round did.
#[derive(Clone, Debug, Serialize)]
pub struct RoundSummary {
    /// Round number.
    pub round: usize,
    /// Search trials so far (including resumed ones; not the votes').
    pub trials: usize,
    /// Trial budget.
    pub budget: usize,
    /// Trials of this round that failed.
    pub failed: usize,
    /// `Σ w_i · latency_i` with the best known micro-kernel per instance (measured where
    /// measured, predicted elsewhere), seconds.
    pub predicted_weighted_latency: f64,
    /// The same over measured instances only, weights renormalized, seconds.
    pub measured_weighted_latency: f64,
    /// Instances with at least one measurement.
    pub measured_instances: usize,
    /// Best measured GFLOP/s so far (any instance).
    pub best_gflops: f64,
    /// Whether the round measured the winners' neighbours (the exploitation round).
    pub exploiting: bool,
    /// Time so far.
    pub time: TimeBreakdown,
}

/// The best micro-kernel found for one instance.
#[derive(Clone, Debug, Serialize)]
pub struct InstanceBest<K = ContractionKernel> {
    /// The instance.
    pub bindings: Bindings,
    /// Its weight.
    pub weight: f64,
    /// The chosen micro-kernel.
    pub micro_kernel: K,
    /// Its latency, seconds (measured if `measured`, else predicted).
    pub latency_seconds: f64,
    /// Whether that latency was measured.
    pub measured: bool,
    /// Useful GFLOP/s at that latency.
    pub gflops: f64,
}

/// The result of a tuning run.
#[derive(Clone, Debug, Serialize)]
pub struct TuneReport<K = ContractionKernel> {
    /// The workload.
    pub workload: String,
    /// Best micro-kernel per instance.
    pub best: Vec<InstanceBest<K>>,
    /// Trials in the records (including resumed ones).
    pub trials: usize,
    /// Failed trials.
    pub failed_trials: usize,
    /// Rounds run by this process.
    pub rounds: usize,
    /// Trials resumed from the records file.
    pub resumed_trials: usize,
    /// Where this process's time went.
    pub time: TimeBreakdown,
    /// One summary per round run by this process.
    pub history: Vec<RoundSummary>,
    /// The fitted occupancy slope `k`.
    pub k: f64,
    /// Spearman correlation of predicted and measured throughput on the last 20% of the
    /// successful trials, the model trained on the first 80%.
    pub holdout_spearman: Option<f64>,
    /// Successful trials the final model was trained on.
    pub model_samples: usize,
    /// Why the search stopped.
    pub stop: StopReason,
}

/// Why a search stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The trial budget is spent.
    Budget,
    /// Three rounds in a row found nothing new to measure (the space is exhausted
    /// around the best micro-kernels).
    Stalled,
    /// Asked to stop (Ctrl-C) before the budget was spent.
    Interrupted,
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StopReason::Budget => "the trial budget is spent",
            StopReason::Stalled => "three rounds found nothing new to measure",
            StopReason::Interrupted => "interrupted (resume with --resume)",
        })
    }
}
