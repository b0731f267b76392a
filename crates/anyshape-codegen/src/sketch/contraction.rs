//! The CPU sketch for contractions (BLIS-like) and its micro-kernel.
//!
//! The output is split into cache tiles `mc x nc` (one task per batch index and cache
//! tile, tasks spread over the cores); for each reduction tile of `kc` the task packs an
//! `mc x kc` block of the M-side input and a `kc x nc` block of the N-side input into
//! local buffers, then runs a register tile of `mr x nr` accumulators (vectorized along
//! N, unrolled) over each pair of packed micro-panels, with the reduction loop unrolled
//! by `uk`; the fused epilogue runs over each finished output tile.
//!
//! The **dot** variant (`dot=1`) vectorizes the reduction instead: each accumulator is a
//! vector of partial dot products along K, `nr` counts output columns (any number, not
//! a multiple of the vector), operands whose K axis is contiguous are read in place
//! (no packing: what small M needs, where a packed element of B is used once) and only
//! the others are packed, and each finished accumulator is summed across its lanes.
//!
//! With `pf=1` the usual variant's reduction loop also prefetches the next register
//! tile column's B micro-panel (weights streaming from memory in a model); with `ia=1`
//! it reads A in place instead of packing it.
//!
//! The **transposed** variant (`vm=1`, vectors along M) computes `Cᵀ = B · Aᵀ` with the
//! usual variant's loop nest: the operands swap roles and M and N swap places, so `mr`,
//! `mc` count output columns (N), `nr`, `nc` output rows (M), B is the broadcast
//! operand (read in place with `ia=1`) and A the packed, vectorized one. What a dense
//! layer's `[N, K]` weights need at small M: A (a few rows) is transposed into vectors
//! along M, and the large B is never copied (the usual variant transposes all of it on
//! every call). The output is written lane by lane (its M axis is strided).
//!
//! A [`ContractionKernel`] fixes every parameter. Its validity depends on the target only
//! (registers, caches), never on a shape: any tile size is allowed, factor or not. The
//! space of micro-kernels is bounded by the same limits ([`Limits`]); the space and the
//! search's moves in it are in `contraction_space.rs`. Its text form is in
//! `contraction_text.rs`, its defaults and the search's seeds in
//! `contraction_seeds.rs`, its AMX variant's shapes and workloads in `contraction_amx.rs`.
use super::contraction_amx::{amx_runs, AMX_TILES};
use super::contraction_space::Limits;
use crate::sketch::{Adaptation, Factors, Sketch};
use crate::{CodegenError, CpuTarget, GemmView, Program, Result};
use anyshape_ir::{BoundWorkload, Precision, Workload};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Every parameter of the contraction sketch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContractionKernel {
    /// Register tile rows (along M).
    pub mr: usize,
    /// Register tile columns (along N, vectorized: a multiple of the vector lanes; in
    /// the dot variant any number of columns).
    pub nr: usize,
    /// Cache tile along M (a multiple of `mr`).
    pub mc: usize,
    /// Cache tile along N (a multiple of `nr`).
    pub nc: usize,
    /// Cache tile along the reduction (a multiple of `uk`; in the dot variant of
    /// `uk` vectors).
    pub kc: usize,
    /// Unroll factor of the reduction loop (in the dot variant, in vectors).
    pub uk: usize,
    /// The dot variant: vectorized along K, operands read in place where K is
    /// contiguous. Absent from the text and JSON forms when false (older records).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dot: bool,
    /// Software prefetch (usual variant only): each reduction step also asks the
    /// caches for the B micro-panel of the next register-tile column, one request per
    /// cache line, so that weights streaming from memory arrive while this tile
    /// computes. Absent from the text and JSON forms when false (older records).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pf: bool,
    /// A read in place (usual variant only): the register tile broadcasts A's elements
    /// from the tensor itself instead of a packed `mc x kc` block, which saves a scalar
    /// copy of A per N tile (for a K-contiguous A, each of the tile's `mr` rows is one
    /// stream). Absent from the text and JSON forms when false (older records).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ia: bool,
    /// B read in place (usual variant only) where its N axis is contiguous (a batch
    /// matmul's `[K, N]` operand, attention's values): the register tile loads B's
    /// vectors from the tensor itself instead of a packed `K x nc` panel, which saves
    /// the copy of B per (batch item, N tile); tiles that overhang N load it masked
    /// to the columns inside. Where N is not contiguous B is packed as usual. Absent from
    /// the text and JSON forms when false (older records).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ib: bool,
    /// The transposed variant (vectors along M; not with the dot variant): the usual
    /// loop nest on `Cᵀ = B · Aᵀ`, the operands' roles and M and N swapped, so `mr`,
    /// `mc` and `ia` speak of N and B, `nr`, `nc` and `ib` of M and A. Absent from the
    /// text and JSON forms when false (older records).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub vm: bool,
    /// AMX tiles (a bf16 contraction that `amx_runs`, on a target with AMX-BF16):
    /// each register tile is `mr/16 x nr/16` output tiles of 16 x 16 summed over the
    /// whole reduction by `tdpbf16ps`; `kc` and `uk` are 16 and 1. See
    /// `contraction_amx.rs` and `lower/amx.rs`. Absent from the text and JSON forms
    /// when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub amx: bool,
}

