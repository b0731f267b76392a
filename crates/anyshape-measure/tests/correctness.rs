//! Every program anyshape generates is checked against the reference implementation:
//! each sketch's workloads (contractions with and without epilogue chains, softmax) x
//! four padding strategies x two kernel modes, over T = 1, primes, the range ends 1 and
//! 128 and values past the range; plus random micro-kernels.
use anyshape_codegen::{
    AttentionKernel, ContractionKernel, CpuTarget, KernelMode, PaddingStrategy, Program, RowKernel,
    Simd, Sketch, KERNEL_MODES, PADDING_STRATEGIES,
};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{Builder, Candidate, MeasureOptions, Outcome, Runner, WorkerCommand};
use rand::{RngExt, SeedableRng};

const TS: [i64; 11] = [1, 7, 17, 37, 61, 97, 113, 127, 128, 129, 200];

/// The usual T set as instances.
fn instances() -> Vec<Bindings> {
    TS.iter()
        .map(|&t| Bindings::from_pairs([("T", t)]))
        .collect()
}

fn runner() -> Runner {
    let worker = WorkerCommand {
        program: env!("CARGO_BIN_EXE_anyshape-worker").into(),
        args: vec![],
    };
    Runner {
        worker,
        options: MeasureOptions {
            min_repeats: 1,
            max_repeats: 1,
            min_seconds: 0.0,
            timeout_seconds: 60.0,
            interleave: false,
            cold: false,
        },
    }
}

/// A micro-kernel with small tiles, so that small shapes still span several cache tiles
/// and reduction tiles; three vectors wide, so that tiles at the N edge run one, two or
/// three of them.
fn small_micro_kernel(target: &CpuTarget) -> ContractionKernel {
    let lanes = target.lanes_f32();
    ContractionKernel {
        mr: 3,
        nr: 3 * lanes,
        mc: 6,
        nc: 6 * lanes,
        kc: 8,
        uk: 4,
        dot: false,
        pf: false,
        ia: false,
        ib: false,
        vm: false,
        amx: false,
    }
}

/// The dot variant with small tiles: several register tiles per cache tile, reduction
/// tiles of one vector (so that K has several tiles and a tail), a tile wider than
/// tall.
fn small_dot_micro_kernel(target: &CpuTarget) -> ContractionKernel {
    ContractionKernel {
        mr: 2,
        nr: 3,
        mc: 4,
        nc: 6,
        kc: target.lanes_f32(),
        uk: 1,
        dot: true,
        pf: false,
        ia: false,
        ib: false,
        vm: false,
        amx: false,
    }
}

/// Row kernels that make small shapes take every path: several rows per task, a
/// vector tail, one vector.
fn small_row_kernels() -> [RowKernel; 2] {
    [
        RowKernel {
            rows: 3,
            vectors: 1,
        },
        RowKernel {
            rows: 1,
            vectors: 3,
        },
    ]
}

/// Build every program, run each on its instances with the check on, and fail listing
/// every program that is wrong or did not run.
fn check_programs<K: Sketch<Target = CpuTarget>>(
    target: &CpuTarget,
    runs: Vec<(Program<K>, Vec<Bindings>)>,
) {
    let dir = tempfile::tempdir().unwrap();
    let programs: Vec<Program<K>> = runs.iter().map(|(p, _)| p.clone()).collect();
    let lib = Builder::new(dir.path())
        .build_programs(target, &programs)
        .unwrap();
    assert!(
        lib.failed.is_empty(),
        "kernels failed to compile: {:#?}",
        lib.failed
    );
    let mut runs: Vec<(Candidate, String)> = runs
        .iter()
        .flat_map(|(p, instances)| {
            instances.iter().map(move |b| {
                let candidate = Candidate {
                    symbol: p.symbol(target),
                    workload: p.workload.clone(),
                    bindings: b.clone(),
                    check: true,
                    gpu: None,
                };
                let label = format!(
                    "{} {} {} {} [{b}]",
                    p.workload, p.micro_kernel, p.strategy, p.mode
                );
                (candidate, label)
            })
        })
        .collect();
    // One instance's candidates one after another: the worker makes an instance's
    // inputs and reference output once for the candidates that follow on it.
    runs.sort_by_cached_key(|(c, _)| (c.workload.to_string(), c.bindings.to_string()));
    let (candidates, labels): (Vec<Candidate>, Vec<String>) = runs.into_iter().unzip();
    let outcomes = runner().measure(&lib.kernels(), &candidates).unwrap();
    let failures: Vec<String> = outcomes
        .iter()
        .zip(&labels)
        .filter_map(|(o, label)| match o {
            Outcome::Measured(m) if m.check.as_ref().is_some_and(|c| c.passed) => None,
            other => Some(format!("{label}: {other:?}")),
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} runs wrong:\n{}",
        failures.len(),
        labels.len(),
        failures.join("\n")
    );
}

