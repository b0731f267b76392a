//! Crash consistency: a real `anyshape tune … --records R --resume --out M` killed with
//! SIGKILL at random moments, many times. After every kill the records are whole
//! records (a valid prefix of the run), hold every trial the run had reported and no
//! trial twice; `M` holds the old module or the new one, complete (it loads, its
//! checksums match); and resuming finishes the budget, measuring nothing twice.
//!
//! Likewise a model's `run --output`: killed at random moments, its output path holds
//! the previous file or the new outputs, whole, and the next run removes what the
//! killed one left.
//!
//! `ANYSHAPE_CRASH_RUNS` sets the number of killed runs (default 20).
mod support;

use anyshape_codegen::{ContractionKernel, CpuTarget};
use anyshape_runtime::Module;
use anyshape_tune::{Record, RecordLog};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

const W: &str = "dense(M=T,N=16,K=16)";

fn tune(dir: &Path, cache: &Path, trials: &str, seed: u64) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_anyshape"));
    cmd.args([
        "tune",
        "-w",
        W,
        "--range",
        "T=1..4",
        "--batch",
        "2",
        "--quiet",
        "--trials",
        trials,
        "--records",
        "R",
        "--resume",
        "--out",
        "M",
        "--seed",
    ])
    .arg(seed.to_string())
    .current_dir(dir)
    .env("ANYSHAPE_CACHE", cache)
    .env("RUST_BACKTRACE", "0");
    cmd
}

fn records(dir: &Path) -> Vec<Record<ContractionKernel, CpuTarget>> {
    let (log, records) =
        RecordLog::open(&dir.join("R"), true).expect("the records are whole records");
    assert!(log.invalid().is_empty(), "{:?}", log.invalid());
    let mut seen = std::collections::BTreeMap::new();
    for r in &records {
        // A vote round may measure a pair the search measured: distinct rounds.
        let n = seen
            .entry((r.micro_kernel, r.bindings.clone(), r.round))
            .or_insert(0);
        *n += 1;
        assert!(*n <= most_times(r.vote), "a trial recorded twice: {r:?}");
    }
    records
}

/// How many times one micro-kernel may be measured on one instance in one round: once in
/// a search round; in a vote round, once more for each re-timing.
fn most_times(vote: bool) -> usize {
    if vote {
        anyshape_tune::VoteOptions::default().most_measurements()
    } else {
        1
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A run in progress, its standard error read as it comes.
struct Run {
    child: std::process::Child,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
    building: std::sync::mpsc::Receiver<()>,
    reader: std::thread::JoinHandle<()>,
}

impl Run {
    fn start(mut cmd: Command) -> Run {
        use std::io::{BufRead, BufReader};
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pipe = child.stderr.take().unwrap();
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, building) = std::sync::mpsc::channel();
        let text = stderr.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if line.contains("module: building") {
                    let _ = tx.send(());
                }
                let mut t = text.lock().unwrap();
                t.push_str(&line);
                t.push('\n');
            }
        });
        Run {
            child,
            stderr,
            building,
            reader,
        }
    }

    /// Wait until the run builds its module; false if it ended first.
    fn until_building(&self) -> bool {
        self.building
            .recv_timeout(std::time::Duration::from_secs(300))
            .is_ok()
    }

    /// Whether it is still running.
    fn child_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Kill it (SIGKILL) unless it ended: whether it had ended, and its standard error.
    fn kill(mut self) -> (bool, String) {
        let done = self.child.try_wait().unwrap().is_some();
        self.child.kill().ok();
        self.child.wait().unwrap();
        self.reader.join().unwrap();
        let text = self.stderr.lock().unwrap().clone();
        (done, text)
    }
}

