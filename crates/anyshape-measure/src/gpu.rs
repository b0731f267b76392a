//! Measuring on an NVIDIA GPU through `cudarc`, which loads the CUDA libraries at run
//! time: anyshape builds everywhere, and where no GPU or driver is present
//! [`GpuDevice::open`] says so as an error instead of failing to link or panicking.
//!
//! The worker loads the builder's PTX (or, for a job of builtin GPU kernels, asks the
//! worker binary's [`GpuBuiltin`]s, e.g. the cuBLAS baseline), uploads a candidate's
//! inputs once, and times each launch with CUDA events, after an untimed warm-up whose
//! output is checked against the reference. So GPU kernels get the CPU's isolation: a
//! kernel that faults or hangs kills only its worker and fails only its candidate.
use crate::{Candidate, MeasureError, Result};
use anyshape_codegen::{launch_config, GpuTarget};
use anyshape_ir::{BoundWorkload, Workload};
use cudarc::driver::sys::CUdevice_attribute as A;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig,
    PushKernelArg,
};
use std::path::Path;
use std::sync::Arc;

/// The device buffers of a candidate on one instance, as a builtin GPU kernel uses them.
pub struct GpuBuffers<'a> {
    /// The stream every launch goes to.
    pub stream: &'a Arc<CudaStream>,
    /// The inputs, in the workload's order.
    pub inputs: &'a [CudaSlice<f32>],
    /// The output.
    pub output: &'a mut CudaSlice<f32>,
}

/// A builtin GPU kernel prepared for one instance: one launch on the buffers.
pub type GpuCall = Box<dyn FnMut(GpuBuffers) -> std::result::Result<(), String>>;

/// A GPU kernel compiled into the worker executable (a baseline such as cuBLAS), found
/// by its symbol when a job names builtin kernels on CUDA. `prepare` runs once per
/// instance, outside the timed calls.
#[derive(Clone, Copy)]
pub struct GpuBuiltin {
    /// The name jobs use for it.
    pub symbol: &'static str,
    /// Set the kernel up for an instance on the stream, or say why it cannot run it.
    pub prepare:
        fn(&Arc<CudaStream>, &Workload, &BoundWorkload) -> std::result::Result<GpuCall, String>,
}

/// One GPU, ready to load and time kernels.
pub struct GpuDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Its limits, read from the device.
    pub target: GpuTarget,
}

