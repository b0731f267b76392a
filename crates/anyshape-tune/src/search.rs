//! The joint evolutionary search: one population of micro-kernels serves every instance.
//!
//! Each round: evolve candidates from the best micro-kernels known for any instance
//! (mutation, crossover, fresh samples); score every candidate on every instance with
//! the cost model (features once per micro-kernel, adapted per instance); pick a batch
//! that most lowers the predicted weighted latency (plus some random picks); build them
//! as symbolic kernels, measure each on the instances where it should help most; append
//! the records; retrain the model. The objective is `Σ_i w_i · latency_i` of the best
//! micro-kernel known for each instance.
use crate::{
    spearman, Backend, CostModel, CpuBackend, Factors, Record, RecordLog, Result, Sample, Trial,
    TrialBatch, TrialResult, TuneError,
};
use anyshape_codegen::{CpuTarget, GemmView, MicroKernel, PaddingStrategy, Program};
use anyshape_ir::{Bindings, BoundWorkload, ShapeVar, Workload};
use anyshape_measure::{MeasureOptions, Measurer};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// One instance of the workload's domain, with its normalized weight.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Shape-var values.
    pub bindings: Bindings,
    /// Weight (all weights sum to 1).
    pub weight: f64,
    /// Bound shapes.
    pub bound: BoundWorkload,
    /// Useful floating-point operations.
    pub flops: f64,
}

/// The most instances one joint search takes (the cartesian product of the domains).
/// Every instance is bound, scored and voted on, so this bounds memory and time; a
/// larger range is better served by a list of representative values (`T=1,2,4,8,...`),
/// since the dispatcher covers the values between them.
pub const MAX_INSTANCES: u64 = 65_536;

/// Every instance of the domains of `vars` (their cartesian product), weighted by the
/// product of the vars' weights and normalized. Every shape var of the workload needs a
/// domain, every domain must name a shape var of the workload (once), and there may be
/// at most [`MAX_INSTANCES`].
pub fn instances(w: &Workload, vars: &[ShapeVar]) -> Result<Vec<Instance>> {
    let needed = w.shape_vars();
    for (i, v) in vars.iter().enumerate() {
        if vars[..i].iter().any(|u| u.name == v.name) {
            return Err(TuneError::Options(format!(
                "shape var `{}` has two domains; give it one",
                v.name
            )));
        }
    }
    for v in &needed {
        if !vars.iter().any(|s| &s.name == v) {
            return Err(TuneError::Options(format!(
                "shape var `{v}` needs a domain, e.g. `--range {v}=1..128`"
            )));
        }
    }
    if let Some(extra) = vars.iter().find(|s| !needed.contains(&s.name)) {
        return Err(TuneError::Options(format!(
            "`{}` is not a shape var of {w} (its shape vars: {})",
            extra.name,
            needed.join(", ")
        )));
    }
    let count = vars
        .iter()
        .try_fold(1u64, |acc, v| acc.checked_mul(v.domain.len()))
        .unwrap_or(u64::MAX);
    if count > MAX_INSTANCES {
        return Err(TuneError::Options(format!(
            "the domains hold {} instances; one joint search takes at most {MAX_INSTANCES} \
             (list representative values instead, e.g. `T=1,2,4,8,16,...`)",
            if count == u64::MAX {
                "more than 2^64".to_string()
            } else {
                count.to_string()
            }
        )));
    }
    let mut points: Vec<(Bindings, f64)> = vec![(Bindings::default(), 1.0)];
    for v in vars {
        let values: Vec<i64> = v.domain.iter().collect();
        // Each var's weights relative to its largest, so products cannot overflow.
        let scale = match &v.weights {
            Some(ws) => {
                if ws.len() != values.len() || ws.iter().any(|x| !x.is_finite() || *x < 0.0) {
                    return Err(TuneError::Options(format!(
                        "weights of `{}`: need {} finite non-negative numbers",
                        v.name,
                        values.len()
                    )));
                }
                ws.iter().copied().fold(0.0, f64::max)
            }
            None => 1.0,
        };
        let mut next = Vec::new();
        for (b, w0) in &points {
            for (i, &x) in values.iter().enumerate() {
                let mut b = b.clone();
                b.set(v.name.clone(), x);
                let wi =
                    v.weights
                        .as_ref()
                        .map_or(1.0, |ws| if scale > 0.0 { ws[i] / scale } else { 0.0 });
                next.push((b, w0 * wi));
            }
        }
        points = next;
    }
    let total: f64 = points.iter().map(|p| p.1).sum();
    if total.is_nan() || total <= 0.0 {
        return Err(TuneError::Options("the weights are all zero".into()));
    }
    points
        .into_iter()
        .map(|(bindings, weight)| {
            let bound = w.bind(&bindings)?;
            let flops = w.flops(&bound);
            Ok(Instance {
                bindings,
                weight: weight / total,
                bound,
                flops,
            })
        })
        .collect()
}

