//! The joint evolutionary search: one population of micro-kernels serves every instance.
//!
//! Each round: evolve candidates from the best micro-kernels known for any instance
//! (mutation, crossover, fresh samples), score every candidate on every instance with
//! the cost model (features once per micro-kernel, adapted per instance; `scores.rs`)
//! and pick a batch that most lowers the predicted weighted latency (plus some random
//! picks; both `explore.rs`); build them as symbolic kernels, measure each on the
//! instances where it should help most; append the records (`journal.rs`); retrain the
//! model. The objective is `Σ_i w_i · latency_i` of the best micro-kernel known for
//! each instance. The last share of the budget measures the winners' neighbours
//! instead (`exploit.rs`). The search stops when the budget is spent, when it stalls,
//! or when interrupted ([`StopReason`]).
use crate::family::Shared;
use crate::journal::{BackendRecord, DbRun, Journal, ResumeSummary, RoundFailures};
use crate::trust_region::Region;
use crate::{
    spearman, Backend, CostModel, CpuBackend, Instance, InstanceBest, Record, RecordLog, Result,
    RoundSummary, Sample, SearchStrategy, StopReason, TimeBreakdown, Trial, TrialBatch,
    TrialResult, TuneError, TuneOptions, TuneReport,
};
use anyshape_codegen::{CpuTarget, Program, Sketch};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::Measurer;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// At most this many records of a family's other workloads are read from the tuning
/// database for a new workload's cost model (the newest runs'; features are extracted
/// for each distinct micro-kernel).
const FAMILY_RECORDS: usize = 3000;

/// A joint tuning run on a backend (the CPU one unless named).
pub struct Tuner<B: Backend> {
    pub(crate) workload: Workload,
    pub(crate) backend: B,
    pub(crate) instances: Vec<Instance>,
    pub(crate) options: TuneOptions,
    pub(crate) journal: Journal<B>,
    pub(crate) resumed: ResumeSummary,
    pub(crate) features: HashMap<B::MicroKernel, Vec<f64>>,
    pub(crate) index: HashMap<Bindings, usize>,
    pub(crate) time: TimeBreakdown,
    /// What the task's family shares with it (nothing outside a model's compile).
    pub(crate) shared: Shared<B::MicroKernel>,
    /// Samples of the family's other workloads in the tuning database, for a workload
    /// it has no run of (`family.rs`).
    pub(crate) database: Vec<Sample>,
    /// The trust regions of [`SearchStrategy::TrustRegion`] (`trust_region.rs`; none
    /// until its first round).
    pub(crate) regions: Vec<Region<B::MicroKernel>>,
}

impl<'a> Tuner<CpuBackend<'a>> {
    /// Prepare a run of the CPU contraction sketch; `log` and `previous` come from
    /// [`RecordLog::open`]. Previous records of this workload, target and strategy are
    /// reused; nothing measured is measured again.
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
}

impl<B: Backend> Tuner<B> {
    /// The tuned program of a micro-kernel: symbolic, so one build serves every
    /// instance; specialized for the instance when tuning per shape.
    pub fn program(&self, mk: B::MicroKernel) -> Program<B::MicroKernel> {
        trial_batch(&self.workload, &self.options, &self.instances, &[], false).program(mk)
    }

