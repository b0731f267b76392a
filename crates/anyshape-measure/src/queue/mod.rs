//! Measurement spread over machines through a work queue: Redis streams with a
//! consumer group. A tuning process ([`Queue`], `client.rs`) puts each round's jobs —
//! kernels' C sources and the instances to measure them on — on the stream of its
//! target; workers on machines of that target ([`serve`], `serve.rs`; `anyshape worker
//! --queue URL`) take them one at a time, build and measure them as a local round
//! would (the builder, the runner's isolated worker) and answer on the client's result
//! stream. The search process stays the only writer of the records, appending each
//! result as it comes back, so a killed compile resumes from them as ever.
//!
//! Delivery: a job stays in the group's pending list until its result is posted; the
//! result and the acknowledgement are one server-side script that runs only while the
//! worker still owns the job, so each job is answered once. A worker renews its claim
//! while it measures; a job whose worker went silent for the lease is taken over by
//! another ([`MAX_DELIVERIES`] at most, then it fails as the candidates' fault).
//!
//! Keys (one Redis server may serve many clients and targets):
//! `anyshape:jobs:<fingerprint>` (a stream, group `workers`), `anyshape:results:<client>`
//! (a stream, expiring a day after its last result), `anyshape:clients:<client>`
//! (present while the client waits), `anyshape:workers` (a hash: worker → its
//! [`WorkerInfo`]).
mod client;
mod serve;

pub use client::{Queue, QueueJob, QueueOutcome, QueueStats};
pub use serve::{serve, ServeEvent, ServeOptions};

use crate::{Candidate, KernelSource, MeasureError, MeasureOptions, Outcome, Result};
use anyshape_codegen::CpuTarget;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The consumer group of every jobs stream.
const GROUP: &str = "workers";
/// The hash of workers and their last heartbeats.
const WORKERS: &str = "anyshape:workers";
/// How many times a job is handed out before it fails (its workers died each time).
pub const MAX_DELIVERIES: i64 = 3;
/// Milliseconds between a worker's heartbeats (its entry in the workers' hash and its
/// claim on the job it measures renewed).
const HEARTBEAT_MS: u64 = 2_000;
/// Seconds a result stream outlives its last result (a client that died leaves it).
const RESULT_TTL: u64 = 24 * 3600;

/// The stream of jobs for machines of one target.
fn jobs_key(fingerprint: &str) -> String {
    format!("anyshape:jobs:{fingerprint}")
}

/// A client's result stream.
fn results_key(client: &str) -> String {
    format!("anyshape:results:{client}")
}

/// The key that is present while a client waits for its results.
fn client_key(client: &str) -> String {
    format!("anyshape:clients:{client}")
}

/// What a job's measurements depend on besides its sources: the target (every field:
/// the kernels' threads, vectors and tiles were chosen for it) and anyshape's version
/// (the prelude, the kernel ABI, the worker protocol). Jobs go only to workers of the
/// same fingerprint.
pub fn fingerprint(target: &CpuTarget) -> String {
    let json = serde_json::to_string(target).expect("targets serialize");
    let digest = Sha256::digest(format!("{}|{json}", env!("CARGO_PKG_VERSION")).as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// One job on the queue: kernels to build for `target` and candidates to measure
/// with them, answered on `client`'s result stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Job {
    /// The client's number for it.
    id: u64,
    /// Who waits for it.
    client: String,
    /// The target it is for ([`fingerprint`]).
    fingerprint: String,
    /// The target itself (a worker checks it against its own).
    target: CpuTarget,
    /// The kernels (after the target's prelude).
    kernels: Vec<KernelSource>,
    /// The candidates, each naming one of `kernels` by its symbol.
    candidates: Vec<Candidate>,
    /// How to time them.
    options: MeasureOptions,
}

/// A job's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct JobResult {
    /// The job's number.
    id: u64,
    /// The worker that measured it.
    worker: String,
    /// Kernel symbol → the compiler's messages, for kernels the compiler rejected.
    rejected: BTreeMap<String, String>,
    /// Kernel symbol → what happened, for kernels the worker's machine could not build.
    unavailable: BTreeMap<String, String>,
    /// One per candidate, in order; none where its kernel was not built.
    outcomes: Vec<Option<Outcome>>,
    /// Seconds the worker spent building.
    build_seconds: f64,
    /// Seconds it spent measuring.
    measure_seconds: f64,
}

/// What a worker tells the queue of itself, refreshed with each heartbeat.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// The jobs it takes ([`fingerprint`]).
    pub fingerprint: String,
    /// Its target's name and cores, for messages.
    pub target: String,
    /// anyshape's version.
    pub anyshape: String,
    /// Its last heartbeat, milliseconds since the Unix epoch.
    pub seen_ms: u64,
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Open a connection to the queue's server at `url` (`redis://host:port[/db]`),
/// checking that it is a Redis of version 6.2 or later (streams with `XAUTOCLAIM`).
fn connect(url: &str) -> Result<(redis::Client, redis::Connection)> {
    let client = redis::Client::open(url)
        .map_err(|e| MeasureError::QueueUrl(format!("{url}: {e} (expected redis://HOST:PORT)")))?;
    let mut con = client
        .get_connection_with_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| unreachable(url, e))?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut con)
        .map_err(|e| unreachable(url, e))?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("0")
        .trim()
        .to_string();
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap_or(0)).collect();
    if (
        parts.first().copied().unwrap_or(0),
        parts.get(1).copied().unwrap_or(0),
    ) < (6, 2)
    {
        return Err(MeasureError::Queue(format!(
            "{url} runs Redis {version}; the work queue needs 6.2 or later (XAUTOCLAIM)"
        )));
    }
    Ok((client, con))
}

/// The error of a server that cannot be reached or answered wrongly.
fn unreachable(url: &str, e: redis::RedisError) -> MeasureError {
    MeasureError::Queue(format!("the work queue at {url}: {e}"))
}

/// The workers the queue knows of: name and what each last said.
fn workers(con: &mut redis::Connection, url: &str) -> Result<Vec<(String, WorkerInfo)>> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(WORKERS)
        .query(con)
        .map_err(|e| unreachable(url, e))?;
    Ok(all
        .into_iter()
        .filter_map(|(name, json)| Some((name, serde_json::from_str(&json).ok()?)))
        .collect())
}

/// Post a job's result and acknowledge it, only while `worker` owns it (a job taken
/// over by another worker is answered by that one): KEYS jobs, results; ARGV group,
/// entry, worker, result, time to live. Returns 1 if posted.
const FINISH: &str = r"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 or p[1][2] ~= ARGV[3] then return 0 end
redis.call('XADD', KEYS[2], '*', 'result', ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
";

/// Renew `worker`'s claim on a job (its idle time back to 0) if it still owns it:
/// KEYS jobs; ARGV group, entry, worker. Returns 1 if renewed.
const RENEW: &str = r"
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #p == 0 or p[1][2] ~= ARGV[3] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[3], 0, ARGV[2], 'JUSTID')
return 1
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_tells_targets_apart() {
        let a = CpuTarget::detect();
        let mut b = a.clone();
        b.cores += 1;
        assert_eq!(fingerprint(&a), fingerprint(&a.clone()));
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a).len(), 16);
    }

    #[test]
    fn a_bad_url_is_the_users_error() {
        let Err(e) = connect("http://nowhere") else {
            panic!("an http URL opened a work queue");
        };
        assert!(matches!(e, MeasureError::QueueUrl(_)), "{e}");
    }
}
