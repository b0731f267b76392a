//! The machine's peaks, the ceilings kernels are compared to (`anyshape peak`, and
//! every comparison measures them in the same run): FP32 FMAs, where the CPU has
//! AVX512_BF16 the bf16 pair products (`vdpbf16ps`) that a `--precision bf16` module's
//! dense layers run on, where it has AMX-BF16 the tile products (`tdpbf16ps`) they
//! run on there, and where it has AVX512_VNNI the 8-bit quad products (`vpdpbusd`) a
//! `--precision i8` module's run on.
//!
//! The kernel runs independent vector chains (enough to cover the instruction's latency
//! times its ports), or four independent output tiles, for `iters` iterations on every
//! core with OpenMP; GFLOP/s = flops per iteration * iters * threads / seconds, best of
//! several runs.
use crate::error::{BenchError, Result};
use anyshape_abi::KernelFn;
use anyshape_codegen::CpuTarget;
use anyshape_measure::{Builder, KernelSource};
use std::time::Instant;

/// Independent FMA chains per thread (enough to cover FMA latency times the FMA ports).
pub const CHAINS: usize = 12;

/// What a peak is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peak {
    /// FP32 fused multiply-adds: 2 flops a lane.
    Fma,
    /// `vdpbf16ps`: two bf16 products and their sum added, 4 flops a lane. Its latency
    /// is longer: measured (Zen 5) 12 chains reach 89 % of what 24 do.
    DotBf16,
    /// AMX's `tdpbf16ps`: a 16 x 16 f32 tile plus a 16 x 32 by 32 x 16 product of
    /// bf16 tiles, 16,384 flops; four independent output tiles (2 x 2, as a register
    /// tile of the AMX variant holds).
    TileBf16,
    /// `vpdpbusd`: four products of bytes and their sum added, 8 (integer) operations a
    /// lane, counted as flops are.
    DotI8,
}

impl Peak {
    /// Independent chains per thread.
    pub fn chains(self) -> usize {
        match self {
            Peak::Fma => CHAINS,
            Peak::DotBf16 | Peak::DotI8 => 2 * CHAINS,
            Peak::TileBf16 => 4,
        }
    }

    /// Flops of one iteration of the kernel's loop on one thread.
    fn flops_per_iteration(self, lanes: usize) -> f64 {
        let per_chain = match self {
            Peak::Fma => 2.0 * lanes as f64,
            Peak::DotBf16 => 4.0 * lanes as f64,
            Peak::DotI8 => 8.0 * lanes as f64,
            Peak::TileBf16 => 2.0 * 16.0 * 16.0 * 32.0,
        };
        per_chain * self.chains() as f64
    }

    /// Whether `target` can run it (bf16 products need AVX512_BF16, tiles AMX-BF16
    /// and the OS's leave, 8-bit products AVX512_VNNI).
    pub fn available(self, target: &CpuTarget) -> bool {
        match self {
            Peak::Fma => true,
            Peak::DotBf16 => target.avx512_bf16,
            Peak::TileBf16 => target.amx,
            Peak::DotI8 => target.avx512_vnni,
        }
    }

    /// The peak a module compiled in `precision` runs its dense layers against, beside
    /// the FMA peak, where `target` has one: bf16's ([`Peak::of_bf16`]), or 8-bit quad
    /// products.
    pub fn of_precision(target: &CpuTarget, precision: anyshape_ir::Precision) -> Option<Peak> {
        match precision {
            anyshape_ir::Precision::F32 => None,
            anyshape_ir::Precision::Bf16 => Peak::of_bf16(target),
            anyshape_ir::Precision::I8 => Some(Peak::DotI8).filter(|p| p.available(target)),
        }
    }

    /// The peak a `--precision bf16` module's dense layers on `target` run against:
    /// tiles where it has AMX-BF16, pair products where it has AVX512_BF16, none
    /// elsewhere.
    pub fn of_bf16(target: &CpuTarget) -> Option<Peak> {
        [Peak::TileBf16, Peak::DotBf16]
            .into_iter()
            .find(|p| p.available(target))
    }

