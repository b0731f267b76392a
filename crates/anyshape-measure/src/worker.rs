//! The worker process: reads one job (kernels + candidates) as a JSON line on standard
//! input, runs each candidate and reports events as JSON lines on standard output.
//! It is started by [`crate::Runner`] through `anyshape __worker` (or, in this crate's
//! tests, `anyshape-worker`).
//!
//! The job names its kernels and so its device ([`Kernels`]): a shared library of C
//! kernels (CPU), a PTX file (the first GPU: inputs are uploaded once per candidate and
//! each call is timed with CUDA events), or the builtin kernels compiled into the worker
//! executable ([`Builtins`]: baselines such as the `gemm` crate on CPU or cuBLAS on GPU).
use crate::gpu::GpuKernel;
use crate::runner::{Event, Job};
use crate::{
    buffer_bytes, check_output, random_inputs, reference_output, Candidate, CheckReport,
    GpuBuiltin, GpuDevice, Kernels, Measurement, Outcome, Reference,
};
use anyshape_abi::{load_library, status_message, KernelFn, STATUS_OK};
use anyshape_codegen::DeviceKind;
use anyshape_ir::BoundWorkload;
use cudarc::driver::CudaModule;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Instant;

/// A kernel prepared for one instance: called with the inputs and the output.
pub type PreparedKernel = Box<dyn FnMut(&[*const f32], *mut f32) -> Result<(), String>>;

/// A kernel compiled into the worker executable, found by its symbol when a job names
/// [`Kernels::Builtin`]. `prepare` runs once per instance, outside the timed calls.
#[derive(Clone, Copy)]
pub struct Builtin {
    /// The name jobs use for it.
    pub symbol: &'static str,
    /// Set the kernel up for an instance (shapes, strides), or say why it cannot run it.
    pub prepare: fn(&anyshape_ir::Workload, &BoundWorkload) -> Result<PreparedKernel, String>,
}

/// The builtin kernels of a worker executable, per device.
#[derive(Clone, Copy)]
pub struct Builtins {
    /// CPU kernels.
    pub cpu: &'static [Builtin],
    /// GPU kernels.
    pub gpu: &'static [GpuBuiltin],
}