/// `workload` with the micro-kernels `mks`, every strategy and mode: symbolic kernels on
/// every T, specialized kernels for every `every`-th T.
fn matrix<K: Sketch<Target = CpuTarget>>(workload: &str, mks: [K; 2], every: usize) {
    matrix_on(
        &CpuTarget::detect(),
        workload,
        mks,
        every,
        &PADDING_STRATEGIES,
    );
}

/// [`matrix`] on `target` with the padding strategies `strategies`.
fn matrix_on<K: Sketch<Target = CpuTarget>>(
    target: &CpuTarget,
    workload: &str,
    mks: [K; 2],
    every: usize,
    strategies: &[PaddingStrategy],
) {
    let w = Workload::parse(workload).unwrap();
    let all = instances();
    let mut runs = Vec::new();
    for &strategy in strategies {
        for mode in KERNEL_MODES {
            match mode {
                KernelMode::Symbolic => {
                    for mk in mks {
                        runs.push((
                            Program {
                                workload: w.clone(),
                                micro_kernel: mk,
                                strategy,
                                mode,
                                bindings: Bindings::default(),
                            },
                            all.clone(),
                        ));
                    }
                }
                KernelMode::Specialized => {
                    for (i, b) in all.iter().enumerate().step_by(every) {
                        let p = Program {
                            workload: w.clone(),
                            micro_kernel: mks[i % 2],
                            strategy,
                            mode,
                            bindings: b.clone(),
                        };
                        runs.push((p, vec![b.clone()]));
                    }
                }
            }
        }
    }
    check_programs(target, runs);
}

/// `workload` with the three variants of the contraction sketch (vectors along N,
/// packed; dot products along K, read in place; transposed, vectors along M), each by
/// its default and a small micro-kernel (the usual variant's default packing A and B,
/// its register tiles half a vector and one row tall, so that A's K-contiguous blocks
/// are transposed in registers; its small one prefetching, the requests running past
/// the tensors' ends, and reading A in place, edge tiles past the last row, and B where
/// its N axis is contiguous, edge tiles loading it masked; the transposed variant the
/// same two with the operands' roles swapped: B broadcast, packed or in place, A
/// packed into vectors along M, the output stored lane by lane).
fn contraction(workload: &str, every: usize) {
    let target = CpuTarget::detect();
    let tall = target.lanes_f32() / 2 + 1;
    let mks = [
        ContractionKernel {
            mr: tall,
            mc: 2 * tall,
            ia: false,
            ib: false,
            vm: false,
            ..ContractionKernel::default_for(&target)
        },
        ContractionKernel {
            pf: true,
            ia: true,
            ib: true,
            vm: false,
            ..small_micro_kernel(&target)
        },
    ];
    matrix(workload, mks, every);
    matrix(
        workload,
        mks.map(|mk| ContractionKernel { vm: true, ..mk }),
        every,
    );
    let dots = [
        ContractionKernel::default_dot_for(&target),
        small_dot_micro_kernel(&target),
    ];
    matrix(workload, dots, every);
}

#[test]
fn dense_all_strategies_and_modes() {
    contraction("dense(M=16*T,N=80,K=42)", 1);
}

/// Weights pre-packed in panels: of whole vectors (read in place by the packed
/// variant), and of a width that is not (packed like any operand), rows padded.
#[test]
fn dense_packed_all_strategies_and_modes() {
    contraction("dense_packed(M=16*T,N=80,K=42,P=16)", 1);
    contraction("dense_packed(M=T,N=T+3,K=T+1,P=5)+bias+gelu", 3);
}

#[test]
fn batch_matmul_nt_all_strategies_and_modes() {
    contraction("batch_matmul_nt(B=3,M=T,N=T,K=64)", 1);
}

/// Also with N of any width: B read in place up to a partial vector at its edge.
#[test]
fn batch_matmul_nn_all_strategies_and_modes() {
    contraction("batch_matmul_nn(B=3,M=T,N=64,K=T)", 1);
    contraction("batch_matmul_nn(B=2,M=T,N=T+3,K=19)", 3);
}

/// Every padding strategy but global padding (which bf16 and i8 contractions refuse).
fn local_strategies() -> Vec<PaddingStrategy> {
    PADDING_STRATEGIES
        .into_iter()
        .filter(|s| !s.policy().copy)
        .collect()
}

/// `native`, then the same CPU with narrower vectors (AVX2, SSE; 16 registers): where
/// bf16 and i8 products have no instruction and are emulated.
fn this_and_narrower_vectors(native: &CpuTarget) -> Vec<CpuTarget> {
    [native.simd, Simd::Avx2, Simd::Sse]
        .into_iter()
        .filter(|simd| simd.vector_bytes() <= native.simd.vector_bytes())
        .map(|simd| CpuTarget {
            simd,
            vector_registers: native.vector_registers.min(16),
            ..native.clone()
        })
        .collect()
}

