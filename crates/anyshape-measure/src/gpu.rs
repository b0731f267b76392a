//! Running generated CUDA kernels on an NVIDIA GPU through `cudarc`, which loads the
//! CUDA libraries at run time: anyshape builds everywhere, and where no GPU or driver is
//! present [`GpuDevice::open`] says so as an error instead of failing to link or
//! panicking. NVRTC compiles, the driver API loads and launches, CUDA events time, and
//! the output is checked against the reference as on CPU.
//!
//! Unlike the CPU runner, kernels run in this process (a faulting kernel poisons the
//! context: the caller should open a new device).
use crate::{check_output, random_inputs, reference_output, MeasureOptions, Measurement};
use crate::{MeasureError, Result};
use anyshape_codegen::{launch_config, GpuProgram, GpuTarget, CUDA_PRELUDE};
use anyshape_ir::Bindings;
use cudarc::driver::sys::CUdevice_attribute as A;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// One GPU, ready to compile and time kernels.
pub struct GpuDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// NVRTC's target architecture, `sm_XY` (NVRTC takes a static string).
    arch: &'static str,
    /// Its limits, read from the device.
    pub target: GpuTarget,
}

/// Kernels compiled and loaded together, by symbol.
pub struct GpuLibrary {
    functions: HashMap<String, CudaFunction>,
}

fn gpu_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> MeasureError + '_ {
    move |e| MeasureError::Gpu(format!("{what}: {e:?}"))
}

impl GpuDevice {
    /// Open GPU `ordinal`; an error (never a panic) where the driver, NVRTC or a GPU is
    /// missing.
    pub fn open(ordinal: usize) -> Result<GpuDevice> {
        // SAFETY: only probes whether the shared libraries can be loaded.
        let (driver, nvrtc) = unsafe {
            (
                cudarc::driver::sys::is_culib_present(),
                cudarc::nvrtc::sys::is_culib_present(),
            )
        };
        if !driver {
            return Err(MeasureError::NoGpu(
                "the CUDA driver (libcuda.so) is not installed".into(),
            ));
        }
        if !nvrtc {
            return Err(MeasureError::NoGpu(
                "NVRTC (libnvrtc.so, CUDA 12) is not installed".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| MeasureError::NoGpu(format!("no usable GPU {ordinal}: {e:?}")))?;
        let attr = |a: A| -> Result<u32> {
            ctx.attribute(a)
                .map(|v| v.max(0) as u32)
                .map_err(gpu_err("reading a device attribute"))
        };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(gpu_err("reading the compute capability"))?;
        let target = GpuTarget {
            name: ctx.name().map_err(gpu_err("reading the device name"))?,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
            sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            warp_size: attr(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE)?,
            max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_threads_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            max_blocks_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)?,
            shared_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            shared_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
            registers_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            // The per-thread register limit of every compute capability since 3.5.
            registers_per_thread: 255,
        };
        // Leaked once per opened device.
        let arch = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        Ok(GpuDevice {
            stream: ctx.default_stream(),
            arch,
            ctx,
            target,
        })
    }

    /// Compile `programs` with NVRTC for this device and load them.
    pub fn compile(&self, programs: &[GpuProgram]) -> Result<GpuLibrary> {
        let mut src = String::from(CUDA_PRELUDE);
        for p in programs {
            src.push_str(
                &p.cuda_source(&self.target)
                    .map_err(|e| MeasureError::Gpu(e.to_string()))?,
            );
        }
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(
            &src,
            cudarc::nvrtc::CompileOptions {
                arch: Some(self.arch),
                ..Default::default()
            },
        )
        .map_err(|e| MeasureError::Compile {
            what: "CUDA kernels (NVRTC)".into(),
            stderr: format!("{e:?}"),
        })?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(gpu_err("loading the compiled kernels"))?;
        let mut functions = HashMap::new();
        for p in programs {
            let sym = p.symbol(&self.target);
            let f = module
                .load_function(&sym)
                .map_err(gpu_err("finding a kernel"))?;
            functions.insert(sym, f);
        }
        Ok(GpuLibrary { functions })
    }

    /// Time `program` on one instance (CUDA events around each launch; the first launch
    /// is an untimed warm-up) and, with `check`, compare its output with the reference.
    pub fn measure(
        &self,
        lib: &GpuLibrary,
        program: &GpuProgram,
        bindings: &Bindings,
        options: &MeasureOptions,
        check: bool,
    ) -> Result<Measurement> {
        let w = &program.workload;
        let bound = w
            .bind(bindings)
            .map_err(|e| MeasureError::Gpu(e.to_string()))?;
        let sym = program.symbol(&self.target);
        let f = lib
            .functions
            .get(&sym)
            .ok_or_else(|| MeasureError::Gpu(format!("kernel {sym} was not compiled")))?;
        let launch = launch_config(w, &bound, &program.micro_kernel)
            .map_err(|e| MeasureError::Gpu(e.to_string()))?;
        let inputs = random_inputs(&bound, w.inputs.len(), 42);
        let s = &self.stream;
        // At least one element each: a zero-sized allocation is not a device pointer.
        let upload = |v: &[f32]| {
            let data = if v.is_empty() { &[0.0f32][..] } else { v };
            s.clone_htod(data).map_err(gpu_err("copying an input"))
        };
        let a = upload(&inputs[0])?;
        let b = upload(&inputs[1])?;
        let out_len = bound.lens[w.inputs.len()];
        let mut c = s
            .alloc_zeros::<f32>(out_len.max(1))
            .map_err(gpu_err("allocating the output"))?;
        let vars: Vec<i64> = w
            .shape_vars()
            .iter()
            .map(|v| bindings.get(v).unwrap_or(0))
            .collect();
        let cfg = LaunchConfig {
            grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
            block_dim: (launch.block[0], launch.block[1], launch.block[2]),
            shared_mem_bytes: launch.shared_bytes,
        };
        let run = |c: &mut cudarc::driver::CudaSlice<f32>| -> Result<()> {
            if launch.blocks() == 0 {
                return Ok(());
            }
            let mut builder = s.launch_builder(f);
            builder.arg(&a).arg(&b).arg(c);
            for v in &vars {
                builder.arg(v);
            }
            // SAFETY: the kernel's parameters are the two inputs, the output and the
            // shape vars in this order; buffers hold the bound instance.
            unsafe { builder.launch(cfg) }
                .map(|_| ())
                .map_err(gpu_err("launching the kernel"))
        };
        run(&mut c)?;
        s.synchronize().map_err(gpu_err("running the kernel"))?;
        let report = if check {
            let got = s.clone_dtoh(&c).map_err(gpu_err("copying the output"))?;
            let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
            let reference = reference_output(w, &bound, &views);
            Some(check_output(&got[..out_len], &reference))
        } else {
            None
        };
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut times = Vec::new();
        let start = Instant::now();
        while times.len() < options.min_repeats
            || (start.elapsed().as_secs_f64() < options.min_seconds
                && times.len() < options.max_repeats)
        {
            let t0 = s
                .record_event(timing)
                .map_err(gpu_err("recording an event"))?;
            run(&mut c)?;
            let t1 = s
                .record_event(timing)
                .map_err(gpu_err("recording an event"))?;
            let ms = t0.elapsed_ms(&t1).map_err(gpu_err("timing the kernel"))?;
            times.push(f64::from(ms) / 1e3);
        }
        times.sort_by(f64::total_cmp);
        Ok(Measurement {
            min_seconds: times.first().copied().unwrap_or(0.0),
            median_seconds: times.get(times.len() / 2).copied().unwrap_or(0.0),
            repeats: times.len(),
            check: report,
        })
    }
}