impl ContractionKernel {
    /// The view its loop nest runs on, with the inputs in the roles of A (broadcast)
    /// and B (vectors): `g` and `[0, 1]`, or in the transposed variant `g` transposed
    /// and `[1, 0]`.
    pub(crate) fn oriented(&self, g: GemmView) -> (GemmView, [usize; 2]) {
        if self.vm {
            (g.transposed(), [1, 0])
        } else {
            (g, [0, 1])
        }
    }

    /// The extents its `mr`/`mc`, `nr`/`nc` and `kc` tile, from [`Sketch::factors`]:
    /// M, N and K, or in the transposed variant N, M and K (the vectorized one rounded
    /// up to the vector).
    pub(super) fn tiled_axes(&self, f: &Factors) -> [usize; 3] {
        match (self.vm, f.0.as_slice()) {
            (true, [_, _, k, n, m_up, ..]) => [*n, *m_up, *k],
            (_, [m, n_up, k, ..]) => [*m, *n_up, *k],
            _ => [1, 1, 1],
        }
    }

    /// The cache tiles of an `m` x `n` output of `batch` items (the oriented view's) on
    /// `threads` threads, as the lowered loop nest makes them: `n / nc` tiles of N
    /// and `m / mc` of M (rounded up) — M's rounded up to a multiple of the threads (at
    /// most one per register tile) where the tasks would not divide evenly among
    /// them, then N's likewise where they still do not (M too short to share: a
    /// decoder's step, whose projections of 256 columns ran on one of two threads).
    /// Each axis's register tiles are spread evenly over its tiles.
    pub fn tiles(&self, batch: f64, m: f64, n: f64, threads: usize) -> (f64, f64) {
        let threads = threads.max(1) as f64;
        let divides = |tiles_m: f64, tiles_n: f64| (batch * tiles_m * tiles_n) % threads == 0.0;
        let up = |tiles: f64, blocks: f64| ((tiles / threads).ceil() * threads).min(blocks);
        let mut tiles_n = (n / self.nc as f64).ceil();
        let mut tiles_m = (m / self.mc as f64).ceil();
        if !divides(tiles_m, tiles_n) {
            tiles_m = up(tiles_m, (m / self.mr as f64).ceil());
        }
        if !divides(tiles_m, tiles_n) {
            tiles_n = up(tiles_n, (n / self.nr as f64).ceil());
        }
        (tiles_m, tiles_n)
    }