/// Latency of micro-kernels on every instance, measured or predicted.
#[derive(Clone, Debug)]
pub struct ScoreTable<K = MicroKernel> {
    /// The micro-kernels (rows).
    pub kernels: Vec<K>,
    /// Seconds, `[kernel][instance]`; infinite where the program failed.
    pub latency: Vec<Vec<f64>>,
    /// Whether each entry was measured (else predicted by the cost model).
    pub measured: Vec<Vec<bool>>,
}

/// Tuning options.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Total trials (programs measured on an instance), including resumed ones.
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
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            trials: 256,
            batch: 16,
            instances_per_kernel: 4,
            epsilon: 0.15,
            seed: 0,
            strategy: PaddingStrategy::LocalPad,
            measure: MeasureOptions {
                min_repeats: 3,
                max_repeats: 200,
                min_seconds: 0.03,
                timeout_seconds: 10.0,
                interleave: true,
            },
            check_flops: 4e8,
            per_shape: false,
        }
    }
}

/// Where tuning wall time went, seconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
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

/// What one round did.
#[derive(Clone, Debug, Serialize)]
pub struct RoundSummary {
    /// Round number.
    pub round: usize,
    /// Trials so far (including resumed ones).
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
    /// Time so far.
    pub time: TimeBreakdown,
}

/// The best micro-kernel found for one instance.
#[derive(Clone, Debug, Serialize)]
pub struct InstanceBest<K = MicroKernel> {
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
pub struct TuneReport<K = MicroKernel> {
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
}

/// How a round's trials failed.
#[derive(Default)]
struct RoundFailures {
    /// The candidates' fault.
    failed: usize,
    /// The environment's fault.
    transient: usize,
    /// The first environment failure's reason.
    first_transient: Option<String>,
}

/// The records of a backend.
type BackendRecord<B> = Record<<B as Backend>::MicroKernel, <B as Backend>::Target>;

/// What a run took from its records file, and what it left aside.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResumeSummary {
    /// Trials of this workload, target and strategy on the run's instances: reused.
    pub trials: usize,
    /// Records of another workload, target or padding strategy: ignored.
    pub other_runs: usize,
    /// Records of instances outside the domain: ignored.
    pub outside_domain: usize,
    /// Trials the environment failed (not the candidate's fault): measured again.
    pub transient: usize,
}

/// A joint tuning run on a backend (the CPU one unless named).
pub struct Tuner<B: Backend> {
    workload: Workload,
    gemm: GemmView,
    backend: B,
    instances: Vec<Instance>,
    options: TuneOptions,
    journal: Journal<B>,
    resumed: ResumeSummary,
    features: HashMap<B::MicroKernel, Vec<f64>>,
    index: HashMap<Bindings, usize>,
    time: TimeBreakdown,
}

/// The records of a run: the file and what it holds.
struct Journal<B: Backend> {
    log: RecordLog,
    /// The run's trials (transient failures excluded).
    records: Vec<BackendRecord<B>>,
    /// Pairs the environment failed in this process: recorded, not chosen again until
    /// the run resumes.
    transient: BTreeSet<(B::MicroKernel, Bindings)>,
    /// Tuning seconds of transient records (spent, though not trials).
    transient_seconds: f64,
    /// The round after the last one in the file, ignored records' included (rounds are
    /// never reused).
    round_floor: usize,
    /// When the last record was written (or the tuner was made).
    clock: Instant,
}