    /// Prepare a run on `backend` (see [`Tuner::new`]).
    pub fn with_backend(
        mut backend: B,
        workload: &Workload,
        instances: Vec<Instance>,
        options: TuneOptions,
        mut log: RecordLog,
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
        B::MicroKernel::applies(workload)?;
        if options.per_shape {
            let factors = B::MicroKernel::factors(backend.target(), workload, &instances[0].bound);
            backend.restrict_to_factors(factors);
        }
        backend.restrict_to_workload(workload);
        let round_floor = previous.iter().map(|r| r.round + 1).max().unwrap_or(0);
        // Records measured by other kernels, or with the caches otherwise, are another
        // run's.
        let measured = crate::measured_under(&options.measure);
        let mut resumed = ResumeSummary::default();
        let mut transient_seconds = 0.0;
        let mut records: Vec<BackendRecord<B>> = Vec::new();
        for r in previous {
            if r.workload != name
                || &r.target != backend.target()
                || r.strategy != options.strategy
                || r.anyshape != measured
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
        let mut db = DbRun::of(&options, workload, backend.target())?;
        if let Some(db) = db.as_mut().filter(|_| records.is_empty()) {
            // Nothing of this workload in the file: start from the database's best run,
            // written to the file as this run's own start (a resume finds it there).
            records = db.best_run(|r: &BackendRecord<B>| index.contains_key(&r.bindings))?;
            for r in &records {
                log.append(r)?;
            }
            resumed.reused = records.len();
        }
        // A workload the database has no run of: its family's other workloads there
        // train the cost model from the first round.
        let family = match &db {
            Some(db) if records.is_empty() => db.family_records(FAMILY_RECORDS)?,
            _ => Vec::new(),
        };
        resumed.trials = records.len();
        let mut tuner = Tuner {
            workload: workload.clone(),
            backend,
            resumed,
            instances,
            options,
            journal: Journal {
                log,
                db,
                records,
                transient: BTreeSet::new(),
                transient_seconds,
                round_floor,
                clock: Instant::now(),
            },
            features: HashMap::new(),
            index,
            time: TimeBreakdown::default(),
            shared: Shared::default(),
            database: Vec::new(),
            regions: Vec::new(),
        };
        tuner.database = tuner.database_samples(&family);
        Ok(tuner)
    }

    /// Features of each micro-kernel (cached; extraction counts as search time).
    pub(crate) fn features_of(&mut self, mks: &[B::MicroKernel]) -> Vec<Vec<f64>> {
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

    /// Trials in the records so far (resumed ones included).
    pub fn trials(&self) -> usize {
        self.journal.records.len()
    }

    /// The search's trials in the records (resumed ones included, vote rounds' not):
    /// what the trial budget counts.
    pub fn search_trials(&self) -> usize {
        self.journal.records.iter().filter(|r| !r.vote).count()
    }

    /// The trial budget.
    pub fn budget(&self) -> usize {
        self.options.trials
    }

    /// Set the trial budget: [`Tuner::run`] goes on until the records hold this many
    /// search trials (the task scheduler raises it slice by slice).
    pub fn set_budget(&mut self, trials: usize) {
        self.options.trials = trials;
    }

    /// The workload being tuned.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// The target it is tuned for.
    pub fn target(&self) -> &<B::MicroKernel as Sketch>::Target {
        self.backend.target()
    }

    /// The padding strategy of the tuned programs.
    pub fn strategy(&self) -> anyshape_codegen::PaddingStrategy {
        self.options.strategy
    }

    /// What the run took from its records file and what it left aside.
    pub fn resumed(&self) -> ResumeSummary {
        self.resumed
    }

    /// Tuning wall time of the records, this run's and resumed ones': the sum of their
    /// [`Record::seconds`]; and how many records carry no time (written by an older
    /// version), which the sum then leaves out. Records reused from the tuning database
    /// cost this run nothing: neither counts them.
    pub fn tuning_seconds(&self) -> (f64, usize) {
        let own = || self.journal.records.iter().filter(|r| !r.reused);
        (
            own().map(|r| r.seconds).sum::<f64>() + self.journal.transient_seconds,
            own().filter(|r| r.seconds == 0.0).count(),
        )
    }

    /// The sketch's seeds (its variants' defaults), which the search measures first.
    pub fn seeds(&self) -> Vec<B::MicroKernel> {
        self.backend.seeds(&self.workload)
    }

    /// The instances it tunes on.
    pub fn instances(&self) -> &[Instance] {
        &self.instances
    }

    fn summary(
        &mut self,
        round: usize,
        failed: usize,
        model: &CostModel,
        exploiting: bool,
    ) -> RoundSummary {
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
            trials: self.search_trials(),
            budget: self.options.trials,
            failed,
            predicted_weighted_latency: predicted,
            measured_weighted_latency: if mw > 0.0 { ml / mw } else { f64::NAN },
            measured_instances: n,
            best_gflops,
            exploiting,
            time: self.time,
        }
    }

    /// Build and measure the trials of a search round (or with `vote`, a vote round),
    /// append their records; returns how many failed, and how many the environment
    /// failed with the first reason. Each trial is recorded as soon as it is measured,
    /// so a killed run loses none. A pair is checked against the reference once: a
    /// micro-kernel whose output on an instance already matched (a record `checked`)
    /// is only timed there (re-timings of close calls computed the whole reference of
    /// every instance again, a pass each: the largest part of a vote round's time).
    pub(crate) fn measure(
        &mut self,
        trials: &[(B::MicroKernel, usize)],
        round: usize,
        vote: bool,
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<RoundFailures> {
        let t0 = Instant::now();
        let checked: HashSet<(B::MicroKernel, &Bindings)> = self
            .journal
            .records
            .iter()
            .filter(|r| matches!(r.result, TrialResult::Measured { checked: true, .. }))
            .map(|r| (r.micro_kernel, &r.bindings))
            .collect();
        let list: Vec<Trial<B::MicroKernel>> = trials
            .iter()
            .map(|&(mk, i)| {
                let bindings = &self.instances[i].bindings;
                Trial {
                    micro_kernel: mk,
                    bindings: bindings.clone(),
                    check: self.instances[i].flops <= self.options.check_flops
                        && !checked.contains(&(mk, bindings)),
                }
            })
            .collect();
        let mut failures = RoundFailures::default();
        let mut append_error = None;
        let batch = trial_batch(&self.workload, &self.options, &self.instances, &list, vote);
        let target = self.backend.target();
        let measured = crate::measured_under(&self.options.measure);
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
                anyshape: measured.clone(),
                workload: batch.workload.to_string(),
                target: target.clone(),
                strategy: batch.strategy,
                micro_kernel: t.micro_kernel,
                bindings: t.bindings.clone(),
                result,
                round,
                seconds: 0.0,
                vote,
                reused: false,
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
        // Time before this call is not this run's (a model's other tasks ran then).
        self.journal.clock = Instant::now();
        let records = self.journal.records.clone();
        let mut model = self.train(&records, self.options.seed);
        let mut history = Vec::new();
        let mut stalled = 0;
        let interrupt = self.options.interrupt.clone();
        let interrupted = || {
            interrupt
                .as_ref()
                .is_some_and(|f| f.load(Ordering::Relaxed))
        };
        let stop = loop {
            if self.search_trials() >= self.options.trials {
                break StopReason::Budget;
            }
            if stalled >= 3 {
                break StopReason::Stalled;
            }
            if interrupted() {
                break StopReason::Interrupted;
            }
            let mut rng = ChaCha8Rng::seed_from_u64(
                self.options.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round as u64,
            );
            let budget = self.options.trials - self.search_trials();
            // The last share of the budget goes to the winners' neighbours
            // (`exploit.rs`). Its turn comes when only its share is left, or when a
            // usual round would get under a quarter of a round's trials (rounds that
            // fell short of theirs; not worth a build). The usual choice stops short of
            // the share, and takes everything where the winners have no neighbour left
            // untried.
            let share = self.exploit_share();
            let round_trials = self.options.batch * self.options.instances_per_kernel;
            let its_turn = share > 0 && budget < share + round_trials.div_ceil(4);
            let mut trials = if its_turn {
                self.exploit(&model, &mut rng, budget)
            } else {
                Vec::new()
            };
            let exploiting = !trials.is_empty();
            let before = self.measured_best();
            if !exploiting {
                let usual = if its_turn { budget } else { budget - share };
                trials = match self.options.search {
                    SearchStrategy::Evolutionary => self.choose(&model, &mut rng, usual),
                    SearchStrategy::TrustRegion => self.choose_in_regions(&model, &mut rng, usual),
                };
            }
            if trials.is_empty() {
                stalled += 1;
                round += 1;
                continue;
            }
            stalled = 0;
            let failures = self.measure(&trials, round, false, on_trial)?;
            if failures.transient == trials.len() {
                return Err(TuneError::Environment(format!(
                    "every trial of round {round} failed for a reason outside the candidates ({}); the records are kept: free the machine and run again with --resume",
                    failures.first_transient.unwrap_or_default()
                )));
            }
            if !exploiting && self.options.search == SearchStrategy::TrustRegion {
                self.update_regions(&before, round, &mut rng);
            }
            let failed = failures.failed;
            let records = self.journal.records.clone();
            model = self.train(&records, self.options.seed ^ round as u64);
            let summary = self.summary(round, failed, &model, exploiting);
            on_round(&summary);
            history.push(summary);
            round += 1;
        };
        Ok(self.report(&model, round - first_round, history, stop))
    }

    fn report(
        &mut self,
        model: &CostModel,
        rounds: usize,
        history: Vec<RoundSummary>,
        stop: StopReason,
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
            stop,
        }
    }
}

/// A round's batch of `trials` (a vote round's with `vote`): the programs' shared
/// settings come from the options (per-shape tuning specializes for its one instance).
/// A free function so the tuner can lend its fields while it appends records.
fn trial_batch<'t, K>(
    workload: &'t Workload,
    options: &TuneOptions,
    instances: &'t [Instance],
    trials: &'t [Trial<K>],
    vote: bool,
) -> TrialBatch<'t, K> {
    TrialBatch {
        workload,
        strategy: options.strategy,
        specialize: options.per_shape.then(|| &instances[0].bindings),
        trials,
        vote,
    }
}
