//! Measuring on an NVIDIA GPU through `cudarc`, which loads the CUDA libraries at run
//! time: anyshape builds everywhere, and where no GPU or driver is present
//! [`GpuDevice::open`] says so as an error instead of failing to link or panicking.
//!
//! The builder compiles generated CUDA kernels with NVRTC into a PTX file in its cache
//! ([`Builder::build_gpu`]); the worker process loads it (or, for the library name
//! [`CUBLAS_LIBRARY`], sets up cuBLAS) and times each candidate with CUDA events around
//! its launch, after an untimed warm-up whose output is checked against the reference.
//! So GPU kernels get the CPU's isolation: a kernel that faults or hangs kills only its
//! worker and fails only its candidate.
use crate::{Builder, BuiltLibrary, Candidate, MeasureError, Result};
use anyshape_codegen::{launch_config, GpuProgram, GpuTarget, StridedGemm, CUDA_PRELUDE};
use anyshape_ir::{BoundWorkload, Epilogue};
use cudarc::cublas::sys::cublasOperation_t as Op;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::sys::CUdevice_attribute as A;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig,
    PushKernelArg,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// The library name that asks the worker for the cuBLAS baseline (symbol
/// [`CUBLAS_SYMBOL`]) instead of generated kernels.
pub const CUBLAS_LIBRARY: &str = "<cublas>";

/// The cuBLAS baseline's symbol: SGEMM, or strided-batched SGEMM for a batch axis.
pub const CUBLAS_SYMBOL: &str = "cublas_sgemm";

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
                "NVRTC (libnvrtc.so, CUDA 12) is not installed".into(),
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
    pub(crate) fn load(&self, ptx: &Path) -> Result<Arc<CudaModule>, String> {
        let text = std::fs::read_to_string(ptx)
            .map_err(|e| format!("cannot read {}: {e}", ptx.display()))?;
        self.ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(text))
            .map_err(gpu_err("loading the PTX"))
    }

    /// A candidate ready to launch on an instance: its inputs uploaded, its output
    /// allocated. `module` holds generated kernels; without it the candidate must be
    /// the cuBLAS baseline.
    pub(crate) fn kernel(
        &self,
        module: Option<&Arc<CudaModule>>,
        cand: &Candidate,
        inputs: &[Vec<f32>],
        bound: &BoundWorkload,
    ) -> Result<GpuKernel, String> {
        let s = &self.stream;
        // At least one element each: a zero-sized allocation is not a device pointer.
        let upload = |v: &[f32]| {
            let data = if v.is_empty() { &[0.0f32][..] } else { v };
            s.clone_htod(data).map_err(gpu_err("copying an input"))
        };
        let [a, b] = inputs else {
            return Err(format!("GPU kernels take 2 inputs, got {}", inputs.len()));
        };
        let out_len = bound.lens[cand.workload.inputs.len()];
        let (a, b) = (upload(a)?, upload(b)?);
        let c = s
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
                let vars = cand.var_values();
                Call::Generated {
                    f,
                    blocks: launch.blocks(),
                    cfg: LaunchConfig {
                        grid_dim: (launch.grid[0], launch.grid[1], launch.grid[2]),
                        block_dim: (launch.block[0], launch.block[1], launch.block[2]),
                        shared_mem_bytes: launch.shared_bytes,
                    },
                    vars,
                }
            }
            None if cand.symbol == CUBLAS_SYMBOL => {
                if cand.workload.epilogue != Epilogue::None {
                    return Err("the cuBLAS baseline takes no epilogue".into());
                }
                // SAFETY: only probes whether the shared library can be loaded.
                if !unsafe { cudarc::cublas::sys::is_culib_present() } {
                    return Err("cuBLAS (libcublas.so, CUDA 12) is not installed".into());
                }
                let g = StridedGemm::of(&cand.workload, bound).map_err(|e| e.to_string())?;
                let cfg = cublas_config(&g)?;
                let blas = CudaBlas::new(s.clone()).map_err(|e| format!("cuBLAS: {e:?}"))?;
                Call::Cublas { blas, cfg }
            }
            None => return Err(format!("no GPU baseline named {}", cand.symbol)),
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
            a,
            b,
            c,
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
    /// cuBLAS; `None` for an empty instance (nothing to compute).
    Cublas {
        blas: CudaBlas,
        cfg: Option<StridedBatchedConfig<f32>>,
    },
}

