//! On a machine with an NVIDIA GPU: the generated CUDA kernels compiled by NVRTC and run
//! on the device in isolated workers, checked against the reference for every T in
//! 1..=128 and past it, and the cuBLAS baseline likewise. That test is `ignored` in
//! `cargo test` (the listing shows why); `scripts/gpu.sh` runs it. Without a GPU,
//! opening the device and GPU jobs are clear errors, never a panic.
use anyshape_bench::CUBLAS_SYMBOL;
use anyshape_codegen::{DeviceKind, GpuContractionKernel, GpuTarget, PaddingStrategy, Program};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{
    Builder, Candidate, GpuDevice, Kernels, MeasureError, MeasureOptions, Outcome, Runner,
    WorkerCommand,
};

const CUBLAS: Kernels = Kernels::Builtin(DeviceKind::Cuda);

fn runner() -> Runner {
    Runner {
        worker: WorkerCommand {
            // `scripts/gpu.sh` names a prebuilt binary on a machine without Rust.
            program: std::env::var_os("ANYSHAPE_WORKER")
                .unwrap_or_else(|| env!("CARGO_BIN_EXE_anyshape").into())
                .into(),
            args: vec!["__worker".into()],
        },
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

/// The paper's shapes for the batched ones; dense with smaller N and K (the reference
/// is a plain loop nest on the host) that are not multiples of the tiles.
const WORKLOADS: [&str; 3] = [
    "dense(M=16*T,N=200,K=100)",
    "batch_matmul_nt(B=192,M=T,N=T,K=64)",
    "batch_matmul_nn(B=192,M=T,N=64,K=T)",
];

fn candidate(w: &Workload, symbol: String, t: i64, gpu: Option<GpuContractionKernel>) -> Candidate {
    Candidate {
        symbol,
        workload: w.clone(),
        bindings: Bindings::from_pairs([("T", t)]),
        check: true,
        gpu,
    }
}

#[test]
fn a_missing_gpu_is_an_error_not_a_panic() {
    let present = match GpuDevice::open(0) {
        Ok(dev) => {
            eprintln!("GPU present: {}", dev.target.name);
            true
        }
        Err(MeasureError::NoGpu(why)) => {
            assert!(!why.is_empty());
            false
        }
        Err(e) => panic!("a missing GPU must be NoGpu, got: {e}"),
    };
    assert!(matches!(
        GpuDevice::open(usize::MAX >> 1),
        Err(MeasureError::NoGpu(_))
    ));
    if present {
        return;
    }
    // GPU jobs fail each candidate with the reason; the worker does not crash.
    let w = Workload::parse(WORKLOADS[1]).unwrap();
    let cands = [
        candidate(&w, CUBLAS_SYMBOL.into(), 3, None),
        candidate(&w, CUBLAS_SYMBOL.into(), 4, None),
    ];
    for out in runner().measure(&CUBLAS, &cands).unwrap() {
        match out {
            Outcome::Failed(why) => assert!(why.contains("CUDA"), "{why}"),
            other => panic!("measured on no GPU, or interrupted: {other:?}"),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let p = Program::symbolic(&w, small(), PaddingStrategy::LocalPad);
    match Builder::new(dir.path()).build_programs(&GpuTarget::h100_sxm(), &[p]) {
        // NVRTC may be installed without a GPU: then the PTX builds.
        Ok(lib) => assert!(lib.failed.is_empty() && lib.path.exists()),
        Err(e) => assert!(matches!(e, MeasureError::NoGpu(_)), "{e}"),
    }
}

fn small() -> GpuContractionKernel {
    GpuContractionKernel {
        bm: 64,
        bn: 64,
        bk: 8,
        tm: 4,
        tn: 4,
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU with CUDA 12 or 13: run scripts/gpu.sh"]
fn generated_cuda_kernels_and_cublas_are_correct_on_the_gpu() {
    let dev = GpuDevice::open(0).expect("this test needs a GPU");
    eprintln!("GPU: {:?}", dev.target);
    let dir = tempfile::tempdir().unwrap();
    let builder = Builder::new(dir.path());
    let shapes: Vec<i64> = (1..=128).chain([129, 200]).collect();
    let mut failures = Vec::new();
    let mut checked = 0;
    for text in WORKLOADS {
        let w = Workload::parse(text).unwrap();
        let mut programs = Vec::new();
        for mk in [
            small(),
            GpuContractionKernel {
                bm: 128,
                bn: 128,
                bk: 8,
                tm: 8,
                tn: 8,
            },
        ] {
            for s in [
                PaddingStrategy::LocalPad,
                PaddingStrategy::BoundaryCheck,
                PaddingStrategy::LoopPartition,
            ] {
                programs.push(Program::symbolic(&w, mk, s));
            }
        }
        let lib = builder.build_programs(&dev.target, &programs).unwrap();
        assert!(lib.failed.is_empty(), "{:#?}", lib.failed);
        // Instance by instance, so the worker computes each reference once.
        let mut cands = Vec::new();
        let mut labels = Vec::new();
        for &t in &shapes {
            for p in &programs {
                cands.push(candidate(
                    &w,
                    p.symbol(&dev.target),
                    t,
                    Some(p.micro_kernel),
                ));
                labels.push(format!("{text} {} {} T={t}", p.micro_kernel, p.strategy));
            }
        }
        let outs = runner().measure(&lib.kernels(), &cands).unwrap();
        let blas: Vec<Candidate> = shapes
            .iter()
            .map(|&t| candidate(&w, CUBLAS_SYMBOL.into(), t, None))
            .collect();
        let blas_outs = runner().measure(&CUBLAS, &blas).unwrap();
        labels.extend(shapes.iter().map(|t| format!("{text} cuBLAS T={t}")));
        for (label, out) in labels.iter().zip(outs.iter().chain(&blas_outs)) {
            checked += 1;
            match out {
                Outcome::Measured(m) if m.check.as_ref().is_some_and(|c| c.passed) => {}
                other => failures.push(format!("{label}: {other:?}")),
            }
        }
    }
    eprintln!("{checked} GPU runs checked against the reference");
    assert!(failures.is_empty(), "{failures:#?}");
}
