//! The runner survives candidates that crash or hang: each fails alone, the others are
//! measured. The faulty kernels are a test-only hook: hand-written C placed in the
//! same library as real programs.
use anyshape_codegen::{ContractionKernel, CpuTarget, KernelMode, PaddingStrategy, Program};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{
    Builder, Candidate, KernelSource, MeasureOptions, Outcome, Runner, WorkerCommand,
};

const SIG: &str = "(const int64_t *vars, const float *const *ins, float *const *outs)";

#[test]
fn crashing_and_hanging_candidates_fail_alone() {
    let target = CpuTarget::detect();
    let w = Workload::parse("dense(M=T,N=40,K=24)").unwrap();
    let good = Program {
        workload: w.clone(),
        micro_kernel: ContractionKernel::default_for(&target),
        strategy: PaddingStrategy::LocalPad,
        mode: KernelMode::Symbolic,
        bindings: Bindings::default(),
    };
    let kernels = vec![
        KernelSource {
            symbol: good.symbol(&target),
            code: good.source(&target).unwrap(),
        },
        KernelSource {
            symbol: "as_test_crash".into(),
            code: format!("int32_t as_test_crash{SIG} {{ *(volatile int *)0 = 1; return 0; }}"),
        },
        KernelSource {
            symbol: "as_test_hang".into(),
            code: format!(
                "int32_t as_test_hang{SIG} {{ for (;;) {{ __asm__ volatile(\"\"); }} return 0; }}"
            ),
        },
        KernelSource {
            symbol: "as_test_abort".into(),
            code: format!("void abort(void); int32_t as_test_abort{SIG} {{ abort(); return 0; }}"),
        },
        KernelSource {
            symbol: "as_test_lazy".into(),
            code: format!("int32_t as_test_lazy{SIG} {{ return 0; }}"),
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    let lib = Builder::new(dir.path()).build(&target, &kernels).unwrap();
    let cand = |symbol: &str, t: i64| Candidate {
        symbol: symbol.into(),
        workload: w.clone(),
        bindings: Bindings::from_pairs([("T", t)]),
        check: true,
        gpu: None,
    };
    let good_sym = good.symbol(&target);
    let batch = [
        cand(&good_sym, 5),
        cand("as_test_crash", 5),
        cand(&good_sym, 9),
        cand("as_test_hang", 9),
        cand("as_test_abort", 3),
        cand("as_missing", 3),
        cand(&good_sym, 33),
        // Writes nothing: in alternation it shares the good kernel's output buffer,
        // which must not pass for its own.
        cand("as_test_lazy", 33),
    ];
    let worker = WorkerCommand {
        program: env!("CARGO_BIN_EXE_anyshape-worker").into(),
        args: vec![],
    };
    // Candidates timed one after the other, and in alternation (groups on one instance).
    for interleave in [false, true] {
        let runner = Runner {
            worker: worker.clone(),
            options: MeasureOptions {
                min_repeats: 2,
                max_repeats: 3,
                min_seconds: 0.0,
                timeout_seconds: 2.0,
                interleave,
                // Flushing the caches between calls (as model tuning does) on one pass.
                cold: interleave,
            },
        };
        let t0 = std::time::Instant::now();
        let out = runner.measure(&lib.kernels(), &batch).unwrap();
        let ok = |o: &Outcome| matches!(o, Outcome::Measured(m) if m.check.as_ref().is_some_and(|c| c.passed));
        assert!(
            ok(&out[0]) && ok(&out[2]) && ok(&out[6]),
            "interleave {interleave}: {out:#?}"
        );
        assert!(
            matches!(&out[1], Outcome::Failed(w) if w.contains("SIGSEGV")),
            "{:?}",
            out[1]
        );
        assert!(
            matches!(&out[3], Outcome::Failed(w) if w.contains("timed out")),
            "{:?}",
            out[3]
        );
        assert!(
            matches!(&out[4], Outcome::Failed(w) if w.contains("SIGABRT")),
            "{:?}",
            out[4]
        );
        assert!(
            matches!(&out[5], Outcome::Failed(w) if w.contains("not found")),
            "{:?}",
            out[5]
        );
        assert!(
            matches!(&out[7], Outcome::Measured(m) if m.check.as_ref().is_some_and(|c| !c.passed)),
            "{:?}",
            out[7]
        );
        assert!(t0.elapsed().as_secs_f64() < 30.0);
    }
}

#[test]
fn a_kernel_that_does_not_compile_fails_alone() {
    let target = CpuTarget::detect();
    let kernels = vec![
        KernelSource {
            symbol: "as_test_ok".into(),
            code: format!("int32_t as_test_ok{SIG} {{ return 0; }}"),
        },
        KernelSource {
            symbol: "as_test_bad".into(),
            code: "int32_t as_test_bad( { syntax error".into(),
        },
    ];
    let dir = tempfile::tempdir().unwrap();
    let lib = Builder::new(dir.path()).build(&target, &kernels).unwrap();
    assert_eq!(lib.failed.keys().collect::<Vec<_>>(), ["as_test_bad"]);
    let again = Builder::new(dir.path()).build(&target, &kernels).unwrap();
    assert!(again.cached && again.failed.contains_key("as_test_bad"));
}

/// A compiler killed by a signal, or out of memory, is the environment's fault: the
/// kernel is `unavailable` (not `failed`), its neighbours build, and the partial library
/// is not cached, so the next build compiles the kernel again.
#[test]
fn a_compile_the_environment_stops_is_not_a_failed_kernel() {
    use std::os::unix::fs::PermissionsExt;
    let target = CpuTarget::detect();
    let dir = tempfile::tempdir().unwrap();
    let cc = dir.path().join("cc");
    std::fs::write(
        &cc,
        "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in *.c)\n  grep -q as_test_killed \"$a\" && kill -9 $$\n  grep -q as_test_oom \"$a\" && { echo 'cc1: out of memory allocating 65536 bytes' >&2; exit 1; }\n;; esac; done\nexec cc \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&cc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let kernel = |name: &str| KernelSource {
        symbol: name.into(),
        code: format!("int32_t {name}{SIG} {{ return 0; }}"),
    };
    let kernels = vec![
        kernel("as_test_ok"),
        kernel("as_test_killed"),
        kernel("as_test_oom"),
    ];
    let mut builder = Builder::new(dir.path().join("cache"));
    builder.cc = cc.display().to_string();
    let lib = builder.build(&target, &kernels).unwrap();
    assert!(lib.failed.is_empty(), "{:?}", lib.failed);
    assert_eq!(
        lib.unavailable.keys().collect::<Vec<_>>(),
        ["as_test_killed", "as_test_oom"]
    );
    assert!(lib.unavailable["as_test_killed"].contains("killed"));
    assert!(lib.unavailable["as_test_oom"].contains("out of memory"));
    assert!(lib.require_all().is_err());
    assert!(!lib.cached && lib.path.exists());
    // With a working compiler the same batch builds whole (nothing stale was cached).
    builder.cc = "cc".into();
    let again = builder.build(&target, &kernels).unwrap();
    assert!(!again.cached && again.unavailable.is_empty() && again.failed.is_empty());
    assert!(again.require_all().is_ok());
}

/// The time limit is per call: slow candidates timed in alternation on one instance,
/// each call well under the limit but the group's rounds together far over it, are all
/// measured (they once shared one window, and each restart blamed the last one started).
#[test]
fn slow_candidates_in_alternation_are_not_timed_out_together() {
    let target = CpuTarget::detect();
    let w = Workload::parse("dense(M=T,N=40,K=24)").unwrap();
    let kernels = vec![KernelSource {
        symbol: "as_test_slow".into(),
        code: format!(
            "int usleep(unsigned); int32_t as_test_slow{SIG} {{ usleep(300000); return 0; }}"
        ),
    }];
    let dir = tempfile::tempdir().unwrap();
    let lib = Builder::new(dir.path()).build(&target, &kernels).unwrap();
    let cand = Candidate {
        symbol: "as_test_slow".into(),
        workload: w,
        bindings: Bindings::from_pairs([("T", 3)]),
        check: false,
        gpu: None,
    };
    let runner = Runner {
        worker: WorkerCommand {
            program: env!("CARGO_BIN_EXE_anyshape-worker").into(),
            args: vec![],
        },
        options: MeasureOptions {
            min_repeats: 2,
            max_repeats: 2,
            min_seconds: 0.0,
            // Each call takes 0.3 s; the group's 4 x 2 timed calls take 2.4 s.
            timeout_seconds: 1.0,
            interleave: true,
            cold: false,
        },
    };
    let out = runner.measure(&lib.kernels(), &vec![cand; 4]).unwrap();
    for o in &out {
        assert!(matches!(o, Outcome::Measured(_)), "{out:#?}");
    }
}
