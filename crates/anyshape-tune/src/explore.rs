//! The search's explorative round: evolve candidates from the best micro-kernels known
//! for any instance (mutation, crossover, fresh samples, the family's best), then choose
//! the batch of trials that most lowers the predicted weighted latency, greedily, each
//! measured where it should help most; plus a share of random picks; the sketch's
//! seeds not measured yet go first. The model's predictions decide here; the exploitation
//! round (`exploit.rs`) measures around what was measured instead.
use crate::{Backend, CostModel, Tuner};
use rand::{Rng, RngExt};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;
use std::time::Instant;

impl<B: Backend> Tuner<B> {
    /// Evolve candidates from the best known micro-kernels; the family's best ones
    /// (foreseen, see `family.rs`) are candidates as they are.
    fn evolve(&self, elites: &[B::MicroKernel], rng: &mut ChaCha8Rng) -> Vec<B::MicroKernel> {
        let mut out: BTreeSet<B::MicroKernel> = elites.iter().copied().collect();
        out.extend(self.shared.kernels.iter().copied());
        for _ in 0..64 {
            out.insert(self.backend.sample(rng));
        }
        if !elites.is_empty() {
            for _ in 0..192 {
                let a = elites[rng.random_range(0..elites.len())];
                out.insert(self.backend.mutate(&a, rng));
            }
            for _ in 0..64 {
                let a = elites[rng.random_range(0..elites.len())];
                let b = elites[rng.random_range(0..elites.len())];
                out.insert(self.backend.crossover(&a, &b, rng));
            }
        }
        out.into_iter().collect()
    }

    /// Choose this round's trials: `(micro-kernel, instance)` pairs.
    pub(crate) fn choose(
        &mut self,
        model: &CostModel,
        rng: &mut ChaCha8Rng,
        budget: usize,
    ) -> Vec<(B::MicroKernel, usize)> {
        let t0 = Instant::now();
        let best = self.best_per_instance(model);
        let mut elites: BTreeSet<B::MicroKernel> = BTreeSet::new();
        for b in &best {
            if b.0.is_finite() {
                elites.insert(b.1);
            }
        }
        let elites: Vec<B::MicroKernel> = elites.into_iter().collect();
        let candidates = self.evolve(&elites, rng);
        self.time.search += t0.elapsed().as_secs_f64();
        let pred = self.predict(model, &candidates);
        let t0 = Instant::now();
        let done = self.journal.tried();
        let w: Vec<f64> = self.instances.iter().map(|x| x.weight).collect();
        // Current objective terms; unknown instances count as twice the best prediction.
        let mut cur: Vec<f64> = best
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if b.0.is_finite() {
                    b.0
                } else {
                    2.0 * pred.iter().map(|p| p[i]).fold(f64::INFINITY, f64::min)
                }
            })
            .collect();
        let gain = |c: usize, i: usize, cur: &[f64]| w[i] * (cur[i] - pred[c][i]).max(0.0);
        let n_kernels = self
            .options
            .batch
            .min(budget.div_ceil(self.options.instances_per_kernel))
            .max(1);
        // With no measurements yet the model knows nothing: explore at random.
        let epsilon = if model.samples == 0 {
            1.0
        } else {
            self.options.epsilon
        };
        let n_random = ((n_kernels as f64 * epsilon).round() as usize).min(n_kernels);
        let mut trials = self.unmeasured_seeds(&w, rng);
        let seeds = trials.len() / self.options.instances_per_kernel;
        let n_random = n_random.saturating_sub(seeds);
        let mut picked: Vec<usize> = Vec::new();
        while picked.len() < n_kernels.saturating_sub(n_random + seeds) {
            let score = |c: usize| (0..w.len()).map(|i| gain(c, i, &cur)).sum::<f64>();
            let Some(c) = (0..candidates.len())
                .filter(|c| !picked.contains(c))
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
            else {
                break;
            };
            picked.push(c);
            // Measure it where it should help most (not measured there yet).
            let mut order: Vec<usize> = (0..w.len())
                .filter(|&i| !done.contains(&(candidates[c], self.instances[i].bindings.clone())))
                .collect();
            order.sort_by(|&a, &b| gain(c, b, &cur).total_cmp(&gain(c, a, &cur)));
            for &i in order.iter().take(self.options.instances_per_kernel) {
                trials.push((candidates[c], i));
            }
            for i in 0..w.len() {
                cur[i] = cur[i].min(pred[c][i]);
            }
        }
        // Exploration: random micro-kernels on instances drawn by weight.
        for _ in 0..n_random {
            let mk = self.backend.sample(rng);
            for _ in 0..self.options.instances_per_kernel {
                trials.push((mk, weighted_pick(&w, rng)));
            }
        }
        let trials = self.fresh(trials, &done, budget);
        self.time.search += t0.elapsed().as_secs_f64();
        trials
    }
}

impl<B: Backend> Tuner<B> {
    /// A round's `trials` without the pairs tried before (`done`) or twice, at most
    /// `budget`.
    pub(crate) fn fresh(
        &self,
        mut trials: Vec<(B::MicroKernel, usize)>,
        done: &BTreeSet<(B::MicroKernel, anyshape_ir::Bindings)>,
        budget: usize,
    ) -> Vec<(B::MicroKernel, usize)> {
        let mut seen = BTreeSet::new();
        trials.retain(|(mk, i)| {
            !done.contains(&(*mk, self.instances[*i].bindings.clone())) && seen.insert((*mk, *i))
        });
        trials.truncate(budget);
        trials
    }

    /// The seeds (the sketch's defaults, hardware-aligned) that no trial measured yet,
    /// each on instances drawn by weight `w`: they come first in every strategy,
    /// whatever the model says — they are what an untuned module runs and what the
    /// votes measure everywhere, and the search starts from them. (Taken only while the
    /// model knew nothing, a task whose first slice was two trials measured one seed:
    /// at `--trials 8` BERT-base's residual projections then searched far from the
    /// seeds and the votes found them 4-16x faster than any kernel the search had
    /// measured.)
    pub(crate) fn unmeasured_seeds(
        &self,
        w: &[f64],
        rng: &mut ChaCha8Rng,
    ) -> Vec<(B::MicroKernel, usize)> {
        let measured: BTreeSet<B::MicroKernel> =
            self.journal.tried().iter().map(|(mk, _)| *mk).collect();
        let mut trials = Vec::new();
        for mk in self.backend.seeds(&self.workload) {
            if !measured.contains(&mk) {
                for _ in 0..self.options.instances_per_kernel {
                    trials.push((mk, weighted_pick(w, rng)));
                }
            }
        }
        trials
    }
}

/// An index drawn with probability proportional to its weight in `w`.
fn weighted_pick(w: &[f64], rng: &mut impl Rng) -> usize {
    let total: f64 = w.iter().sum();
    let mut x = rng.random_range(0.0..total.max(1e-300));
    for (i, wi) in w.iter().enumerate() {
        if x < *wi {
            return i;
        }
        x -= wi;
    }
    w.len() - 1
}