/// bf16 contractions: words of bfloat16 pairs in panels read in place (or attention's
/// keys packed as such words), A's pairs
/// rounded in the register tile (read in place) or as it is packed, by the default and
/// the small micro-kernel as a bf16
/// workload's space fits them (prefetching, edge tiles at M and at N, several reduction
/// tiles and a tail), every strategy but global padding (which a bf16 contraction
/// refuses), both modes; on this machine's vectors (`vdpbf16ps` where it has
/// AVX512_BF16) and on narrower ones (the halves widened by shifts).
#[test]
fn dense_bf16_all_strategies_modes_and_vectors() {
    let native = CpuTarget::detect();
    let strategies = local_strategies();
    for target in this_and_narrower_vectors(&native) {
        let simd = target.simd;
        // Attention's scores read both operands in pairs (B packed, its pairs rounded
        // into words): the projections' layout, a cache's with rows to spare, and
        // grouped heads reading one cache head (on this machine's vectors only: the
        // products are the dense layers' above).
        let attention = [
            (
                "attention_scores_bf16(B=2,H=3,M=T,N=T,K=16)+scale(0.25)+add(b,m,n)",
                1,
            ),
            ("cache_attention_scores_bf16(B=2,H=3,M=T,N=T+1,K=16,R=5)", 3),
            (
                "grouped_cache_attention_scores_bf16(B=1,H=2,G=3,M=T,N=T+1,K=8,R=0)+add(b,m,n)",
                3,
            ),
        ];
        let attention = attention.iter().filter(|_| simd == native.simd);
        for &(workload, every) in [
            ("dense_bf16(M=T,N=80,K=42,P=16)+bias+gelu", 1),
            ("dense_bf16(M=2*T,N=T+3,K=64,P=16)", 3),
        ]
        .iter()
        .chain(attention)
        {
            let w = Workload::parse(workload).unwrap();
            let small = ContractionKernel {
                pf: true,
                ..small_micro_kernel(&target)
            };
            let mks =
                [ContractionKernel::default_for(&target), small].map(|mk| mk.fit(&target, &w));
            // A read in place (the default) and packed as words of pairs (the small one).
            assert!(mks.iter().all(|mk| !mk.dot && !mk.vm), "{mks:?}");
            assert_eq!(mks.map(|mk| mk.ia), [true, false]);
            matrix_on(&target, workload, mks, every, &strategies);
        }
    }
}

/// i8 contractions (`dense_i8`: rows quantized before the tasks, quads of bytes
/// multiplied, 32-bit sums converted at write-back) against the reference's exact
/// integer products, every local strategy and both modes, on this machine's vectors
/// (`vpdpbusd` where it has AVX512_VNNI) and narrower ones (byte by byte): edge tiles
/// at M and N, a last panel narrower than the register tile, several reduction slices
/// (the correction added in the first only), epilogues with inputs. Both micro-kernels
/// as fitted: A never read in place.
#[test]
fn dense_i8_all_strategies_modes_and_vectors() {
    let native = CpuTarget::detect();
    let strategies = local_strategies();
    for target in this_and_narrower_vectors(&native) {
        for &(workload, every) in &[
            ("dense_i8(M=T,N=80,K=44,P=16)+bias+gelu", 1),
            ("dense_i8(M=2*T,N=T+3,K=128,P=16)+add(n)+add(m,n)", 3),
        ] {
            let w = Workload::parse(workload).unwrap();
            let small = ContractionKernel {
                pf: true,
                ia: true,
                ..small_micro_kernel(&target)
            };
            let mks =
                [ContractionKernel::default_for(&target), small].map(|mk| mk.fit(&target, &w));
            assert!(mks.iter().all(|mk| !mk.dot && !mk.vm && !mk.ia), "{mks:?}");
            matrix_on(&target, workload, mks, every, &strategies);
        }
    }
}

/// AMX tiles (`amx=1`, where this machine has AMX-BF16; skipped elsewhere): dense
/// layers over weights in panels (edge tiles at M and at N, a last panel narrower than
/// the register tile, epilogues with inputs) and attention's scores in their three forms
/// (keys packed in groups of 16), a one-row and a square register tile, both modes.
/// The variant handles tiles that overhang the tensors itself, so one strategy.
#[test]
fn bf16_on_amx_tiles() {
    let target = CpuTarget::detect();
    if !target.amx {
        eprintln!("skipped: this CPU has no AMX-BF16 tiles (or the OS refuses them)");
        return;
    }
    for &(workload, every) in &[
        ("dense_bf16(M=T,N=80,K=64,P=16)+bias+gelu", 1),
        ("dense_bf16(M=2*T,N=T+3,K=96,P=16)+add(n)+add(m,n)", 3),
        (
            "attention_scores_bf16(B=2,H=3,M=T,N=T,K=32)+scale(0.25)+add(b,m,n)",
            3,
        ),
        ("cache_attention_scores_bf16(B=2,H=3,M=T,N=T+1,K=64,R=5)", 3),
        (
            "grouped_cache_attention_scores_bf16(B=1,H=2,G=3,M=T,N=T+1,K=32,R=0)+add(b,m,n)",
            3,
        ),
    ] {
        let w = Workload::parse(workload).unwrap();
        let square = ContractionKernel::parse("mr=32,nr=32,mc=64,nc=64,kc=16,uk=1,amx=1").unwrap();
        let mks = [ContractionKernel::default_amx_for(&target), square];
        assert!(
            mks.iter().all(|mk| mk.fit(&target, &w) == *mk),
            "{workload}: tiles run it"
        );
        matrix_on(&target, workload, mks, every, &[PaddingStrategy::LocalPad]);
    }
}