/// Where a job's kernels come from.
enum Source {
    Library(libloading::Library),
    Builtins(&'static [Builtin]),
    /// The first GPU, with the job's PTX (none for builtin GPU kernels).
    Gpu(GpuDevice, Option<Arc<CudaModule>>, &'static [GpuBuiltin]),
}

/// Open what the job names.
fn open_source(kernels: &Kernels, builtins: Builtins) -> Result<Source, String> {
    match kernels {
        Kernels::Builtin(DeviceKind::Cpu) => Ok(Source::Builtins(builtins.cpu)),
        Kernels::Builtin(DeviceKind::Cuda) | Kernels::Ptx(_) => {
            let dev = GpuDevice::open(0).map_err(|e| e.to_string())?;
            let module = match kernels {
                Kernels::Ptx(path) => Some(dev.load(path)?),
                _ => None,
            };
            Ok(Source::Gpu(dev, module, builtins.gpu))
        }
        // SAFETY: the library is one the builder produced from generated C; loading runs
        // no constructors of ours beyond the C runtime's.
        Kernels::Library(path) => unsafe { load_library(path) }
            .map(Source::Library)
            .map_err(|e| e.to_string()),
    }
}

/// Serve one job from standard input with no builtin kernels.
pub fn serve() -> i32 {
    serve_with(Builtins { cpu: &[], gpu: &[] })
}

/// Serve one job from standard input, resolving builtin kernels against `builtins`;
/// returns the process exit code.
pub fn serve_with(builtins: Builtins) -> i32 {
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return 2;
    }
    let job: Job = match serde_json::from_str(&line) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("anyshape worker: bad job: {e}");
            return 2;
        }
    };
    let library = open_source(&job.kernels, builtins);
    let mut out = std::io::stdout().lock();
    let mut emit = |ev: Event| {
        let line = serde_json::to_string(&ev).expect("events serialize");
        // The runner is gone (killed): stop instead of measuring for nobody.
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            std::process::exit(3);
        }
    };
    let mut instance: Option<Instance> = None;
    let cold = job.options.cold.then(Cold::new);
    let cands = &job.candidates;
    let mut i = 0;
    while i < cands.len() {
        // A group: consecutive candidates on the same instance, timed in alternation when
        // the options ask for it (drift on a shared machine then hits them alike).
        let same = |a: &Candidate, b: &Candidate| {
            a.workload == b.workload && a.bindings == b.bindings && a.check == b.check
        };
        let mut j = i + 1;
        if job.options.interleave {
            while j < cands.len() && same(&cands[i], &cands[j]) {
                j += 1;
            }
        }
        let lib = match &library {
            Err(e) => {
                for k in i..j {
                    let why = format!("cannot load {}: {e}", job.kernels);
                    emit(Event::Done(k, Outcome::Failed(why)));
                }
                i = j;
                continue;
            }
            Ok(lib) => lib,
        };
        let prepared = prepare(&cands[i], &mut instance);
        // One output for the group: candidates timed in alternation each writing their
        // own would hold the caches as a kernel never does (at batch_matmul_nn T = 79,
        // sixteen 3.9 MB outputs; the votes then saw some kernels 30-45 % slower than a
        // module's calls run them).
        let mut output = Vec::new();
        let mut ready: Vec<(usize, Timed)> = Vec::new();
        for (k, cand) in cands.iter().enumerate().take(j).skip(i) {
            let warmed = prepared.clone().and_then(|(inputs, reference, bound)| {
                let f = kernel(lib, cand, inputs, bound)?;
                emit(Event::Start(k));
                Timed::warm(f, cand, inputs, &mut output, reference, bound)
            });
            match warmed {
                Ok(t) => ready.push((k, t)),
                Err(why) => emit(Event::Done(k, Outcome::Failed(why))),
            }
        }
        let o = &job.options;
        let start = Instant::now();
        let mut round = 0;
        while !ready.is_empty()
            && (round < o.min_repeats
                || (start.elapsed().as_secs_f64() < o.min_seconds * ready.len() as f64
                    && round < o.max_repeats))
        {
            let mut failed = Vec::new();
            for (n, (k, t)) in ready.iter_mut().enumerate() {
                if let (Some(cold), Ok((inputs, ..))) = (&cold, &prepared) {
                    cold.evict(inputs, &output);
                }
                // The time limit is per call: a group of slow candidates timed in
                // alternation would otherwise share one window, and the last one
                // started would be blamed for the others' time.
                emit(Event::Start(*k));
                if let Err(why) = t.call(&mut output) {
                    failed.push((n, why));
                }
            }
            for (n, why) in failed.into_iter().rev() {
                let (k, _) = ready.remove(n);
                emit(Event::Done(k, Outcome::Failed(why)));
            }
            round += 1;
        }
        for (k, t) in ready {
            emit(Event::Done(k, t.outcome()));
        }
        i = j;
    }
    0
}

/// What a model's kernel finds when its turn comes: its weights and activations out
/// of the caches and their pages out of the TLB, since the other layers ran in
/// between ([`crate::MeasureOptions::cold`]).
struct Cold {
    /// Pages read one byte each to push the kernel's pages out of the TLB.
    pages: Vec<u8>,
    /// The CPU has `clflushopt` (x86-64).
    clflushopt: bool,
}

impl Cold {
    /// Page size assumed, bytes (4 KiB: large allocations get small pages unless
    /// transparent huge pages are forced for every mapping).
    const PAGE: usize = 4096;

    fn new() -> Cold {
        // 8192 pages: more than the second-level TLBs of current x86 and Arm cores
        // hold (1.5-3 K entries); written, so that each is a page of its own.
        Cold {
            pages: vec![1u8; 8192 * Self::PAGE],
            clflushopt: has_clflushopt(),
        }
    }

    /// Flush `inputs` and `output` from the caches and walk the pages.
    fn evict(&self, inputs: &[Vec<f32>], output: &[f32]) {
        inputs.iter().for_each(|v| flush_lines(v, self.clflushopt));
        flush_lines(output, self.clflushopt);
        let mut sum = 0u8;
        for i in (0..self.pages.len()).step_by(Self::PAGE) {
            // SAFETY: `i` is inside the buffer; volatile so that the reads happen.
            sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(self.pages.as_ptr().add(i)) });
        }
        std::hint::black_box(sum);
    }
}

