//! The space of contraction micro-kernels ([`ContractionKernel`]): the target's limits
//! on their parameters ([`Limits`], shared by validation and the space, which samples
//! only what validates) and the search's moves on them — samples, neighbours, steps,
//! crossover — and the snap of their tiles to an instance's factors. The sketch's
//! [`Sketch`](crate::Sketch) methods call these.
use super::contraction::ContractionKernel;
use crate::{CpuTarget, Factors};
use rand::{Rng, RngExt};

impl ContractionKernel {
    /// The other variant (dot or usual), the register tile keeping its registers and
    /// the flags of the usual variant cleared.
    pub(super) fn switched(&self, lanes: usize) -> Self {
        let col = self.column_granule(lanes);
        let mut m = *self;
        m.dot = !m.dot;
        m.pf = false;
        m.ia = false;
        m.ib = false;
        m.vm = false;
        m.amx = false;
        let nr = m.nr / col * m.column_granule(lanes);
        m.nc = (m.nc / m.nr).max(1) * nr;
        m.nr = nr;
        m.kc = m.kc.div_ceil(m.k_granule(lanes)).max(1) * m.k_granule(lanes);
        m
    }

    /// `mr` rows (at least one), the M cache tile keeping its count of register tiles.
    fn with_rows(&self, mr: i64) -> Self {
        let mr = mr.max(1) as usize;
        ContractionKernel {
            mr,
            mc: (self.mc / self.mr).max(1) * mr,
            ..*self
        }
    }

    /// `granules + step` granules of `col` columns (at least one), the N cache tile
    /// keeping its count of register tiles.
    fn with_columns(&self, granules: usize, step: i64, col: usize) -> Self {
        let nr = (granules as i64 + step).max(1) as usize * col;
        ContractionKernel {
            nr,
            nc: (self.nc / self.nr).max(1) * nr,
            ..*self
        }
    }

    /// Register tile `nv` vectors wide (the dot variant, a third of the time: `nv`
    /// columns) with as many rows as registers allow; cache tiles up to what the caches
    /// hold.
    pub(super) fn sampled(target: &CpuTarget, rng: &mut impl Rng) -> Self {
        let lanes = target.lanes_f32();
        let limits = Limits(target);
        let dot = rng.random_bool(1.0 / 3.0);
        let max_nv = if dot {
            max_multiple(1, |nv| limits.registers(1, nv)).min(8)
        } else {
            ((target.vector_registers - 2) / 2).clamp(1, 6)
        };
        let nv = rng.random_range(1..=max_nv);
        let nr = if dot { nv } else { nv * lanes };
        let max_mr = limits.max_rows(nv);
        let mr = rng.random_range(1..=max_mr);
        let uk = UNROLLS[rng.random_range(0..UNROLLS.len())];
        let k_unit = if dot { uk * lanes } else { uk };
        // The dot variant's B micro-panel is `nr` rows of `kc`, its A rows `mr` more.
        let panel_rows = if dot { nr + mr } else { nr };
        let kc =
            k_unit * rng.random_range(1..=max_multiple(k_unit, |kc| limits.l1(kc, panel_rows)));
        let mc = mr * rng.random_range(1..=max_multiple(mr, |mc| limits.l2(mc, kc)).min(64));
        let nc = nr * rng.random_range(1..=max_multiple(nr, |nc| limits.l3(kc, nc)).min(96));
        let mk = ContractionKernel {
            mr,
            nr,
            mc,
            nc,
            kc,
            uk,
            dot,
            pf: !dot && rng.random_bool(0.5),
            ia: !dot && rng.random_bool(0.5),
            ib: !dot && rng.random_bool(0.5),
            vm: !dot && rng.random_bool(0.5),
            amx: false,
        };
        debug_assert!(mk.validate(target).is_ok(), "{mk}");
        // Half the samples on a target with AMX are tiles (`fit` keeps them only where
        // a workload can run them).
        if target.amx && rng.random_bool(0.5) {
            return mk.fit_amx();
        }
        mk
    }

    /// One parameter changed, the tiles of the others kept where they stay multiples;
    /// or the variant switched, the register tile keeping its registers.
    pub(super) fn moved(&self, target: &CpuTarget, rng: &mut impl Rng) -> Self {
        let lanes = target.lanes_f32();
        let col = self.column_granule(lanes);
        let mut m = *self;
        match rng.random_range(0..11) {
            0 => m = self.with_rows(self.mr as i64 + ROW_STEPS[rng.random_range(0..4)]),
            1 => m = self.with_columns(self.nr / col, [-1, 1][rng.random_range(0..2)], col),
            2 => m.mc = scale(m.mc, m.mr, rng),
            3 => m.nc = scale(m.nc, m.nr, rng),
            4 => m.kc = scale(m.kc, m.k_granule(lanes), rng),
            5 => {
                m.uk = UNROLLS[rng.random_range(0..UNROLLS.len())];
                m.kc = m.kc.div_ceil(m.k_granule(lanes)).max(1) * m.k_granule(lanes);
            }
            6 if !m.dot => m.pf = !m.pf,
            7 if !m.dot => m.ia = !m.ia,
            8 if !m.dot => m.ib = !m.ib,
            9 if !m.dot => m.vm = !m.vm,
            _ if target.amx && !m.amx && rng.random_bool(0.5) => m = self.fit_amx(),
            _ => m = self.switched(lanes),
        }
        if m.amx {
            m = m.fit_amx();
        }
        m
    }