/// Targets with narrower vectors than this machine's (their partial loads and stores
/// at the N edge are masked AVX ones for 8 lanes, element by element for 4).
#[test]
fn narrower_vectors_are_correct() {
    let native = CpuTarget::detect();
    for simd in [Simd::Avx2, Simd::Sse] {
        if simd.vector_bytes() >= native.simd.vector_bytes() {
            continue;
        }
        let target = CpuTarget {
            simd,
            vector_registers: 16,
            ..native.clone()
        };
        let w = Workload::parse("batch_matmul_nn(B=2,M=T,N=T+3,K=19)+relu").unwrap();
        let mk = ContractionKernel {
            pf: true,
            ia: true,
            ib: true,
            vm: false,
            ..small_micro_kernel(&target)
        };
        let mut runs = Vec::new();
        for mk in [mk, ContractionKernel { ib: false, ..mk }] {
            for strategy in PADDING_STRATEGIES {
                let program = Program {
                    workload: w.clone(),
                    micro_kernel: mk,
                    strategy,
                    mode: KernelMode::Symbolic,
                    bindings: Bindings::default(),
                };
                runs.push((program, instances()));
            }
        }
        check_programs(&target, runs);
    }
}

/// Multi-head attention's contractions, reading and writing heads in the
/// `[batch, sequence, heads, dim]` layout (two batch axes, rows strided by the heads)
/// and a cache's `[batch, heads, sequence, dim]`, the scores with a mask broadcast over
/// the heads.
#[test]
fn attention_all_strategies_and_modes() {
    contraction(
        "attention_scores(B=2,H=3,M=T,N=T,K=16)+scale(0.25)+add(b,m,n)",
        1,
    );
    contraction("attention_context(B=2,H=3,M=T,N=16,K=T)", 1);
    // A decoder's: keys and values in a cache's `[batch, heads, sequence, dim]`, the
    // cache one row longer than the queries (M = 1 is a decode step) and holding rows
    // to spare past them (a cache kept in place: its rows strided by its room).
    contraction(
        "cache_attention_scores(B=2,H=3,M=T,N=T+1,K=16,R=5)+scale(0.25)+add(b,m,n)",
        3,
    );
    contraction("cache_attention_context(B=2,H=3,M=T,N=16,K=T+1,R=T)", 3);
    // Grouped-query attention's: G = 3 query heads per cache head, the cache read in
    // place by each (broadcast over g), the mask broadcast over the heads and groups.
    contraction(
        "grouped_cache_attention_scores(B=2,H=2,G=3,M=T,N=T+1,K=16,R=5)+scale(0.25)+add(b,m,n)",
        3,
    );
    contraction(
        "grouped_cache_attention_context(B=2,H=2,G=3,M=T,N=16,K=T+1,R=T)",
        3,
    );
}

/// A convolution on its input's columns: filters shared by the batch (the first
/// operand broadcast over `b`), the columns read N-contiguous, with a per-channel bias,
/// a residual input and ReLU (a ResNet block's), at batch 1 and 3.
#[test]
fn conv_columns_all_strategies_and_modes() {
    contraction("conv_columns(B=1,M=19,N=T,K=27)+add(m)+relu", 2);
    contraction("conv_columns(B=3,M=8,N=T*T,K=36)+add(m)+add(b,m,n)+relu", 3);
}

/// The filters in panels (`conv_packed`): of whole vectors (read in place by the
/// transposed variant, broadcast from by the usual one), rows padded (19 channels), and
/// of a width that is not (packed like any operand).
#[test]
fn conv_packed_all_strategies_and_modes() {
    contraction("conv_packed(B=1,M=19,N=T,K=27,P=16)+add(m)+relu", 2);
    contraction(
        "conv_packed(B=3,M=32,N=T*T,K=36,P=16)+add(m)+add(b,m,n)+relu",
        3,
    );
    contraction("conv_packed(B=2,M=12,N=T+2,K=20,P=5)", 3);
}

/// A batch of matrices in panels (`batch_matmul_packed`: Winograd's transformed
/// filters): each item's rows padded (19), read in place or packed, with a residual;
/// and of a width that is not whole vectors.
#[test]
fn batch_matmul_packed_all_strategies_and_modes() {
    contraction(
        "batch_matmul_packed(B=4,M=19,N=T*T,K=T+5,P=16)+add(b,m,n)+relu",
        3,
    );
    contraction("batch_matmul_packed(B=2,M=12,N=T,K=20,P=5)", 3);
}