fn gpu_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> String + '_ {
    move |e| format!("{what}: {e:?}")
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
                "NVRTC (libnvrtc.so, CUDA 12 or 13) is not installed".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| MeasureError::NoGpu(format!("no usable GPU {ordinal}: {e:?}")))?;
        let attr = |a: A| -> Result<u32> {
            ctx.attribute(a)
                .map(|v| v.max(0) as u32)
                .map_err(|e| MeasureError::Gpu(gpu_err("reading a device attribute")(e)))
        };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| MeasureError::Gpu(gpu_err("reading the compute capability")(e)))?;
        let target = GpuTarget {
            name: ctx
                .name()
                .map_err(|e| MeasureError::Gpu(gpu_err("reading the device name")(e)))?,
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
        Ok(GpuDevice {
            stream: ctx.default_stream(),
            ctx,
            target,
        })
    }

    /// Load a PTX file the builder wrote.
    pub(crate) fn load(&self, ptx: &Path) -> std::result::Result<Arc<CudaModule>, String> {
        let text = anyshape_files::read_to_string(ptx, anyshape_files::GIB, "a PTX file")
            .map_err(|e| e.to_string())?;
        self.ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(text))
            .map_err(gpu_err("loading the PTX"))
    }

    /// A candidate ready to launch on an instance: its inputs uploaded, its output
    /// allocated; a generated kernel of `module`, or the builtin of `builtins` it names.
    pub(crate) fn kernel(
        &self,
        module: Option<&Arc<CudaModule>>,
        builtins: &[GpuBuiltin],
        cand: &Candidate,
        inputs: &[Vec<f32>],
        bound: &BoundWorkload,
    ) -> std::result::Result<GpuKernel, String> {
        let s = &self.stream;
        // At least one element each: a zero-sized allocation is not a device pointer.
        let upload = |v: &[f32]| {
            let data = if v.is_empty() { &[0.0f32][..] } else { v };
            s.clone_htod(data).map_err(gpu_err("copying an input"))
        };
        let out_len = bound.lens[cand.workload.inputs.len()];
        let ins = inputs
            .iter()
            .map(|v| upload(v))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let out = s
            .alloc_zeros::<f32>(out_len.max(1))
            .map_err(gpu_err("allocating the output"))?;
        let call = match module {
            Some(m) => {
                let mk = cand
                    .gpu
                    .ok_or("a GPU candidate needs its micro-kernel (for the launch)")?;
                let launch =
                    launch_config(&cand.workload, bound, &mk).map_err(|e| e.to_string())?;
                let f = m
                    .load_function(&cand.symbol)
                    .map_err(|e| format!("kernel {} not found: {e:?}", cand.symbol))?;
                Call::Generated {
                    f,
                    blocks: launch.blocks(),
                    cfg: LaunchConfig {
                        grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
                        block_dim: (launch.block[0], launch.block[1], launch.block[2]),
                        shared_mem_bytes: launch.shared_bytes,
                    },
                    vars: cand.var_values(),
                }
            }
            None => {
                let b = builtins
                    .iter()
                    .find(|b| b.symbol == cand.symbol)
                    .ok_or_else(|| format!("no builtin GPU kernel {}", cand.symbol))?;
                Call::Builtin((b.prepare)(s, &cand.workload, bound)?)
            }
        };
        let event = || {
            self.ctx
                .new_event(Some(
                    cudarc::driver::sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC,
                ))
                .map_err(gpu_err("creating an event"))
        };
        Ok(GpuKernel {
            stream: s.clone(),
            call,
            start: event()?,
            end: event()?,
            ins,
            out,
            out_len,
        })
    }
}

/// How a GPU candidate is launched.
enum Call {
    /// A generated kernel: its function, launch and shape-var values.
    Generated {
        f: CudaFunction,
        blocks: u64,
        cfg: LaunchConfig,
        vars: Vec<i64>,
    },
    /// A builtin kernel of the worker.
    Builtin(GpuCall),
}

/// A GPU candidate on one instance, with its device buffers.
pub(crate) struct GpuKernel {
    stream: Arc<CudaStream>,
    call: Call,
    start: CudaEvent,
    end: CudaEvent,
    ins: Vec<CudaSlice<f32>>,
    out: CudaSlice<f32>,
    out_len: usize,
}

impl GpuKernel {
    /// One launch, timed by CUDA events around it; seconds.
    pub(crate) fn call(&mut self) -> std::result::Result<f64, String> {
        self.start
            .record(&self.stream)
            .map_err(gpu_err("recording an event"))?;
        match &mut self.call {
            Call::Generated {
                f,
                blocks,
                cfg,
                vars,
            } => {
                if *blocks > 0 {
                    let mut builder = self.stream.launch_builder(f);
                    for input in &self.ins {
                        builder.arg(input);
                    }
                    builder.arg(&mut self.out);
                    for v in vars.iter() {
                        builder.arg(v);
                    }
                    // SAFETY: generated kernels take the inputs, the output and the shape
                    // vars in this order; the buffers hold the bound instance.
                    unsafe { builder.launch(*cfg) }.map_err(gpu_err("launching the kernel"))?;
                }
            }
            Call::Builtin(call) => call(GpuBuffers {
                stream: &self.stream,
                inputs: &self.ins,
                output: &mut self.out,
            })?,
        }
        self.end
            .record(&self.stream)
            .map_err(gpu_err("recording an event"))?;
        let ms = self
            .start
            .elapsed_ms(&self.end)
            .map_err(gpu_err("running the kernel"))?;
        Ok(f64::from(ms) / 1e3)
    }

    /// The output, copied to the host.
    pub(crate) fn output(&self) -> std::result::Result<Vec<f32>, String> {
        let mut out = self
            .stream
            .clone_dtoh(&self.out)
            .map_err(gpu_err("copying the output"))?;
        out.truncate(self.out_len);
        Ok(out)
    }
}
