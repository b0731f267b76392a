//! The GPU side of the contraction sketch: the target's limits ([`GpuTarget`]), the
//! GPU micro-kernel (block, thread and reduction tiles) with its constraints — from the
//! target, never from the shape — the launch configuration of an instance, and the
//! occupancy and wave model (TSCompiler's) that `f_occ` uses on GPU.
use crate::{CodegenError, GemmView, Result};
use anyshape_ir::{BoundWorkload, Workload};
use serde::{Deserialize, Serialize};
use std::fmt;

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
    pub fn blocks_per_sm(&self, mk: &GpuMicroKernel) -> u32 {
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

    /// Wave efficiency of a grid of `blocks` blocks of `mk`: the fraction of the SMs'
    /// block slots busy over the waves the grid needs (1 when the last wave is full).
    /// This is `f_occ` on GPU.
    pub fn wave_efficiency(&self, mk: &GpuMicroKernel, blocks: u64) -> f64 {
        let slots = u64::from(self.sm_count) * u64::from(self.blocks_per_sm(mk));
        if blocks == 0 || slots == 0 {
            return 0.0;
        }
        let waves = blocks.div_ceil(slots);
        blocks as f64 / (waves * slots) as f64
    }
}

/// A GPU micro-kernel for contractions: a `bm × bn` block tile staged through shared
/// memory `bk` reduction steps at a time, each thread accumulating a `tm × tn` tile in
/// registers (its rows and columns strided across the block, so that a warp's shared
/// reads and global writes are contiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuMicroKernel {
    /// Block tile rows (M).
    pub bm: u32,
    /// Block tile columns (N).
    pub bn: u32,
    /// Reduction tile (K) staged per step.
    pub bk: u32,
    /// Thread tile rows.
    pub tm: u32,
    /// Thread tile columns.
    pub tn: u32,
}

impl fmt::Display for GpuMicroKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bm={},bn={},bk={},tm={},tn={}",
            self.bm, self.bn, self.bk, self.tm, self.tn
        )
    }
}

/// Shared-memory rows are padded by one float against bank conflicts.
pub const SHARED_PAD: u32 = 1;

impl GpuMicroKernel {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm.max(1)) * (self.bn / self.tn.max(1))
    }

    /// Static shared memory per block, bytes: both staged tiles.
    pub fn shared_bytes(&self) -> u32 {
        4 * self.bk * (self.bm + self.bn + 2 * SHARED_PAD)
    }

    /// Registers per thread, estimated: accumulators, one column of A and row of B, and
    /// a fixed allowance for addresses and loop counters.
    pub fn registers_per_thread(&self) -> u32 {
        self.tm * self.tn + self.tm + self.tn + 32
    }

    /// Check the micro-kernel against the target's limits (never against a shape).
    pub fn validate(&self, t: &GpuTarget) -> Result<()> {
        let fail = |reason: String| {
            Err(CodegenError::InvalidMicroKernel {
                micro_kernel: self.to_string(),
                reason,
            })
        };
        if [self.bm, self.bn, self.bk, self.tm, self.tn].contains(&0) {
            return fail("every tile must be at least 1".into());
        }
        if !self.bm.is_multiple_of(self.tm) || !self.bn.is_multiple_of(self.tn) {
            return fail("the thread tile must divide the block tile".into());
        }
        if self.tm > 16 || self.tn > 16 {
            return fail("thread tiles above 16 do not stay in registers".into());
        }
        let threads = self.threads();
        if threads > t.max_threads_per_block || !threads.is_multiple_of(t.warp_size) {
            return fail(format!(
                "{threads} threads per block: needs a multiple of {} up to {}",
                t.warp_size, t.max_threads_per_block
            ));
        }
        if self.shared_bytes() > t.shared_per_block {
            return fail(format!(
                "{} bytes of shared memory, the block limit is {}",
                self.shared_bytes(),
                t.shared_per_block
            ));
        }
        if self.registers_per_thread() > t.registers_per_thread {
            return fail(format!(
                "~{} registers per thread, the limit is {}",
                self.registers_per_thread(),
                t.registers_per_thread
            ));
        }
        if t.blocks_per_sm(self) == 0 {
            return fail("one block does not fit on an SM".into());
        }
        Ok(())
    }
}