/// The trial count of the last progress line a run printed.
fn last_reported(stderr: &str) -> usize {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.split_once("trials ")?.1;
            rest.split('/').next()?.trim().parse().ok()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn killed_at_random_moments_nothing_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let runs: u64 = std::env::var("ANYSHAPE_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    // The old module and its records: what every killed run starts from.
    let base = tmp.path().join("base");
    std::fs::create_dir(&base).unwrap();
    let o = tune(&base, &cache, "6", 0).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let old_checksum = Module::load(base.join("M"))
        .unwrap()
        .manifest()
        .checksum
        .clone();
    let base_records = records(&base).len();
    // How long an unkilled run takes (search, votes, module build and swap).
    let probe = tmp.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    std::fs::copy(base.join("R"), probe.join("R")).unwrap();
    copy_dir(&base.join("M"), &probe.join("M"));
    let t0 = Instant::now();
    let mut probe_run = Run::start(tune(&probe, &cache, "24", 1000));
    assert!(probe_run.until_building());
    let build_started = t0.elapsed();
    while probe_run.child_running() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let full = t0.elapsed();
    let build = full - build_started;
    let (ended, probe_err) = probe_run.kill();
    assert!(ended, "{probe_err}");
    assert_ne!(
        Module::load(probe.join("M")).unwrap().manifest().checksum,
        old_checksum,
        "the run writes a new module"
    );

    let (mut old_kept, mut new_in_place, mut finished, mut lost) = (0, 0, 0, 0);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for run in 0..runs {
        let dir = tmp.path().join(format!("run{run}"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::copy(base.join("R"), dir.join("R")).unwrap();
        copy_dir(&base.join("M"), &dir.join("M"));
        // A kill moment spread over the whole run (even runs), or over the module's
        // build (odd runs): its kernels compiled, its files written beside the old
        // module, swapped in, and the end of the run.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let u = (state % 1000) as f64 / 1000.0;
        let child = Run::start(tune(&dir, &cache, "24", run + 1));
        let t0 = Instant::now();
        if run % 2 == 0 {
            std::thread::sleep(full.mul_f64(1.1 * u));
        } else {
            child.until_building();
            std::thread::sleep(build.mul_f64(1.1 * u));
        }
        let at = t0.elapsed();
        let (done, stderr) = child.kill();
        let have = records(&dir);
        let reported = last_reported(&stderr);
        if have.len() < base_records.max(reported) {
            lost += 1;
        }
        assert!(
            have.len() >= base_records.max(reported),
            "run {run} killed at {at:?}: {} records, {reported} reported, {base_records} before",
            have.len()
        );
        let module = Module::load(dir.join("M")).unwrap_or_else(|e| {
            panic!("run {run} killed at {at:?}: the module at M is broken: {e}")
        });
        if done {
            finished += 1;
        } else if module.manifest().checksum == old_checksum {
            old_kept += 1;
        } else {
            new_in_place += 1;
        }
        // Every third run is resumed to the end: the budget completes, nothing twice,
        // and what the killed run left beside M is cleaned up.
        if run % 3 == 0 {
            let o = tune(&dir, &cache, "24", run + 1).output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let n = records(&dir).len();
            assert!(n >= 24, "the budget completes: {n} records");
            Module::load(dir.join("M")).unwrap();
            let leftovers: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".M."))
                .collect();
            assert!(leftovers.is_empty(), "{leftovers:?}");
        }
    }
    eprintln!(
        "crash consistency: {runs} runs killed at random moments over {:.1} s: module kept old {old_kept}, new in place {new_in_place}, finished before the kill {finished}; lost records {lost}, broken modules 0",
        full.as_secs_f64()
    );
}

/// Every records file of a model's compile (`dir/rec/tNN.jsonl`): its lines, each a
/// whole JSON record, no trial twice.
fn model_records(dir: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut files = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(dir.join("rec")).unwrap() {
        let path = e.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut seen = std::collections::BTreeMap::new();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        for l in &lines {
            let r: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{}: not a whole record ({e}): {l}", path.display()));
            let key = format!("{} {} {}", r["micro_kernel"], r["bindings"], r["round"]);
            let n = seen.entry(key).or_insert(0);
            *n += 1;
            assert!(
                *n <= most_times(r["vote"] == true),
                "{}: a trial recorded twice: {l}",
                path.display()
            );
        }
        files.insert(path.file_name().unwrap().to_string_lossy().into(), lines);
    }
    files
}

/// A tuned model compile killed (SIGKILL) in the middle of its scheduled search: its
/// records are whole, and the resumed compile keeps every one of them, measures none
/// twice, gives out the rest of the budget (a scheduler line per slice, with the
/// model's expected latency) and writes a module that runs the recorded cases right.
#[test]
fn a_killed_model_compile_resumes_from_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let onnx = models.join("bert_tiny.dynamo.onnx");
    let compile = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_anyshape"));
        cmd.arg("compile")
            .arg(&onnx)
            .args([
                "--dim",
                "batch=1",
                "--dim",
                "sequence=1..16",
                "--trials",
                "8",
            ])
            .args([
                "--tune-values",
                "4",
                "--records",
                "rec",
                "--resume",
                "--out",
                "m",
            ])
            .current_dir(dir.path())
            .env("ANYSHAPE_CACHE", &cache)
            .env("RUST_BACKTRACE", "0");
        cmd
    };
    let mut run = Run::start(compile());
    let start = Instant::now();
    // Records so far (whole lines; the run may be writing one).
    let lines = |d: &Path| -> usize {
        std::fs::read_dir(d.join("rec")).map_or(0, |files| {
            files
                .map(|e| std::fs::read(e.unwrap().path()).unwrap_or_default())
                .map(|b| b.iter().filter(|&&c| c == b'\n').count())
                .sum()
        })
    };
    while run.child_running() && lines(dir.path()) < 30 {
        assert!(start.elapsed().as_secs() < 300, "no progress");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (done, stderr) = run.kill();
    assert!(!done, "the compile ended before the kill: {stderr}");
    let before = model_records(dir.path());
    let o = compile().output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("scheduler: done") && err.contains("expected model latency"),
        "{err}"
    );
    let after = model_records(dir.path());
    for (file, lines) in &before {
        assert!(
            after[file].starts_with(lines),
            "{file}: the resumed compile lost records"
        );
    }
    for case in ["s1", "s37"] {
        let npz = models.join(format!("bert_tiny.dynamo.{case}.npz"));
        let o = Command::new(env!("CARGO_BIN_EXE_anyshape"))
            .args(["run", "--module", "m", "--seconds", "0", "--inputs"])
            .arg(&npz)
            .current_dir(dir.path())
            .env("ANYSHAPE_CACHE", &cache)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("max relative error"),
            "{case}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// `anyshape run --module M --output out.npz` killed with SIGKILL at random moments of
/// its run: `out.npz` always reads back whole as the previous file or the new outputs;
/// a later run leaves no temporary file behind.
#[test]
fn a_killed_run_output_leaves_the_old_file_or_the_new() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let onnx = support::models().join("gpt2_tiny.ts.onnx");
    let o = support::anyshape(
        d,
        &[
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1..4",
            "--dim",
            "sequence=1..64",
            "--out",
            "m",
            "--quiet",
        ],
    );
    assert!(o.status.success(), "{}", support::text(&o));
    std::fs::copy(
        support::models().join("gpt2_tiny.ts.b3s17.npz"),
        d.join("case.npz"),
    )
    .unwrap();
    let args = [
        "run",
        "--module",
        "m",
        "--inputs",
        "case.npz",
        "--output",
        "out.npz",
        "--seconds",
        "0",
    ];
    // The new outputs, from a run left alone, and how long a run takes.
    let start = Instant::now();
    let o = support::anyshape(d, &args);
    let full = start.elapsed();
    assert!(o.status.success(), "{}", support::text(&o));
    let new = anyshape_tensor::npz::read(&d.join("out.npz")).unwrap();
    let old = vec![(
        "previous".to_string(),
        anyshape_tensor::Tensor::f32(vec![2], vec![1.0, 2.0]).unwrap(),
    )];
    let runs: usize = std::env::var("ANYSHAPE_CRASH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let (mut kept_old, mut got_new) = (0, 0);
    for _ in 0..runs {
        anyshape_tensor::npz::write(
            &d.join("out.npz"),
            &old,
            &anyshape_files::Reads::new(),
            "test",
        )
        .unwrap();
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let at = full.mul_f64((state % 1000) as f64 / 1000.0 * 1.2);
        let mut child = support::command(d, &args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(at);
        child.kill().ok();
        child.wait().unwrap();
        let now = anyshape_tensor::npz::read(&d.join("out.npz"))
            .expect("out.npz reads back whole after a kill");
        if now == old {
            kept_old += 1;
        } else {
            assert_eq!(now, new, "out.npz holds the old file or the new outputs");
            got_new += 1;
        }
    }
    // A run to the end cleans up what the killed ones left.
    let o = support::anyshape(d, &args);
    assert!(o.status.success(), "{}", support::text(&o));
    let left: Vec<String> = support::listing(d)
        .into_iter()
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    eprintln!("{runs} runs killed: {kept_old} left the old file, {got_new} the new outputs");
}