/// A transformer block's epilogues fused into the matmul: bias, GELU (exact and tanh),
/// a residual input, scaling; on every strategy and mode.
#[test]
fn epilogue_chains_all_strategies_and_modes() {
    contraction("dense(M=T,N=40,K=24)+bias+gelu+residual", 3);
    contraction(
        "batch_matmul_nt(B=2,M=T,N=T,K=16)+scale(0.125)+gelu_tanh+mul(m,n)",
        3,
    );
    // Llama's gated MLP: SiLU of one projection times another.
    contraction("dense_packed(M=T,N=40,K=24,P=16)+silu+mul(m,n)", 3);
}

/// Softmax along rows of any length (1 to past the tile), every strategy and mode.
#[test]
fn softmax_all_strategies_and_modes() {
    let target = CpuTarget::detect();
    matrix("softmax(M=3*T,N=T)", small_row_kernels(), 1);
    matrix(
        "softmax(M=T,N=T+5)+nan_to_zero",
        [RowKernel::default_for(&target), small_row_kernels()[0]],
        2,
    );
}

/// Layer norm (BERT's, with its scale and bias) and RMSNorm (Llama's, with its scale)
/// along rows of any length (1 to past the tile), every strategy and mode.
#[test]
fn layer_norm_and_rms_norm_all_strategies_and_modes() {
    let target = CpuTarget::detect();
    matrix(
        "layer_norm(M=3*T,N=T,eps=1e-12)+mul(n)+add(n)",
        small_row_kernels(),
        1,
    );
    matrix(
        "layer_norm(M=T,N=2*T+3)+residual",
        [RowKernel::default_for(&target), small_row_kernels()[0]],
        2,
    );
    matrix(
        "rms_norm(M=T,N=T+5,eps=1e-6)+mul(n)",
        [RowKernel::default_for(&target), small_row_kernels()[1]],
        2,
    );
}

/// The fused attention's vector variant with `rows` query rows per block and `vectors`
/// vectors per tile row.
fn vector_attention(rows: usize, vectors: usize) -> AttentionKernel {
    AttentionKernel {
        rows,
        vectors,
        amx: false,
        pairs: false,
    }
}

/// Fused attention (masked or not, NaN probabilities counted as 0 or not) over query
/// and key counts of 1 to past the tiles, head dims of whole tile rows and not, both
/// modes; its tails are the sketch's own whatever the strategy, so one strategy.
#[test]
fn fused_attention_all_shapes_and_modes() {
    let target = CpuTarget::detect();
    let strategies = [PaddingStrategy::LocalPad];
    let small = vector_attention;
    matrix_on(
        &target,
        "masked_attention(B=2,H=3,M=T,N=T,D=64,scale=0.125,nan_to_zero)",
        [AttentionKernel::default_for(&target), small(3, 1)],
        1,
        &strategies,
    );
    matrix_on(
        &target,
        "attention(B=1,H=2,M=T,N=T+5,D=24,scale=0.3)",
        [small(1, 3), small(5, 2)],
        2,
        &strategies,
    );
    matrix_on(
        &target,
        "masked_attention(B=1,H=1,M=T,N=2*T+1,D=7)",
        [small(2, 1), AttentionKernel::default_for(&target)],
        2,
        &strategies,
    );
    for w in [
        "masked_attention_bf16(B=2,H=3,M=T,N=T,D=64,scale=0.125,nan_to_zero)",
        "attention_bf16(B=1,H=2,M=T,N=T+5,D=32,scale=0.3)",
    ] {
        matrix_on(&target, w, bf16_attentions(&target, w), 2, &strategies);
    }
}

/// Fused attention in a decoder's layouts: keys and values in a cache with rows to
/// spare (`R`), query heads grouped on shared key/value heads (Llama's), one query row
/// against a growing cache (a generation step); masked or not, in f32 and bf16 (AMX
/// tiles where the CPU has them), over T = 1 to past the tiles; one and three
/// key/value heads, whose blocks are split into pieces over the threads.
#[test]
fn fused_cache_and_grouped_attention() {
    let target = CpuTarget::detect();
    let strategies = [PaddingStrategy::LocalPad];
    let small = vector_attention;
    for (w, mks) in [
        (
            "masked_grouped_cache_attention(B=2,H=2,G=3,M=T,N=T,D=64,R=3,scale=0.125,nan_to_zero)",
            [AttentionKernel::default_for(&target), small(3, 1)],
        ),
        (
            "grouped_cache_attention(B=1,H=1,G=2,M=T,N=T+4,D=24,R=0,scale=0.3)",
            [small(1, 3), small(5, 2)],
        ),
        (
            "masked_cache_attention(B=2,H=3,M=T,N=T+7,D=32,R=5)",
            [small(2, 1), AttentionKernel::default_for(&target)],
        ),
        (
            "masked_cache_attention(B=1,H=4,M=1,N=T,D=64,R=T+1,scale=0.125)",
            [small(1, 2), AttentionKernel::default_for(&target)],
        ),
        // Heads that do not divide among two threads: each head's blocks in pieces.
        (
            "masked_grouped_cache_attention(B=1,H=3,G=2,M=T,N=T+1,D=32,R=0,scale=0.2)",
            [small(2, 2), AttentionKernel::default_for(&target)],
        ),
    ] {
        matrix_on(&target, w, mks, 2, &strategies);
    }
    for w in [
        "masked_grouped_cache_attention_bf16(B=1,H=2,G=3,M=T,N=T,D=64,R=2,scale=0.125,nan_to_zero)",
        "cache_attention_bf16(B=2,H=2,M=T,N=T+9,D=32,R=1,scale=0.3)",
        "masked_cache_attention_bf16(B=1,H=3,M=1,N=T,D=64,R=0)",
        "grouped_cache_attention_bf16(B=1,H=1,G=4,M=T,N=T+2,D=64,R=1,scale=0.125)",
    ] {
        matrix_on(&target, w, bf16_attentions(&target, w), 2, &strategies);
    }
}

