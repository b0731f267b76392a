//! The runner: measures candidates in a separate worker process with a time limit per
//! candidate. A candidate that crashes the worker or runs past its limit is reported as
//! failed; the worker is restarted for the candidates after it.
use crate::{CheckReport, MeasureError, Result};
use anyshape_codegen::{DeviceKind, GpuContractionKernel};
use anyshape_ir::{Bindings, Workload};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

/// Where a job's kernels are; the worker runs them on the device this names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kernels {
    /// A shared library of C kernels (CPU).
    Library(PathBuf),
    /// A PTX file of CUDA kernels (the first GPU).
    Ptx(PathBuf),
    /// Kernels compiled into the worker executable (baselines), on a device.
    Builtin(DeviceKind),
}

impl Kernels {
    /// The device the kernels run on.
    pub fn device(&self) -> DeviceKind {
        match self {
            Kernels::Library(_) => DeviceKind::Cpu,
            Kernels::Ptx(_) => DeviceKind::Cuda,
            Kernels::Builtin(d) => *d,
        }
    }
}

impl std::fmt::Display for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kernels::Library(p) | Kernels::Ptx(p) => write!(f, "{}", p.display()),
            Kernels::Builtin(d) => write!(f, "the worker's builtin {} kernels", d.name()),
        }
    }
}

/// One program to measure: a symbol in the library and the instance to run it on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Candidate {
    /// The kernel's symbol.
    pub symbol: String,
    /// The workload it computes.
    pub workload: Workload,
    /// The instance.
    pub bindings: Bindings,
    /// Compare the output with the reference implementation.
    pub check: bool,
    /// A generated GPU kernel's micro-kernel, which its launch needs (`None` on CPU and
    /// for baselines).
    #[serde(default)]
    pub gpu: Option<GpuContractionKernel>,
}

impl Candidate {
    /// The values of the workload's shape vars, sorted by name (as kernels take them).
    pub fn var_values(&self) -> Vec<i64> {
        self.workload
            .shape_vars()
            .iter()
            .map(|v| self.bindings.get(v).unwrap_or(0))
            .collect()
    }
}

/// How candidates are timed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MeasureOptions {
    /// Timed calls at least.
    pub min_repeats: usize,
    /// Timed calls at most.
    pub max_repeats: usize,
    /// Keep timing until this many seconds have passed (or `max_repeats`).
    pub min_seconds: f64,
    /// Seconds a candidate may take (all its calls together) before it is killed.
    pub timeout_seconds: f64,
    /// Time consecutive candidates on the same instance in alternation (one call each,
    /// round after round) rather than one after the other, so that a slow phase of a
    /// shared machine slows them alike; they then share `min_seconds * n`.
    #[serde(default)]
    pub interleave: bool,
    /// Before every timed call, flush the call's inputs and output from every cache
    /// level (outside the timed region): timed as a model's kernels run, whose weights
    /// the other layers evicted since their last call. `false`: warm caches (every call
    /// after the first finds its inputs cached).
    #[serde(default)]
    pub cold: bool,
}

impl Default for MeasureOptions {
    fn default() -> Self {
        MeasureOptions {
            min_repeats: 5,
            max_repeats: 1000,
            min_seconds: 0.2,
            timeout_seconds: 30.0,
            interleave: false,
            cold: false,
        }
    }
}

/// The longest time limit accepted, seconds (a week).
pub const MAX_TIMEOUT_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

impl MeasureOptions {
    /// Check that the options make sense: timing seconds finite and not negative, a
    /// time limit above 0 and at most [`MAX_TIMEOUT_SECONDS`], at least one timed call.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(MeasureError::Options(m));
        if !(self.min_seconds.is_finite() && self.min_seconds >= 0.0) {
            return bad(format!(
                "timing for {} s: need a number of seconds >= 0",
                self.min_seconds
            ));
        }
        if !(self.timeout_seconds > 0.0 && self.timeout_seconds <= MAX_TIMEOUT_SECONDS) {
            return bad(format!(
                "a time limit of {} s: need a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS}",
                self.timeout_seconds
            ));
        }
        if self.max_repeats == 0 || self.min_repeats > self.max_repeats {
            return bad(format!(
                "{}..{} timed calls: need at least one, the minimum not above the maximum",
                self.min_repeats, self.max_repeats
            ));
        }
        Ok(())
    }
}