impl<B: Backend> Journal<B> {
    /// The round after the last recorded one.
    fn next_round(&self) -> usize {
        self.records
            .iter()
            .map(|r| r.round + 1)
            .max()
            .unwrap_or(0)
            .max(self.round_floor)
    }

    /// Append one trial to the records file and the in-memory records, timed since the
    /// previous one; `on_trial` hears the new count of trials.
    fn append(
        &mut self,
        mut record: BackendRecord<B>,
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<()> {
        record.seconds = self.clock.elapsed().as_secs_f64();
        self.clock = Instant::now();
        self.log.append(&record)?;
        self.round_floor = self.round_floor.max(record.round + 1);
        if record.is_transient() {
            self.transient_seconds += record.seconds;
            self.transient
                .insert((record.micro_kernel, record.bindings.clone()));
        } else {
            self.records.push(record);
        }
        on_trial(self.records.len());
        Ok(())
    }
}

impl<'a> Tuner<CpuBackend<'a>> {
    /// Prepare a run on the CPU; `log` and `previous` come from [`RecordLog::open`].
    /// Previous records of this workload, target and strategy are reused; nothing
    /// measured is measured again.
    pub fn new(
        workload: &Workload,
        target: &CpuTarget,
        instances: Vec<Instance>,
        options: TuneOptions,
        measurer: &'a Measurer,
        log: RecordLog,
        previous: Vec<Record>,
    ) -> Result<Tuner<CpuBackend<'a>>> {
        let backend = CpuBackend::new(target, measurer);
        Tuner::with_backend(backend, workload, instances, options, log, previous)
    }

    /// The tuned program of a micro-kernel: symbolic, so one build serves every
    /// instance; specialized for the instance when tuning per shape.
    pub fn program(&self, mk: MicroKernel) -> Program {
        let batch = trial_batch(&self.workload, &self.options, &self.instances, &[]);
        CpuBackend::program(&batch, mk)
    }
}

impl<B: Backend> Tuner<B> {
    /// Prepare a run on `backend` (see [`Tuner::new`]).
    pub fn with_backend(
        mut backend: B,
        workload: &Workload,
        instances: Vec<Instance>,
        options: TuneOptions,
        log: RecordLog,
        previous: Vec<BackendRecord<B>>,
    ) -> Result<Tuner<B>> {
        if instances.is_empty() {
            return Err(TuneError::Options("the domain has no instances".into()));
        }
        if options.batch == 0 || options.instances_per_kernel == 0 {
            return Err(TuneError::Options(
                "batch and instances per kernel must be at least 1".into(),
            ));
        }
        let name = workload.to_string();
        let index: HashMap<Bindings, usize> = instances
            .iter()
            .enumerate()
            .map(|(i, x)| (x.bindings.clone(), i))
            .collect();
        if options.per_shape && instances.len() != 1 {
            return Err(TuneError::Options(format!(
                "per-shape tuning takes exactly one instance, not {}",
                instances.len()
            )));
        }
        let gemm = GemmView::of(workload)?;
        if options.per_shape {
            let e = &instances[0].bound.extents;
            let extent = |a: usize| usize::try_from(e[a]).unwrap_or(1);
            backend.restrict_to_factors(Factors {
                m: extent(gemm.m),
                n: extent(gemm.n),
                k: extent(gemm.k),
            });
        }
        let round_floor = previous.iter().map(|r| r.round + 1).max().unwrap_or(0);
        let mut resumed = ResumeSummary::default();
        let mut transient_seconds = 0.0;
        let mut records: Vec<BackendRecord<B>> = Vec::new();
        for r in previous {
            if r.workload != name || &r.target != backend.target() || r.strategy != options.strategy
            {
                resumed.other_runs += 1;
            } else if !index.contains_key(&r.bindings) {
                resumed.outside_domain += 1;
            } else if r.is_transient() {
                resumed.transient += 1;
                transient_seconds += r.seconds;
            } else {
                records.push(r);
            }
        }
        resumed.trials = records.len();
        Ok(Tuner {
            gemm,
            workload: workload.clone(),
            backend,
            resumed,
            instances,
            options,
            journal: Journal {
                log,
                records,
                transient: BTreeSet::new(),
                transient_seconds,
                round_floor,
                clock: Instant::now(),
            },
            features: HashMap::new(),
            index,
            time: TimeBreakdown::default(),
        })
    }