/// Two kernels of the bf16 attention `w`: on AMX tiles (blocks of 16 and 32 rows) where
/// the CPU has them; else on pairs (where it has AVX512_BF16) and a vector kernel in f32
/// products (what a CPU without runs; the bf16 bound holds it too).
fn bf16_attentions(target: &CpuTarget, w: &str) -> [AttentionKernel; 2] {
    let wl = Workload::parse(w).unwrap();
    let fitted = |rows, vectors| {
        AttentionKernel {
            pairs: true,
            ..vector_attention(rows, vectors)
        }
        .fit(target, &wl)
    };
    match target.amx {
        true => [fitted(16, 2), fitted(32, 2)],
        false => [fitted(6, 4), vector_attention(5, 1)],
    }
}

/// Random valid micro-kernels on random shapes (with and without an epilogue), every
/// strategy, symbolic mode; run on several instances each, including T = 0.
#[test]
fn random_micro_kernels_are_correct() {
    let target = CpuTarget::detect();
    let lanes = target.lanes_f32();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2026);
    let workloads = [
        "dense(M=T,N=2*T+3,K=T+1)+relu",
        "batch_matmul_nn(B=2,M=T+1,N=T,K=3*T)",
        "batch_matmul_nt(B=T,M=5,N=T,K=7)+relu",
        "dense_packed(M=T,N=2*T+3,K=T+1,P=16)+relu",
        "attention_context(B=2,H=2,M=T,N=T+1,K=T+2)+residual",
    ];
    let mut runs = Vec::new();
    while runs.len() < 32 {
        let nv = rng.random_range(1..=3usize);
        // Every third one the dot variant: any column count, K tiles of whole vectors.
        let dot = runs.len() % 3 == 2;
        let col = if dot { 1 } else { lanes };
        let mk = ContractionKernel {
            // Up to a vector and a half tall: A's blocks transposed in one or two groups.
            mr: rng.random_range(1..=lanes + lanes / 2 + 1),
            nr: nv * col,
            mc: 0,
            nc: nv * col * rng.random_range(1..=4usize),
            kc: 0,
            uk: [1, 2, 4, 8][rng.random_range(0..4usize)],
            dot,
            pf: !dot && rng.random_bool(0.5),
            ia: !dot && rng.random_bool(0.5),
            ib: !dot && rng.random_bool(0.5),
            vm: !dot && rng.random_bool(0.5),
            amx: false,
        };
        let mk = ContractionKernel {
            mc: mk.mr * rng.random_range(1..=5usize),
            kc: mk.k_granule(lanes) * rng.random_range(1..=6usize),
            ..mk
        };
        if mk.validate(&target).is_err() {
            continue;
        }
        let w = Workload::parse(workloads[runs.len() % workloads.len()]).unwrap();
        let strategy = PADDING_STRATEGIES[runs.len() % 4];
        let instances = [0, 1, rng.random_range(2..40), rng.random_range(40..90)]
            .map(|t| Bindings::from_pairs([("T", t)]))
            .to_vec();
        runs.push((
            Program {
                workload: w,
                micro_kernel: mk,
                strategy,
                mode: KernelMode::Symbolic,
                bindings: Bindings::default(),
            },
            instances,
        ));
    }
    check_programs(&target, runs);
}

