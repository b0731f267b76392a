//! The search space of a sketch's micro-kernels: shape-generic (bounded by the target's
//! limits only, never by the factors of a shape), or, for per-shape tuning (the
//! Ansor-style baseline), restricted to tiles that divide one instance's extents.
//! Sampling, mutation and crossover stay inside the space; what is valid comes from
//! the sketch ([`Sketch::validate`]), so the space and validation cannot disagree. A
//! space for one workload holds only the micro-kernels that run it as they are
//! ([`Sketch::fit`]: a bf16 contraction's fixed variant).
use anyshape_codegen::{Factors, Sketch};
use anyshape_ir::Workload;
use rand::Rng;

/// The space of valid micro-kernels of sketch `K` on a target.
#[derive(Clone, Debug)]
pub struct SearchSpace<K: Sketch> {
    target: K::Target,
    factors: Option<Factors>,
    workload: Option<Workload>,
}

impl<K: Sketch> SearchSpace<K> {
    /// The shape-generic space for `target`.
    pub fn new(target: &K::Target) -> Self {
        SearchSpace {
            target: target.clone(),
            factors: None,
            workload: None,
        }
    }

    /// The space restricted to the micro-kernels that run `w` as they are.
    pub fn for_workload(mut self, w: &Workload) -> Self {
        self.workload = Some(w.clone());
        self
    }

    /// The shape-dependent space of one instance: only tiles that divide its extents
    /// (what per-shape auto-schedulers such as Ansor search).
    pub fn factor_only(target: &K::Target, factors: Factors) -> Self {
        SearchSpace::new(target).with_factors(factors)
    }

    /// The space restricted to tiles that divide `factors` (whatever else restricts
    /// it stays).
    pub fn with_factors(mut self, factors: Factors) -> Self {
        self.factors = Some(factors);
        self
    }

    /// Whether `mk` is in the space (valid on the target; dividing the extents in a
    /// factor-only space).
    pub fn contains(&self, mk: &K) -> bool {
        mk.validate(&self.target).is_ok()
            && self.factors.as_ref().is_none_or(|f| mk.divides(f))
            && self.fit(*mk) == *mk
    }

    /// `mk` as it runs the space's workload (itself where the space has none).
    pub fn fit(&self, mk: K) -> K {
        match &self.workload {
            Some(w) => mk.fit(&self.target, w),
            None => mk,
        }
    }

    /// `mk` fitted to the workload and shrunk to dividing tiles in a factor-only space.
    fn snap(&self, mk: K) -> K {
        let mk = self.fit(mk);
        match &self.factors {
            Some(f) => mk.snap(&self.target, f),
            None => mk,
        }
    }

    /// The sketch's default as it runs the space's workload
    /// ([`Sketch::default_for_workload`]; the plain default where the space has none).
    pub fn default_kernel(&self) -> K {
        match &self.workload {
            Some(w) => K::default_for_workload(&self.target, w),
            None => K::default_for(&self.target),
        }
    }

    /// A micro-kernel of the space (the sketch's default if sampling finds none).
    pub fn sample(&self, rng: &mut impl Rng) -> K {
        for _ in 0..1000 {
            let mk = self.snap(K::sample(&self.target, rng));
            if self.contains(&mk) {
                return mk;
            }
        }
        self.default_kernel()
    }

    /// A neighbour of `mk` in the space (a fresh sample where none turns up).
    pub fn mutate(&self, mk: &K, rng: &mut impl Rng) -> K {
        for _ in 0..32 {
            let m = self.snap(mk.neighbour(&self.target, rng));
            if m != *mk && self.contains(&m) {
                return m;
            }
        }
        self.sample(rng)
    }

    /// The sketch's one-step neighbours of `mk` that the space holds (shrunk to dividing
    /// tiles in a factor-only space), without `mk` and without repeats.
    pub fn steps(&self, mk: &K) -> Vec<K> {
        let mut out: Vec<K> = Vec::new();
        for m in mk.steps(&self.target).into_iter().map(|m| self.snap(m)) {
            if m != *mk && self.contains(&m) && !out.contains(&m) {
                out.push(m);
            }
        }
        out
    }

    /// A child of `a` and `b` in the space (a neighbour of `a` where the child is not).
    pub fn crossover(&self, a: &K, b: &K, rng: &mut impl Rng) -> K {
        let child = self.snap(a.child(b, &self.target, rng));
        if self.contains(&child) {
            child
        } else {
            self.mutate(a, rng)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_codegen::{ContractionKernel, CpuTarget};
    use rand::SeedableRng;

    #[test]
    fn sampling_mutation_and_crossover_stay_in_the_space() {
        let target = CpuTarget::detect();
        let space = SearchSpace::<ContractionKernel>::new(&target);
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
        // A prime M: only mr = mc = 1 or 37 divide it (in the transposed variant,
        // which tiles N = 50 by mr and M rounded up to the vector by nr, 1, 2, 5, ...).
        let n_padded = 50usize.div_ceil(lanes) * lanes;
        let m_padded = 37usize.div_ceil(lanes) * lanes;
        let f = Factors(vec![37, n_padded, 96, 50, m_padded]);
        let space = SearchSpace::<ContractionKernel>::factor_only(&target, f);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        for _ in 0..300 {
            let a = space.sample(&mut rng);
            let b = space.mutate(&a, &mut rng);
            let c = space.crossover(&a, &b, &mut rng);
            for m in [a, b, c] {
                assert!(space.contains(&m), "{m}");
                let (rows, cols) = match m.vm {
                    true => (50, m_padded),
                    false => (37, n_padded),
                };
                assert!(rows % m.mr + rows % m.mc + 96 % m.kc == 0, "{m}");
                assert!(cols % m.nr + cols % m.nc == 0, "{m}");
            }
        }
        // The generic space holds tiles the factor-only one lacks.
        let generic = SearchSpace::<ContractionKernel>::new(&target);
        let mk = generic.sample(&mut rng);
        assert!(generic.contains(&mk));
    }
}