    /// The heights of the register tiles the usual variant computes, lowest first:
    /// `mr`, and at the M edge the lowest of these that covers the rows left — `mr`'s
    /// thirds, rounded up (`mr` = 12: 4, 8, 12; every M a multiple of 4 without a
    /// wasted row). Halves only (6, 12) computed 36 rows for 32 and 12 for 8; BERT-base
    /// untuned, f32, against them (minima of 5 interleaved rounds, Zen 4): 1.45x at
    /// sequence 8, 1.15x at 20, 1.11x at 32, 0.95x at 77 (its edge 8 rows, not 6),
    /// level elsewhere. Each height is one more tile body: the kernels' C takes 1.8x as
    /// long to build. The dot variant tiles M by `mr` only.
    pub fn heights(&self) -> Vec<usize> {
        if self.dot || self.mr < 2 {
            return vec![self.mr];
        }
        let mut heights: Vec<usize> = (1..=EDGE_PARTS)
            .map(|i| (self.mr * i).div_ceil(EDGE_PARTS))
            .collect();
        heights.dedup();
        heights
    }

    /// The rows the register tiles compute for an M of `m` rows ([`Self::heights`]).
    pub fn rows_computed(&self, m: u64) -> u64 {
        let mr = self.mr.max(1) as u64;
        let rest = m % mr;
        let edge = if rest == 0 {
            0
        } else {
            self.heights()
                .into_iter()
                .map(|h| h as u64)
                .find(|&h| h >= rest)
                .unwrap_or(mr)
        };
        m - rest + edge
    }

    /// Vector lanes of one register-tile column: the vector in the usual variant, one
    /// column in the dot variant.
    pub(super) fn column_granule(&self, lanes: usize) -> usize {
        if self.dot {
            1
        } else {
            lanes
        }
    }

    /// What the reduction tile is a multiple of: the unroll (`uk` vectors in the dot
    /// variant).
    pub fn k_granule(&self, lanes: usize) -> usize {
        if self.dot {
            self.uk * lanes
        } else {
            self.uk
        }
    }

    /// Vector registers the register tile needs: accumulators, one row of B, one of A
    /// (a broadcast element, or in the dot variant a vector).
    pub fn registers_needed(&self, lanes: usize) -> usize {
        let nv = self.nr / self.column_granule(lanes.max(1));
        self.mr * nv + nv + 1
    }