    /// How reports name it.
    pub fn describe(self) -> &'static str {
        match self {
            Peak::Fma => "FP32 FMA peak",
            Peak::DotBf16 => "bf16 pair-product peak (`vdpbf16ps`)",
            Peak::TileBf16 => "bf16 tile-product peak (AMX `tdpbf16ps`)",
            Peak::DotI8 => "i8 quad-product peak (`vpdpbusd`)",
        }
    }

    /// The precision it is the peak of, as a report's column names it.
    pub fn precision(self) -> &'static str {
        match self {
            Peak::Fma => "FMA",
            Peak::DotBf16 | Peak::TileBf16 => "bf16",
            Peak::DotI8 => "i8",
        }
    }

    fn step(self, i: usize) -> String {
        match self {
            Peak::Fma => format!("    a{i} = a{i} * m + d;\n"),
            Peak::DotBf16 => {
                format!(
                    "    __asm__(\"vdpbf16ps %1, %2, %0\" : \"+v\"(a{i}) : \"v\"(m), \"v\"(d));\n"
                )
            }
            Peak::DotI8 => {
                format!(
                    "    __asm__(\"vpdpbusd %1, %2, %0\" : \"+v\"(a{i}) : \"v\"(m), \"v\"(d));\n"
                )
            }
            Peak::TileBf16 => format!(
                "    __asm__ volatile(\"tdpbf16ps %%tmm{}, %%tmm{}, %%tmm{i}\" ::: \"memory\");\n",
                6 + i % 2,
                4 + i / 2
            ),
        }
    }

    fn symbol(self, threads: usize) -> String {
        match self {
            Peak::Fma => format!("as_peak_{threads}"),
            Peak::DotBf16 => format!("as_peak_bf16_{threads}"),
            Peak::TileBf16 => format!("as_peak_amx_{threads}"),
            Peak::DotI8 => format!("as_peak_i8_{threads}"),
        }
    }
}

fn source(kind: Peak, threads: usize) -> String {
    if kind == Peak::TileBf16 {
        return tile_source(threads);
    }
    let chains = kind.chains();
    let decl: String = (0..chains)
        .map(|i| format!("  as_vf a{i} = (as_vf){{0}} + (float)(t + {i});\n"))
        .collect();
    let body: String = (0..chains).map(|i| kind.step(i)).collect();
    let sum: String = (0..chains).map(|i| format!(" + a{i}")).collect();
    let symbol = kind.symbol(threads);
    format!(
        "int32_t {symbol}(const int64_t *vars, const float *const *ins, float *const *outs) {{\n\
         const int64_t iters = vars[0];\n\
         #pragma omp parallel for num_threads({threads}) schedule(static)\n\
         for (int t = 0; t < {threads}; t++) {{\n\
         as_vf m = (as_vf){{0}} + ins[0][0], d = (as_vf){{0}} + ins[0][1];\n{decl}\
         for (int64_t i = 0; i < iters; i++) {{\n{body}    __asm__ volatile(\"\" ::: \"memory\");\n  }}\n\
         as_vf s = (as_vf){{0}}{sum};\n  memcpy(&outs[0][t * 16], &s, sizeof(float));\n}}\n  return 0;\n}}\n"
    )
}

/// The tile-product kernel: on each thread, with the tiles configured as the kernels'
/// prelude does (`as_amx_ready`, which returns a status where the OS refuses them),
/// four output tiles from zero, A and B tiles loaded once from zeros (the products'
/// speed does not depend on the values), `iters` rounds of the four products.
fn tile_source(threads: usize) -> String {
    let symbol = Peak::TileBf16.symbol(threads);
    let body: String = (0..4).map(|i| Peak::TileBf16.step(i)).collect();
    format!(
        "int32_t {symbol}(const int64_t *vars, const float *const *ins, float *const *outs) {{\n\
         const int64_t iters = vars[0];\n\
         int32_t status = 0;\n\
         (void)ins;\n\
         #pragma omp parallel for num_threads({threads}) schedule(static)\n\
         for (int t = 0; t < {threads}; t++) {{\n\
         static const float zeros[256] __attribute__((aligned(64)));\n\
         float c[256] __attribute__((aligned(64)));\n\
         int32_t st = as_amx_ready(__atomic_add_fetch(&as_calls, 1, __ATOMIC_RELAXED));\n\
         if (st) {{ __atomic_store_n(&status, st, __ATOMIC_RELAXED); continue; }}\n\
         __asm__ volatile(\"tilezero %%tmm0\\ntilezero %%tmm1\\ntilezero %%tmm2\\ntilezero %%tmm3\" ::: \"memory\");\n\
         __asm__ volatile(\"tileloadd (%0,%1,1), %%tmm4\\ntileloadd (%0,%1,1), %%tmm5\\ntileloadd (%0,%1,1), %%tmm6\\ntileloadd (%0,%1,1), %%tmm7\" :: \"r\"(zeros), \"r\"((int64_t)64) : \"memory\");\n\
         for (int64_t i = 0; i < iters; i++) {{\n{body}  }}\n\
         __asm__ volatile(\"tilestored %%tmm0, (%0,%1,1)\" :: \"r\"(c), \"r\"((int64_t)64) : \"memory\");\n\
         outs[0][t * 16] = c[0];\n}}\n  return status;\n}}\n"
    )
}

