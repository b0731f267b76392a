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
    let cases: &[(&[&str], &str)] = &[
        (&["run", "-w", w], "shape var `T` is not bound"),
        (&["run", "-w", w, "--set", "T=-4"], "negative"),
        (
            &["run", "-w", w, "--set", "Q=4"],
            "shape var `T` is not bound",
        ),
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
                "mr=4,nr=32,mc=8,nc=64,kc=100000,uk=4",
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
            "reading target",
        ),
        (
            &["run", "-w", w, "--set", "T=99999999999"],
            "cannot allocate",
        ),
    ];
    for (args, needle) in cases {
        let o = anyshape(args, dir.path());
        let out = text(&o);
        assert!(!o.status.success(), "{args:?} succeeded: {out}");
        assert!(!out.contains("panicked"), "{args:?} panicked: {out}");
        assert!(
            out.contains(needle),
            "{args:?}: expected `{needle}` in:\n{out}"
        );
    }
}