    /// The register tile's rows one or two up and down, its columns one granule (a
    /// vector, or a column in the dot variant) up and down; cache tiles keep their
    /// count of register tiles.
    pub(super) fn stepped(&self, target: &CpuTarget) -> Vec<Self> {
        let col = self.column_granule(target.lanes_f32());
        let rows = ROW_STEPS.map(|d| self.with_rows(self.mr as i64 + d));
        let columns = [-1, 1].map(|d| self.with_columns(self.nr / col, d, col));
        rows.into_iter()
            .chain(columns)
            .filter(|m| m != self)
            .collect()
    }

    /// The register tile (and variant) of one parent, the cache tiles of the other.
    pub(super) fn crossed(&self, other: &Self, target: &CpuTarget, rng: &mut impl Rng) -> Self {
        let (reg, other) = if rng.random_bool(0.5) {
            (self, other)
        } else {
            (other, self)
        };
        let k_unit = reg.k_granule(target.lanes_f32());
        ContractionKernel {
            mc: (other.mc / other.mr).max(1) * reg.mr,
            nc: (other.nc / other.nr).max(1) * reg.nr,
            kc: (other.kc / k_unit).max(1) * k_unit,
            ..*reg
        }
    }

    /// Every tile shrunk to the nearest size dividing its extent.
    pub(super) fn snapped(&self, target: &CpuTarget, f: &Factors) -> Self {
        let lanes = target.lanes_f32();
        let col = self.column_granule(lanes);
        let [m, n, k] = self.tiled_axes(f);
        let mr = largest_factor(m, 1, self.mr).unwrap_or(1);
        let mc = largest_factor(m, mr, self.mc.max(mr)).unwrap_or(mr);
        let nr = largest_factor(n, col, self.nr).unwrap_or(col);
        let nc = largest_factor(n, nr, self.nc.max(nr)).unwrap_or(nr);
        // The reduction tile in whole unrolled steps (vectors in the dot variant), or
        // without unrolling; a K no tile divides gives a kernel the space refuses.
        let vector = if self.dot { lanes } else { 1 };
        let (kc, uk) = match largest_factor(k, self.uk * vector, self.kc) {
            Some(kc) => (kc, self.uk),
            None => (
                largest_factor(k, vector, self.kc.max(vector)).unwrap_or(vector),
                1,
            ),
        };
        ContractionKernel {
            mr,
            nr,
            mc,
            nc,
            kc,
            uk,
            ..*self
        }
    }
}

/// The target's limits on the sketch's parameters, shared by validation and the space
/// (which samples only what validates): registers bound the register tile, the caches
/// the packed blocks.
pub(crate) struct Limits<'a>(pub &'a CpuTarget);

impl Limits<'_> {
    /// A register tile of `mr` rows by `nv` vectors fits the vector registers, with `nv`
    /// for a row of B and one for A.
    pub fn registers(&self, mr: usize, nv: usize) -> bool {
        mr * nv + nv < self.0.vector_registers
    }

    /// The most rows a register tile of `nv` vectors may have (at least 1).
    pub fn max_rows(&self, nv: usize) -> usize {
        max_multiple(1, |mr| self.registers(mr, nv.max(1))).clamp(1, 32)
    }

    /// A packed `kc x nr` micro-panel of B fits L1d.
    pub fn l1(&self, kc: usize, nr: usize) -> bool {
        kc.saturating_mul(nr).saturating_mul(4) <= self.0.l1d_bytes
    }

    /// A packed `mc x kc` block of A fits L2.
    pub fn l2(&self, mc: usize, kc: usize) -> bool {
        mc.saturating_mul(kc).saturating_mul(4) <= self.0.l2_bytes
    }

    /// A packed `kc x nc` block of B fits L3.
    pub fn l3(&self, kc: usize, nc: usize) -> bool {
        kc.saturating_mul(nc).saturating_mul(4) <= self.0.l3_bytes
    }
}

/// How far a mutation moves the register tile's rows.
const ROW_STEPS: [i64; 4] = [-2, -1, 1, 2];
/// Unroll factors of the reduction loop the space uses.
const UNROLLS: [usize; 4] = [1, 2, 4, 8];

/// `x` (a multiple of `unit`) scaled by a random factor, still a multiple of `unit`.
fn scale(x: usize, unit: usize, rng: &mut impl Rng) -> usize {
    let blocks = (x / unit).max(1);
    let factor: f64 = [0.5, 0.75, 1.25, 1.5, 2.0][rng.random_range(0..5)];
    let mut b = ((blocks as f64 * factor).round() as usize).max(1);
    if b == blocks {
        b = if rng.random_bool(0.5) {
            b + 1
        } else {
            b.saturating_sub(1).max(1)
        };
    }
    b * unit
}

/// Largest `x <= at_most` with `x % unit == 0` and `total % x == 0`, if any.
fn largest_factor(total: usize, unit: usize, at_most: usize) -> Option<usize> {
    (1..=at_most / unit)
        .rev()
        .map(|j| j * unit)
        .find(|x| total.is_multiple_of(*x))
}

/// Largest multiplier `x` with `unit * x` passing `fits` (at least 1).
pub(super) fn max_multiple(unit: usize, fits: impl Fn(usize) -> bool) -> usize {
    let mut x = 1;
    while x < 4096 && fits(unit * (x + 1)) {
        x += 1;
    }
    x
}
