//! The shape-generic search space: micro-kernels bounded by the target's limits only
//! (vector registers for the register tile, caches for the cache tiles), never by the
//! factors of a shape. Sampling and mutation stay inside the space.
use anyshape_codegen::{CpuTarget, MicroKernel};
use rand::{Rng, RngExt};

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

/// GEMM extents of one instance, for the shape-dependent (Ansor-style) space whose tiles
/// divide the extents: `mr`, `mc` divide M; `nr`, `nc` divide N rounded up to the vector
/// width (a vector register is never split); `kc` divides K.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Factors {
    /// Rows (M).
    pub m: usize,
    /// Columns (N).
    pub n: usize,
    /// Reduction (K).
    pub k: usize,
}

/// Largest `x <= at_most` with `x % unit == 0` and `total % x == 0`, if any.
fn largest_factor(total: usize, unit: usize, at_most: usize) -> Option<usize> {
    (1..=at_most / unit)
        .rev()
        .map(|j| j * unit)
        .find(|x| total.is_multiple_of(*x))
}

/// The space of valid micro-kernels for a target.
#[derive(Clone, Debug)]
pub struct SearchSpace {
    target: CpuTarget,
    factors: Option<Factors>,
}

impl SearchSpace {
    /// The shape-generic space for `target`.
    pub fn new(target: &CpuTarget) -> SearchSpace {
        SearchSpace {
            target: target.clone(),
            factors: None,
        }
    }

    /// The shape-dependent space of one instance: only tiles that divide its extents
    /// (what per-shape auto-schedulers such as Ansor search).
    pub fn factor_only(target: &CpuTarget, f: Factors) -> SearchSpace {
        let lanes = target.lanes_f32();
        SearchSpace {
            target: target.clone(),
            factors: Some(Factors {
                m: f.m.max(1),
                n: f.n.max(1).div_ceil(lanes) * lanes,
                k: f.k.max(1),
            }),
        }
    }

    /// Whether `mk` is in the space (valid on the target; dividing the extents in a
    /// factor-only space).
    pub fn contains(&self, mk: &MicroKernel) -> bool {
        mk.validate(&self.target).is_ok()
            && self.factors.is_none_or(|f| {
                f.m.is_multiple_of(mk.mr)
                    && f.m.is_multiple_of(mk.mc)
                    && f.n.is_multiple_of(mk.nr)
                    && f.n.is_multiple_of(mk.nc)
                    && f.k.is_multiple_of(mk.kc)
            })
    }

    /// In a factor-only space, shrink every tile to the nearest dividing size (only
    /// shrinking, so target limits still hold); elsewhere `mk` itself.
    fn snap(&self, mk: MicroKernel) -> MicroKernel {
        let Some(f) = self.factors else {
            return mk;
        };
        let lanes = self.lanes();
        let mr = largest_factor(f.m, 1, mk.mr).unwrap_or(1);
        let mc = largest_factor(f.m, mr, mk.mc.max(mr)).unwrap_or(mr);
        let nr = largest_factor(f.n, lanes, mk.nr).unwrap_or(lanes);
        let nc = largest_factor(f.n, nr, mk.nc.max(nr)).unwrap_or(nr);
        let (kc, uk) = match largest_factor(f.k, mk.uk, mk.kc) {
            Some(kc) => (kc, mk.uk),
            None => (largest_factor(f.k, 1, mk.kc.max(1)).unwrap_or(1), 1),
        };
        MicroKernel {
            mr,
            nr,
            mc,
            nc,
            kc,
            uk,
        }
    }

    fn lanes(&self) -> usize {
        self.target.lanes_f32()
    }

    /// Largest multiplier `x` with `unit * x` passing `fits` (at least 1).
    fn max_multiple(unit: usize, fits: impl Fn(usize) -> bool) -> usize {
        let mut x = 1;
        while x < 4096 && fits(unit * (x + 1)) {
            x += 1;
        }
        x
    }

    /// A uniformly drawn valid micro-kernel (snapped to dividing tiles in a factor-only space).
    pub fn sample(&self, rng: &mut impl Rng) -> MicroKernel {
        self.snap(self.sample_generic(rng))
    }

