//! GPU targets: what bounds a GPU micro-kernel (SMs, threads, shared memory,
//! registers), read from the device at run time or from JSON, and the occupancy it
//! allows.
use crate::loop_ir::Func;
use crate::render::{prelude, render, Dialect};
use crate::GpuContractionKernel;
use serde::{Deserialize, Serialize};

/// What bounds a GPU micro-kernel: read from the device at run time, or from JSON for
/// offline work.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuTarget {
    /// Device name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Compute capability, e.g. `(9, 0)`.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Threads per warp.
    pub warp_size: u32,
    /// Threads per block.
    pub max_threads_per_block: u32,
    /// Resident threads per SM.
    pub max_threads_per_sm: u32,
    /// Resident blocks per SM.
    pub max_blocks_per_sm: u32,
    /// Static shared memory per block, bytes.
    pub shared_per_block: u32,
    /// Shared memory per SM, bytes.
    pub shared_per_sm: u32,
    /// 32-bit registers per SM.
    pub registers_per_sm: u32,
    /// 32-bit registers per thread.
    pub registers_per_thread: u32,
}

impl GpuTarget {
    /// An H100 SXM as its data sheet describes it (compute capability 9.0), for offline
    /// code generation and tests; a real run reads the device instead.
    pub fn h100_sxm() -> GpuTarget {
        GpuTarget {
            name: "NVIDIA H100 SXM (data sheet)".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            warp_size: 32,
            max_threads_per_block: 1024,
            max_threads_per_sm: 2048,
            max_blocks_per_sm: 32,
            shared_per_block: 48 * 1024,
            shared_per_sm: 228 * 1024,
            registers_per_sm: 65536,
            registers_per_thread: 255,
        }
    }

    /// Blocks of `mk` resident on one SM at once (0 if one does not fit): the tightest of
    /// the block, thread, shared-memory and register limits.
    pub fn blocks_per_sm(&self, mk: &GpuContractionKernel) -> u32 {
        let threads = mk.threads();
        let regs = mk.registers_per_thread() * threads;
        [
            self.max_blocks_per_sm,
            self.max_threads_per_sm / threads.max(1),
            self.shared_per_sm / mk.shared_bytes().max(1),
            self.registers_per_sm / regs.max(1),
        ]
        .into_iter()
        .min()
        .unwrap_or(0)
    }

    /// Blocks of `mk` that run at once on the whole device: the slots of the wave
    /// model (`f_occ` with `k = 1` is the wave efficiency over them).
    pub fn slots(&self, mk: &GpuContractionKernel) -> u32 {
        self.sm_count * self.blocks_per_sm(mk)
    }
}

impl super::Target for GpuTarget {
    const DEVICE: super::DeviceKind = super::DeviceKind::Cuda;

    fn name(&self) -> &str {
        &self.name
    }

    fn describe(&self) -> String {
        format!(
            "{} ({} SMs, sm_{}{})",
            self.name, self.sm_count, self.compute_capability.0, self.compute_capability.1
        )
    }

    fn prelude(&self) -> String {
        prelude(Dialect::Cuda, 1, false)
    }

    fn render(&self, f: &Func) -> String {
        render(f, Dialect::Cuda, 1, 1)
    }

    /// NVRTC compiles for the device's compute capability.
    fn compile_flags(&self) -> Vec<String> {
        let (major, minor) = self.compute_capability;
        vec![format!("--gpu-architecture=compute_{major}{minor}")]
    }
}