/// Every seed of the contraction workloads (the micro-kernels every search measures
/// first and every vote measures everywhere), as the tuner builds them: symbolic, with
/// local padding, over the usual T set.
#[test]
fn every_seed_is_correct() {
    let target = CpuTarget::detect();
    let mut runs = Vec::new();
    for w in [
        "dense(M=T,N=2*T+3,K=T+1)+bias+gelu",
        "dense_packed(M=T,N=96,K=T+1,P=16)",
        "batch_matmul_nt(B=3,M=T,N=T,K=67)",
        "batch_matmul_nn(B=3,M=T,N=64,K=T)+relu",
        "conv_packed(B=2,M=40,N=T*T,K=T+5,P=16)+add(m)+relu",
        "batch_matmul_packed(B=3,M=40,N=T*T,K=T+5,P=16)+add(b,m,n)",
    ] {
        let w = Workload::parse(w).unwrap();
        for mk in ContractionKernel::seeds(&target, &w) {
            let p = Program {
                workload: w.clone(),
                micro_kernel: mk,
                strategy: PaddingStrategy::LocalPad,
                mode: KernelMode::Symbolic,
                bindings: Bindings::default(),
            };
            runs.push((p, instances()));
        }
    }
    check_programs(&target, runs);
}

/// A specialized kernel refuses shape-var values it was not built for.
#[test]
fn specialized_kernel_rejects_other_shapes() {
    let target = CpuTarget::detect();
    let w = Workload::parse("dense(M=T,N=16,K=8)").unwrap();
    let p = Program {
        workload: w.clone(),
        micro_kernel: small_micro_kernel(&target),
        strategy: PaddingStrategy::LocalPad,
        mode: KernelMode::Specialized,
        bindings: Bindings::from_pairs([("T", 5)]),
    };
    let dir = tempfile::tempdir().unwrap();
    let lib = Builder::new(dir.path())
        .build_programs(&target, std::slice::from_ref(&p))
        .unwrap();
    let cand = |t| Candidate {
        symbol: p.symbol(&target),
        workload: w.clone(),
        bindings: Bindings::from_pairs([("T", t)]),
        check: true,
        gpu: None,
    };
    let out = runner()
        .measure(&lib.kernels(), &[cand(5), cand(6)])
        .unwrap();
    assert!(matches!(&out[0], Outcome::Measured(m) if m.check.as_ref().unwrap().passed));
    assert!(
        matches!(&out[1], Outcome::Failed(why) if why.contains("status 1")),
        "{:?}",
        out[1]
    );
}

/// `w` with micro-kernel `mk` built under every padding strategy (symbolic mode) into
/// one library, and `each` called with each strategy and its loaded kernel.
fn each_strategy_kernel<K: Sketch<Target = CpuTarget>>(
    w: &Workload,
    mk: K,
    mut each: impl FnMut(PaddingStrategy, anyshape_abi::KernelFn),
) {
    let target = CpuTarget::detect();
    let dir = tempfile::tempdir().unwrap();
    let programs: Vec<Program<K>> = PADDING_STRATEGIES
        .into_iter()
        .map(|strategy| Program {
            workload: w.clone(),
            micro_kernel: mk,
            strategy,
            mode: KernelMode::Symbolic,
            bindings: Bindings::default(),
        })
        .collect();
    let lib = Builder::new(dir.path())
        .build_programs(&target, &programs)
        .unwrap();
    // SAFETY: a library just built from generated kernels.
    let library = unsafe { anyshape_abi::load_library(&lib.path) }.unwrap();
    for p in &programs {
        // SAFETY: generated kernels have the KernelFn signature.
        let f =
            unsafe { library.get::<anyshape_abi::KernelFn>(p.symbol(&target).as_bytes()) }.unwrap();
        each(p.strategy, *f);
    }
}

/// Kernels keep packed panels in per-thread scratch across calls; a second call on the
/// same shape with new data must not reuse them.
#[test]
fn repeated_calls_with_new_data_are_correct() {
    use anyshape_measure::{check_output, random_inputs, reference_output};
    let target = CpuTarget::detect();
    let w = Workload::parse("batch_matmul_nt(B=2,M=T,N=40,K=24)").unwrap();
    let b = Bindings::from_pairs([("T", 30)]);
    let bound = w.bind(&b).unwrap();
    each_strategy_kernel(&w, small_micro_kernel(&target), |strategy, f| {
        for seed in [1, 2, 3] {
            let inputs = random_inputs(&w, &bound, seed);
            let mut out = vec![f32::NAN; bound.lens[2]];
            let ins = [inputs[0].as_ptr(), inputs[1].as_ptr()];
            let outs = [out.as_mut_ptr()];
            // SAFETY: buffers sized by the bound workload.
            assert_eq!(
                unsafe { f([30i64].as_ptr(), ins.as_ptr(), outs.as_ptr()) },
                0
            );
            let r = reference_output(&w, &bound, &[&inputs[0], &inputs[1]]);
            assert!(check_output(&out, &r).passed, "{strategy} seed {seed}");
        }
    });
}