    /// Features of each micro-kernel (cached; extraction counts as search time).
    fn features_of(&mut self, mks: &[B::MicroKernel]) -> Vec<Vec<f64>> {
        let t0 = Instant::now();
        let rep = self.instances[self.instances.len() / 2].bindings.clone();
        let out = mks
            .iter()
            .map(|mk| {
                self.features
                    .entry(*mk)
                    .or_insert_with(|| {
                        self.backend
                            .features(&self.workload, mk, self.options.strategy, &rep)
                    })
                    .clone()
            })
            .collect();
        self.time.search += t0.elapsed().as_secs_f64();
        out
    }

    /// Best measured latency per instance, and the micro-kernel that gave it.
    fn measured_best(&self) -> Vec<Option<(f64, B::MicroKernel)>> {
        let mut best: Vec<Option<(f64, B::MicroKernel)>> = vec![None; self.instances.len()];
        for r in &self.journal.records {
            if let (Some(lat), Some(&i)) = (r.latency(), self.index.get(&r.bindings)) {
                if best[i].is_none_or(|(b, _)| lat < b) {
                    best[i] = Some((lat, r.micro_kernel));
                }
            }
        }
        best
    }

    fn samples(&mut self, records: &[BackendRecord<B>]) -> Vec<Sample> {
        let ok: Vec<(B::MicroKernel, usize, f64)> = records
            .iter()
            .filter_map(|r| Some((r.micro_kernel, *self.index.get(&r.bindings)?, r.latency()?)))
            .collect();
        let feats = self.features_of(&ok.iter().map(|x| x.0).collect::<Vec<_>>());
        ok.iter()
            .zip(feats)
            .map(|(&(mk, i, lat), features)| {
                let inst = &self.instances[i];
                Sample {
                    features,
                    adaptation: self.backend.adaptation(&self.gemm, &mk, &inst.bound),
                    throughput: inst.flops / lat,
                    weight: inst.weight,
                }
            })
            .collect()
    }

    fn train(&mut self, records: &[BackendRecord<B>], seed: u64) -> CostModel {
        let samples = self.samples(records);
        let t0 = Instant::now();
        let model = CostModel::fit(&samples, seed);
        self.time.model += t0.elapsed().as_secs_f64();
        model
    }

    /// Predicted latency of every micro-kernel on every instance: `[kernel][instance]`.
    fn predict(&mut self, model: &CostModel, mks: &[B::MicroKernel]) -> Vec<Vec<f64>> {
        let feats = self.features_of(mks);
        let t0 = Instant::now();
        let ln = model.ln_f_mk(&feats);
        let out = mks
            .iter()
            .zip(ln)
            .map(|(mk, l)| {
                self.instances
                    .iter()
                    .map(|x| {
                        x.flops
                            / model
                                .throughput(l, self.backend.adaptation(&self.gemm, mk, &x.bound))
                                .max(1e-30)
                    })
                    .collect()
            })
            .collect();
        self.time.model += t0.elapsed().as_secs_f64();
        out
    }

