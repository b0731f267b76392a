//! The tuning side of the work queue: a round's jobs put on its target's stream, their
//! results read back from the client's own stream as workers post them.
use super::{
    client_key, connect, fingerprint, jobs_key, now_ms, results_key, unreachable, workers, Job,
    JobResult,
};
use crate::{Candidate, KernelSource, MeasureError, MeasureOptions, Outcome, Result};
use anyshape_codegen::{CpuTarget, DeviceKind, Target};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Seconds the key that says a client waits outlives its last refresh.
const CLIENT_TTL_MS: u64 = 60_000;
/// A worker is live if it was heard from this recently (five of its heartbeats).
const LIVE_MS: u64 = 5 * super::HEARTBEAT_MS;

/// Kernels and the candidates to measure with them, as one job for one worker.
#[derive(Clone, Debug)]
pub struct QueueJob {
    /// The kernels' sources (after the target's prelude).
    pub kernels: Vec<KernelSource>,
    /// The candidates, each naming one of `kernels` by its symbol.
    pub candidates: Vec<Candidate>,
}

/// What became of one candidate of a job.
#[derive(Clone, Debug, PartialEq)]
pub enum QueueOutcome {
    /// Its kernel was built and it ran (or failed) as a local measurement would.
    Measured(Outcome),
    /// The worker's compiler rejected its kernel: the compiler's messages.
    Rejected(String),
    /// The worker's machine could not build or measure it (not the candidate's fault).
    Unavailable(String),
}

/// What the queue did for a client so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QueueStats {
    /// Jobs answered.
    pub jobs: usize,
    /// Candidates in them.
    pub candidates: usize,
    /// Seconds the client waited for them (from the first job put on the stream to
    /// the last result read, per call).
    pub wall_seconds: f64,
    /// Seconds the workers spent building their kernels.
    pub build_seconds: f64,
    /// Seconds the workers spent measuring.
    pub measure_seconds: f64,
    /// The workers that answered.
    pub workers: BTreeSet<String>,
}

impl QueueStats {
    /// With one worker: the client's wait per job beyond the worker's building and
    /// measuring (the queue's round trip, serialization, the worker's start of a job).
    pub fn overhead_per_job(&self) -> Option<f64> {
        (self.jobs > 0 && self.workers.len() == 1).then(|| {
            (self.wall_seconds - self.build_seconds - self.measure_seconds) / self.jobs as f64
        })
    }
}

/// A client of the work queue at a Redis URL: measures rounds of jobs on the workers
/// of its target.
#[derive(Clone, Debug)]
pub struct Queue {
    url: String,
    redis: redis::Client,
    name: String,
    /// Seconds to wait for a worker of the target before giving up (also when every
    /// worker went silent with jobs unanswered).
    pub wait_seconds: f64,
    next_id: Arc<AtomicU64>,
    stats: Arc<Mutex<QueueStats>>,
}

