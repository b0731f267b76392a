//! The measuring side of the work queue: a worker takes its target's jobs a few at a
//! time (one per parallel compiler) — first any a silent worker left for longer than
//! the lease, then new ones — builds their kernels together, measures each job as a
//! local round would and posts its result while it still owns the job; a heartbeat
//! thread keeps its entry in the workers' hash and its claims on its jobs fresh.
use super::{
    client_key, connect, fingerprint, jobs_key, now_ms, results_key, unreachable, Job, JobResult,
    WorkerInfo, FINISH, GROUP, HEARTBEAT_MS, MAX_DELIVERIES, RENEW, RESULT_TTL, WORKERS,
};
use crate::{
    Builder, BuiltLibrary, KernelSource, MeasureError, Outcome, Result, Runner, WorkerCommand,
};
use anyshape_codegen::{CpuTarget, Target};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a queue worker runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Its name on the queue (unique among the queue's workers).
    pub name: String,
    /// The machine it measures on; it takes the jobs of this target only.
    pub target: CpuTarget,
    /// Builds the jobs' kernels (and caches them).
    pub builder: Builder,
    /// The isolated process that measures them.
    pub worker: WorkerCommand,
    /// Seconds a job may go without its worker's heartbeat before another worker
    /// takes it over.
    pub lease_seconds: f64,
}

/// What a queue worker is doing, for its log.
#[derive(Clone, Debug)]
pub enum ServeEvent {
    /// Connected and registered: the jobs stream it reads.
    Ready {
        /// The target's fingerprint.
        fingerprint: String,
        /// The target in words.
        target: String,
    },
    /// A job taken.
    Started {
        /// Its entry on the stream.
        entry: String,
        /// Kernels to build.
        kernels: usize,
        /// Candidates to measure.
        candidates: usize,
        /// Taken over from a worker that went silent.
        took_over: bool,
    },
    /// A job's result posted (`posted` false: another worker had taken it over).
    Finished {
        /// Its entry on the stream.
        entry: String,
        /// Seconds it took.
        seconds: f64,
        /// Whether its result went to the client.
        posted: bool,
    },
    /// A job dropped unanswered.
    Dropped {
        /// Its entry on the stream.
        entry: String,
        /// Why.
        why: String,
    },
}

/// Serve the queue at `url` until `stop` is set (checked between jobs and while
/// waiting for one): take the jobs of `options.target`, build and measure them, post
/// their results. A connection lost fails the call.
pub fn serve(
    url: &str,
    options: &ServeOptions,
    stop: &AtomicBool,
    on_event: &mut dyn FnMut(ServeEvent),
) -> Result<()> {
    let long_enough = options.lease_seconds.is_finite()
        && options.lease_seconds * 1000.0 >= 3.0 * HEARTBEAT_MS as f64;
    if !long_enough {
        return Err(MeasureError::Options(format!(
            "a lease of {} s: need at least {} s (three heartbeats)",
            options.lease_seconds,
            3 * HEARTBEAT_MS / 1000
        )));
    }
    let (redis, mut con) = connect(url)?;
    let fail = |e| unreachable(url, e);
    let fp = fingerprint(&options.target);
    let key = jobs_key(&fp);
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&key)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query(&mut con);
    if let Err(e) = created {
        if e.code() != Some("BUSYGROUP") {
            return Err(fail(e));
        }
    }
    let current: Arc<Mutex<Vec<String>>> = Arc::default();
    let info = WorkerInfo {
        fingerprint: fp.clone(),
        target: options.target.describe(),
        anyshape: env!("CARGO_PKG_VERSION").to_string(),
        seen_ms: 0,
    };
    let beat = |con: &mut redis::Connection| -> redis::RedisResult<()> {
        let info = WorkerInfo {
            seen_ms: now_ms(),
            ..info.clone()
        };
        redis::cmd("HSET")
            .arg(WORKERS)
            .arg(&options.name)
            .arg(serde_json::to_string(&info).expect("infos serialize"))
            .query(con)
    };
    beat(&mut con).map_err(fail)?;
    on_event(ServeEvent::Ready {
        fingerprint: fp.clone(),
        target: options.target.describe(),
    });
    let done = AtomicBool::new(false);
    let lease_ms = (options.lease_seconds * 1000.0) as u64;
    let result = std::thread::scope(|scope| {
        // The heartbeat: the worker's entry, and its claim on the job it measures.
        let heart = scope.spawn(|| -> Result<()> {
            let mut con = redis
                .get_connection_with_timeout(Duration::from_secs(10))
                .map_err(fail)?;
            let renew = redis::Script::new(RENEW);
            while !done.load(Ordering::Relaxed) {
                beat(&mut con).map_err(fail)?;
                let held = current.lock().expect("no panic holds it").clone();
                for entry in held {
                    let owned: i64 = renew
                        .key(&key)
                        .arg(GROUP)
                        .arg(&entry)
                        .arg(&options.name)
                        .invoke(&mut con)
                        .map_err(fail)?;
                    if owned == 0 {
                        tracing::warn!("job {entry} was taken over by another worker");
                    }
                }
                let next = Instant::now() + Duration::from_millis(HEARTBEAT_MS);
                while Instant::now() < next && !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            Ok(())
        });
        let served = take_jobs(
            &mut con, url, options, &key, lease_ms, stop, &current, on_event,
        );
        done.store(true, Ordering::Relaxed);
        let beats = heart.join().expect("the heartbeat does not panic");
        served.and(beats)
    });
    let _ = redis::cmd("HDEL")
        .arg(WORKERS)
        .arg(&options.name)
        .query::<()>(&mut con);
    result
}