    /// Micro-kernels measured successfully at least once.
    fn known(&self) -> Vec<B::MicroKernel> {
        self.journal
            .records
            .iter()
            .filter(|r| r.latency().is_some())
            .map(|r| r.micro_kernel)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Latency of `kernels` (all successfully measured ones when `None`) on every
    /// instance under `model`: the best measurement where measured, infinite where the
    /// program failed there, the model's prediction elsewhere.
    pub(crate) fn scores_with(
        &mut self,
        model: &CostModel,
        kernels: Option<&[B::MicroKernel]>,
        round: Option<usize>,
    ) -> ScoreTable<B::MicroKernel> {
        let kernels = kernels.map_or_else(|| self.known(), <[B::MicroKernel]>::to_vec);
        let mut latency = self.predict(model, &kernels);
        let mut measured = vec![vec![false; self.instances.len()]; kernels.len()];
        let row: HashMap<B::MicroKernel, usize> =
            kernels.iter().enumerate().map(|(k, mk)| (*mk, k)).collect();
        for r in self
            .journal
            .records
            .iter()
            .filter(|r| round.is_none_or(|n| r.round == n))
        {
            let (Some(&k), Some(&i)) = (row.get(&r.micro_kernel), self.index.get(&r.bindings))
            else {
                continue;
            };
            let l = r.latency().unwrap_or(f64::INFINITY);
            if !measured[k][i] || l < latency[k][i] {
                latency[k][i] = l;
            }
            measured[k][i] = true;
        }
        ScoreTable {
            kernels,
            latency,
            measured,
        }
    }

    /// The latency table of [`Tuner::scores_with`] under a model trained on every record.
    pub fn scores(&mut self, kernels: Option<&[B::MicroKernel]>) -> ScoreTable<B::MicroKernel> {
        let records = self.journal.records.clone();
        let model = self.train(&records, self.options.seed);
        self.scores_with(&model, kernels, None)
    }

    /// The latest round that measured some micro-kernels on every instance (a vote
    /// round, see [`Tuner::measure_everywhere`]), with those micro-kernels.
    pub fn vote_round(&self) -> Option<(usize, Vec<B::MicroKernel>)> {
        let last = self.journal.records.iter().map(|r| r.round).max()?;
        let mut seen: BTreeMap<B::MicroKernel, BTreeSet<&Bindings>> = BTreeMap::new();
        for r in self.journal.records.iter().filter(|r| r.round == last) {
            seen.entry(r.micro_kernel).or_default().insert(&r.bindings);
        }
        let everywhere =
            |s: &BTreeSet<&Bindings>| self.instances.iter().all(|x| s.contains(&x.bindings));
        let kernels: Vec<B::MicroKernel> = seen
            .iter()
            .filter(|(_, s)| everywhere(s))
            .map(|(mk, _)| *mk)
            .collect();
        (!kernels.is_empty() && kernels.len() == seen.len()).then_some((last, kernels))
    }

    /// Measure each of `kernels` on every instance in one round, interleaved by instance
    /// (all of them timed side by side, at the same time); returns the round.
    pub fn measure_everywhere(
        &mut self,
        kernels: &[B::MicroKernel],
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<usize> {
        let trials: Vec<(B::MicroKernel, usize)> = kernels
            .iter()
            .flat_map(|mk| (0..self.instances.len()).map(move |i| (*mk, i)))
            .collect();
        let round = self.journal.next_round();
        self.measure(&trials, round, on_trial)?;
        Ok(round)
    }

    /// The latency table of `kernels` from the trials of one `round` only: measurements
    /// taken side by side, not the minimum over every time a program ran, which favours
    /// programs measured more often.
    pub fn scores_in_round(
        &mut self,
        kernels: &[B::MicroKernel],
        round: usize,
    ) -> ScoreTable<B::MicroKernel> {
        let records = self.journal.records.clone();
        let model = self.train(&records, self.options.seed);
        self.scores_with(&model, Some(kernels), Some(round))
    }

    /// Trials in the records so far (resumed ones included).
    pub fn trials(&self) -> usize {
        self.journal.records.len()
    }

    /// What the run took from its records file and what it left aside.
    pub fn resumed(&self) -> ResumeSummary {
        self.resumed
    }

    /// Tuning wall time of the records, this run's and resumed ones': the sum of their
    /// [`Record::seconds`]; and how many records carry no time (written by an older
    /// version), which the sum then leaves out.
    pub fn tuning_seconds(&self) -> (f64, usize) {
        let untimed = self
            .journal
            .records
            .iter()
            .filter(|r| r.seconds == 0.0)
            .count();
        (
            self.journal.records.iter().map(|r| r.seconds).sum::<f64>()
                + self.journal.transient_seconds,
            untimed,
        )
    }

    /// The instances being tuned.
    pub fn instances(&self) -> &[Instance] {
        &self.instances
    }

    /// Best latency per instance over the known kernels (see [`Tuner::scores_with`]),
    /// with the micro-kernel and whether it was measured.
    fn best_per_instance(&mut self, model: &CostModel) -> Vec<(f64, B::MicroKernel, bool)> {
        let t = self.scores_with(model, None, None);
        (0..self.instances.len())
            .map(|i| {
                (0..t.kernels.len())
                    .filter(|&k| t.latency[k][i].is_finite())
                    .min_by(|&a, &b| t.latency[a][i].total_cmp(&t.latency[b][i]))
                    .map_or((f64::INFINITY, self.backend.default_kernel(), false), |k| {
                        (t.latency[k][i], t.kernels[k], t.measured[k][i])
                    })
            })
            .collect()
    }

    fn summary(&mut self, round: usize, failed: usize, model: &CostModel) -> RoundSummary {
        let best = self.best_per_instance(model);
        let measured = self.measured_best();
        let predicted: f64 = best
            .iter()
            .zip(&self.instances)
            .map(|(b, x)| x.weight * b.0)
            .sum();
        let (mut mw, mut ml, mut n) = (0.0, 0.0, 0);
        for (m, x) in measured.iter().zip(&self.instances) {
            if let Some((l, _)) = m {
                mw += x.weight;
                ml += x.weight * l;
                n += 1;
            }
        }
        let best_gflops = self
            .journal
            .records
            .iter()
            .filter_map(|r| {
                Some(self.instances[*self.index.get(&r.bindings)?].flops / r.latency()? / 1e9)
            })
            .fold(0.0, f64::max);
        RoundSummary {
            round,
            trials: self.journal.records.len(),
            budget: self.options.trials,
            failed,
            predicted_weighted_latency: predicted,
            measured_weighted_latency: if mw > 0.0 { ml / mw } else { f64::NAN },
            measured_instances: n,
            best_gflops,
            time: self.time,
        }
    }

    /// Evolve candidates from the best known micro-kernels.
    fn evolve(&self, elites: &[B::MicroKernel], rng: &mut ChaCha8Rng) -> Vec<B::MicroKernel> {
        let mut out: BTreeSet<B::MicroKernel> = elites.iter().copied().collect();
        for _ in 0..64 {
            out.insert(self.backend.sample(rng));
        }
        if !elites.is_empty() {
            for _ in 0..192 {
                let a = elites[rng.random_range(0..elites.len())];
                out.insert(self.backend.mutate(&a, rng));
            }
            for _ in 0..64 {
                let a = elites[rng.random_range(0..elites.len())];
                let b = elites[rng.random_range(0..elites.len())];
                out.insert(self.backend.crossover(&a, &b, rng));
            }
        }
        out.into_iter().collect()
    }

    /// Choose this round's trials: `(micro-kernel, instance)` pairs.
    fn choose(
        &mut self,
        model: &CostModel,
        rng: &mut ChaCha8Rng,
        budget: usize,
    ) -> Vec<(B::MicroKernel, usize)> {
        let t0 = Instant::now();
        let best = self.best_per_instance(model);
        let mut elites: BTreeSet<B::MicroKernel> = BTreeSet::new();
        for b in &best {
            if b.0.is_finite() {
                elites.insert(b.1);
            }
        }
        let elites: Vec<B::MicroKernel> = elites.into_iter().collect();
        let candidates = self.evolve(&elites, rng);
        self.time.search += t0.elapsed().as_secs_f64();
        let pred = self.predict(model, &candidates);
        let t0 = Instant::now();
        let done: BTreeSet<(B::MicroKernel, Bindings)> = self
            .journal
            .records
            .iter()
            .map(|r| (r.micro_kernel, r.bindings.clone()))
            .chain(self.journal.transient.iter().cloned())
            .collect();
        let w: Vec<f64> = self.instances.iter().map(|x| x.weight).collect();
        // Current objective terms; unknown instances count as twice the best prediction.
        let mut cur: Vec<f64> = best
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if b.0.is_finite() {
                    b.0
                } else {
                    2.0 * pred.iter().map(|p| p[i]).fold(f64::INFINITY, f64::min)
                }
            })
            .collect();
        let gain = |c: usize, i: usize, cur: &[f64]| w[i] * (cur[i] - pred[c][i]).max(0.0);
        let n_kernels = self
            .options
            .batch
            .min(budget.div_ceil(self.options.instances_per_kernel))
            .max(1);
        // With no measurements yet the model knows nothing: explore at random.
        let epsilon = if model.samples == 0 {
            1.0
        } else {
            self.options.epsilon
        };
        let n_random = ((n_kernels as f64 * epsilon).round() as usize).min(n_kernels);
        let mut picked: Vec<usize> = Vec::new();
        let mut trials: Vec<(B::MicroKernel, usize)> = Vec::new();
        while picked.len() < n_kernels - n_random {
            let score = |c: usize| (0..w.len()).map(|i| gain(c, i, &cur)).sum::<f64>();
            let Some(c) = (0..candidates.len())
                .filter(|c| !picked.contains(c))
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
            else {
                break;
            };
            picked.push(c);
            // Measure it where it should help most (not measured there yet).
            let mut order: Vec<usize> = (0..w.len())
                .filter(|&i| !done.contains(&(candidates[c], self.instances[i].bindings.clone())))
                .collect();
            order.sort_by(|&a, &b| gain(c, b, &cur).total_cmp(&gain(c, a, &cur)));
            for &i in order.iter().take(self.options.instances_per_kernel) {
                trials.push((candidates[c], i));
            }
            for i in 0..w.len() {
                cur[i] = cur[i].min(pred[c][i]);
            }
        }
        // Exploration: random micro-kernels on instances drawn by weight.
        for _ in 0..n_random {
            let mk = self.backend.sample(rng);
            for _ in 0..self.options.instances_per_kernel {
                trials.push((mk, weighted_pick(&w, rng)));
            }
        }
        let mut seen = BTreeSet::new();
        trials.retain(|(mk, i)| {
            !done.contains(&(*mk, self.instances[*i].bindings.clone())) && seen.insert((*mk, *i))
        });
        trials.truncate(budget);
        self.time.search += t0.elapsed().as_secs_f64();
        trials
    }