    fn sample_generic(&self, rng: &mut impl Rng) -> MicroKernel {
        let lanes = self.lanes();
        let regs = self.target.vector_registers;
        // Register tile: nv vectors wide, as many rows as registers allow.
        let max_nv = ((regs - 2) / 2).clamp(1, 6);
        let nv = rng.random_range(1..=max_nv);
        let max_mr = ((regs - 1 - nv) / nv).clamp(1, 32);
        let mr = rng.random_range(1..=max_mr);
        let nr = nv * lanes;
        let uk = UNROLLS[rng.random_range(0..UNROLLS.len())];
        let t = &self.target;
        let kc_max = Self::max_multiple(uk, |kc| kc * nr * 4 <= t.l1d_bytes);
        let kc = uk * rng.random_range(1..=kc_max);
        let mc_max = Self::max_multiple(mr, |mc| mc * kc * 4 <= t.l2_bytes).min(64);
        let mc = mr * rng.random_range(1..=mc_max);
        let nc_max = Self::max_multiple(nr, |nc| nc * kc * 4 <= t.l3_bytes).min(96);
        let nc = nr * rng.random_range(1..=nc_max);
        let mk = MicroKernel {
            mr,
            nr,
            mc,
            nc,
            kc,
            uk,
        };
        debug_assert!(mk.validate(t).is_ok(), "{mk}");
        mk
    }

    /// Change one parameter of `mk` (keeping the others where they stay valid); always
    /// returns a member of the space.
    pub fn mutate(&self, mk: &MicroKernel, rng: &mut impl Rng) -> MicroKernel {
        for _ in 0..32 {
            let mut m = *mk;
            match rng.random_range(0..6) {
                0 => {
                    let mr = (m.mr as i64 + [-2, -1, 1, 2][rng.random_range(0..4)]).max(1) as usize;
                    m.mc = (m.mc / m.mr).max(1) * mr;
                    m.mr = mr;
                }
                1 => {
                    let nv = (m.nr / self.lanes()) as i64 + [-1, 1][rng.random_range(0..2)];
                    let nr = nv.max(1) as usize * self.lanes();
                    m.nc = (m.nc / m.nr).max(1) * nr;
                    m.nr = nr;
                }
                2 => m.mc = scale(m.mc, m.mr, rng),
                3 => m.nc = scale(m.nc, m.nr, rng),
                4 => m.kc = scale(m.kc, m.uk, rng),
                _ => {
                    m.uk = UNROLLS[rng.random_range(0..UNROLLS.len())];
                    m.kc = (m.kc / m.uk).max(1) * m.uk;
                }
            }
            let m = self.snap(m);
            if m != *mk && self.contains(&m) {
                return m;
            }
        }
        self.sample(rng)
    }

    /// Take each parameter group (register tile, cache tiles) from either parent.
    pub fn crossover(&self, a: &MicroKernel, b: &MicroKernel, rng: &mut impl Rng) -> MicroKernel {
        let (reg, other) = if rng.random_bool(0.5) { (a, b) } else { (b, a) };
        let mc = (other.mc / other.mr).max(1) * reg.mr;
        let nc = (other.nc / other.nr).max(1) * reg.nr;
        let kc = (other.kc / reg.uk).max(1) * reg.uk;
        let child = self.snap(MicroKernel {
            mr: reg.mr,
            nr: reg.nr,
            mc,
            nc,
            kc,
            uk: reg.uk,
        });
        if self.contains(&child) {
            child
        } else {
            self.mutate(reg, rng)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn sampling_mutation_and_crossover_stay_in_the_space() {
        let target = CpuTarget::detect();
        let space = SearchSpace::new(&target);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let a = space.sample(&mut rng);
            let b = space.mutate(&a, &mut rng);
            let c = space.crossover(&a, &b, &mut rng);
            for m in [a, b, c] {
                assert!(space.contains(&m), "{m}");
                seen.insert(m);
            }
        }
        // Non-factor tiles of every kind are members: the space is not shape-bound.
        assert!(seen.iter().any(|m| m.mr == 7 || m.mr == 5 || m.mr == 11));
        assert!(seen.len() > 1000);
    }

    #[test]
    fn factor_only_space_divides_the_extents() {
        let target = CpuTarget::detect();
        let lanes = target.lanes_f32();
        // A prime M: only mr = mc = 1 or 37 divide it.
        let f = Factors {
            m: 37,
            n: 50,
            k: 96,
        };
        let space = SearchSpace::factor_only(&target, f);
        let n_padded = 50usize.div_ceil(lanes) * lanes;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        for _ in 0..300 {
            let a = space.sample(&mut rng);
            let b = space.mutate(&a, &mut rng);
            let c = space.crossover(&a, &b, &mut rng);
            for m in [a, b, c] {
                assert!(space.contains(&m), "{m}");
                assert!(37 % m.mr + 37 % m.mc + 96 % m.kc == 0, "{m}");
                assert!(n_padded % m.nr + n_padded % m.nc == 0, "{m}");
            }
        }
        // The generic space holds tiles the factor-only one lacks.
        let generic = SearchSpace::new(&target);
        let mk = generic.sample(&mut rng);
        assert!(generic.contains(&mk));
    }
}