/// A stream entry: its id and its fields and values in turn.
type Entry = (String, Vec<String>);

/// A job taken, ready to measure.
struct Taken {
    entry: String,
    job: Job,
    /// How many times the queue has handed it out.
    deliveries: i64,
    started: Instant,
}

/// The worker's loop: up to one job per parallel compiler at a time — those silent
/// workers left first, then new ones — built together, then measured and answered one
/// by one, until `stop`.
#[allow(clippy::too_many_arguments)]
fn take_jobs(
    con: &mut redis::Connection,
    url: &str,
    options: &ServeOptions,
    key: &str,
    lease_ms: u64,
    stop: &AtomicBool,
    current: &Mutex<Vec<String>>,
    on_event: &mut dyn FnMut(ServeEvent),
) -> Result<()> {
    let fail = |e| unreachable(url, e);
    let finish = redis::Script::new(FINISH);
    let batch = options.builder.jobs.max(1);
    while !stop.load(Ordering::Relaxed) {
        // XAUTOCLAIM: [next start, [[entry, [field, value, ...]], ...], [deleted, ...]].
        type Claimed = (String, Vec<Entry>, Vec<String>);
        let (_, stale, _): Claimed = redis::cmd("XAUTOCLAIM")
            .arg(key)
            .arg(GROUP)
            .arg(&options.name)
            .arg(lease_ms)
            .arg("0-0")
            .arg("COUNT")
            .arg(batch)
            .query(con)
            .map_err(fail)?;
        let mut entries: Vec<(Entry, bool)> = stale.into_iter().map(|e| (e, true)).collect();
        if entries.len() < batch {
            let mut read = redis::cmd("XREADGROUP");
            read.arg("GROUP")
                .arg(GROUP)
                .arg(&options.name)
                .arg("COUNT")
                .arg(batch - entries.len());
            if entries.is_empty() {
                read.arg("BLOCK").arg(1000);
            }
            type Reply = Option<Vec<(String, Vec<Entry>)>>;
            let reply: Reply = read
                .arg("STREAMS")
                .arg(key)
                .arg(">")
                .query(con)
                .map_err(fail)?;
            entries.extend(
                reply
                    .into_iter()
                    .flatten()
                    .flat_map(|(_, e)| e)
                    .map(|e| (e, false)),
            );
        }
        if entries.is_empty() {
            continue;
        }
        *current.lock().expect("no panic holds it") =
            entries.iter().map(|((id, _), _)| id.clone()).collect();
        let mut taken = Vec::new();
        for ((entry, fields), took_over) in entries {
            if let Some(t) = take(con, url, key, entry, &fields, took_over, on_event)? {
                taken.push(t);
            }
        }
        // Every kernel of the batch in one build (the builder compiles in parallel),
        // each once: jobs of a vote round share their candidates.
        let mut kernels: Vec<KernelSource> = Vec::new();
        for k in taken.iter().flat_map(|t| &t.job.kernels) {
            if !kernels.iter().any(|have| have.symbol == k.symbol) {
                kernels.push(k.clone());
            }
        }
        let t0 = Instant::now();
        let lib = options.builder.build(&options.target, &kernels);
        let build_seconds = t0.elapsed().as_secs_f64() / taken.len().max(1) as f64;
        for t in taken {
            let result = measure(options, &t, lib.as_ref(), build_seconds)?;
            let posted: i64 = finish
                .key(key)
                .key(results_key(&t.job.client))
                .arg(GROUP)
                .arg(&t.entry)
                .arg(&options.name)
                .arg(serde_json::to_string(&result).expect("results serialize"))
                .arg(RESULT_TTL)
                .invoke(con)
                .map_err(fail)?;
            current
                .lock()
                .expect("no panic holds it")
                .retain(|id| *id != t.entry);
            on_event(ServeEvent::Finished {
                entry: t.entry,
                seconds: t.started.elapsed().as_secs_f64(),
                posted: posted == 1,
            });
        }
        current.lock().expect("no panic holds it").clear();
    }
    Ok(())
}

