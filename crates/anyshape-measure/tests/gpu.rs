//! On a machine with an NVIDIA GPU: the generated CUDA kernels compiled by NVRTC and run
//! on the device, checked against the reference for every T in 1..=128 and past it.
//! That test is `ignored` in `cargo test` (the listing shows why); `scripts/gpu.sh` runs
//! it. Without a GPU, opening the device is a clear error, never a panic.
use anyshape_codegen::{GpuMicroKernel, GpuProgram, PaddingStrategy};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{GpuDevice, MeasureError, MeasureOptions};

#[test]
fn opening_a_missing_gpu_is_an_error_not_a_panic() {
    match GpuDevice::open(0) {
        Ok(dev) => eprintln!("GPU present: {}", dev.target.name),
        Err(MeasureError::NoGpu(why)) => assert!(!why.is_empty()),
        Err(e) => panic!("a missing GPU must be NoGpu, got: {e}"),
    }
    assert!(matches!(
        GpuDevice::open(usize::MAX >> 1),
        Err(MeasureError::NoGpu(_))
    ));
}

#[test]
#[ignore = "needs an NVIDIA GPU with CUDA 12: run scripts/gpu.sh"]
fn generated_cuda_kernels_are_correct_on_the_gpu() {
    let dev = GpuDevice::open(0).expect("this test needs a GPU");
    eprintln!("GPU: {:?}", dev.target);
    let mk = GpuMicroKernel {
        bm: 64,
        bn: 64,
        bk: 8,
        tm: 4,
        tn: 4,
    };
    let once = MeasureOptions {
        min_repeats: 1,
        max_repeats: 1,
        min_seconds: 0.0,
        timeout_seconds: 60.0,
        interleave: false,
    };
    let mut failures = Vec::new();
    for w in [
        "dense(M=16*T,N=768,K=2304)",
        "batch_matmul_nt(B=192,M=T,N=T,K=64)",
        "batch_matmul_nn(B=192,M=T,N=64,K=T)",
    ] {
        let w = Workload::parse(w).unwrap();
        let programs: Vec<GpuProgram> = [
            PaddingStrategy::LocalPad,
            PaddingStrategy::BoundaryCheck,
            PaddingStrategy::LoopPartition,
        ]
        .map(|s| GpuProgram::symbolic(&w, mk, s))
        .to_vec();
        let lib = dev.compile(&programs).unwrap();
        for p in &programs {
            for t in (1..=128).chain([129, 200]) {
                let b = Bindings::from_pairs([("T", t)]);
                let m = dev.measure(&lib, p, &b, &once, true).unwrap();
                if !m.check.as_ref().is_some_and(|c| c.passed) {
                    failures.push(format!("{w} {} T={t}: {:?}", p.strategy, m.check));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
