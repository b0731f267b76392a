//! The journal of a run: its records file and what the run holds of it (its trials,
//! the trials the environment failed, the round numbers), its run in the tuning
//! database ([`DbRun`]), and what resuming took from the file and left aside.
use crate::database::{RunKey, TuningDb};
use crate::{family_of, Backend, Record, RecordLog, Result, TuneOptions};
use anyshape_codegen::Sketch;
use anyshape_ir::{Bindings, Workload};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeSet;
use std::time::Instant;

/// How a round's trials failed.
#[derive(Default)]
pub(crate) struct RoundFailures {
    /// The candidates' fault.
    pub failed: usize,
    /// The environment's fault.
    pub transient: usize,
    /// The first environment failure's reason.
    pub first_transient: Option<String>,
}

/// The records of a backend.
pub(crate) type BackendRecord<B> =
    Record<<B as Backend>::MicroKernel, <<B as Backend>::MicroKernel as Sketch>::Target>;

/// What a run took from its records file, and what it left aside.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ResumeSummary {
    /// Trials of this workload, target and strategy on the run's instances: reused
    /// (those of the tuning database's best earlier run included).
    pub trials: usize,
    /// Of `trials`, those taken from the tuning database (the file held none).
    pub reused: usize,
    /// Records of another workload, target, padding strategy, version or caches'
    /// state: ignored.
    pub other_runs: usize,
    /// Records of instances outside the domain: ignored.
    pub outside_domain: usize,
    /// Trials the environment failed (not the candidate's fault): measured again.
    pub transient: usize,
}

/// The records of a run: the file and what it holds.
pub(crate) struct Journal<B: Backend> {
    pub log: RecordLog,
    /// The run in the tuning database, where there is one.
    pub db: Option<DbRun>,
    /// The run's trials (transient failures excluded).
    pub records: Vec<BackendRecord<B>>,
    /// Pairs the environment failed in this process: recorded, not chosen again until
    /// the run resumes.
    pub transient: BTreeSet<(B::MicroKernel, Bindings)>,
    /// Tuning seconds of transient records (spent, though not trials).
    pub transient_seconds: f64,
    /// The round after the last one in the file, ignored records' included (rounds are
    /// never reused).
    pub round_floor: usize,
    /// When the last record was written (or the tuner was made).
    pub clock: Instant,
}

impl<B: Backend> Journal<B> {
    /// The round after the last recorded one.
    pub fn next_round(&self) -> usize {
        self.records
            .iter()
            .map(|r| r.round + 1)
            .max()
            .unwrap_or(0)
            .max(self.round_floor)
    }

    /// The (micro-kernel, instance) pairs recorded, or failed by the environment in
    /// this process: what a search round does not choose again.
    pub fn tried(&self) -> BTreeSet<(B::MicroKernel, Bindings)> {
        self.records
            .iter()
            .map(|r| (r.micro_kernel, r.bindings.clone()))
            .chain(self.transient.iter().cloned())
            .collect()
    }

    /// Append one trial to the records file and the in-memory records, timed since the
    /// previous one; `on_trial` hears the new count of trials.
    pub fn append(
        &mut self,
        mut record: BackendRecord<B>,
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<()> {
        record.seconds = self.clock.elapsed().as_secs_f64();
        self.clock = Instant::now();
        self.log.append(&record)?;
        if let Some(db) = &mut self.db {
            db.append(&self.records, &record)?;
        }
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

/// A tuner's run in the database, started at its first new trial: it then holds the
/// tuner's earlier records (resumed or reused) and every trial after, so that each run
/// is whole.
pub(crate) struct DbRun {
    db: TuningDb,
    key: RunKey,
    /// The run's id and its next trial's number, once started.
    run: Option<(i64, i64)>,
}

impl DbRun {
    /// The run of a tuner of `workload` on `target` with `options`, where they name a
    /// tuning database (per-shape runs use none).
    pub fn of<T: Serialize>(
        options: &TuneOptions,
        workload: &Workload,
        target: &T,
    ) -> Result<Option<DbRun>> {
        let Some(path) = options.database.as_ref().filter(|_| !options.per_shape) else {
            return Ok(None);
        };
        Ok(Some(DbRun {
            db: TuningDb::open(path)?,
            key: RunKey {
                workload: workload.to_string(),
                family: family_of(workload),
                target: serde_json::to_string(target).expect("targets serialize"),
                strategy: serde_json::to_string(&options.strategy).expect("strategies serialize"),
                anyshape: crate::measured_under(&options.measure),
            },
            run: None,
        }))
    }

    /// Record `record`, after the `earlier` records the tuner held before its first.
    pub fn append<R: Serialize>(&mut self, earlier: &[R], record: &R) -> Result<()> {
        let json = |r: &R| serde_json::to_string(r).expect("records serialize");
        let (run, next) = match self.run {
            Some(started) => started,
            None => {
                let run = self.db.start_run(&self.key)?;
                let earlier: Vec<String> = earlier.iter().map(json).collect();
                self.db.append(run, 0, &earlier)?;
                (run, earlier.len() as i64)
            }
        };
        self.db.append(run, next, &[json(record)])?;
        self.run = Some((run, next + 1));
        Ok(())
    }

    /// Measured records of the family's other workloads (see
    /// [`TuningDb::family_records`]), each trial once (runs repeat the runs they
    /// started from), at most `limit` read.
    pub fn family_records<K, T>(&self, limit: usize) -> Result<Vec<Record<K, T>>>
    where
        K: DeserializeOwned + Ord + Copy,
        T: DeserializeOwned,
    {
        let mut seen = std::collections::BTreeSet::new();
        Ok(self
            .db
            .family_records(&self.key, limit)?
            .into_iter()
            .filter_map(|text| serde_json::from_str::<Record<K, T>>(&text).ok())
            .filter(|r| r.latency().is_some() && r.invalid().is_none())
            .filter(|r| seen.insert((r.workload.clone(), r.micro_kernel, r.bindings.clone())))
            .collect())
    }

    /// The records of the key's best earlier run: the one with the most records that
    /// `keep` accepts (the latest of equals), only those, in order, each marked
    /// [`Record::reused`]; records that do not parse (another version's) are left out.
    pub fn best_run<K: DeserializeOwned, T: DeserializeOwned>(
        &self,
        keep: impl Fn(&Record<K, T>) -> bool,
    ) -> Result<Vec<Record<K, T>>> {
        let mut best: Vec<Record<K, T>> = Vec::new();
        for (_, texts) in self.db.runs(&self.key)? {
            let run: Vec<Record<K, T>> = texts
                .iter()
                .filter_map(|t| serde_json::from_str::<Record<K, T>>(t).ok())
                .filter(|r| !r.is_transient() && r.invalid().is_none() && keep(r))
                .map(|r| Record { reused: true, ..r })
                .collect();
            if !run.is_empty() && run.len() >= best.len() {
                best = run;
            }
        }
        Ok(best)
    }
}
