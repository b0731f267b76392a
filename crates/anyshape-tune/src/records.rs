//! Records: the append-only JSONL log of every trial, the source of truth of a tuning
//! run.
//!
//! - Each record is written with one `write` to a file opened for appending, so a killed
//!   run leaves at most a torn last line; [`RecordLog::open`] cuts it off (and says how
//!   many bytes), and keeps a last record that is complete but lacks its newline.
//! - A records file has one writer at a time: [`RecordLog`] holds an exclusive lock on
//!   it (released by the OS when the process dies), so a second run on the same file is
//!   refused with a clear error instead of measuring the same trials twice.
//! - A record whose values are impossible (a latency that is not a positive number) is
//!   skipped and reported, never used; the file is left as it is.
//! - A trial that failed because of the environment rather than the candidate
//!   ([`TrialResult::Transient`]: the compiler killed, out of memory, the worker killed
//!   from outside) is recorded as such, does not count as a trial, and is measured again
//!   when the run resumes.
use crate::{Result, TuneError};
use anyshape_codegen::{ContractionKernel, CpuTarget, PaddingStrategy};
use anyshape_ir::Bindings;
use anyshape_measure::Outcome;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
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
    /// Why the trial failed (compile error, crash, timeout, wrong result): the
    /// candidate's fault.
    Failed {
        /// The reason.
        error: String,
    },
    /// The environment failed, not the candidate (the compiler killed or out of memory,
    /// the worker killed from outside): not a trial; measured again on resume.
    Transient {
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
            Outcome::Interrupted(error) => TrialResult::Transient {
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

/// What a trial measured with `measure` is recorded under, and a tuning database's run
/// keyed by: the kernels' version ([`anyshape_codegen::kernels_version`]) and the
/// caches' state a call found (`+cold`: a model's, its weights evicted; `+warm`), so
/// that a run never resumes or reuses trials timed otherwise — a model's cold
/// latencies as an operator's warm ones, or an older generation's kernels
/// (`0.1.0+k5+cold`).
pub fn measured_under(measure: &anyshape_measure::MeasureOptions) -> String {
    let caches = if measure.cold { "cold" } else { "warm" };
    format!("{}+{caches}", anyshape_codegen::kernels_version())
}

/// One trial: a program measured on an instance (on the CPU unless `K`, the
/// micro-kernel, and `T`, the target, say otherwise).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record<K = ContractionKernel, T = CpuTarget> {
    /// The version and caches' state it was measured under ([`measured_under`]).
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
    /// Whether the trial belongs to a vote round (the votes' candidates measured on
    /// every instance side by side), not a search round. Absent when false; records of
    /// older versions have no vote rounds, so a run resumed from them votes again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub vote: bool,
    /// Taken from the tuning database: measured by an earlier run (its `seconds` are
    /// that run's), reused by this one at no cost. Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
}

impl<K, T> Record<K, T> {
    /// The minimum latency, for a successful trial.
    pub fn latency(&self) -> Option<f64> {
        match self.result {
            TrialResult::Measured { min_seconds, .. } => Some(min_seconds),
            TrialResult::Failed { .. } | TrialResult::Transient { .. } => None,
        }
    }

    /// Whether the environment, not the candidate, failed this trial.
    pub fn is_transient(&self) -> bool {
        matches!(self.result, TrialResult::Transient { .. })
    }

    /// Why the record's values are impossible, if they are: a measured latency that is
    /// not a positive finite number, a median below the minimum, no timed call.
    pub fn invalid(&self) -> Option<String> {
        match self.result {
            TrialResult::Measured {
                min_seconds,
                median_seconds,
                repeats,
                ..
            } => {
                if !(min_seconds.is_finite() && min_seconds > 0.0) {
                    Some(format!("latency {min_seconds} s is not a positive number"))
                } else if !(median_seconds.is_finite() && median_seconds >= min_seconds) {
                    Some(format!(
                        "median {median_seconds} s is below the minimum {min_seconds} s"
                    ))
                } else if repeats == 0 {
                    Some("no timed call".into())
                } else {
                    None
                }
            }
            _ if !(self.seconds.is_finite() && self.seconds >= 0.0) => {
                Some(format!("{} s of tuning time", self.seconds))
            }
            _ => None,
        }
    }
}

/// An open records file, locked for this process alone.
pub struct RecordLog {
    path: PathBuf,
    file: File,
    torn_bytes: usize,
    invalid: Vec<(usize, String)>,
}

impl RecordLog {
    /// Open `path` for appending and return the records it already holds. An existing,
    /// non-empty file is only continued with `resume` (so runs are never mixed by
    /// accident). The file is locked until the log is dropped: a second writer gets an
    /// error. A torn last line (from a killed run) is cut off
    /// ([`RecordLog::torn_bytes`]); a complete last record without its newline is kept;
    /// records with impossible values are skipped ([`RecordLog::invalid`]).
    pub fn open<K: DeserializeOwned, T: DeserializeOwned>(
        path: &Path,
        resume: bool,
    ) -> Result<(RecordLog, Vec<Record<K, T>>)> {
        let err = |message: String| TuneError::Records {
            path: path.display().to_string(),
            message,
        };
        if path.is_dir() {
            return Err(err("is a directory; name a file, e.g. records.jsonl".into()));
        }
        // Only a regular file (or none yet): a FIFO or a device would hang or never end.
        if path.exists() {
            anyshape_files::regular_file_len(path).map_err(|e| err(e.to_string()))?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(|e| err(e.to_string()))?;
        // A run killed a moment ago may still share the lock through a child it was
        // starting (until the child's `exec` closes the file): wait a moment for it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(err("is in use by another anyshape run (a records file takes one writer at a time); wait for that run to finish, or give this one its own file".into()))
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(err(format!("cannot lock it: {e}")))
                }
            }
        }
        let mut text = Vec::new();
        file.read_to_end(&mut text)
            .map_err(|e| err(e.to_string()))?;
        let parse = |line: &[u8]| serde_json::from_slice::<Record<K, T>>(line);
        if !text.is_empty() && !resume {
            let first = text.split(|&b| b == b'\n').next().unwrap_or_default();
            return Err(err(if parse(first).is_ok() {
                "the file already holds records; pass --resume to continue that run, or name a new file".into()
            } else {
                "is not a records file (its first line is not a record): name a new file".into()
            }));
        }
        let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let tail = &text[complete..];
        // A last line without its newline: a complete record is kept (and terminated),
        // anything else is what a killed writer left and is cut off — but only once
        // every complete line is known to be a record: the file is changed only if it
        // is a records file.
        let keep_tail = !tail.iter().all(u8::is_ascii_whitespace) && parse(tail).is_ok();
        let mut records = Vec::new();
        let mut invalid = Vec::new();
        for (n, line) in text[..complete].split(|&b| b == b'\n').enumerate() {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let rec = parse(line).map_err(|e| {
                err(format!(
                    "line {} is not a record of this backend ({}): {e}",
                    n + 1,
                    std::any::type_name::<K>().rsplit("::").next().unwrap_or("")
                ))
            })?;
            match rec.invalid() {
                Some(why) => invalid.push((n + 1, why)),
                None => records.push(rec),
            }
        }
        let mut torn_bytes = 0;
        if keep_tail {
            let rec = parse(tail).expect("parsed above");
            let n = text[..complete].split(|&b| b == b'\n').count();
            match rec.invalid() {
                Some(why) => invalid.push((n, why)),
                None => records.push(rec),
            }
            file.write_all(b"\n").map_err(|e| err(e.to_string()))?;
        } else if complete < text.len() {
            if records.is_empty() && invalid.is_empty() && complete == 0 {
                return Err(err(
                    "holds no records (its only line is not one): not a records file; name a new file".into(),
                ));
            }
            torn_bytes = text.len() - complete;
            file.set_len(complete as u64)
                .map_err(|e| err(format!("cannot cut the torn last line: {e}")))?;
        }
        Ok((
            RecordLog {
                path: path.to_path_buf(),
                file,
                torn_bytes,
                invalid,
            },
            records,
        ))
    }

    /// Bytes of a torn last line that [`RecordLog::open`] cut off (0 if none).
    pub fn torn_bytes(&self) -> usize {
        self.torn_bytes
    }

    /// Lines holding records with impossible values, skipped (line number, why).
    pub fn invalid(&self) -> &[(usize, String)] {
        &self.invalid
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
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
            micro_kernel: ContractionKernel {
                mr: i + 1,
                nr: 16,
                mc: i + 1,
                nc: 16,
                kc: 4,
                uk: 4,
                dot: false,
                pf: false,
                ia: false,
                ib: false,
                vm: false,
                amx: false,
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
            vote: false,
            reused: false,
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
        assert_eq!(log.torn_bytes(), 15);
        log.append(&record(2)).unwrap();
        drop(log);
        let (_, all) = open(&path, true).unwrap();
        assert_eq!(all, vec![record(0), record(1), record(2)]);
        std::fs::write(&path, "not json\n").unwrap();
        assert!(matches!(open(&path, true), Err(TuneError::Records { .. })));
    }

    #[test]
    fn a_complete_last_record_without_newline_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let line = |i| serde_json::to_string(&record(i)).unwrap();
        std::fs::write(&path, format!("{}\n{}", line(0), line(1))).unwrap();
        let (mut log, old) = open(&path, true).unwrap();
        assert_eq!((old.len(), log.torn_bytes()), (2, 0));
        log.append(&record(2)).unwrap();
        drop(log);
        let (_, all) = open(&path, true).unwrap();
        assert_eq!(all, vec![record(0), record(1), record(2)]);
    }

    #[test]
    fn one_writer_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let (log, _) = open(&path, true).unwrap();
        let Err(TuneError::Records { message, .. }) = open(&path, true) else {
            panic!("a second writer was let in");
        };
        assert!(message.contains("in use"), "{message}");
        drop(log);
        assert!(open(&path, true).is_ok(), "the lock goes with the log");
    }

    #[test]
    fn impossible_records_are_skipped_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let mut lines = Vec::new();
        for (i, min) in [1.0, 0.0, -2.0, 1.0].into_iter().enumerate() {
            let mut r = record(i);
            r.result = TrialResult::Measured {
                min_seconds: min,
                median_seconds: 1.0,
                repeats: 1,
                checked: false,
            };
            lines.push(serde_json::to_string(&r).unwrap());
        }
        let mut transient = record(9);
        transient.result = TrialResult::Transient {
            error: "the compiler was killed".into(),
        };
        lines.push(serde_json::to_string(&transient).unwrap());
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let (log, old) = open(&path, true).unwrap();
        assert_eq!(old.len(), 3);
        assert!(old[2].is_transient() && old[2].latency().is_none());
        let bad: Vec<usize> = log.invalid().iter().map(|x| x.0).collect();
        assert_eq!(bad, vec![2, 3]);
        assert!(log.invalid()[0].1.contains("not a positive number"));
    }
}
