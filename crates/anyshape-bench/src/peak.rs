//! The machine's FP32 FMA peak, the ceiling kernels are compared to (`anyshape peak`,
//! and every comparison measures it in the same run).
//!
//! The kernel runs `chains` independent vector FMA chains (enough to cover FMA latency
//! times the number of FMA ports) for `iters` iterations on every core with OpenMP;
//! GFLOP/s = 2 * lanes * chains * iters * threads / seconds, best of several runs.
use crate::error::{BenchError, Result};
use anyshape_abi::KernelFn;
use anyshape_codegen::CpuTarget;
use anyshape_measure::{Builder, KernelSource};
use std::time::Instant;

/// Independent FMA chains per thread (enough to cover FMA latency times the FMA ports).
pub const CHAINS: usize = 12;

fn source(threads: usize) -> String {
    let decl: String = (0..CHAINS)
        .map(|i| format!("  as_vf a{i} = (as_vf){{0}} + (float)(t + {i});\n"))
        .collect();
    let fma: String = (0..CHAINS)
        .map(|i| format!("    a{i} = a{i} * m + d;\n"))
        .collect();
    let sum: String = (0..CHAINS).map(|i| format!(" + a{i}")).collect();
    format!(
        "int32_t as_peak_{threads}(const int64_t *vars, const float *const *ins, float *const *outs) {{\n\
         const int64_t iters = vars[0];\n\
         #pragma omp parallel for num_threads({threads}) schedule(static)\n\
         for (int t = 0; t < {threads}; t++) {{\n\
         as_vf m = (as_vf){{0}} + ins[0][0], d = (as_vf){{0}} + ins[0][1];\n{decl}\
         for (int64_t i = 0; i < iters; i++) {{\n{fma}    __asm__ volatile(\"\" ::: \"memory\");\n  }}\n\
         as_vf s = (as_vf){{0}}{sum};\n  memcpy(&outs[0][t * 16], &s, sizeof(float));\n}}\n  return 0;\n}}\n"
    )
}

/// Peak GFLOP/s on one thread and on all cores: `[(threads, GFLOP/s)]`.
pub fn measure(target: &CpuTarget, builder: &Builder, seconds: f64) -> Result<Vec<(usize, f64)>> {
    let threads = [1, target.cores];
    let kernels: Vec<KernelSource> = threads
        .iter()
        .map(|&t| KernelSource {
            symbol: format!("as_peak_{t}"),
            code: source(t),
        })
        .collect();
    let lib = builder.build(target, &kernels)?;
    lib.require_all()?;
    let load = |e: anyshape_abi::LoadError| {
        BenchError::Environment(format!("loading the peak kernel: {e}"))
    };
    // SAFETY: our own library, built just now from the source above.
    let library = unsafe { anyshape_abi::load_library(&lib.path) }.map_err(load)?;
    let lanes = target.lanes_f32();
    let mut peaks = Vec::new();
    for &t in &threads {
        // SAFETY: the kernel has the KernelFn signature.
        let f =
            unsafe { library.get::<KernelFn>(format!("as_peak_{t}").as_bytes()) }.map_err(load)?;
        let input = [0.999_f32, 0.001];
        let mut out = vec![0f32; 16 * t.max(1)];
        let mut iters: i64 = 1 << 16;
        let mut best = 0f64;
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < seconds * 3.0 {
            let ins = [input.as_ptr()];
            let outs = [out.as_mut_ptr()];
            let t0 = Instant::now();
            // SAFETY: `ins[0]` has 2 elements, `outs[0]` 16 per thread.
            unsafe { f([iters].as_ptr(), ins.as_ptr(), outs.as_ptr()) };
            let dt = t0.elapsed().as_secs_f64();
            if dt < seconds / 4.0 {
                iters *= 2;
                continue;
            }
            best = best.max(2.0 * (lanes * CHAINS) as f64 * iters as f64 * t as f64 / dt / 1e9);
        }
        peaks.push((t, best));
    }
    Ok(peaks)
}