/// Whether the CPU has `clflushopt`: CPUID leaf 7, EBX bit 23 (std's feature detection
/// lacks it; leaf 0 says whether leaf 7 exists). Asked once per job: CPUID leaves a
/// virtual machine.
fn has_clflushopt() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unused_unsafe)]
        // SAFETY: CPUID exists on every x86-64 CPU.
        unsafe {
            use std::arch::x86_64::{__cpuid, __cpuid_count};
            __cpuid(0).eax >= 7 && __cpuid_count(7, 0).ebx & (1 << 23) != 0
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Flush every cache line of `data` from every cache level (written back where
/// dirty), and wait until that is done: `clflushopt` on x86-64 where `opt` says the CPU
/// has it (else `clflush`), `dc civac` on Arm. Where neither applies, nothing (the call
/// runs warm).
/// Flushing what the kernel reads costs a fraction of evicting the caches by writing
/// twice their size (Emerald Rapids class: 10 MB in 0.5 ms against 60 ms for 520 MB),
/// so tuning with cold caches takes hardly longer than with warm ones.
fn flush_lines(data: &[f32], opt: bool) {
    const LINE: usize = 64;
    let Some(last) = data.len().checked_sub(1) else {
        return;
    };
    let first = data.as_ptr() as usize & !(LINE - 1);
    let end = data.as_ptr().wrapping_add(last) as usize;
    #[cfg(target_arch = "x86_64")]
    {
        for line in (first..=end).step_by(LINE) {
            // SAFETY: every line flushed holds a byte of `data`, so it is mapped; a
            // flush changes no value.
            unsafe {
                if opt {
                    std::arch::asm!("clflushopt [{}]", in(reg) line, options(nostack, preserves_flags));
                } else {
                    std::arch::x86_64::_mm_clflush(line as *const u8);
                }
            }
        }
        // SAFETY: a fence has no operands.
        unsafe { std::arch::x86_64::_mm_mfence() };
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _ = opt;
        for line in (first..=end).step_by(LINE) {
            // SAFETY: as above.
            unsafe {
                std::arch::asm!("dc civac, {}", in(reg) line, options(nostack, preserves_flags))
            };
        }
        // SAFETY: a barrier has no operands.
        unsafe { std::arch::asm!("dsb ish", options(nostack, preserves_flags)) };
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (first, end, opt);
}

/// The candidate's kernel, from the library, the builtins or the GPU.
fn kernel(
    source: &Source,
    cand: &Candidate,
    inputs: &[Vec<f32>],
    bound: &BoundWorkload,
) -> Result<Kernel, String> {
    match source {
        Source::Gpu(dev, module, builtins) => Ok(Kernel::Gpu(Box::new(dev.kernel(
            module.as_ref(),
            builtins,
            cand,
            inputs,
            bound,
        )?))),
        Source::Library(lib) => {
            // SAFETY: every generated kernel has the `KernelFn` signature.
            let f = unsafe { lib.get::<KernelFn>(cand.symbol.as_bytes()) }
                .map_err(|e| format!("symbol {} not found: {e}", cand.symbol))?;
            let vars = cand.var_values();
            Ok(Kernel::C(*f, vars))
        }
        Source::Builtins(all) => {
            let b = all
                .iter()
                .find(|b| b.symbol == cand.symbol)
                .ok_or_else(|| format!("no builtin kernel {}", cand.symbol))?;
            Ok(Kernel::Builtin((b.prepare)(&cand.workload, bound)?))
        }
    }
}

/// A callable kernel: generated C with its shape-var values, a prepared builtin, or a
/// GPU kernel with its device buffers.
enum Kernel {
    C(KernelFn, Vec<i64>),
    Builtin(PreparedKernel),
    Gpu(Box<GpuKernel>),
}

type Prepared<'a> = (&'a [Vec<f32>], Option<&'a Reference>, &'a BoundWorkload);

/// Data of the instance last prepared, reused by the next candidate on the same instance.
struct Instance {
    key: String,
    inputs: Vec<Vec<f32>>,
    reference: Option<Reference>,
    bound: BoundWorkload,
}

/// Inputs and reference for the candidate's instance, reused across candidates of one instance.
fn prepare<'a>(cand: &Candidate, cache: &'a mut Option<Instance>) -> Result<Prepared<'a>, String> {
    let key = format!("{}|{}", cand.workload, cand.bindings);
    let bound = cand
        .workload
        .bind(&cand.bindings)
        .map_err(|e| e.to_string())?;
    let stale = cache
        .as_ref()
        .is_none_or(|c| c.key != key || (cand.check && c.reference.is_none()));
    if stale {
        *cache = None;
        // Inputs and output in f32, the reference and its magnitudes in f64.
        let out_len = bound.lens[cand.workload.inputs.len()];
        let bytes = buffer_bytes(&bound) + if cand.check { out_len as u128 * 16 } else { 0 };
        anyshape_abi::check_fits(bytes, "the instance's buffers")?;
        let inputs = random_inputs(&cand.workload, &bound, 42);
        let reference = cand.check.then(|| {
            let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
            reference_output(&cand.workload, &bound, &views)
        });
        *cache = Some(Instance {
            key,
            inputs,
            reference,
            bound,
        });
    }
    let c = cache.as_ref().expect("filled above");
    Ok((
        &c.inputs,
        if cand.check {
            c.reference.as_ref()
        } else {
            None
        },
        &c.bound,
    ))
}

