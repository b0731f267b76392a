//! `anyshape tune` end to end: a killed run resumes from its records, modules are
//! written, run, inspected and benched, the softmax sketch and fused epilogues run
//! correctly in and past the range.
mod support;

use std::process::Command;
use support::{anyshape_cached, text};

/// Kill a tuning run with SIGKILL mid-way, resume it: the records file has no torn or
/// duplicate lines and the run reaches its budget.
#[test]
fn killed_tuning_run_resumes_from_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("r.jsonl");
    let args = |resume: bool| {
        let mut a = vec![
            "tune",
            "-w",
            "dense(M=T,N=T+16,K=32)",
            "--range",
            "T=1..30",
            "--trials",
            "30",
            "--batch",
            "2",
            "--quiet",
            "--records",
        ];
        a.push(records.to_str().unwrap());
        if resume {
            a.push("--resume");
        }
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_anyshape"))
        .args(args(false))
        .env("ANYSHAPE_CACHE", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines = || {
        std::fs::read_to_string(&records)
            .map(|s| s.lines().count())
            .unwrap_or(0)
    };
    let start = std::time::Instant::now();
    while lines() < 9 && start.elapsed().as_secs() < 240 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed_at = lines();
    assert!(
        (9..30).contains(&killed_at),
        "killed after {killed_at} records"
    );

    let o = anyshape_cached(
        &args(false).iter().map(String::as_str).collect::<Vec<_>>(),
        dir.path(),
    );
    assert!(
        !o.status.success() && text(&o).contains("--resume"),
        "{}",
        text(&o)
    );
    let o = anyshape_cached(
        &args(true).iter().map(String::as_str).collect::<Vec<_>>(),
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("{killed_at} resumed")),
        "{}",
        text(&o)
    );
    let content = std::fs::read_to_string(&records).unwrap();
    assert!(content.ends_with('\n'));
    let mut seen = std::collections::BTreeSet::new();
    for line in content.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).expect("every line is a whole record");
        assert!(
            seen.insert((v["micro_kernel"].to_string(), v["bindings"].to_string())),
            "duplicate trial: {line}"
        );
    }
    assert_eq!(seen.len(), 30);
}