/// A row that is masked out entirely (all -inf) is NaN after a softmax, as in ONNX;
/// with `+nan_to_zero` (what models write after attention's softmax) it is zeros, and
/// the other rows are the softmax: every strategy, a row with a tail.
#[test]
fn fully_masked_softmax_rows_are_nan_or_zero() {
    use anyshape_measure::{check_output, reference_output};
    let n = 21usize;
    let mut x: Vec<f32> = (0..3 * n)
        .map(|i| ((i * 7 % 11) as f32) / 3.0 - 1.0)
        .collect();
    x[n..2 * n].fill(f32::NEG_INFINITY);
    for j in (0..n).step_by(3) {
        x[2 * n + j] = f32::NEG_INFINITY;
    }
    for text in ["softmax(M=3,N=T)", "softmax(M=3,N=T)+nan_to_zero"] {
        let w = Workload::parse(text).unwrap();
        let bound = w.bind(&Bindings::from_pairs([("T", n as i64)])).unwrap();
        each_strategy_kernel(&w, small_row_kernels()[0], |strategy, f| {
            let mut out = vec![1f32; 3 * n];
            let (ins, outs) = ([x.as_ptr()], [out.as_mut_ptr()]);
            // SAFETY: buffers sized by the bound workload.
            assert_eq!(
                unsafe { f([n as i64].as_ptr(), ins.as_ptr(), outs.as_ptr()) },
                0
            );
            let masked = &out[n..2 * n];
            if w.epilogue.is_empty() {
                assert!(
                    masked.iter().all(|y| y.is_nan()),
                    "{text} {strategy}: {masked:?}"
                );
            } else {
                assert!(
                    masked.iter().all(|&y| y == 0.0),
                    "{text} {strategy}: {masked:?}"
                );
                let r = reference_output(&w, &bound, &[&x]);
                assert!(check_output(&out, &r).passed, "{text} {strategy}");
            }
            let sum: f32 = out[2 * n..].iter().sum();
            assert!((sum - 1.0).abs() < 1e-5, "{text} {strategy}: {sum}");
        });
    }
}

/// A fused attention whose mask is -inf over a whole query row: NaN there without
/// `nan_to_zero` (as the softmax gives), zeros with it, and likewise a row with one NaN
/// score; a row with some keys masked matches the reference either way; in f32 and in
/// bf16.
#[test]
fn fully_masked_attention_rows_are_nan_or_zero() {
    use anyshape_measure::reference_output;
    let (h, m, n, d) = (2usize, 3usize, 21usize, 32usize);
    let wave = |len: usize, k: usize| -> Vec<f32> {
        (0..len)
            .map(|i| ((i * k % 13) as f32) / 6.0 - 1.0)
            .collect()
    };
    let (q, k, v) = (wave(m * h * d, 5), wave(n * h * d, 7), wave(n * h * d, 3));
    let mut mask = vec![0f32; m * n];
    mask[n..2 * n].fill(f32::NEG_INFINITY);
    // One NaN score makes its whole row NaN in the softmax (zeros under nan_to_zero).
    mask[5] = f32::NAN;
    for j in (0..n).step_by(3) {
        mask[2 * n + j] = f32::NEG_INFINITY;
    }
    let target = CpuTarget::detect();
    // In f32, and in bf16 (on AMX tiles where the CPU has them: D a multiple of 32).
    for (op, nan_to_zero) in [
        ("masked_attention", false),
        ("masked_attention", true),
        ("masked_attention_bf16", false),
        ("masked_attention_bf16", true),
    ] {
        let w = Workload::parse(&format!("{op}(B=1,H=2,M=3,N=T,D=32,scale=0.25)"))
            .unwrap()
            .with_attention(0.25, nan_to_zero)
            .unwrap();
        let bound = w.bind(&Bindings::from_pairs([("T", n as i64)])).unwrap();
        let reference = reference_output(&w, &bound, &[&q, &k, &v, &mask]);
        let mk = AttentionKernel {
            rows: 2,
            vectors: 1,
            amx: false,
            pairs: true,
        }
        .fit(&target, &w);
        each_strategy_kernel(&w, mk, |strategy, f| {
            let mut out = vec![1f32; m * h * d];
            let ins = [q.as_ptr(), k.as_ptr(), v.as_ptr(), mask.as_ptr()];
            let outs = [out.as_mut_ptr()];
            // SAFETY: buffers sized by the bound workload.
            assert_eq!(
                unsafe { f([n as i64].as_ptr(), ins.as_ptr(), outs.as_ptr()) },
                0
            );
            // Y is [1, M, H, D]: query row 1 is the masked one, both heads.
            let masked = &out[h * d..2 * h * d];
            match nan_to_zero {
                false => assert!(masked.iter().all(|y| y.is_nan()), "{strategy}: {masked:?}"),
                true => assert!(masked.iter().all(|&y| y == 0.0), "{strategy}: {masked:?}"),
            }
            for (i, (&y, (&r, &tol))) in out
                .iter()
                .zip(reference.output.iter().zip(&reference.tolerance))
                .enumerate()
            {
                let want = r.is_nan() && y.is_nan() || (y as f64 - r).abs() <= tol;
                assert!(
                    want,
                    "{strategy} nan_to_zero={nan_to_zero}: element {i} is {y}, not {r}"
                );
            }
        });
    }
}
