//! The command line: a correct run, and bad input that gets a clear error and a
//! non-zero exit, never a panic.
use std::process::{Command, Output};

fn anyshape(args: &[&str], cache: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_anyshape"))
        .args(args)
        .env("ANYSHAPE_CACHE", cache)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn run_checks_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    for strategy in ["local-pad", "boundary-check"] {
        let o = anyshape(
            &[
                "run",
                "--workload",
                "dense(M=16*T,N=96,K=64)",
                "--set",
                "T=37",
                "--strategy",
                strategy,
                "--check",
                "--seconds",
                "0.05",
            ],
            dir.path(),
        );
        let out = text(&o);
        assert!(o.status.success(), "{out}");
        assert!(
            out.contains("GFLOP/s") && out.contains("check        ok"),
            "{out}"
        );
    }
    let o = anyshape(
        &[
            "run",
            "-w",
            "batch_matmul_nn(B=2,M=T,N=20,K=T)+relu",
            "--set",
            "T=5",
            "--mode",
            "symbolic",
            "--micro-kernel",
            "mr=2,nr=16,mc=4,nc=32,kc=8,uk=2",
            "--check",
            "--seconds",
            "0",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let w = "dense(M=16*T,N=64,K=64)";
    let deep = format!("dense(M={}T{},N=64,K=64)", "(".repeat(40), ")".repeat(40));
    let long = format!("dense(M={},N=64,K=64)", vec!["T"; 3000].join("+"));
    let cases: &[(&[&str], &str)] = &[
        (&["run", "-w", w], "shape var `T` is not bound"),
        (
            &[
                "gpu",
                "-w",
                w,
                "--range",
                "Q=1..4",
                "--out-dir",
                "/nonexistent",
            ],
            "shape var `T` needs a domain",
        ),
        (
            &[
                "gpu",
                "-w",
                w,
                "--range",
                "T=1..4",
                "--strategy",
                "global-pad",
            ],
            "invalid value 'global-pad'",
        ),
        (&["run", "-w", w, "--set", "T=-4"], "negative"),
        (&["run", "-w", w, "--set", "Q=4"], "not a shape var"),
        (
            &["run", "-w", "dense(M=16*T,N=64", "--set", "T=4"],
            "missing `)`",
        ),
        (
            &["run", "-w", "dense(M=16*T,N=64,K=64", "--set", "T=4"],
            "^",
        ),
        (
            &["run", "-w", "conv2d(1,2)", "--set", "T=4"],
            "unknown workload `conv2d`",
        ),
        (
            &["run", "-w", "dense(M=16*,N=64,K=64)", "--set", "T=4"],
            "expected a number",
        ),
        (
            &["run", "-w", "dense(M=T-8,N=64,K=64)", "--set", "T=4"],
            "negative",
        ),
        (
            &[
                "run",
                "-w",
                w,
                "--set",
                "T=4",
                "--micro-kernel",
                "mr=20,nr=32,mc=40,nc=64,kc=64,uk=4",
            ],
            "vector registers",
        ),
        (
            &[
                "run",
                "-w",
                w,
                "--set",
                "T=4",
                "--micro-kernel",
                "mr=4,nr=16,mc=8,nc=64,kc=100000,uk=4",
            ],
            "L1d",
        ),
        (
            &[
                "run",
                "-w",
                w,
                "--set",
                "T=4",
                "--micro-kernel",
                "mr=4,nr=32",
            ],
            "missing",
        ),
        (
            &["run", "-w", w, "--set", "T=4", "--strategy", "magic"],
            "magic",
        ),
        (
            &[
                "run",
                "-w",
                w,
                "--set",
                "T=4",
                "--target",
                "/nonexistent.json",
            ],
            "/nonexistent.json: No such file",
        ),
        (
            &["run", "-w", w, "--set", "T=99999999999"],
            "the machine has",
        ),
        // Durations that cannot be durations.
        (
            &["run", "-w", w, "--set", "T=4", "--timeout", "-1"],
            "time limit",
        ),
        (
            &["run", "-w", w, "--set", "T=4", "--timeout", "1e308"],
            "time limit",
        ),
        (
            &["run", "-w", w, "--set", "T=4", "--timeout", "NaN"],
            "time limit",
        ),
        (
            &["run", "-w", w, "--set", "T=4", "--seconds", "inf"],
            "seconds",
        ),
        (
            &["run", "-w", w, "--set", "T=4", "--seconds", "-1"],
            "seconds",
        ),
        // Domains too large to enumerate.
        (
            &[
                "tune",
                "-w",
                w,
                "--range",
                "T=1..9223372036854775807",
                "--records",
                "r",
            ],
            "at most 65536",
        ),
        (
            &[
                "tune",
                "-w",
                w,
                "--range",
                "T=1..10000000",
                "--records",
                "r",
            ],
            "at most 65536",
        ),
        // Text that would exhaust the stack.
        (&["run", "-w", &deep, "--set", "T=4"], "nested more than"),
        (&["run", "-w", &long, "--set", "T=4"], "bytes"),
        // What used to be accepted silently.
        (
            &["run", "-w", w, "--set", "T=5", "--set", "T=7"],
            "given twice",
        ),
        (&["run", "-w", w, "--set", "T=5,T=7"], "given twice"),
        (&["run", "-w", w, "--set", "T=3,U=3"], "not a shape var"),
        (
            &[
                "tune",
                "-w",
                w,
                "--range",
                "T=1..4",
                "--range",
                "T=1..8",
                "--records",
                "r",
            ],
            "two domains",
        ),
        (
            &[
                "run",
                "-w",
                w,
                "--set",
                "T=4",
                "--micro-kernel",
                r#"{"mr":1,"nr":16,"mc":1,"nc":16,"kc":4,"uk":4,"turbo":1}"#,
            ],
            "unknown field",
        ),
        (
            &[
                "run",
                "-w",
                w,
                "--set",
                "T=4",
                "--micro-kernel",
                "mr=1,mr=2,nr=16,mc=1,nc=16,kc=4,uk=4",
            ],
            "given twice",
        ),
        (
            &[
                "tune",
                "-w",
                w,
                "--range",
                "T=1..4",
                "--records",
                "r",
                "--max-kernels",
                "0",
            ],
            "--max-kernels",
        ),
        (
            &[
                "tune",
                "-w",
                w,
                "--range",
                "T=1..4",
                "--records",
                "r",
                "--tolerance",
                "1.5",
            ],
            "fraction",
        ),
        (
            &[
                "tune",
                "-w",
                w,
                "--range",
                "T=1..4",
                "--records",
                "r",
                "--trials",
                "0",
            ],
            "--trials",
        ),
        (
            &[
                "tune",
                "-w",
                w,
                "--range",
                "T=1..4",
                "--records",
                "r",
                "--out",
                "/etc/hostname",
            ],
            "is a file",
        ),
    ];
    for (args, needle) in cases {
        let o = anyshape(args, dir.path());
        let out = text(&o);
        assert!(!o.status.success(), "{args:?} succeeded: {out}");
        assert!(
            !dir.path().join("r").exists(),
            "{args:?}: refused after work began"
        );
        assert!(!out.contains("panicked"), "{args:?} panicked: {out}");
        assert!(
            out.contains(needle),
            "{args:?}: expected `{needle}` in:\n{out}"
        );
    }
}

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

    let o = anyshape(
        &args(false).iter().map(String::as_str).collect::<Vec<_>>(),
        dir.path(),
    );
    assert!(
        !o.status.success() && text(&o).contains("--resume"),
        "{}",
        text(&o)
    );
    let o = anyshape(
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
    let o = anyshape(
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
        let o = anyshape(
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
    let o = anyshape(&["inspect", m], dir.path());
    let out = text(&o);
    assert!(
        o.status.success() && out.contains("dispatch tree") && out.contains("T=1"),
        "{out}"
    );
    let csv = dir.path().join("loss.csv");
    let o = anyshape(
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
    // Side by side with the vendor libraries (skipped with a warning where missing) and
    // the tuned baselines, on a few instances.
    let out_dir = dir.path().join("compare");
    let o = anyshape(
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
        let o = anyshape(&args, dir.path());
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
    let o = anyshape(&["run", "--module", m, "--set", "T=3"], dir.path());
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
    let o = anyshape(
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
        let o = anyshape(
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
    let o = anyshape(
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
        let o = anyshape(
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

/// A model from ONNX to a module and back: `compile` (untuned: default micro-kernels)
/// for a range of sequence lengths, `run --module` on recorded cases in the range and
/// past it (onnxruntime's outputs in the same file are compared), outputs to `.npz`;
/// and the mistakes a user makes are clear errors.
#[test]
fn compile_run_and_bench_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let onnx = models.join("bert_tiny.dynamo.onnx");
    let module = dir.path().join("bert.module");
    let m = module.to_str().unwrap();
    let o = anyshape(
        &[
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..64",
            "--out",
            m,
            "--quiet",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success() && out.contains("8 tasks"), "{out}");
    for case in ["s1", "s37", "s128", "b3s17"] {
        let npz = models.join(format!("bert_tiny.dynamo.{case}.npz"));
        let written = dir.path().join(format!("{case}.out.npz"));
        let o = anyshape(
            &[
                "run",
                "--module",
                m,
                "--inputs",
                npz.to_str().unwrap(),
                "--output",
                written.to_str().unwrap(),
                "--seconds",
                "0",
            ],
            dir.path(),
        );
        let out = text(&o);
        assert!(o.status.success(), "{case}: {out}");
        let errors: Vec<f64> = out
            .lines()
            .filter_map(|l| l.split("max relative error ").nth(1))
            .map(|r| r.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(errors.len(), 2, "{case}: {out}");
        assert!(errors.iter().all(|&e| e <= 1e-4), "{case}: {out}");
        assert!(written.exists());
    }
    // Raced against the peers that are installed (onnxruntime where its Python package
    // is; tract only in a `--features tract` build): a report, and every peer's outputs
    // agree with anyshape's.
    let report = dir.path().join("bench");
    let o = anyshape(
        &[
            "bench",
            "--model",
            m,
            "--compare",
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1,5,64,70",
            "--rounds",
            "1",
            "--seconds",
            "0",
            "--out-dir",
            report.to_str().unwrap(),
            "--quiet",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success() && out.contains("sequence=70"), "{out}");
    let csv = std::fs::read_to_string(report.join("model.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert!(
        rows.iter().filter(|r| r[2] == "\"anyshape\"").count() == 4,
        "{csv}"
    );
    for r in rows.iter().filter(|r| r[2] != "\"anyshape\"") {
        let e: f64 = r[5].parse().unwrap_or_else(|_| panic!("{csv}"));
        assert!(e <= 1e-4, "{csv}");
        // One round: the paired speedup is that round's ratio, the ratio of minima.
        let (speedup, paired): (f64, f64) = (r[4].parse().unwrap(), r[6].parse().unwrap());
        assert!((speedup - paired).abs() <= 1e-3 * speedup, "{csv}");
    }
    let s37 = models.join("bert_tiny.dynamo.s37.npz");
    let bad: &[(&[&str], &str)] = &[
        (
            &[
                "compile",
                onnx.to_str().unwrap(),
                "--dim",
                "seq=1..4",
                "--dim",
                "batch=1",
                "--out",
                "x.module",
            ],
            "no dim of that name",
        ),
        (
            &[
                "compile",
                onnx.to_str().unwrap(),
                "--dim",
                "batch=1",
                "--out",
                "x.module",
            ],
            "needs a domain",
        ),
        (
            &[
                "compile",
                "/nonexistent.onnx",
                "--dim",
                "batch=1",
                "--out",
                "x.module",
            ],
            "nonexistent",
        ),
        (
            &[
                "compile",
                onnx.to_str().unwrap(),
                "--dim",
                "batch=1",
                "--dim",
                "sequence=1..4",
                "--trials",
                "4",
                "--out",
                "x.module",
            ],
            "--records",
        ),
        (&["run", "--module", m], "--inputs"),
        (
            &["run", "--module", m, "--inputs", onnx.to_str().unwrap()],
            "not a .npz file",
        ),
        (
            &[
                "run",
                "--module",
                m,
                "--inputs",
                s37.to_str().unwrap(),
                "--max-error",
                "0",
            ],
            "outputs differ from those recorded",
        ),
        (
            &["run", "--module", m, "--input", "ids=/nonexistent.npy"],
            "no input of that name",
        ),
        (
            &[
                "run",
                "--module",
                m,
                "--input",
                "input_ids=/nonexistent.npy",
            ],
            "nonexistent.npy",
        ),
        (
            &["bench", "--model", m, "--compare", "--dim", "batch=1"],
            "--dim sequence=… is missing",
        ),
        (
            &[
                "bench",
                "--model",
                m,
                "--compare",
                "--dim",
                "seq=1",
                "--dim",
                "batch=1",
            ],
            "no dim of that name",
        ),
    ];
    for (args, needle) in bad {
        let o = anyshape(args, dir.path());
        let out = text(&o);
        assert!(
            !o.status.success() && out.contains(needle) && !out.contains("panicked"),
            "{args:?}: {out}"
        );
    }
}

/// A tuned model compile with families (the default) and one without, equal shares:
/// each writes its tuning log (a curve point per slice, trials rising to the budget);
/// the families of more than one task are reported; equal shares give every task the
/// same trials; and `bench --tuning-against` compares the two curves.
#[test]
fn tuning_logs_of_two_compiles_compared() {
    let dir = tempfile::tempdir().unwrap();
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let onnx = models.join("bert_tiny.ts.onnx");
    let compile = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let records = dir.path().join(format!("{name}.records"));
        let mut args = vec![
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..16",
            "--trials",
            "4",
            "--tune-values",
            "3",
            "--records",
            records.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ];
        args.extend_from_slice(extra);
        let o = anyshape(&args, dir.path());
        let said = text(&o);
        assert!(o.status.success(), "{said}");
        let log: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("tuning.json")).unwrap())
                .unwrap();
        (said, log, out)
    };
    let (said, fam, fam_dir) = compile("families", &[]);
    assert!(
        said.contains("family dense_packed[batch,sequence]: tasks ")
            && said.contains("tuning (scheduler + families)"),
        "{said}"
    );
    assert_eq!(fam["mode"], "scheduler + families");
    let curve = fam["curve"].as_array().unwrap();
    assert!(curve.len() >= 8, "{fam}");
    let trials: Vec<u64> = curve
        .iter()
        .map(|p| p["trials"].as_u64().unwrap())
        .collect();
    assert!(trials.windows(2).all(|w| w[0] <= w[1]), "{trials:?}");
    assert!(curve.last().unwrap()["expected_seconds"].as_f64().unwrap() > 0.0);
    let (said, ind, ind_dir) = compile("independent", &["--equal-shares", "--no-families"]);
    assert_eq!(ind["mode"], "equal shares", "{said}");
    assert!(!ind["families"].as_array().unwrap().is_empty());
    assert!(!said.contains("tuning (scheduler"), "{said}");
    // Both within the budget of 8 tasks x 4 trials.
    for log in [&fam, &ind] {
        let last = log["curve"].as_array().unwrap().last().unwrap()["trials"]
            .as_u64()
            .unwrap();
        assert!((16..=32).contains(&last), "{log}");
    }
    let report = dir.path().join("report");
    let o = anyshape(
        &[
            "bench",
            "--model",
            fam_dir.to_str().unwrap(),
            "--tuning-against",
            ind_dir.to_str().unwrap(),
            "--out-dir",
            report.to_str().unwrap(),
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for row in ["| 80 % |", "| 90 % |", "| 100 % |", "trials per hour"] {
        assert!(out.contains(row), "{out}");
    }
    assert!(report.join("tuning.csv").exists() && report.join("tuning.md").exists());
    // A module without a tuning log (untuned) is a clear error.
    let o = anyshape(
        &[
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..16",
            "--out",
            dir.path().join("untuned").to_str().unwrap(),
            "--quiet",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = anyshape(
        &[
            "bench",
            "--model",
            fam_dir.to_str().unwrap(),
            "--tuning-against",
            dir.path().join("untuned").to_str().unwrap(),
            "--out-dir",
            report.to_str().unwrap(),
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(!o.status.success() && out.contains("tuning.json"), "{out}");
}
