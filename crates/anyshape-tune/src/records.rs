//! Records: the append-only JSONL log of every trial. Each record is written with one
//! `write` to a file opened for appending, so a killed run leaves at most a torn last
//! line, which [`RecordLog::open`] removes on resume.
use crate::{Result, TuneError};
use anyshape_codegen::{CpuTarget, MicroKernel, PaddingStrategy};
use anyshape_ir::Bindings;
use anyshape_measure::Outcome;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What a trial produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialResult {
    /// Timing statistics.
    Measured {
        /// Fastest call, seconds.
        min_seconds: f64,
        /// Median call, seconds.
        median_seconds: f64,
        /// Timed calls.
        repeats: usize,
        /// Whether the output was compared with the reference (and matched).
        checked: bool,
    },
    /// Why the trial failed (compile error, crash, timeout, wrong result).
    Failed {
        /// The reason.
        error: String,
    },
}

impl TrialResult {
    /// The record of a measurement outcome (a wrong result is a failure).
    pub fn of(outcome: &Outcome, checked: bool) -> TrialResult {
        match outcome {
            Outcome::Failed(error) => TrialResult::Failed {
                error: error.clone(),
            },
            Outcome::Measured(m) => match &m.check {
                Some(c) if !c.passed => TrialResult::Failed {
                    error: format!("wrong result: {} elements differ", c.mismatches),
                },
                _ => TrialResult::Measured {
                    min_seconds: m.min_seconds,
                    median_seconds: m.median_seconds,
                    repeats: m.repeats,
                    checked,
                },
            },
        }
    }
}

/// One trial: a program measured on an instance (on the CPU unless `K`, the
/// micro-kernel, and `T`, the target, say otherwise).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record<K = MicroKernel, T = CpuTarget> {
    /// The anyshape version that measured it.
    pub anyshape: String,
    /// The workload, in its textual form.
    pub workload: String,
    /// The target it ran on.
    pub target: T,
    /// The padding strategy.
    pub strategy: PaddingStrategy,
    /// The micro-kernel.
    pub micro_kernel: K,
    /// The instance.
    pub bindings: Bindings,
    /// The outcome.
    pub result: TrialResult,
    /// The search round it belongs to.
    pub round: usize,
    /// Wall-clock seconds the tuning run spent on this record since its previous one
    /// (search, build, measurement), so a run's tuning time survives being killed and
    /// resumed: it is the sum over its records. 0 in records of older versions.
    #[serde(default)]
    pub seconds: f64,
}

impl<K, T> Record<K, T> {
    /// The minimum latency, for a successful trial.
    pub fn latency(&self) -> Option<f64> {
        match self.result {
            TrialResult::Measured { min_seconds, .. } => Some(min_seconds),
            TrialResult::Failed { .. } => None,
        }
    }
}

/// An open records file.
pub struct RecordLog {
    path: PathBuf,
    file: File,
}

impl RecordLog {
    /// Open `path` for appending and return the records it already holds. An existing,
    /// non-empty file is only continued with `resume` (so runs are never mixed by
    /// accident); a torn last line (from a killed run) is cut off.
    pub fn open<K: DeserializeOwned, T: DeserializeOwned>(
        path: &Path,
        resume: bool,
    ) -> Result<(RecordLog, Vec<Record<K, T>>)> {
        let err = |message: String| TuneError::Records {
            path: path.display().to_string(),
            message,
        };
        let text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(err(e.to_string())),
        };
        if !text.is_empty() && !resume {
            return Err(err("the file already holds records; pass --resume to continue that run, or name a new file".into()));
        }
        let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let mut records = Vec::new();
        for (n, line) in text[..complete].split(|&b| b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let rec: Record<K, T> = serde_json::from_slice(line).map_err(|e| {
                err(format!(
                    "line {} is not a record of this backend ({}): {e}",
                    n + 1,
                    std::any::type_name::<K>().rsplit("::").next().unwrap_or("")
                ))
            })?;
            records.push(rec);
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| err(e.to_string()))?;
        if complete < text.len() {
            file.set_len(complete as u64)
                .map_err(|e| err(format!("cannot cut the torn last line: {e}")))?;
        }
        Ok((
            RecordLog {
                path: path.to_path_buf(),
                file,
            },
            records,
        ))
    }

    /// Append one record (one `write`, then flushed to the OS).
    pub fn append<K: Serialize, T: Serialize>(&mut self, record: &Record<K, T>) -> Result<()> {
        let mut line = serde_json::to_string(record).expect("records serialize");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|_| self.file.flush())
            .map_err(|e| TuneError::Records {
                path: self.path.display().to_string(),
                message: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: usize) -> Record {
        Record {
            anyshape: "test".into(),
            workload: "dense(M=T,N=4,K=4)".into(),
            target: CpuTarget::detect(),
            strategy: PaddingStrategy::LocalPad,
            micro_kernel: MicroKernel {
                mr: i + 1,
                nr: 16,
                mc: i + 1,
                nc: 16,
                kc: 4,
                uk: 4,
            },
            bindings: Bindings::from_pairs([("T", i as i64)]),
            result: TrialResult::Measured {
                min_seconds: 1.0,
                median_seconds: 1.0,
                repeats: 1,
                checked: false,
            },
            round: 0,
            seconds: 0.5,
        }
    }

    /// The CPU records of a file.
    fn open(path: &Path, resume: bool) -> Result<(RecordLog, Vec<Record>)> {
        RecordLog::open(path, resume)
    }

    #[test]
    fn appends_resumes_and_cuts_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let (mut log, old) = open(&path, false).unwrap();
        assert!(old.is_empty());
        log.append(&record(0)).unwrap();
        log.append(&record(1)).unwrap();
        drop(log);
        assert!(
            open(&path, false).is_err(),
            "an existing run needs --resume"
        );
        // A killed writer leaves half a line.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"anyshape\":\"te").unwrap();
        drop(f);
        let (mut log, old) = open(&path, true).unwrap();
        assert_eq!(old, vec![record(0), record(1)]);
        log.append(&record(2)).unwrap();
        let (_, all) = open(&path, true).unwrap();
        assert_eq!(all, vec![record(0), record(1), record(2)]);
        std::fs::write(&path, "not json\n").unwrap();
        assert!(matches!(open(&path, true), Err(TuneError::Records { .. })));
    }
}