/// A GPU candidate on one instance, with its device buffers.
pub(crate) struct GpuKernel {
    stream: Arc<CudaStream>,
    call: Call,
    start: CudaEvent,
    end: CudaEvent,
    a: CudaSlice<f32>,
    b: CudaSlice<f32>,
    c: CudaSlice<f32>,
    out_len: usize,
}

impl GpuKernel {
    /// One launch, timed by CUDA events around it; seconds.
    pub(crate) fn call(&mut self) -> Result<f64, String> {
        self.start
            .record(&self.stream)
            .map_err(gpu_err("recording an event"))?;
        match &self.call {
            Call::Generated {
                f,
                blocks,
                cfg,
                vars,
            } => {
                if *blocks > 0 {
                    let mut builder = self.stream.launch_builder(f);
                    builder.arg(&self.a).arg(&self.b).arg(&mut self.c);
                    for v in vars {
                        builder.arg(v);
                    }
                    // SAFETY: generated kernels take the two inputs, the output and the
                    // shape vars in this order; the buffers hold the bound instance.
                    unsafe { builder.launch(*cfg) }.map_err(gpu_err("launching the kernel"))?;
                }
            }
            Call::Cublas { blas, cfg } => {
                if let Some(cfg) = cfg {
                    // SAFETY: the configuration comes from the bound instance's strides
                    // (cuBLAS's column-major view of the row-major C = A·B), within the
                    // buffers.
                    unsafe { blas.gemm_strided_batched(*cfg, &self.b, &self.a, &mut self.c) }
                        .map_err(|e| format!("cuBLAS SGEMM: {e:?}"))?;
                }
            }
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
    pub(crate) fn output(&self) -> Result<Vec<f32>, String> {
        let mut out = self
            .stream
            .clone_dtoh(&self.c)
            .map_err(gpu_err("copying the output"))?;
        out.truncate(self.out_len);
        Ok(out)
    }
}

/// cuBLAS's view of a row-major `C = A · B`: column-major `Cᵀ = Bᵀ · Aᵀ`, each operand
/// transposed or not by which of its axes has unit stride. `None` for an empty instance.
fn cublas_config(g: &StridedGemm) -> Result<Option<StridedBatchedConfig<f32>>, String> {
    if g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
        return Ok(None);
    }
    if [g.a.offset, g.b.offset, g.c.offset] != [0, 0, 0] || g.c.col != 1 {
        return Err("cuBLAS baseline: the output must be row-major from offset 0".into());
    }
    let int = |x: i64| i32::try_from(x).map_err(|_| format!("{x} is past cuBLAS's int range"));
    // An operand X (p × q in the row-major view) is wanted as Xᵀ (q × p) in column
    // major: its memory is Xᵀ with leading dimension `row` where columns are unit-stride,
    // else X with leading dimension `col`, to be transposed.
    let operand = |o: &anyshape_codegen::GemmOperand, p: usize, q: usize| {
        if o.col == 1 && o.row >= q.max(1) as i64 {
            Ok((Op::CUBLAS_OP_N, int(o.row)?))
        } else if o.row == 1 && o.col >= p.max(1) as i64 {
            Ok((Op::CUBLAS_OP_T, int(o.col)?))
        } else {
            Err("cuBLAS baseline: an input with no unit-stride axis".to_string())
        }
    };
    let (transa, lda) = operand(&g.b, g.k, g.n)?;
    let (transb, ldb) = operand(&g.a, g.m, g.k)?;
    Ok(Some(StridedBatchedConfig {
        gemm: GemmConfig {
            transa,
            transb,
            m: int(g.n as i64)?,
            n: int(g.m as i64)?,
            k: int(g.k as i64)?,
            alpha: 1.0,
            lda,
            ldb,
            beta: 0.0,
            ldc: int(g.c.row.max(1))?,
        },
        batch_size: int(g.batch as i64)?,
        stride_a: g.b.batch,
        stride_b: g.a.batch,
        stride_c: g.c.batch,
    }))
}

impl Builder {
    /// Compile `programs` for `target` with NVRTC into one PTX file in the cache (named
    /// by the hash of its source). Programs that do not print or compile are left out and
    /// listed in `failed`; the rest still build.
    pub fn build_gpu(&self, target: &GpuTarget, programs: &[GpuProgram]) -> Result<BuiltLibrary> {
        let mut failed = BTreeMap::new();
        let mut sources = Vec::new();
        for p in programs {
            match p.cuda_source(target) {
                Ok(code) => sources.push((p.symbol(target), code)),
                Err(e) => {
                    failed.insert(p.symbol(target), e.to_string());
                }
            }
        }
        let unit = |sources: &[(String, String)]| -> String {
            let mut src = String::from(CUDA_PRELUDE);
            for (_, code) in sources {
                src.push_str(code);
            }
            src
        };
        let (major, minor) = target.compute_capability;
        let arch = format!("compute_{major}{minor}");
        let mut src = unit(&sources);
        let mut h = Sha256::new();
        h.update(&arch);
        h.update(&src);
        let hash: String = h.finalize()[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let path = self.cache_dir.join(format!("gpu-{hash}.ptx"));
        match crate::cache::lookup(&path) {
            Ok(true) => {
                return Ok(BuiltLibrary {
                    path,
                    failed,
                    unavailable: BTreeMap::new(),
                    cached: true,
                })
            }
            Ok(false) => {}
            Err(why) => tracing::warn!(
                "kernel cache entry {} is damaged ({why}); rebuilding it",
                path.display()
            ),
        }
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(MeasureError::NoGpu(
                "NVRTC (libnvrtc.so, CUDA 12) is not installed".into(),
            ));
        }
        let compile = |src: &str| {
            cudarc::nvrtc::compile_ptx_with_opts(
                src,
                cudarc::nvrtc::CompileOptions {
                    options: vec![format!("--gpu-architecture={arch}")],
                    ..Default::default()
                },
            )
            .map(|ptx| ptx.to_src())
            .map_err(|e| format!("{e:?}"))
        };
        let ptx = match compile(&src) {
            Ok(ptx) => ptx,
            Err(_) => {
                // Find the kernels NVRTC rejects, one by one; build the others.
                sources.retain(|(symbol, code)| {
                    match compile(&unit(&[(symbol.clone(), code.clone())])) {
                        Ok(_) => true,
                        Err(e) => {
                            failed.insert(symbol.clone(), e);
                            false
                        }
                    }
                });
                src = unit(&sources);
                compile(&src).map_err(|stderr| MeasureError::Compile {
                    what: "CUDA kernels (NVRTC)".into(),
                    stderr,
                })?
            }
        };
        let io = |source| MeasureError::Io {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(&self.cache_dir).map_err(io)?;
        crate::cache::store_bytes(&path, ptx.as_bytes()).map_err(io)?;
        Ok(BuiltLibrary {
            path,
            failed,
            unavailable: BTreeMap::new(),
            cached: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_ir::{Bindings, Workload};

    /// cuBLAS's configuration of the three layouts, checked by evaluating the
    /// column-major product it describes on the host.
    #[test]
    fn cublas_sees_the_row_major_product() {
        for (w, t) in [
            ("dense(M=T,N=5,K=3)", 4),
            ("batch_matmul_nt(B=2,M=T,N=T,K=3)", 3),
            ("batch_matmul_nn(B=2,M=T,N=4,K=T)", 5),
        ] {
            let w = Workload::parse(w).unwrap();
            let bound = w.bind(&Bindings::from_pairs([("T", t)])).unwrap();
            let inputs = crate::random_inputs(&bound, 2, 7);
            let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
            let reference = crate::reference_output(&w, &bound, &views);
            let g = StridedGemm::of(&w, &bound).unwrap();
            let cfg = cublas_config(&g).unwrap().unwrap();
            // Column-major C'(i, j) = Σ_l op(P)(i, l) · op(Q)(l, j), P = in1, Q = in0.
            let at = |x: &[f32], op: Op, ld: i32, r: usize, c: usize| match op {
                Op::CUBLAS_OP_N => x[r + c * ld as usize],
                _ => x[c + r * ld as usize],
            };
            let mut out = vec![0.0f32; bound.lens[2]];
            let c = cfg.gemm;
            for item in 0..cfg.batch_size as usize {
                let p = &inputs[1][item * cfg.stride_a as usize..];
                let q = &inputs[0][item * cfg.stride_b as usize..];
                for i in 0..c.m as usize {
                    for j in 0..c.n as usize {
                        let s: f32 = (0..c.k as usize)
                            .map(|l| at(p, c.transa, c.lda, i, l) * at(q, c.transb, c.ldb, l, j))
                            .sum();
                        out[item * cfg.stride_c as usize + i + j * c.ldc as usize] = s;
                    }
                }
            }
            assert!(crate::check_output(&out, &reference).passed, "{w}");
        }
        let w = Workload::parse("dense(M=T,N=5,K=3)").unwrap();
        let bound = w.bind(&Bindings::from_pairs([("T", 0)])).unwrap();
        assert!(cublas_config(&StridedGemm::of(&w, &bound).unwrap())
            .unwrap()
            .is_none());
    }
}