/// The FP32 FMA peak in GFLOP/s on one thread and on all cores: `[(threads, GFLOP/s)]`.
pub fn measure(target: &CpuTarget, builder: &Builder, seconds: f64) -> Result<Vec<(usize, f64)>> {
    measure_kind(Peak::Fma, target, builder, seconds)
}

/// The peak of `kind` in GFLOP/s on one thread and on all cores (the caller checks
/// [`Peak::available`]: an instruction the CPU lacks would kill the process).
pub fn measure_kind(
    kind: Peak,
    target: &CpuTarget,
    builder: &Builder,
    seconds: f64,
) -> Result<Vec<(usize, f64)>> {
    measure_threads(kind, target, builder, seconds, &[1, target.cores])
}

/// The peak of `kind` in GFLOP/s on all cores, as a comparison's ceiling: measured by
/// [`Ceiling::measure`] before its runs and again by [`Ceiling::remeasure`] after them,
/// the better of the two kept — on a shared machine a neighbour busy through the first
/// second halved the peak of a run (`bench --model --conv-kernels` then reported 120 %
/// of it).
#[derive(Clone, Copy, Debug)]
pub struct Ceiling {
    /// What it is the peak of.
    pub kind: Peak,
    /// GFLOP/s: the best measurement so far.
    pub gflops: f64,
}

impl Ceiling {
    /// Seconds each measurement of a ceiling times its kernel (three rounds of them).
    const SECONDS: f64 = 0.3;

    /// The first measurement (the caller checks [`Peak::available`]).
    pub fn measure(kind: Peak, target: &CpuTarget, builder: &Builder) -> Result<Ceiling> {
        let gflops = all_cores(kind, target, builder)?;
        Ok(Ceiling { kind, gflops })
    }

    /// Measure again and keep the better.
    pub fn remeasure(&mut self, target: &CpuTarget, builder: &Builder) -> Result<()> {
        self.gflops = self.gflops.max(all_cores(self.kind, target, builder)?);
        Ok(())
    }
}

fn all_cores(kind: Peak, target: &CpuTarget, builder: &Builder) -> Result<f64> {
    let peaks = measure_threads(kind, target, builder, Ceiling::SECONDS, &[target.cores])?;
    Ok(peaks.first().map_or(f64::NAN, |p| p.1))
}

fn measure_threads(
    kind: Peak,
    target: &CpuTarget,
    builder: &Builder,
    seconds: f64,
    threads: &[usize],
) -> Result<Vec<(usize, f64)>> {
    let kernels: Vec<KernelSource> = threads
        .iter()
        .map(|&t| KernelSource {
            symbol: kind.symbol(t),
            code: source(kind, t),
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
    for &t in threads {
        // SAFETY: the kernel has the KernelFn signature.
        let f = unsafe { library.get::<KernelFn>(kind.symbol(t).as_bytes()) }.map_err(load)?;
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
            let status = unsafe { f([iters].as_ptr(), ins.as_ptr(), outs.as_ptr()) };
            if status != anyshape_abi::STATUS_OK {
                return Err(BenchError::Environment(format!(
                    "the {} kernel: {}",
                    kind.describe(),
                    anyshape_abi::status_message(status)
                )));
            }
            let dt = t0.elapsed().as_secs_f64();
            if dt < seconds / 4.0 {
                iters *= 2;
                continue;
            }
            let flops = kind.flops_per_iteration(lanes);
            best = best.max(flops * iters as f64 * t as f64 / dt / 1e9);
        }
        peaks.push((t, best));
    }
    Ok(peaks)
}
