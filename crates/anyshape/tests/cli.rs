//! The command line on workloads: a correct run, and bad input that gets a clear error
//! and a non-zero exit, never a panic.
mod support;

use std::process::Command;
use support::{anyshape_cached, bin, text};

#[test]
fn run_checks_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    for strategy in ["local-pad", "boundary-check"] {
        let o = anyshape_cached(
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
    let o = anyshape_cached(
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
                "compile",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../models/bert_tiny.ts.onnx"
                ),
                "--dim",
                "batch=1",
                "--dim",
                "sequence=1..4",
                "--trials",
                "1",
                "--seconds",
                "NaN",
                "--records",
                "r",
                "--out",
                "m",
            ],
            "--seconds NaN",
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
        // As from a Rust developer's shell: still the message alone, no backtrace.
        let o = Command::new(bin())
            .args(*args)
            .env("ANYSHAPE_CACHE", dir.path())
            .env("RUST_BACKTRACE", "1")
            .env_remove("RUST_LIB_BACKTRACE")
            .output()
            .unwrap();
        let out = text(&o);
        assert!(!o.status.success(), "{args:?} succeeded: {out}");
        assert!(
            !out.contains("backtrace"),
            "{args:?}: a backtrace in:\n{out}"
        );
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
