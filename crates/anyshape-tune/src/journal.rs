//! The journal of a run: its records file and what the run holds of it (its trials,
//! the trials the environment failed, the round numbers), and what resuming took from
//! the file and left aside.
use crate::database::DbRun;
use crate::{Backend, Record, RecordLog, Result};
use anyshape_codegen::Sketch;
use anyshape_ir::Bindings;
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
    /// Records of another workload, target or padding strategy: ignored.
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