/// Timing statistics of one successful candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Fastest call, seconds.
    pub min_seconds: f64,
    /// Median call, seconds.
    pub median_seconds: f64,
    /// Timed calls.
    pub repeats: usize,
    /// The comparison with the reference, when asked for.
    pub check: Option<CheckReport>,
}

/// What happened to a candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// It ran; see the statistics (and the check, which may have failed).
    Measured(Measurement),
    /// It could not be measured: the reason (crash, timeout, error status, missing symbol).
    Failed(String),
    /// The environment stopped it, not the candidate: its worker was killed from outside
    /// (by the out-of-memory killer, say). Worth measuring again later.
    Interrupted(String),
}

/// How to start a worker process: a program and its arguments.
#[derive(Clone, Debug)]
pub struct WorkerCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// Measures candidates in isolated worker processes.
#[derive(Clone, Debug)]
pub struct Runner {
    /// How to start a worker.
    pub worker: WorkerCommand,
    /// Timing options.
    pub options: MeasureOptions,
}

/// The job a worker reads from its standard input (one JSON line).
#[derive(Serialize, Deserialize)]
pub(crate) struct Job {
    pub kernels: Kernels,
    pub candidates: Vec<Candidate>,
    pub options: MeasureOptions,
}

/// One line a worker writes to its standard output.
#[derive(Serialize, Deserialize)]
pub(crate) enum Event {
    /// About to call candidate `i` (its time limit starts).
    Start(usize),
    /// Candidate `i` is finished.
    Done(usize, Outcome),
}

/// Seconds a worker may take to prepare a candidate (inputs, reference) before starting it.
const PREPARE_SECONDS: f64 = 600.0;

impl Runner {
    /// Measure every candidate in `kernels`; the result has one outcome per candidate.
    pub fn measure(&self, kernels: &Kernels, candidates: &[Candidate]) -> Result<Vec<Outcome>> {
        self.measure_with(kernels, candidates, &mut |_, _| {})
    }