    /// Check every limit of the target; the error names the broken one.
    pub fn validate(&self, target: &CpuTarget) -> Result<()> {
        let fail = |reason: String| {
            Err(CodegenError::InvalidMicroKernel {
                micro_kernel: self.to_string(),
                reason,
            })
        };
        let lanes = target.lanes_f32();
        if self.values()[..6].contains(&0) {
            return fail("every parameter must be at least 1".into());
        }
        if !self.nr.is_multiple_of(self.column_granule(lanes)) {
            return fail(format!(
                "nr = {} is not a multiple of the {lanes} vector lanes",
                self.nr
            ));
        }
        let kc_unit = if self.dot { "uk vectors" } else { "uk" };
        for (tile, reg, name) in [
            (self.mc, self.mr, "mc/mr"),
            (self.nc, self.nr, "nc/nr"),
            (self.kc, self.k_granule(lanes), &*format!("kc/{kc_unit}")),
        ] {
            if !tile.is_multiple_of(reg) {
                return fail(format!("{name}: {tile} is not a multiple of {reg}"));
            }
        }
        if self.dot && self.pf {
            return fail("prefetch (pf=1) is for the usual variant, not the dot one".into());
        }
        for (set, name) in [
            (self.ia, "A in place (ia=1)"),
            (self.ib, "B in place (ib=1)"),
            (self.vm, "the transposed variant (vm=1)"),
        ] {
            if self.dot && set {
                return fail(format!(
                    "{name} is for the usual variant; the dot one reads its operands in \
                     place wherever their K axis is contiguous"
                ));
            }
        }
        if self.uk > 16 || (self.mr > 32 && !self.amx) {
            return fail("uk must be <= 16 and mr <= 32 (code size)".into());
        }
        if self.amx {
            if !target.amx {
                return fail(
                    "AMX tiles (amx=1) need a CPU with AMX-BF16; this target has none".into(),
                );
            }
            if *self != self.fit_amx() {
                return fail(format!(
                    "AMX tiles (amx=1) take mr x nr of 16 x 16 output tiles, {}, kc = 16, \
                     uk = 1 and no other variant",
                    AMX_TILES
                        .map(|(r, c)| format!("{}x{}", r * 16, c * 16))
                        .join(", ")
                ));
            }
        }
        let limits = Limits(target);
        if !self.amx && !limits.registers(self.mr, self.nr / self.column_granule(lanes)) {
            return fail(format!(
                "the {}x{} register tile needs {} vector registers; the target has {}",
                self.mr,
                self.nr,
                self.registers_needed(lanes),
                target.vector_registers
            ));
        }
        let bytes = |a: usize, b: usize| a.saturating_mul(b).saturating_mul(4);
        let checks = [
            (
                limits.l1(self.kc, self.nr),
                bytes(self.kc, self.nr),
                target.l1d_bytes,
                "packed kc x nr micro-panel",
                "L1d",
            ),
            (
                limits.l2(self.mc, self.kc),
                bytes(self.mc, self.kc),
                target.l2_bytes,
                "packed mc x kc block",
                "L2",
            ),
            (
                limits.l3(self.kc, self.nc),
                bytes(self.kc, self.nc),
                target.l3_bytes,
                "packed kc x nc block",
                "L3",
            ),
        ];
        for (ok, need, have, what, cache) in checks {
            if !ok {
                return fail(format!(
                    "the {what} takes {need} bytes; {cache} holds {have}"
                ));
            }
        }
        Ok(())
    }
}

/// Into how many parts the usual variant's edge tiles divide `mr` (see
/// [`ContractionKernel::heights`]).
const EDGE_PARTS: usize = 3;

impl Sketch for ContractionKernel {
    type Target = CpuTarget;
    const NAME: &'static str = "contraction";

    fn applies(w: &Workload) -> Result<()> {
        GemmView::of(w).map(|_| ())
    }

    fn default_for(target: &CpuTarget) -> Self {
        ContractionKernel::default_for(target)
    }

    /// See `contraction_seeds.rs`.
    fn seeds(target: &CpuTarget, w: &Workload) -> Vec<Self> {
        super::contraction_seeds::seeds(target, w)
    }

    /// See `contraction_seeds.rs`.
    fn default_for_instance(target: &CpuTarget, w: &Workload, bound: &BoundWorkload) -> Self {
        super::contraction_seeds::default_for_instance(target, w, bound)
    }

    fn parse(text: &str) -> Result<Self> {
        ContractionKernel::parse(text)
    }

    fn validate(&self, target: &CpuTarget) -> Result<()> {
        ContractionKernel::validate(self, target)
    }

    fn lower(p: &Program<Self>, target: &CpuTarget) -> Result<crate::loop_ir::Func> {
        crate::lower::contraction(p, target)
    }