/// A candidate warmed up (called once, checked) and being timed.
struct Timed {
    f: Kernel,
    ins: Vec<*const f32>,
    times: Vec<f64>,
    check: Option<CheckReport>,
}

impl Timed {
    /// Call once into `output` (untimed: first-call costs such as page faults or a
    /// vendor library's setup stay out of the timings) and check the output against the
    /// reference. `output` is refilled with NaN first (its length the instance's
    /// output), so that what an earlier candidate wrote there never passes for this
    /// one's.
    fn warm(
        f: Kernel,
        cand: &Candidate,
        inputs: &[Vec<f32>],
        output: &mut Vec<f32>,
        reference: Option<&Reference>,
        bound: &BoundWorkload,
    ) -> Result<Timed, String> {
        output.clear();
        output.resize(bound.lens[cand.workload.inputs.len()], f32::NAN);
        let mut t = Timed {
            f,
            ins: inputs.iter().map(|v| v.as_ptr()).collect(),
            times: Vec::new(),
            check: None,
        };
        t.call(output)?;
        if let Kernel::Gpu(k) = &t.f {
            *output = k.output()?;
        }
        t.times.clear();
        t.check = reference.map(|r| check_output(output, r));
        Ok(t)
    }

    /// One timed call writing `output`, which is the instance's (GPU kernels time
    /// themselves with CUDA events and keep their output on the device).
    fn call(&mut self, output: &mut [f32]) -> Result<(), String> {
        let outs = [output.as_mut_ptr()];
        let t0 = Instant::now();
        match &mut self.f {
            Kernel::Gpu(k) => {
                let seconds = k.call()?;
                self.times.push(seconds);
                return Ok(());
            }
            Kernel::C(f, vars) => {
                // SAFETY: buffers have the lengths the bound workload gives for these
                // shape vars; the inputs outlive the group of candidates being timed.
                let status = unsafe { f(vars.as_ptr(), self.ins.as_ptr(), outs.as_ptr()) };
                if status != STATUS_OK {
                    return Err(format!("kernel returned {}", status_message(status)));
                }
            }
            Kernel::Builtin(f) => f(&self.ins, outs[0])?,
        }
        self.times.push(t0.elapsed().as_secs_f64());
        Ok(())
    }

    fn outcome(mut self) -> Outcome {
        self.times.sort_by(f64::total_cmp);
        // A timer can read 0 for a call shorter than its resolution; a latency is
        // positive (records refuse others).
        let at_least = |t: f64| t.max(1e-9);
        Outcome::Measured(Measurement {
            min_seconds: at_least(self.times[0]),
            median_seconds: at_least(self.times[self.times.len() / 2]),
            repeats: self.times.len(),
            check: self.check,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushing_keeps_the_values() {
        let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        // Empty, one element, unaligned starts and ends across lines.
        for opt in [false, has_clflushopt()] {
            flush_lines(&data[..0], opt);
            flush_lines(&data[7..8], opt);
            flush_lines(&data[3..517], opt);
        }
        Cold::new().evict(&[data.clone(), Vec::new()], &data[1..]);
        assert!(data.iter().enumerate().all(|(i, &x)| x == i as f32));
    }
}
