//! Golden sources: the code generated for a few fixed programs, compared with committed
//! files, so that a change of the code generator shows exactly which kernels changed.
//! After an intended change, regenerate with `ANYSHAPE_BLESS=1 cargo test -p
//! anyshape-codegen --test golden` and review the diff of `tests/golden/`.
use anyshape_codegen::{
    AttentionKernel, ContractionKernel, CpuTarget, GpuContractionKernel, GpuTarget, KernelMode,
    PaddingStrategy, Program, RowKernel, Simd, Target, PADDING_STRATEGIES,
};
use anyshape_ir::{Bindings, Workload};
use std::path::PathBuf;

fn target(simd: Simd) -> CpuTarget {
    CpuTarget {
        name: "golden".into(),
        cores: 2,
        simd,
        vector_registers: if simd == Simd::Avx512 { 32 } else { 16 },
        l1d_bytes: 32 << 10,
        l2_bytes: 1 << 20,
        l3_bytes: 32 << 20,
        amx: false,
        avx512_bf16: false,
        avx512_vnni: false,
    }
}

/// C sources must also compile: a golden file can only bless what the C compiler takes.
fn compiles(name: &str, text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut child = Command::new(&cc)
        .args(["-fsyntax-only", "-fopenmp", "-x", "c", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {cc} (the README's setup installs gcc): {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{name} does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn check(name: &str, text: &str) {
    if name.ends_with(".c") {
        compiles(name, text);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("ANYSHAPE_BLESS").is_some() {
        std::fs::write(&path, text).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with ANYSHAPE_BLESS=1)", path.display()));
    if want != text {
        let line = want
            .lines()
            .zip(text.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(text.lines().count()));
        panic!(
            "{name} changed (first difference at line {}):\n  was: {:?}\n  now: {:?}\nreview, then bless with ANYSHAPE_BLESS=1",
            line + 1,
            want.lines().nth(line).unwrap_or(""),
            text.lines().nth(line).unwrap_or("")
        );
    }
}

fn cpu(
    w: &str,
    mk: ContractionKernel,
    strategy: PaddingStrategy,
    t: Option<i64>,
    simd: Simd,
) -> String {
    let target = target(simd);
    let p = Program {
        workload: Workload::parse(w).unwrap(),
        micro_kernel: mk,
        strategy,
        mode: if t.is_some() {
            KernelMode::Specialized
        } else {
            KernelMode::Symbolic
        },
        bindings: t.map_or_else(Bindings::default, |t| Bindings::from_pairs([("T", t)])),
    };
    format!("{}\n{}", target.prelude(), p.source(&target).unwrap())
}

#[test]
fn cpu_kernels_are_unchanged() {
    let wide = ContractionKernel::parse("mr=12,nr=32,mc=96,nc=384,kc=256,uk=4").unwrap();
    let narrow = ContractionKernel::parse("mr=5,nr=16,mc=20,nc=64,kc=24,uk=2").unwrap();
    check(
        "dense-local-pad-symbolic-avx512.c",
        &cpu(
            "dense(M=16*T,N=2304,K=768)",
            wide,
            PaddingStrategy::LocalPad,
            None,
            Simd::Avx512,
        ),
    );
    // bf16: A's rows rounded into words (`as_round_pairs`), then transposed into panels.
    check(
        "dense_bf16-local-pad-symbolic-avx512.c",
        &cpu(
            "dense_bf16(M=T,N=768,K=768,P=16)",
            wide,
            PaddingStrategy::LocalPad,
            None,
            Simd::Avx512,
        ),
    );
    // i8: A's rows quantized before the tasks (`as_quantize_row`), packed from there;
    // quads multiplied (`as_vdot_i8`), the sums converted at write-back, then the
    // channels' scales and the bias.
    check(
        "dense_i8-local-pad-symbolic-avx512.c",
        &cpu(
            "dense_i8(M=T,N=768,K=768,P=16)+mul(n)+bias",
            ContractionKernel { ia: false, ..wide },
            PaddingStrategy::LocalPad,
            None,
            Simd::Avx512,
        ),
    );
    check(
        "dense-local-pad-specialized-avx2.c",
        &cpu(
            "dense(M=16*T,N=2304,K=768)",
            narrow,
            PaddingStrategy::LocalPad,
            Some(37),
            Simd::Avx2,
        ),
    );
    for s in PADDING_STRATEGIES {
        check(
            &format!("bmm_nt-{s}-symbolic-avx2.c"),
            &cpu(
                "batch_matmul_nt(B=192,M=T,N=T,K=64)",
                narrow,
                s,
                None,
                Simd::Avx2,
            ),
        );
    }
    check(
        "bmm_nn-relu-local-pad-symbolic-avx2.c",
        &cpu(
            "batch_matmul_nn(B=192,M=T,N=64,K=T)+relu",
            narrow,
            PaddingStrategy::LocalPad,
            None,
            Simd::Avx2,
        ),
    );
    check(
        "dense-relu-global-pad-specialized-sse.c",
        &cpu(
            "dense(M=T,N=20,K=T)+relu",
            ContractionKernel::parse("mr=3,nr=8,mc=6,nc=16,kc=8,uk=4").unwrap(),
            PaddingStrategy::GlobalPad,
            Some(5),
            Simd::Sse,
        ),
    );
    // The dot variant: a dense layer read in place, and a batch matmul whose B is
    // packed K-major (its K axis is not contiguous).
    let dot = ContractionKernel::parse("mr=2,nr=3,mc=8,nc=24,kc=32,uk=2,dot=1").unwrap();
    check(
        "dense-gelu-dot-local-pad-symbolic-avx2.c",
        &cpu(
            "dense(M=T,N=3072,K=768)+bias+gelu",
            dot,
            PaddingStrategy::LocalPad,
            None,
            Simd::Avx2,
        ),
    );
    check(
        "bmm_nn-dot-local-pad-symbolic-avx2.c",
        &cpu(
            "batch_matmul_nn(B=192,M=T,N=64,K=T)",
            dot,
            PaddingStrategy::LocalPad,
            None,
            Simd::Avx2,
        ),
    );
    // The transposed variant: a dense layer's B broadcast in place, each register tile
    // over the whole reduction, stored lane by lane; the epilogue along M.
    let vm = ContractionKernel::parse("mr=4,nr=16,mc=8,nc=32,kc=16,uk=2,ia=1,vm=1").unwrap();
    check(
        "dense-bias-gelu-vm-local-pad-symbolic-avx2.c",
        &cpu(
            "dense(M=T,N=3072,K=768)+bias+gelu",
            vm,
            PaddingStrategy::LocalPad,
            None,
            Simd::Avx2,
        ),
    );
}

#[test]
fn cuda_kernels_are_unchanged() {
    let t = GpuTarget::h100_sxm();
    let mk = GpuContractionKernel {
        bm: 64,
        bn: 64,
        bk: 8,
        tm: 4,
        tn: 4,
    };
    let w = Workload::parse("batch_matmul_nn(B=192,M=T,N=64,K=T)+relu").unwrap();
    let mut text = t.prelude();
    for s in [
        PaddingStrategy::LocalPad,
        PaddingStrategy::BoundaryCheck,
        PaddingStrategy::LoopPartition,
    ] {
        let mut p = Program::symbolic(&w, mk, s);
        text.push_str(&p.source(&t).unwrap());
        p.mode = KernelMode::Specialized;
        p.bindings = Bindings::from_pairs([("T", 60)]);
        text.push_str(&p.source(&t).unwrap());
    }
    check("bmm_nn-relu-all-strategies.cu", &text);
}

/// The row-wise sketch (softmax; layer norm and RMSNorm with their scale and bias),
/// every strategy.
#[test]
fn row_kernels_are_unchanged() {
    let target = target(Simd::Avx2);
    for (workload, file) in [
        ("softmax(M=12*T,N=T)", "softmax-all-strategies-avx2.c"),
        (
            "layer_norm(M=T,N=768,eps=1e-12)+mul(n)+add(n)",
            "layer_norm-all-strategies-avx2.c",
        ),
        (
            "rms_norm(M=T,N=D,eps=1e-6)+mul(n)",
            "rms_norm-all-strategies-avx2.c",
        ),
    ] {
        let w = Workload::parse(workload).unwrap();
        let mut text = target.prelude();
        for s in PADDING_STRATEGIES {
            let p = Program::symbolic(
                &w,
                RowKernel {
                    rows: 4,
                    vectors: 2,
                },
                s,
            );
            text.push_str(&p.source(&target).unwrap());
        }
        check(file, &text);
    }
}

/// The fused attention sketch, masked with NaN probabilities counted as 0, on AVX-512
/// (whole tile rows of the head dim) and AVX2 (its last vectors partial), and its AMX
/// variant in bf16.
#[test]
fn attention_kernels_are_unchanged() {
    let w =
        Workload::parse("masked_attention(B=B,H=12,M=T,N=T,D=48,scale=0.125,nan_to_zero)").unwrap();
    for (simd, rows, vectors, isa) in [(Simd::Avx512, 3, 3, "avx512"), (Simd::Avx2, 2, 4, "avx2")] {
        let target = target(simd);
        let mut text = target.prelude();
        let mk = AttentionKernel {
            rows,
            vectors,
            amx: false,
            pairs: false,
        };
        let p = Program::symbolic(&w, mk, PaddingStrategy::LocalPad);
        text.push_str(&p.source(&target).unwrap());
        check(
            &format!("masked_attention-local-pad-symbolic-{isa}.c"),
            &text,
        );
    }
    // The AMX variant: both products on tiles, in blocks of 32 query rows.
    let w = Workload::parse("masked_attention_bf16(B=B,H=12,M=T,N=T,D=64,scale=0.125,nan_to_zero)")
        .unwrap();
    let target = CpuTarget {
        amx: true,
        ..target(Simd::Avx512)
    };
    let mk = AttentionKernel {
        rows: 32,
        vectors: 2,
        amx: true,
        pairs: false,
    };
    let mut text = target.prelude();
    let p = Program::symbolic(&w, mk, PaddingStrategy::LocalPad);
    text.push_str(&p.source(&target).unwrap());
    check(
        "masked_attention_bf16-amx-local-pad-symbolic-avx512.c",
        &text,
    );
    // The pairs variant: both products as `vdpbf16ps` register tiles, operands packed
    // as the AMX variant's.
    let pairs_target = CpuTarget {
        amx: false,
        avx512_bf16: true,
        avx512_vnni: false,
        ..target
    };
    let mk = AttentionKernel {
        rows: 6,
        vectors: 3,
        amx: false,
        pairs: true,
    };
    let mut text = pairs_target.prelude();
    let p = Program::symbolic(&w, mk, PaddingStrategy::LocalPad);
    text.push_str(&p.source(&pairs_target).unwrap());
    check(
        "masked_attention_bf16-pairs-local-pad-symbolic-avx512.c",
        &text,
    );
}
