//! The tuning log of a model's compile (`tuning.json` in the model module): how the
//! model's expected latency fell against tuning time as the task scheduler gave out
//! the budget (the tuning curve, FamilySeer Fig. 7), where the time went, and how well
//! each family's shared cost model ranked held-out trials. `anyshape bench --tuning`
//! compares two of them (e.g. families and scheduler against independent equal shares).
use crate::{DatabaseQuality, FamilyQuality, TimeBreakdown};
use serde::{Deserialize, Serialize};

/// The tuning log's file name in a model module.
pub const TUNING_FILE: &str = "tuning.json";

/// A point of the tuning curve: after a slice of the task scheduler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// Tuning time so far, seconds: the resumed records' time plus this run's wall time
    /// since its search began.
    pub seconds: f64,
    /// Trials in the tasks' records.
    pub trials: usize,
    /// The model's expected latency (seconds per call; `Σ count · weighted latency`),
    /// once every task has one.
    pub expected_seconds: Option<f64>,
}

/// How a model was tuned (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuningLog {
    /// How the budget was given out: `scheduler` or `equal shares`, `+ families` where
    /// the families shared cost models and candidates.
    pub mode: String,
    /// The trial budget (per task on average).
    pub trials_per_task: usize,
    /// The tasks.
    pub tasks: usize,
    /// The tuning curve.
    pub curve: Vec<CurvePoint>,
    /// Where this run's search time went, summed over the tasks (seconds).
    pub time: TimeBreakdown,
    /// This run's wall time of the search, seconds.
    pub wall_seconds: f64,
    /// This run's trials (resumed ones not included).
    pub new_trials: usize,
    /// Trials the tasks took from the tuning database's earlier runs.
    #[serde(default)]
    pub reused_trials: usize,
    /// The tasks the database had no run of, trained on its samples of their families'
    /// other workloads: how well those ranked their trials.
    #[serde(default)]
    pub database: Vec<DatabaseQuality>,
    /// The families of more than one task: their shared models' held-out quality.
    pub families: Vec<FamilyQuality>,
}

impl TuningLog {
    /// The share of this run's wall time spent compiling kernels.
    pub fn build_share(&self) -> f64 {
        self.time.build / self.wall_seconds.max(1e-9)
    }

    /// This run's trials per hour of wall time.
    pub fn trials_per_hour(&self) -> f64 {
        self.new_trials as f64 * 3600.0 / self.wall_seconds.max(1e-9)
    }

    /// The tuning time from which the expected latency stays at most `latency` (it can
    /// rise: where an instance is not measured it is the cost model's prediction, which
    /// a later measurement may replace with a slower truth).
    pub fn time_to(&self, latency: f64) -> Option<f64> {
        let mut since = None;
        for p in self.curve.iter().filter(|p| p.expected_seconds.is_some()) {
            if p.expected_seconds.is_some_and(|e| e <= latency) {
                since.get_or_insert(p.seconds);
            } else {
                since = None;
            }
        }
        since
    }

    /// The last expected latency.
    pub fn final_latency(&self) -> Option<f64> {
        self.curve.iter().rev().find_map(|p| p.expected_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_to_a_latency_is_when_the_curve_reaches_it_for_good() {
        let p = |seconds, expected_seconds| CurvePoint {
            seconds,
            trials: 0,
            expected_seconds,
        };
        let log = TuningLog {
            mode: "scheduler".into(),
            trials_per_task: 8,
            tasks: 2,
            curve: vec![
                p(1.0, None),
                p(2.0, Some(3.0)),
                p(3.0, Some(1.9)),
                p(4.0, Some(2.2)),
                p(5.0, Some(2.0)),
                p(9.0, Some(1.5)),
            ],
            time: TimeBreakdown {
                build: 3.0,
                ..Default::default()
            },
            wall_seconds: 10.0,
            new_trials: 20,
            reused_trials: 0,
            database: vec![],
            families: vec![],
        };
        // 1.9 at 3 s, but back above 2.0 at 4 s: reached for good at 5 s.
        assert_eq!(log.time_to(2.0), Some(5.0));
        assert_eq!(log.time_to(2.5), Some(3.0));
        assert_eq!(log.time_to(3.0), Some(2.0));
        assert_eq!(log.time_to(1.0), None);
        assert_eq!(log.final_latency(), Some(1.5));
        assert!((log.build_share() - 0.3).abs() < 1e-12);
        assert!((log.trials_per_hour() - 7200.0).abs() < 1e-9);
    }
}