/// How a kernel is launched on one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchConfig {
    /// Blocks along x (N tiles), y (M tiles), z (batch).
    pub grid: [u32; 3],
    /// Threads per block (x only).
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes (the kernels use static shared memory: 0).
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// Blocks in the grid.
    pub fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| u64::from(g)).product()
    }
}

/// The launch of `mk` on an instance: one block per output tile and batch item. Errors
/// when the grid exceeds the hardware's grid limits (user input: a huge shape).
pub fn launch_config(
    w: &Workload,
    bound: &BoundWorkload,
    mk: &GpuMicroKernel,
) -> Result<LaunchConfig> {
    let g = GemmView::of(w)?;
    let extent = |a: usize| bound.extents[a].max(0) as u64;
    let batch: u64 = g.batch.iter().map(|&b| extent(b)).product();
    let tiles = |n: u64, t: u32| n.div_ceil(u64::from(t));
    let dims = [
        (tiles(extent(g.n), mk.bn), u64::from(u32::MAX >> 1)),
        (tiles(extent(g.m), mk.bm), 65535),
        (batch, 65535),
    ];
    let mut grid = [0u32; 3];
    for (i, (n, limit)) in dims.into_iter().enumerate() {
        if n > limit {
            return Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: format!("grid dimension {i} would need {n} blocks (limit {limit})"),
            });
        }
        grid[i] = n as u32;
    }
    Ok(LaunchConfig {
        grid,
        block: [mk.threads(), 1, 1],
        shared_bytes: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_ir::Bindings;

    fn mk(bm: u32, bn: u32, bk: u32, tm: u32, tn: u32) -> GpuMicroKernel {
        GpuMicroKernel { bm, bn, bk, tm, tn }
    }

    #[test]
    fn constraints_come_from_the_target() {
        let t = GpuTarget::h100_sxm();
        assert!(mk(128, 128, 8, 8, 8).validate(&t).is_ok());
        assert!(mk(64, 64, 16, 4, 4).validate(&t).is_ok());
        // 2048 threads, too much shared memory, a thread tile that does not divide,
        // too many registers, a partial warp.
        for bad in [
            mk(128, 128, 8, 2, 4),
            mk(256, 256, 32, 8, 8),
            mk(100, 128, 8, 8, 8),
            mk(256, 256, 8, 16, 16),
            mk(8, 8, 8, 2, 2),
            mk(0, 8, 8, 1, 1),
        ] {
            assert!(bad.validate(&t).is_err(), "{bad}");
        }
        // JSON round trip (the offline description).
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<GpuTarget>(&json).unwrap(), t);
    }

    #[test]
    fn occupancy_and_waves() {
        let t = GpuTarget::h100_sxm();
        let k = mk(128, 128, 8, 8, 8); // 256 threads, 8 KiB shared, 112 registers
        assert_eq!(k.threads(), 256);
        // Registers bound it: 65536 / (256 * 112) = 2.
        assert_eq!(t.blocks_per_sm(&k), 2);
        let slots = 132 * 2;
        assert_eq!(t.wave_efficiency(&k, slots), 1.0);
        assert!(
            (t.wave_efficiency(&k, slots + 1) - (slots + 1) as f64 / (2 * slots) as f64).abs()
                < 1e-12
        );
        assert_eq!(t.wave_efficiency(&k, 0), 0.0);
    }

    #[test]
    fn the_grid_follows_the_shape() {
        let w = Workload::parse("batch_matmul_nt(B=3,M=T,N=T,K=64)").unwrap();
        let k = mk(64, 32, 8, 4, 4);
        for (t, gx, gy) in [
            (1, 1, 1),
            (32, 1, 1),
            (33, 2, 1),
            (64, 2, 1),
            (65, 3, 2),
            (0, 0, 0),
        ] {
            let b = w.bind(&Bindings::from_pairs([("T", t)])).unwrap();
            let l = launch_config(&w, &b, &k).unwrap();
            assert_eq!(l.grid, [gx, gy, 3], "T={t}");
            assert_eq!(l.block, [128, 1, 1]);
        }
        let w = Workload::parse("dense(M=T,N=8,K=8)").unwrap();
        let b = w.bind(&Bindings::from_pairs([("T", 1 << 40)]));
        if let Ok(b) = b {
            assert!(launch_config(&w, &b, &k).is_err(), "a grid past the limits");
        }
    }
}