#[test]
fn tune_writes_a_module_that_runs_inspects_and_benches() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("small.module");
    let m = module.to_str().unwrap();
    let records = dir.path().join("r.jsonl");
    let o = anyshape_cached(
        &[
            "tune",
            "-w",
            "batch_matmul_nn(B=2,M=T,N=24,K=T)",
            "--range",
            "T=1..12",
            "--trials",
            "12",
            "--batch",
            "3",
            "--records",
            records.to_str().unwrap(),
            "--out",
            m,
            "--specialize",
            "2",
            "--quiet",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("module written to") && out.contains("training accuracy"),
        "{out}"
    );
    // In the tuned range, at its ends and far past it: correct.
    for t in ["1", "12", "13", "97", "300"] {
        let set = format!("T={t}");
        let o = anyshape_cached(
            &[
                "run",
                "--module",
                m,
                "--set",
                &set,
                "--check",
                "--seconds",
                "0.01",
            ],
            dir.path(),
        );
        let out = text(&o);
        assert!(
            o.status.success() && out.contains("check        ok"),
            "T={t}: {out}"
        );
    }
    let o = anyshape_cached(&["inspect", m], dir.path());
    let out = text(&o);
    assert!(
        o.status.success() && out.contains("dispatch tree") && out.contains("T=1"),
        "{out}"
    );
    let csv = dir.path().join("loss.csv");
    let o = anyshape_cached(
        &[
            "bench",
            "--module",
            m,
            "--dispatch-loss",
            "--overhead",
            "--seconds",
            "0.01",
            "--csv",
            csv.to_str().unwrap(),
            "--quiet",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(
        o.status.success()
            && out.contains("dispatch loss over 12 instances")
            && out.contains("C entry"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 13);
    // At values it was not tuned at, and past its range, timed cold.
    let o = anyshape_cached(
        &[
            "bench",
            "--module",
            m,
            "--dispatch-loss",
            "--range",
            "T=2,7,13,20",
            "--cold",
            "--seconds",
            "0.01",
            "--quiet",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(
        o.status.success()
            && out.contains("dispatch loss over 4 instances")
            && out.contains("cold"),
        "{out}"
    );
    let o = anyshape_cached(
        &["bench", "--module", m, "--overhead", "--cold"],
        dir.path(),
    );
    assert!(
        !o.status.success() && text(&o).contains("--cold is for --dispatch-loss"),
        "{}",
        text(&o)
    );
    // Side by side with the vendor libraries (skipped with a warning where missing) and
    // the tuned baselines, on a few instances.
    let out_dir = dir.path().join("compare");
    let o = anyshape_cached(
        &[
            "bench",
            "--module",
            m,
            "--compare",
            "--range",
            "T=1,5,12",
            "--samples",
            "T=5,12",
            "--per-shape-trials",
            "3",
            "--bucket",
            "8",
            "--seconds",
            "0.01",
            "--rounds",
            "2",
            "--quiet",
            "--out-dir",
            out_dir.to_str().unwrap(),
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(
        o.status.success()
            && out.contains("paired over 2 rounds")
            && out.contains("vs per-shape")
            && out.contains("vs nimble")
            && out.contains("vs bucketing")
            && out.contains("vs gemm"),
        "{out}"
    );
    // Plots where a font is installed (scripts/setup.sh installs one), else a warning.
    for plot in ["latency.svg", "throughput.svg", "tuning.svg"] {
        assert!(
            out_dir.join(plot).exists() || out.contains("no TrueType font"),
            "{plot}: {out}"
        );
    }
    let report = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(
        report.contains("| T=12 |") && !out.contains("wrong result"),
        "{report}"
    );
    let rows = std::fs::read_to_string(out_dir.join("results.csv")).unwrap();
    assert!(
        rows.lines().filter(|l| l.contains(",per-shape,")).count() == 2,
        "{rows}"
    );
    // Every row has each round's minimum, the smallest of them its minimum.
    for row in rows.lines().skip(1) {
        let cells: Vec<&str> = row.split(',').collect();
        let rounds: Vec<f64> = cells[5].split(';').map(|r| r.parse().unwrap()).collect();
        let min: f64 = cells[2].parse().unwrap();
        assert!(rounds.len() == 2 && rounds.contains(&min), "{row}");
        assert!(rounds.iter().all(|&r| r >= min), "{row}");
    }
    // Bad module input: a clear error, no panic.
    for (args, expect) in [
        (
            vec!["run", "--module", m, "--set", "U=3"],
            "not a shape var",
        ),
        (vec!["run", "--module", m], "is not bound"),
        (
            vec!["inspect", "/nonexistent.module"],
            "not an anyshape module",
        ),
        (vec!["bench", "--module", m], "nothing to measure"),
    ] {
        let o = anyshape_cached(&args, dir.path());
        let out = text(&o);
        assert!(
            !o.status.success() && out.contains(expect) && !out.contains("panicked"),
            "{args:?}: {out}"
        );
    }
    let lib = std::fs::read_dir(&module)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "so"))
        .unwrap();
    std::fs::write(&lib, b"not a library").unwrap();
    let o = anyshape_cached(&["run", "--module", m, "--set", "T=3"], dir.path());
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("corrupted or truncated"),
        "{out}"
    );
}

/// The other sketch and the fused epilogues, end to end: softmax tuned into a module
/// that runs correctly in the range, at its ends and past it; a matmul with a bias, GELU
/// and a residual input run and checked on odd shapes; --compare refuses a softmax
/// module with the reason.
#[test]
fn softmax_modules_and_fused_epilogues_run_correctly() {
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("softmax.module");
    let m = module.to_str().unwrap();
    let records = dir.path().join("softmax.jsonl");
    let o = anyshape_cached(
        &[
            "tune",
            "-w",
            "softmax(M=4*T,N=T)",
            "--range",
            "T=1..16",
            "--trials",
            "8",
            "--batch",
            "4",
            "--records",
            records.to_str().unwrap(),
            "--out",
            m,
            "--quiet",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(
        o.status.success() && out.contains("sketch") && out.contains("module written to"),
        "{out}"
    );
    for t in ["1", "13", "16", "17", "97"] {
        let set = format!("T={t}");
        let o = anyshape_cached(
            &[
                "run",
                "--module",
                m,
                "--set",
                &set,
                "--check",
                "--seconds",
                "0",
            ],
            dir.path(),
        );
        let out = text(&o);
        assert!(
            o.status.success() && out.contains("check        ok"),
            "T={t}: {out}"
        );
    }
    let o = anyshape_cached(
        &["bench", "--module", m, "--compare", "--quiet"],
        dir.path(),
    );
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("not one") && !out.contains("panicked"),
        "{out}"
    );
    for (w, t) in [
        ("dense(M=T,N=72,K=40)+bias+gelu+residual", "1"),
        ("dense(M=T,N=72,K=40)+bias+gelu+residual", "37"),
        ("batch_matmul_nt(B=3,M=T,N=T,K=16)+scale(0.125)", "29"),
        ("softmax(M=3*T,N=T)", "129"),
    ] {
        let set = format!("T={t}");
        let o = anyshape_cached(
            &["run", "-w", w, "--set", &set, "--check", "--seconds", "0"],
            dir.path(),
        );
        let out = text(&o);
        assert!(
            o.status.success() && out.contains("check        ok"),
            "{w} at T={t}: {out}"
        );
    }
}