/// Read a job off its entry; `None` where it is dropped unanswered (unreadable, or its
/// client is gone), acknowledged so that nobody takes it again.
fn take(
    con: &mut redis::Connection,
    url: &str,
    key: &str,
    entry: String,
    fields: &[String],
    took_over: bool,
    on_event: &mut dyn FnMut(ServeEvent),
) -> Result<Option<Taken>> {
    let fail = |e| unreachable(url, e);
    let job = fields
        .chunks(2)
        .find(|kv| kv[0] == "job")
        .and_then(|kv| kv.get(1))
        .ok_or_else(|| "no job field".to_string())
        .and_then(|json| serde_json::from_str::<Job>(json).map_err(|e| e.to_string()));
    let why = match &job {
        Err(e) => Some(format!("unreadable ({e})")),
        Ok(job) => {
            let waiting: i64 = redis::cmd("EXISTS")
                .arg(client_key(&job.client))
                .query(con)
                .map_err(fail)?;
            (waiting == 0).then(|| format!("its client {} is gone", job.client))
        }
    };
    if let Some(why) = why {
        redis::pipe()
            .cmd("XACK")
            .arg(key)
            .arg(GROUP)
            .arg(&entry)
            .cmd("XDEL")
            .arg(key)
            .arg(&entry)
            .query::<()>(con)
            .map_err(fail)?;
        on_event(ServeEvent::Dropped { entry, why });
        return Ok(None);
    }
    let job = job.expect("checked above");
    // [[entry, consumer, idle ms, deliveries]]
    let pending: Vec<(String, String, i64, i64)> = redis::cmd("XPENDING")
        .arg(key)
        .arg(GROUP)
        .arg(&entry)
        .arg(&entry)
        .arg(1)
        .query(con)
        .map_err(fail)?;
    on_event(ServeEvent::Started {
        entry: entry.clone(),
        kernels: job.kernels.len(),
        candidates: job.candidates.len(),
        took_over,
    });
    Ok(Some(Taken {
        entry,
        job,
        deliveries: pending.first().map_or(1, |p| p.3),
        started: Instant::now(),
    }))
}

/// Measure a taken job with the batch's library (its build's share of the time
/// given): its result.
fn measure(
    options: &ServeOptions,
    taken: &Taken,
    lib: std::result::Result<&BuiltLibrary, &MeasureError>,
    build_seconds: f64,
) -> Result<JobResult> {
    let job = &taken.job;
    let mut result = JobResult {
        id: job.id,
        worker: options.name.clone(),
        rejected: BTreeMap::new(),
        unavailable: BTreeMap::new(),
        outcomes: vec![None; job.candidates.len()],
        build_seconds,
        measure_seconds: 0.0,
    };
    let everything = |why: String| -> BTreeMap<String, String> {
        job.kernels
            .iter()
            .map(|k| (k.symbol.clone(), why.clone()))
            .collect()
    };
    if job.fingerprint != fingerprint(&options.target) || job.target != options.target {
        result.unavailable = everything(format!(
            "worker {} measures {}, not {}",
            options.name,
            options.target.describe(),
            job.target.describe()
        ));
        return Ok(result);
    }
    if taken.deliveries > MAX_DELIVERIES {
        let why = format!(
            "taken up {} times by the queue's workers, and each died measuring it",
            taken.deliveries
        );
        result.outcomes = vec![Some(Outcome::Failed(why)); job.candidates.len()];
        return Ok(result);
    }
    let lib = match lib {
        Err(e) => {
            result.unavailable = everything(e.to_string());
            return Ok(result);
        }
        Ok(lib) => lib,
    };
    for k in &job.kernels {
        if let Some(e) = lib.failed.get(&k.symbol) {
            result.rejected.insert(k.symbol.clone(), e.clone());
        }
        if let Some(e) = lib.unavailable.get(&k.symbol) {
            result.unavailable.insert(k.symbol.clone(), e.clone());
        }
    }
    let built: Vec<usize> = (0..job.candidates.len())
        .filter(|&c| {
            let s = &job.candidates[c].symbol;
            !lib.failed.contains_key(s) && !lib.unavailable.contains_key(s)
        })
        .collect();
    let runner = Runner {
        worker: options.worker.clone(),
        options: job.options.clone(),
    };
    let t0 = Instant::now();
    let cands: Vec<_> = built.iter().map(|&c| job.candidates[c].clone()).collect();
    let outcomes = runner.measure(&lib.kernels(), &cands)?;
    for (c, o) in built.into_iter().zip(outcomes) {
        result.outcomes[c] = Some(o);
    }
    result.measure_seconds = t0.elapsed().as_secs_f64();
    Ok(result)
}