    /// Like [`Runner::measure`], telling `on_outcome` each candidate's outcome (by index)
    /// as soon as it is known.
    pub fn measure_with(
        &self,
        kernels: &Kernels,
        candidates: &[Candidate],
        on_outcome: &mut dyn FnMut(usize, &Outcome),
    ) -> Result<Vec<Outcome>> {
        self.options.check()?;
        let mut outcomes: Vec<Option<Outcome>> = vec![None; candidates.len()];
        // Each worker gets the candidates still without an outcome; a crash or hang
        // settles its culprit and the rest go to a new worker (with interleaving, those
        // timed alongside the culprit lost their run and are measured again). Every
        // restart settles at least one candidate, so this ends.
        loop {
            let open: Vec<usize> = (0..candidates.len())
                .filter(|&i| outcomes[i].is_none())
                .collect();
            if open.is_empty() {
                break;
            }
            let job = Job {
                kernels: kernels.clone(),
                candidates: open.iter().map(|&i| candidates[i].clone()).collect(),
                options: self.options.clone(),
            };
            let (mut child, events) = self.spawn(&job)?;
            let mut started: Option<usize> = None;
            loop {
                let limit = if started.is_some() {
                    self.options.timeout_seconds
                } else {
                    PREPARE_SECONDS
                };
                match events.recv_timeout(Duration::from_secs_f64(limit)) {
                    Ok(Ok(Event::Start(i))) => started = open.get(i).copied(),
                    Ok(Ok(Event::Done(i, outcome))) => {
                        if let Some(&k) = open.get(i) {
                            on_outcome(k, &outcome);
                            outcomes[k] = Some(outcome);
                        }
                        started = None;
                        if open.iter().all(|&k| outcomes[k].is_some()) {
                            break;
                        }
                    }
                    Ok(Err(unreadable)) => {
                        // A bug of ours, not the candidate's; it fails that candidate
                        // only, the others go to a new worker.
                        let _ = child.kill();
                        let _ = child.wait();
                        let culprit = culprit(started, &open, &outcomes);
                        let failed = Outcome::Failed(format!(
                            "internal error: the worker's report could not be read ({unreadable})"
                        ));
                        on_outcome(culprit, &failed);
                        outcomes[culprit] = Some(failed);
                        break;
                    }
                    Err(e) => {
                        let _ = child.kill();
                        let status = child.wait().ok();
                        let culprit = culprit(started, &open, &outcomes);
                        let failed = match (e, status) {
                            (RecvTimeoutError::Timeout, _) => Outcome::Failed(format!(
                                "timed out after {:.1} s",
                                if started.is_some() {
                                    self.options.timeout_seconds
                                } else {
                                    PREPARE_SECONDS
                                }
                            )),
                            // SIGKILL that was not ours (we kill on timeouts only): the
                            // out-of-memory killer or a person; SIGINT, SIGTERM, SIGHUP:
                            // Ctrl-C or a shutdown. Not the candidate.
                            (RecvTimeoutError::Disconnected, Some(st)) if killed(st) => {
                                Outcome::Interrupted(format!(
                                    "the worker was stopped from outside ({}; Ctrl-C, or out of memory?)",
                                    describe_exit(st)
                                ))
                            }
                            (RecvTimeoutError::Disconnected, Some(st)) => {
                                Outcome::Failed(format!("the worker died ({})", describe_exit(st)))
                            }
                            (RecvTimeoutError::Disconnected, None) => {
                                Outcome::Failed("the worker died".into())
                            }
                        };
                        on_outcome(culprit, &failed);
                        outcomes[culprit] = Some(failed);
                        break;
                    }
                }
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Outcome::Failed("not measured".into())))
            .collect())
    }

    /// Start a worker on `job`; its events arrive on the channel, a line that does not
    /// parse as one as `Err` (after which the channel ends).
    fn spawn(&self, job: &Job) -> Result<(Child, Receiver<std::result::Result<Event, String>>)> {
        let cmd = self.worker.program.display().to_string();
        let mut child = Command::new(&self.worker.program)
            .args(&self.worker.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| MeasureError::Worker {
                cmd: cmd.clone(),
                source,
            })?;
        let line = serde_json::to_string(job).expect("jobs serialize");
        let mut stdin = child.stdin.take().expect("piped stdin");
        stdin
            .write_all(line.as_bytes())
            .and_then(|_| stdin.write_all(b"\n"))
            .map_err(|source| MeasureError::Worker { cmd, source })?;
        drop(stdin);
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<Event>(&line) {
                    Ok(ev) => {
                        if tx.send(Ok(ev)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(format!("{e} in `{line:.200}`")));
                        break;
                    }
                }
            }
        });
        Ok((child, rx))
    }
}

/// Who a dead or stuck worker's failure is blamed on: the candidate started last, else
/// the first of `open` without an outcome.
fn culprit(started: Option<usize>, open: &[usize], outcomes: &[Option<Outcome>]) -> usize {
    started
        .filter(|&k| outcomes[k].is_none())
        .or_else(|| open.iter().copied().find(|&k| outcomes[k].is_none()))
        .expect("a candidate without an outcome")
}

/// Whether the process was ended from outside: SIGKILL (we kill on timeouts only, and
/// wait for those), SIGINT, SIGTERM or SIGHUP (candidates raise none of these).
fn killed(status: std::process::ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        matches!(status.signal(), Some(1 | 2 | 9 | 15))
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

/// A process's end in words: the signal's name or the exit status.
pub(crate) fn describe_exit(status: std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                4 => "SIGILL",
                6 => "SIGABRT",
                7 => "SIGBUS",
                8 => "SIGFPE",
                9 => "SIGKILL",
                11 => "SIGSEGV",
                _ => "signal",
            };
            return format!("{name} ({sig})");
        }
    }
    format!("exit status {}", status.code().unwrap_or(-1))
}
