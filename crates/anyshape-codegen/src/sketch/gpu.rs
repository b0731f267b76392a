//! The contraction sketch on CUDA GPUs: a block computes a `bm x bn` tile of the
//! output, staging `bk`-deep slices of the A and B block tiles in shared memory (fetch),
//! each thread accumulating a `tm x tn` tile in registers (compute) and storing it
//! (write-back); the fused epilogue runs on the registers before the store. The
//! micro-kernel's constraints come from the target (threads, shared memory, registers),
//! never from the shape; the launch of an instance and its waves (TSCompiler's model,
//! `f_occ` on GPU) follow from it.
use crate::sketch::{Adaptation, Factors, Sketch};
use crate::{CodegenError, GemmView, GpuTarget, Program, Result};
use anyshape_ir::{BoundWorkload, Workload};
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A GPU micro-kernel for contractions: a `bm × bn` block tile staged through shared
/// memory `bk` reduction steps at a time, each thread accumulating a `tm × tn` tile in
/// registers (its rows and columns strided across the block, so that a warp's shared
/// reads and global writes are contiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuContractionKernel {
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

impl fmt::Display for GpuContractionKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bm={},bn={},bk={},tm={},tn={}",
            self.bm, self.bn, self.bk, self.tm, self.tn
        )
    }
}

/// Shared-memory rows are padded by four floats: rows stay 16-byte aligned for `float4`
/// reads, and a warp's transposing stores of a `bk = 8` slice hit 32 distinct banks.
pub const SHARED_PAD: u32 = 4;