    /// Build and measure the trials, append their records; returns how many failed,
    /// and how many the environment failed with the first reason. Each trial is recorded
    /// as soon as it is measured, so a killed run loses none.
    fn measure(
        &mut self,
        trials: &[(B::MicroKernel, usize)],
        round: usize,
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<RoundFailures> {
        let t0 = Instant::now();
        let list: Vec<Trial<B::MicroKernel>> = trials
            .iter()
            .map(|&(mk, i)| Trial {
                micro_kernel: mk,
                bindings: self.instances[i].bindings.clone(),
                check: self.instances[i].flops <= self.options.check_flops,
            })
            .collect();
        let mut failures = RoundFailures::default();
        let mut append_error = None;
        let batch = trial_batch(&self.workload, &self.options, &self.instances, &list);
        let target = self.backend.target();
        let journal = &mut self.journal;
        let mut on_result = |n: usize, result: TrialResult| {
            match &result {
                TrialResult::Failed { .. } => failures.failed += 1,
                TrialResult::Transient { error } => {
                    failures.transient += 1;
                    failures
                        .first_transient
                        .get_or_insert_with(|| error.clone());
                }
                TrialResult::Measured { .. } => {}
            }
            let t = &list[n];
            let record = Record {
                anyshape: env!("CARGO_PKG_VERSION").to_string(),
                workload: batch.workload.to_string(),
                target: target.clone(),
                strategy: batch.strategy,
                micro_kernel: t.micro_kernel,
                bindings: t.bindings.clone(),
                result,
                round,
                seconds: 0.0,
            };
            if let Err(e) = journal.append(record, on_trial) {
                append_error.get_or_insert(e);
            }
        };
        let build = self.backend.measure(&batch, &mut on_result)?;
        self.time.build += build;
        self.time.measure += t0.elapsed().as_secs_f64() - build;
        if let Some(e) = append_error {
            return Err(e);
        }
        Ok(failures)
    }

    /// Run rounds until the trial budget is spent; `on_round` hears each round's summary
    /// and `on_trial` the trial count after each measured trial.
    pub fn run(
        &mut self,
        on_round: &mut dyn FnMut(&RoundSummary),
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<TuneReport<B::MicroKernel>> {
        let first_round = self.journal.next_round();
        let mut round = first_round;
        let records = self.journal.records.clone();
        let mut model = self.train(&records, self.options.seed);
        let mut history = Vec::new();
        let mut stalled = 0;
        while self.journal.records.len() < self.options.trials && stalled < 3 {
            let mut rng = ChaCha8Rng::seed_from_u64(
                self.options.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round as u64,
            );
            let budget = self.options.trials - self.journal.records.len();
            let trials = self.choose(&model, &mut rng, budget);
            if trials.is_empty() {
                stalled += 1;
                round += 1;
                continue;
            }
            stalled = 0;
            let failures = self.measure(&trials, round, on_trial)?;
            if failures.transient == trials.len() {
                return Err(TuneError::Environment(format!(
                    "every trial of round {round} failed for a reason outside the candidates ({}); the records are kept: free the machine and run again with --resume",
                    failures.first_transient.unwrap_or_default()
                )));
            }
            let failed = failures.failed;
            let records = self.journal.records.clone();
            model = self.train(&records, self.options.seed ^ round as u64);
            let summary = self.summary(round, failed, &model);
            on_round(&summary);
            history.push(summary);
            round += 1;
        }
        Ok(self.report(&model, round - first_round, history))
    }

    fn report(
        &mut self,
        model: &CostModel,
        rounds: usize,
        history: Vec<RoundSummary>,
    ) -> TuneReport<B::MicroKernel> {
        let best = self.best_per_instance(model);
        let best = best
            .into_iter()
            .zip(&self.instances)
            .map(|((lat, mk, measured), x)| InstanceBest {
                bindings: x.bindings.clone(),
                weight: x.weight,
                micro_kernel: mk,
                latency_seconds: lat,
                measured,
                gflops: x.flops / lat / 1e9,
            })
            .collect();
        let ok: Vec<BackendRecord<B>> = self
            .journal
            .records
            .iter()
            .filter(|r| r.latency().is_some())
            .cloned()
            .collect();
        let holdout_spearman = (ok.len() >= 20).then(|| {
            let cut = ok.len() * 4 / 5;
            let held = self.samples(&ok[cut..]);
            let m = self.train(&ok[..cut], self.options.seed);
            let feats: Vec<Vec<f64>> = held.iter().map(|s| s.features.clone()).collect();
            let ln = m.ln_f_mk(&feats);
            let pred: Vec<f64> = held
                .iter()
                .zip(ln)
                .map(|(s, l)| m.throughput(l, s.adaptation))
                .collect();
            let truth: Vec<f64> = held.iter().map(|s| s.throughput).collect();
            spearman(&pred, &truth)
        });
        TuneReport {
            workload: self.workload.to_string(),
            best,
            trials: self.journal.records.len(),
            failed_trials: self
                .journal
                .records
                .iter()
                .filter(|r| r.latency().is_none())
                .count(),
            rounds,
            resumed_trials: self.resumed.trials,
            time: self.time,
            history,
            k: model.k,
            holdout_spearman,
            model_samples: model.samples,
        }
    }
}

/// A round's batch of `trials`: the programs' shared settings come from the options
/// (per-shape tuning specializes for its one instance). A free function so the tuner
/// can lend its fields while it appends records.
fn trial_batch<'t, K>(
    workload: &'t Workload,
    options: &TuneOptions,
    instances: &'t [Instance],
    trials: &'t [Trial<K>],
) -> TrialBatch<'t, K> {
    TrialBatch {
        workload,
        strategy: options.strategy,
        specialize: options.per_shape.then(|| &instances[0].bindings),
        trials,
    }
}

fn weighted_pick(w: &[f64], rng: &mut impl Rng) -> usize {
    let total: f64 = w.iter().sum();
    let mut x = rng.random_range(0.0..total.max(1e-300));
    for (i, wi) in w.iter().enumerate() {
        if x < *wi {
            return i;
        }
        x -= wi;
    }
    w.len() - 1
}
