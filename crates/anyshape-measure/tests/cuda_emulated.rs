//! The CUDA kernels anyshape generates, checked against the reference without a GPU:
//! each kernel is compiled as C++ with a small emulation of CUDA's execution model (a
//! block's threads are OS threads, `__syncthreads` a barrier, `__shared__` memory one
//! copy per block as blocks run one after another) and run over T = 0, 1, primes, tile
//! edges, the range ends and past them, for three workloads, three padding strategies
//! and both kernel modes. On a GPU the same sources are compiled by NVRTC.
use anyshape_codegen::{
    launch_config, GpuContractionKernel, GpuTarget, KernelMode, PaddingStrategy, Program, Target,
};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{check_output, random_inputs, reference_output};
use std::fmt::Write;
use std::process::Command;

const EMULATION: &str = r#"
#include <barrier>
#include <cmath>
#include <math.h>
#include <thread>
#include <vector>
struct as_dim3 { unsigned x, y, z; };
static thread_local as_dim3 threadIdx;
static as_dim3 blockIdx;
static std::barrier<> *as_bar;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct float4 { float x, y, z, w; };
#define __syncthreads() as_bar->arrive_and_wait()
"#;

const TS: [i64; 14] = [0, 1, 2, 7, 13, 31, 32, 33, 60, 64, 65, 97, 128, 129];

/// C++ for `programs` plus a launcher per kernel: `launch_i(grid, threads, ins, out, vars)`.
fn emulated_source(programs: &[Program<GpuContractionKernel>], target: &GpuTarget) -> String {
    let mut s = format!("{EMULATION}{}", target.prelude());
    for (i, p) in programs.iter().enumerate() {
        s.push_str(&p.source(target).unwrap());
        let sym = p.symbol(target);
        let ins: String = (0..p.workload.inputs.len())
            .map(|k| format!("ins[{k}], "))
            .collect();
        let args: String = (0..p.workload.shape_vars().len())
            .map(|v| format!(", vars[{v}]"))
            .collect();
        let _ = writeln!(
            s,
            r#"extern "C" void launch_{i}(const unsigned *grid, unsigned threads, const float *const *ins, float *c, const long long *vars) {{
  for (unsigned z = 0; z < grid[2]; z++) for (unsigned y = 0; y < grid[1]; y++) for (unsigned x = 0; x < grid[0]; x++) {{
    blockIdx = {{x, y, z}};
    std::barrier<> bar(threads);
    as_bar = &bar;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; t++) ts.emplace_back([=] {{ threadIdx = {{t, 0, 0}}; {sym}({ins}c{args}); }});
    for (auto &t : ts) t.join();
  }}
}}"#
        );
    }
    s
}

type Launch = unsafe extern "C" fn(*const u32, u32, *const *const f32, *mut f32, *const i64);

#[test]
fn generated_cuda_kernels_compute_the_reference_under_emulation() {
    if Command::new("g++").arg("--version").output().is_err() {
        eprintln!("skipping: no g++ to compile the emulated CUDA kernels");
        return;
    }
    let target = GpuTarget::h100_sxm();
    // Scalar and float4 shared reads on either side, thread tiles of 1 to 8, and slices
    // that the threads do not divide (48 and 96 elements over 128 threads).
    let micro_kernels = [(32, 32, 4, 2, 4), (16, 32, 3, 4, 1), (64, 32, 4, 8, 8)]
        .map(|(bm, bn, bk, tm, tn)| GpuContractionKernel { bm, bn, bk, tm, tn });
    let mut programs = Vec::new();
    for w in [
        "dense(M=T,N=40,K=24)+relu",
        "dense(M=T,N=40,K=24)+bias+gelu+residual",
        "batch_matmul_nt(B=2,M=T,N=T,K=16)",
        "batch_matmul_nn(B=2,M=T,N=16,K=T)",
    ] {
        let w = Workload::parse(w).unwrap();
        for (mk, strategy) in micro_kernels.iter().flat_map(|&mk| {
            [
                PaddingStrategy::LocalPad,
                PaddingStrategy::BoundaryCheck,
                PaddingStrategy::LoopPartition,
            ]
            .map(|s| (mk, s))
        }) {
            programs.push(Program::symbolic(&w, mk, strategy));
            let mut p = Program::symbolic(&w, mk, strategy);
            p.mode = KernelMode::Specialized;
            p.bindings = Bindings::from_pairs([("T", 60)]);
            programs.push(p);
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("k.cpp");
    let so = dir.path().join("k.so");
    std::fs::write(&src, emulated_source(&programs, &target)).unwrap();
    let out = Command::new("g++")
        .args([
            "-std=c++20",
            "-O1",
            "-shared",
            "-fPIC",
            "-pthread",
            "-Wno-unknown-pragmas",
            "-o",
        ])
        .arg(&so)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: the library was just built from the sources above.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let mut failures = Vec::new();
    for (i, p) in programs.iter().enumerate() {
        // SAFETY: every launcher has the `Launch` signature.
        let launch = *unsafe { lib.get::<Launch>(format!("launch_{i}").as_bytes()) }.unwrap();
        let ts: Vec<i64> = match p.mode {
            KernelMode::Symbolic => TS.to_vec(),
            KernelMode::Specialized => vec![60],
        };
        for t in ts {
            let w = &p.workload;
            let b = Bindings::from_pairs([("T", t)]);
            let bound = w.bind(&b).unwrap();
            let n_in = w.inputs.len();
            let inputs = random_inputs(w, &bound, 3);
            let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
            let ins: Vec<*const f32> = inputs.iter().map(|v| v.as_ptr()).collect();
            let reference = reference_output(w, &bound, &views);
            let mut c = vec![f32::NAN; bound.lens[n_in]];
            let l = launch_config(w, &bound, &p.micro_kernel).unwrap();
            let vars = [t];
            // SAFETY: buffers have the bound instance's lengths; the grid covers it.
            unsafe {
                launch(
                    l.grid.as_ptr(),
                    l.block[0],
                    ins.as_ptr(),
                    c.as_mut_ptr(),
                    vars.as_ptr(),
                )
            };
            let r = check_output(&c, &reference);
            if !r.passed {
                failures.push(format!("{} {} {} at T={t}: {r:?}", w, p.strategy, p.mode));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