impl GpuContractionKernel {
    /// Threads per block.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm.max(1)) * (self.bn / self.tn.max(1))
    }

    /// Static shared memory per block, bytes: both staged tiles, double-buffered.
    pub fn shared_bytes(&self) -> u32 {
        2 * 4 * self.bk * (self.bm + self.bn + 2 * SHARED_PAD)
    }

    /// Elements of the A and B slices each thread loads per reduction tile (its staging
    /// registers).
    pub fn staged_per_thread(&self) -> [u32; 2] {
        let threads = self.threads().max(1);
        [
            (self.bm * self.bk).div_ceil(threads),
            (self.bk * self.bn).div_ceil(threads),
        ]
    }

    /// Registers per thread, estimated: accumulators, one column of A and row of B, the
    /// staging registers, and a fixed allowance for addresses and loop counters.
    pub fn registers_per_thread(&self) -> u32 {
        let [na, nb] = self.staged_per_thread();
        self.tm * self.tn + self.tm + self.tn + na + nb + 32
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
    mk: &GpuContractionKernel,
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

/// Block tile sizes (M and N) of the space.
const BLOCK: [u32; 6] = [8, 16, 32, 64, 128, 256];
/// Reduction tile sizes.
const REDUCTION: [u32; 5] = [2, 4, 8, 16, 32];
/// Thread tile sizes (M and N).
const THREAD: [u32; 5] = [1, 2, 4, 8, 16];

fn pick(values: &[u32], rng: &mut impl Rng) -> u32 {
    values[rng.random_range(0..values.len())]
}

/// A neighbour of `x` in `values` (one step up or down).
fn step(values: &[u32], x: u32, rng: &mut impl Rng) -> u32 {
    let i = values.iter().position(|&v| v == x).unwrap_or(0);
    let j = if rng.random_bool(0.5) {
        (i + 1).min(values.len() - 1)
    } else {
        i.saturating_sub(1)
    };
    values[j]
}

impl GpuContractionKernel {
    /// Parse the compact form `bm=64,bn=64,bk=8,tm=4,tn=4` or the JSON form.
    pub fn parse(text: &str) -> Result<GpuContractionKernel> {
        let bad = |reason: String| CodegenError::BadMicroKernelText {
            text: text.into(),
            reason,
        };
        if text.trim_start().starts_with('{') {
            return serde_json::from_str(text).map_err(|e| bad(e.to_string()));
        }
        const NAMES: [&str; 5] = ["bm", "bn", "bk", "tm", "tn"];
        let v: Vec<Option<u32>> = super::parse_fields(text, &NAMES).map_err(bad)?;
        match v[..] {
            [Some(bm), Some(bn), Some(bk), Some(tm), Some(tn)] => {
                Ok(GpuContractionKernel { bm, bn, bk, tm, tn })
            }
            _ => Err(bad(format!("need all of {}", NAMES.join(", ")))),
        }
    }
}

impl Sketch for GpuContractionKernel {
    type Target = GpuTarget;
    const NAME: &'static str = "gpu-contraction";

    fn applies(w: &Workload) -> Result<()> {
        let g = GemmView::of(w)?;
        if g.batch.len() > 1 {
            return Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: "the GPU sketch takes at most one batch axis (the grid's z)".into(),
            });
        }
        if w.precision != anyshape_ir::Precision::F32 {
            return Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: format!("the GPU sketch computes in f32, not {}", w.precision),
            });
        }
        if w.tensors().any(|t| t.panels.is_some()) {
            return Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: "the GPU sketch reads no tensor in panels (pre-packed weights)".into(),
            });
        }
        Ok(())
    }

    fn default_for(_target: &GpuTarget) -> Self {
        GpuContractionKernel {
            bm: 64,
            bn: 64,
            bk: 8,
            tm: 4,
            tn: 4,
        }
    }

    fn parse(text: &str) -> Result<Self> {
        GpuContractionKernel::parse(text)
    }

    fn validate(&self, target: &GpuTarget) -> Result<()> {
        GpuContractionKernel::validate(self, target)
    }

    fn lower(p: &Program<Self>, target: &GpuTarget) -> Result<crate::loop_ir::Func> {
        crate::lower::gpu_contraction(p, target)
    }

    /// One task per block (batch x M tiles x N tiles), as many at once as the SMs hold
    /// (the wave model); local padding pads every axis to its block tile.
    fn adaptation(&self, target: &GpuTarget, w: &Workload, bound: &BoundWorkload) -> Adaptation {
        let slots = f64::from(target.slots(self));
        let Ok(launch) = launch_config(w, bound, self) else {
            return Adaptation {
                tasks: 1.0,
                slots,
                pad: 1.0,
            };
        };
        let g = GemmView::of(w).expect("launch_config classified it");
        let e = |a: usize| bound.extents[a].max(0) as f64;
        let up = |x: f64, m: u32| (x / f64::from(m)).ceil() * f64::from(m);
        let (m, n, k) = (e(g.m), e(g.n), e(g.k));
        let padded = up(m, self.bm) * up(n, self.bn) * up(k, self.bk);
        Adaptation {
            tasks: (launch.blocks() as f64).max(1.0),
            slots,
            pad: if padded > 0.0 {
                (m * n * k) / padded
            } else {
                1.0
            },
        }
    }

    /// Uniform over the tile sets, rejecting what the target cannot run (the default
    /// micro-kernel if nothing valid turns up).
    fn sample(target: &GpuTarget, rng: &mut impl Rng) -> Self {
        for _ in 0..10_000 {
            let mk = GpuContractionKernel {
                bm: pick(&BLOCK, rng),
                bn: pick(&BLOCK, rng),
                bk: pick(&REDUCTION, rng),
                tm: pick(&THREAD, rng),
                tn: pick(&THREAD, rng),
            };
            if mk.validate(target).is_ok() {
                return mk;
            }
        }
        Self::default_for(target)
    }

    fn neighbour(&self, _target: &GpuTarget, rng: &mut impl Rng) -> Self {
        let mut m = *self;
        match rng.random_range(0..5) {
            0 => m.bm = step(&BLOCK, m.bm, rng),
            1 => m.bn = step(&BLOCK, m.bn, rng),
            2 => m.bk = step(&REDUCTION, m.bk, rng),
            3 => m.tm = step(&THREAD, m.tm, rng),
            _ => m.tn = step(&THREAD, m.tn, rng),
        }
        m
    }

    fn child(&self, other: &Self, _target: &GpuTarget, rng: &mut impl Rng) -> Self {
        let mut either = |x: u32, y: u32| if rng.random_bool(0.5) { x } else { y };
        GpuContractionKernel {
            bm: either(self.bm, other.bm),
            bn: either(self.bn, other.bn),
            bk: either(self.bk, other.bk),
            tm: either(self.tm, other.tm),
            tn: either(self.tn, other.tn),
        }
    }

    /// M, N and K.
    fn factors(_target: &GpuTarget, w: &Workload, bound: &BoundWorkload) -> Factors {
        match GemmView::of(w) {
            Ok(g) => {
                let e = |a: usize| usize::try_from(bound.extents[a]).unwrap_or(1).max(1);
                Factors(vec![e(g.m), e(g.n), e(g.k)])
            }
            Err(_) => Factors(vec![1, 1, 1]),
        }
    }

    /// Block tiles shrunk, within the space's sizes, to ones dividing the extents.
    fn snap(&self, _target: &GpuTarget, f: &Factors) -> Self {
        let fit = |sizes: &[u32], x: u32, total: usize| {
            sizes
                .iter()
                .rev()
                .copied()
                .find(|&s| s <= x && total.is_multiple_of(s as usize))
                .unwrap_or(x)
        };
        GpuContractionKernel {
            bm: fit(&BLOCK, self.bm, f.0[0]),
            bn: fit(&BLOCK, self.bn, f.0[1]),
            bk: fit(&REDUCTION, self.bk, f.0[2]),
            ..*self
        }
    }

    fn divides(&self, f: &Factors) -> bool {
        f.0[0].is_multiple_of(self.bm as usize)
            && f.0[1].is_multiple_of(self.bn as usize)
            && f.0[2].is_multiple_of(self.bk as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_ir::Bindings;

    fn mk(bm: u32, bn: u32, bk: u32, tm: u32, tn: u32) -> GpuContractionKernel {
        GpuContractionKernel { bm, bn, bk, tm, tn }
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
        // Registers bound it: 65536 / (256 * 112) = 2, on 132 SMs.
        assert_eq!(t.blocks_per_sm(&k), 2);
        assert_eq!(t.slots(&k), 264);
        // The paper's Fig. 5 instance: 192 blocks of 128x128 in one partial wave; local
        // padding pads 60 to 128 along M and N.
        let w = Workload::parse("batch_matmul_nt(B=192,M=T,N=T,K=64)").unwrap();
        let bound = w.bind(&Bindings::from_pairs([("T", 60)])).unwrap();
        let a = k.adaptation(&t, &w, &bound);
        assert_eq!((a.tasks, a.slots), (192.0, 264.0));
        assert!((a.pad - (60.0 * 60.0) / (128.0 * 128.0)).abs() < 1e-12);
    }

    #[test]
    fn the_space_stays_within_the_target() {
        use rand::SeedableRng;
        let t = GpuTarget::h100_sxm();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..300 {
            let a = GpuContractionKernel::sample(&t, &mut rng);
            assert!(a.validate(&t).is_ok(), "{a}");
            seen.insert(a);
        }
        assert!(seen.len() > 100, "the space is explored: {}", seen.len());
        let f = Factors(vec![96, 64, 48]);
        // Snapping only shrinks tiles, to ones that divide the extents; shrinking can
        // break a lower bound (a full warp), which the search space checks after it.
        let mut valid = 0;
        for k in &seen {
            let s = k.snap(&t, &f);
            assert!(
                s.bm <= k.bm && s.bn <= k.bn && s.bk <= k.bk,
                "{k} grew to {s}"
            );
            assert!(
                s.divides(&f),
                "{k} snapped to {s}, which does not divide {f:?}"
            );
            valid += usize::from(s.validate(&t).is_ok());
        }
        assert!(
            valid > seen.len() / 2,
            "{valid} of {} stay valid",
            seen.len()
        );
        let text = mk(64, 32, 8, 4, 2).to_string();
        assert_eq!(
            GpuContractionKernel::parse(&text).unwrap(),
            mk(64, 32, 8, 4, 2)
        );
        assert!(GpuContractionKernel::parse("bm=64").is_err());
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