impl Queue {
    /// Connect to the queue at `url` (`redis://HOST:PORT`): the server must answer and
    /// be Redis 6.2 or later.
    pub fn connect(url: &str) -> Result<Queue> {
        let (redis, _) = connect(url)?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "host".into());
        Ok(Queue {
            url: url.to_string(),
            redis,
            name: format!("{host}-{}-{}", std::process::id(), now_ms()),
            wait_seconds: 60.0,
            next_id: Arc::default(),
            stats: Arc::default(),
        })
    }

    /// The queue's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the queue did for this client so far.
    pub fn stats(&self) -> QueueStats {
        self.stats.lock().expect("no panic holds it").clone()
    }

    /// Measure `jobs` on the workers of `target`, timing with `options`; `on_outcome`
    /// hears (job, candidate, outcome) as each job's result comes back, once per
    /// candidate whatever the workers did (a job whose worker dies is taken over by
    /// another). Fails where no worker of the target answers within
    /// [`Queue::wait_seconds`].
    pub fn measure<T: Target>(
        &self,
        target: &T,
        jobs: &[QueueJob],
        options: &MeasureOptions,
        on_outcome: &mut dyn FnMut(usize, usize, QueueOutcome),
    ) -> Result<()> {
        options.check()?;
        if jobs.is_empty() {
            return Ok(());
        }
        if T::DEVICE != DeviceKind::Cpu {
            return Err(MeasureError::Options(format!(
                "the work queue measures CPU kernels only, not {}'s",
                target.describe()
            )));
        }
        let target: CpuTarget =
            serde_json::from_value(serde_json::to_value(target).expect("targets serialize"))
                .expect("a CPU device's target is a CpuTarget");
        let url = &self.url;
        let fail = |e| unreachable(url, e);
        let mut con = self
            .redis
            .get_connection_with_timeout(Duration::from_secs(10))
            .map_err(fail)?;
        let fp = fingerprint(&target);
        let (results, alive) = (results_key(&self.name), client_key(&self.name));
        let refresh = |con: &mut redis::Connection| -> Result<()> {
            redis::cmd("SET")
                .arg(&alive)
                .arg(1)
                .arg("PX")
                .arg(CLIENT_TTL_MS)
                .query::<()>(con)
                .map_err(fail)
        };
        refresh(&mut con)?;
        self.await_worker(&mut con, &fp, &target)?;
        let start = Instant::now();
        let first = self.next_id.fetch_add(jobs.len() as u64, Ordering::Relaxed);
        for (n, job) in jobs.iter().enumerate() {
            let job = Job {
                id: first + n as u64,
                client: self.name.clone(),
                fingerprint: fp.clone(),
                target: target.clone(),
                kernels: job.kernels.clone(),
                candidates: job.candidates.clone(),
                options: options.clone(),
            };
            redis::cmd("XADD")
                .arg(jobs_key(&fp))
                .arg("*")
                .arg("job")
                .arg(serde_json::to_string(&job).expect("jobs serialize"))
                .query::<String>(&mut con)
                .map_err(fail)?;
        }
        let mut answered: BTreeSet<u64> = BTreeSet::new();
        let mut last = "0-0".to_string();
        let mut silent_since: Option<Instant> = None;
        while answered.len() < jobs.len() {
            refresh(&mut con)?;
            type Reply = Option<Vec<(String, Vec<(String, Vec<String>)>)>>;
            let reply: Reply = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(100)
                .arg("BLOCK")
                .arg(1000)
                .arg("STREAMS")
                .arg(&results)
                .arg(&last)
                .query(&mut con)
                .map_err(fail)?;
            let entries: Vec<(String, Vec<String>)> = reply
                .into_iter()
                .flatten()
                .flat_map(|(_, entries)| entries)
                .collect();
            if entries.is_empty() {
                // Nothing came: are there still workers to answer?
                let live = live_workers(&mut con, url, &fp)?;
                if live > 0 {
                    silent_since = None;
                } else if silent_since
                    .get_or_insert_with(Instant::now)
                    .elapsed()
                    .as_secs_f64()
                    > self.wait_seconds
                {
                    return Err(MeasureError::Queue(format!(
                        "no worker of {} has been heard from on {url} for {:.0} s, with {} of {} jobs unanswered: start one (`anyshape worker --queue {url}` on a machine of that CPU) and resume",
                        target.describe(),
                        self.wait_seconds,
                        jobs.len() - answered.len(),
                        jobs.len()
                    )));
                }
            }
            for (entry, fields) in entries {
                last = entry;
                let Some(result) = fields
                    .chunks(2)
                    .find(|kv| kv[0] == "result")
                    .and_then(|kv| kv.get(1))
                    .and_then(|json| serde_json::from_str::<JobResult>(json).ok())
                else {
                    tracing::warn!("the work queue holds an unreadable result; ignored");
                    continue;
                };
                let Some(n) = result.id.checked_sub(first).map(|n| n as usize) else {
                    continue; // an earlier call's
                };
                if n >= jobs.len() || !answered.insert(result.id) {
                    continue;
                }
                self.deliver(n, &jobs[n], &result, on_outcome);
            }
        }
        let _ = redis::cmd("DEL")
            .arg(&results)
            .arg(&alive)
            .query::<()>(&mut con);
        self.stats.lock().expect("no panic holds it").wall_seconds += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Hand one job's result to `on_outcome`, candidate by candidate, and count it.
    fn deliver(
        &self,
        n: usize,
        job: &QueueJob,
        result: &JobResult,
        on_outcome: &mut dyn FnMut(usize, usize, QueueOutcome),
    ) {
        for (c, cand) in job.candidates.iter().enumerate() {
            let outcome = if let Some(e) = result.rejected.get(&cand.symbol) {
                QueueOutcome::Rejected(e.clone())
            } else if let Some(e) = result.unavailable.get(&cand.symbol) {
                QueueOutcome::Unavailable(e.clone())
            } else {
                match result.outcomes.get(c).cloned().flatten() {
                    Some(o) => QueueOutcome::Measured(o),
                    None => QueueOutcome::Unavailable(format!(
                        "worker {} did not measure it",
                        result.worker
                    )),
                }
            };
            on_outcome(n, c, outcome);
        }
        let mut stats = self.stats.lock().expect("no panic holds it");
        stats.jobs += 1;
        stats.candidates += job.candidates.len();
        stats.build_seconds += result.build_seconds;
        stats.measure_seconds += result.measure_seconds;
        stats.workers.insert(result.worker.clone());
    }

    /// Wait until a worker of fingerprint `fp` is live, at most
    /// [`Queue::wait_seconds`]; the error names the workers the queue has instead.
    fn await_worker(
        &self,
        con: &mut redis::Connection,
        fp: &str,
        target: &CpuTarget,
    ) -> Result<()> {
        let start = Instant::now();
        let mut told = false;
        loop {
            if live_workers(con, &self.url, fp)? > 0 {
                return Ok(());
            }
            if start.elapsed().as_secs_f64() >= self.wait_seconds {
                let others: BTreeMap<String, usize> = workers(con, &self.url)?
                    .into_iter()
                    .filter(|(_, w)| now_ms().saturating_sub(w.seen_ms) < LIVE_MS)
                    .fold(BTreeMap::new(), |mut m, (_, w)| {
                        *m.entry(format!("{} with anyshape {}", w.target, w.anyshape))
                            .or_default() += 1;
                        m
                    });
                let others = if others.is_empty() {
                    "none".to_string()
                } else {
                    others
                        .iter()
                        .map(|(t, n)| format!("{n} of {t}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(MeasureError::Queue(format!(
                    "no worker of {} with anyshape {} on {} after {:.0} s (live workers: {others}); start one with `anyshape worker --queue {}` on a machine of that CPU",
                    target.describe(),
                    env!("CARGO_PKG_VERSION"),
                    self.url,
                    self.wait_seconds,
                    self.url
                )));
            }
            if !told {
                tracing::warn!(
                    "waiting for a worker of {} on {}",
                    target.describe(),
                    self.url
                );
                told = true;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// How many workers of fingerprint `fp` were heard from lately.
fn live_workers(con: &mut redis::Connection, url: &str, fp: &str) -> Result<usize> {
    let now = now_ms();
    Ok(workers(con, url)?
        .iter()
        .filter(|(_, w)| w.fingerprint == fp && now.saturating_sub(w.seen_ms) < LIVE_MS)
        .count())
}