    /// Local padding pads each axis to its register-tile granularity (`mr`, in the usual
    /// variant the lowest of its heights that covers the rows left at the edge
    /// ([`Self::heights`]); `nr`, in the
    /// usual variant the vector, as its edge tiles are narrower; `uk`; the dot variant's
    /// K to the vector, whose tail runs element by element); a task is
    /// one cache tile of M and N of one batch item (in the transposed variant, `mr`
    /// and `mc` tile N, `nr` and `nc` M).
    fn adaptation(&self, target: &CpuTarget, w: &Workload, bound: &BoundWorkload) -> Adaptation {
        let Ok(g) = GemmView::of(w) else {
            return Adaptation {
                tasks: 1.0,
                slots: target.cores as f64,
                pad: 1.0,
            };
        };
        let e = |a: usize| bound.extents[a].max(0) as f64;
        let up = |x: f64, m: usize| (x / m as f64).ceil() * m as f64;
        let batch: f64 = g.batch.iter().map(|&a| e(a)).product();
        let (g, _) = self.oriented(g);
        let (m, n, k) = (e(g.m), e(g.n), e(g.k));
        let (tiles_m, tiles_n) = self.tiles(batch, m, n, target.cores);
        let tasks = batch * tiles_m * tiles_n;
        let k_unit = if self.dot {
            target.lanes_f32()
        } else {
            self.uk
        };
        // The usual variant's tile at the N edge computes only the vectors it needs.
        let n_unit = if self.dot {
            self.nr
        } else {
            target.lanes_f32()
        };
        // Its tile at the M edge computes the lowest of its heights that covers the rows
        // left.
        let m_padded = self.rows_computed(m as u64) as f64;
        let padded = m_padded * up(n, n_unit) * up(k, k_unit);
        let pad = if padded > 0.0 {
            (m * n * k) / padded
        } else {
            1.0
        };
        Adaptation {
            tasks: tasks.max(1.0),
            slots: target.cores as f64,
            pad,
        }
    }

    fn sample(target: &CpuTarget, rng: &mut impl Rng) -> Self {
        ContractionKernel::sampled(target, rng)
    }

    fn neighbour(&self, target: &CpuTarget, rng: &mut impl Rng) -> Self {
        self.moved(target, rng)
    }

    fn fit(self, target: &CpuTarget, w: &Workload) -> Self {
        if self.amx {
            if target.amx && amx_runs(w) {
                return self.fit_amx();
            }
            // Tiles are for the contractions that can run them; the rest runs the
            // register tile the AMX one has, in vectors.
            let mut m = ContractionKernel { amx: false, ..self };
            m.mr = m.mr.min(Limits(target).max_rows(m.nr / target.lanes_f32()));
            m.mc = (self.mc / self.mr).max(1) * m.mr;
            return m.fit(target, w);
        }
        if w.precision.is_f32() {
            return self;
        }
        let mut m = if self.dot {
            self.switched(target.lanes_f32())
        } else {
            self
        };
        m.ib = false;
        m.vm = false;
        // An i8 contraction's A is its rows quantized before the tasks: packed from
        // there, never read in place.
        if w.precision == Precision::I8 {
            m.ia = false;
        }
        m
    }

    fn steps(&self, target: &CpuTarget) -> Vec<Self> {
        self.stepped(target)
    }

    fn child(&self, other: &Self, target: &CpuTarget, rng: &mut impl Rng) -> Self {
        self.crossed(other, target, rng)
    }

    /// M, N rounded up to the vector (a vector register is never split), K; then N
    /// and M so rounded, for the transposed variant (see `ContractionKernel::tiled_axes`).
    fn factors(target: &CpuTarget, w: &Workload, bound: &BoundWorkload) -> Factors {
        let lanes = target.lanes_f32();
        let (m, n, k) = match GemmView::of(w) {
            Ok(g) => {
                let e = |a: usize| usize::try_from(bound.extents[a]).unwrap_or(1).max(1);
                (e(g.m), e(g.n), e(g.k))
            }
            Err(_) => (1, 1, 1),
        };
        let up = |x: usize| x.div_ceil(lanes) * lanes;
        Factors(vec![m, up(n), k, n, up(m)])
    }

    fn snap(&self, target: &CpuTarget, f: &Factors) -> Self {
        self.snapped(target, f)
    }

    fn divides(&self, f: &Factors) -> bool {
        let [m, n, k] = self.tiled_axes(f);
        m.is_multiple_of(self.mr)
            && m.is_multiple_of(self.mc)
            && n.is_multiple_of(self.nr)
            && n.is_multiple_of(self.nc)
            && k.is_multiple_of(self.kc)
    }
}
