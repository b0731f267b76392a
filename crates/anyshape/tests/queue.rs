//! Measurement through a work queue, on loopback: a real Redis server started by the
//! test, two `anyshape worker`s, and a `tune --queue` whose jobs they share. One worker
//! is killed in the middle of a job: the other takes it over after the lease, every
//! job is measured to the end exactly once (the workers' logs against the client's
//! count), and the records hold the whole budget, no trial twice and none transient.
//! A tune whose target has no worker fails with a clear error instead of waiting
//! forever. Needs `redis-server` (scripts/setup.sh installs it).
use anyshape_codegen::{ContractionKernel, CpuTarget};
use anyshape_tune::{Record, RecordLog};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_anyshape");

/// A Redis server on a free loopback port, stopped when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// A server of its own on a free port: two tests starting servers at once may be
    /// handed the same free port, so the one that answers must be this one (its `dir`).
    fn start(dir: &Path) -> Server {
        for _ in 0..20 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server runs (scripts/setup.sh installs it: apt-get install redis-server)");
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(20) {
                if child.try_wait().unwrap().is_some() {
                    break; // the port was taken meanwhile: another one
                }
                if serves(port, dir) {
                    return Server {
                        child,
                        url: format!("redis://127.0.0.1:{port}"),
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not start");
    }
}

/// Whether the Redis server on `port` is the one working in `dir`.
fn serves(port: u16, dir: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut reply = [0u8; 4096];
    s.write_all(b"CONFIG GET dir\r\n").is_ok()
        && s.read(&mut reply).is_ok_and(|n| {
            let canonical = dir.canonicalize().unwrap_or(dir.to_path_buf());
            String::from_utf8_lossy(&reply[..n]).contains(&*canonical.to_string_lossy())
        })
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A queue worker whose log lines arrive on a channel.
struct Worker {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// The lines read so far.
    seen: std::cell::RefCell<Vec<String>>,
}

impl Worker {
    /// Start one and wait until it is registered on the queue.
    fn start(url: &str, name: &str, cache: &Path, extra: &[&str]) -> Worker {
        let mut child = Command::new(BIN)
            .args(["worker", "--queue", url, "--name", name, "--lease", "6"])
            .arg("--cache-dir")
            .arg(cache)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let w = Worker {
            child,
            lines,
            seen: Default::default(),
        };
        if w.next(|l| l.contains("measuring for")).is_none() {
            panic!("the worker {name} did not start: {:?}", w.seen.borrow());
        }
        w
    }

    /// The next line that `pick` accepts, within two minutes.
    fn next(&self, pick: impl Fn(&str) -> bool) -> Option<String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(l) = self.lines.recv_timeout(left) else {
                return None;
            };
            self.seen.borrow_mut().push(l.clone());
            if pick(&l) {
                return Some(l);
            }
        }
        None
    }

    /// Every line of its log, once the process ends (after it is stopped).
    fn log(&self) -> Vec<String> {
        let mut all = self.seen.borrow().clone();
        all.extend(self.lines.iter());
        all
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

/// The job entry a worker's log line names (`job ENTRY: ...`).
fn entry(line: &str) -> String {
    line.strip_prefix("job ")
        .and_then(|l| l.split(':').next())
        .unwrap_or_default()
        .to_string()
}

fn tune(url: &str, dir: &Path, wait: &str) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["tune", "-w", "dense(M=T,N=48,K=64)", "--range", "T=1..24"])
        .args(["--trials", "32", "--batch", "4", "--quiet", "--no-db"])
        .args(["--records", "r.jsonl", "--out", "m", "--queue", url])
        .args(["--queue-wait", wait])
        .arg("--cache-dir")
        .arg(dir.join("client-cache"))
        .current_dir(dir);
    cmd
}

#[test]
fn a_worker_killed_mid_job_loses_nothing_and_measures_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut a = Worker::start(&server.url, "a", &dir.path().join("cache-a"), &[]);
    let b = Worker::start(&server.url, "b", &dir.path().join("cache-b"), &[]);
    let client = tune(&server.url, dir.path(), "60")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Worker a's second job: frozen the moment it starts (so it cannot post), then
    // killed.
    let started = |l: &str| l.starts_with("job ") && l.contains("kernel(s)");
    a.next(started).expect("worker a took a job");
    let second = a.next(started).expect("worker a took a second job");
    signal(&a.child, "-STOP");
    signal(&a.child, "-KILL");
    let killed = entry(&second);
    let out = client.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tune failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(a.child.wait());
    let a_log = a.log();
    signal(&b.child, "-TERM");
    let b_log = b.log();
    // Every job measured to the end once: a's finished ones and b's, each entry once,
    // as many as the client counted; the killed one finished by b, taken over.
    let done: Vec<String> = a_log
        .iter()
        .chain(&b_log)
        .filter(|l| l.contains(": done in"))
        .map(|l| entry(l))
        .collect();
    let mut count = BTreeMap::new();
    for e in &done {
        *count.entry(e.clone()).or_insert(0) += 1;
    }
    assert!(
        count.values().all(|&n| n == 1),
        "a job finished twice: {count:?}"
    );
    assert!(
        !a_log
            .iter()
            .any(|l| entry(l) == killed && l.contains("done")),
        "worker a finished the job it was killed in: {a_log:?}"
    );
    assert!(
        b_log
            .iter()
            .any(|l| entry(l) == killed && l.contains("taken over")),
        "worker b did not take over {killed}: {b_log:?}"
    );
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("work queue"))
        .expect("tune reports the queue");
    let jobs: usize = summary
        .split(": ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a job count");
    assert_eq!(done.len(), jobs, "{summary}");
    assert!(summary.contains("by 2 worker(s)"), "{summary}");
    // The records: the whole budget, no search trial twice, none transient, the votes
    // within their re-timings.
    let (log, records): (_, Vec<Record<ContractionKernel, CpuTarget>>) =
        RecordLog::open(&dir.path().join("r.jsonl"), true).unwrap();
    assert!(log.invalid().is_empty());
    assert_eq!(records.iter().filter(|r| !r.vote).count(), 32);
    let transient: Vec<_> = records.iter().filter(|r| r.is_transient()).collect();
    assert!(transient.is_empty(), "{:?}", transient.first());
    let mut seen = BTreeMap::new();
    let most = anyshape_tune::VoteOptions::default().most_measurements();
    for r in &records {
        let n = seen
            .entry((r.micro_kernel, r.bindings.clone(), r.round))
            .or_insert(0);
        *n += 1;
        assert!(*n <= if r.vote { most } else { 1 }, "measured twice: {r:?}");
    }
    // The module the queue's measurements chose runs and checks.
    let run = Command::new(BIN)
        .args(["run", "--module", "m", "--set", "T=13", "--check"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[test]
fn no_worker_of_the_target_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    // A worker of another target is no help.
    let mut other = CpuTarget::detect();
    other.cores += 1;
    let target = dir.path().join("other.json");
    std::fs::write(&target, serde_json::to_string(&other).unwrap()).unwrap();
    let _w = Worker::start(
        &server.url,
        "other",
        &dir.path().join("cache-other"),
        &["--target", target.to_str().unwrap()],
    );
    let start = Instant::now();
    let out = tune(&server.url, dir.path(), "3").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(start.elapsed() < Duration::from_secs(60));
    assert!(stderr.contains("no worker of"), "{stderr}");
    assert!(stderr.contains("1 of"), "names the worker it has: {stderr}");
    assert!(stderr.contains("anyshape worker --queue"), "{stderr}");
    // An address that is not a Redis server's, and one that is not an address.
    let bad = tune("redis://127.0.0.1:1", dir.path(), "3")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("work queue"));
    let bad = tune("http://example.com", dir.path(), "3")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--queue"));
}
