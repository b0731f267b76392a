//! The trust-region search (TSCompiler §5.1, after TuRBO), the second strategy beside
//! the evolutionary one (`explore.rs`): several **regions**, each the micro-kernels a
//! few mutation steps (its length) from a center — at first the sketch's
//! hardware-aligned seeds, the micro-kernels measured best somewhere and random samples
//! (TuRBO's several starts). Each round a
//! multi-armed bandit (Thompson sampling of each region's rate of improving on the
//! best known latency of some instance) gives every slot of the batch to a region; the
//! region proposes candidates by walks from its center no longer than its length,
//! scores them with a **local surrogate** — the task's cost model calibrated by the
//! region's own measurements (the mean log ratio of measured to predicted latency of
//! the micro-kernels it proposed), each prediction scaled by a log-normal draw in
//! place of a Gaussian process's posterior sample (TuRBO's Thompson sampling; without
//! it the region chases the model's most optimistic predictions and did worse than
//! random picks on the synthetic device of `tests/backend.rs`) — and the best by that
//! draw's gain is measured where it should help most. A region that improved moves its center to its best
//! micro-kernel and, after two successes in a row, doubles its length; after three
//! failures in a row it halves it, and a region of length 0 restarts from a fresh
//! sample. The regions live in the search's process: a resumed run starts them anew
//! from the seeds and the records' best micro-kernels.
use crate::{Backend, CostModel, Tuner};
use rand::RngExt;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Beta, Distribution, LogNormal};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

/// A region's length at its start (mutation steps from its center).
const LENGTH_START: usize = 4;
/// The longest a region grows.
const LENGTH_MAX: usize = 8;
/// Successes in a row that double a region's length.
const SUCCESSES_TO_GROW: usize = 2;
/// Failures in a row that halve it.
const FAILURES_TO_SHRINK: usize = 3;
/// Regions at most.
const MAX_REGIONS: usize = 8;
/// The spread (σ of the log) of the surrogate's draws: how far a prediction may be off.
const SPREAD: f64 = 0.3;
/// Candidates a region proposes per slot it is given.
const PROPOSALS: usize = 48;

/// One trust region.
#[derive(Clone, Debug)]
pub(crate) struct Region<K> {
    /// Its center.
    center: K,
    /// How many mutation steps from the center its candidates may be.
    length: usize,
    /// Successes and failures in a row.
    streak: (usize, usize),
    /// Rounds it improved on some instance's best, and rounds it did not (the
    /// bandit's evidence).
    record: (usize, usize),
    /// The micro-kernels it proposed and had measured.
    proposed: BTreeSet<K>,
}

impl<K: Copy + Ord> Region<K> {
    fn new(center: K) -> Region<K> {
        Region {
            center,
            length: LENGTH_START,
            streak: (0, 0),
            record: (0, 0),
            proposed: BTreeSet::new(),
        }
    }
}

impl<B: Backend> Tuner<B> {
    /// Start the regions: one around each seed, then around the micro-kernels measured
    /// best somewhere, then around random samples, [`MAX_REGIONS`] in all.
    fn start_regions(&mut self, rng: &mut ChaCha8Rng) {
        let mut centers: Vec<B::MicroKernel> = self.backend.seeds(&self.workload);
        for (_, mk) in self.measured_best().into_iter().flatten() {
            if !centers.contains(&mk) {
                centers.push(mk);
            }
        }
        for _ in 0..4 * MAX_REGIONS {
            if centers.len() >= MAX_REGIONS {
                break;
            }
            let mk = self.backend.sample(rng);
            if !centers.contains(&mk) {
                centers.push(mk);
            }
        }
        centers.truncate(MAX_REGIONS);
        self.regions = centers.into_iter().map(Region::new).collect();
    }

    /// A region's proposals: walks of one to `length` mutations from its center, the
    /// center itself included.
    fn propose(&self, region: usize, rng: &mut ChaCha8Rng) -> Vec<B::MicroKernel> {
        let r = &self.regions[region];
        let mut out = BTreeSet::from([r.center]);
        for _ in 0..PROPOSALS {
            let steps = rng.random_range(1..=r.length.max(1));
            let mut mk = r.center;
            for _ in 0..steps {
                mk = self.backend.mutate(&mk, rng);
            }
            out.insert(mk);
        }
        out.into_iter().collect()
    }

    /// The region's calibration of the cost model: the mean of ln(measured ÷ predicted)
    /// over the measurements of the micro-kernels it proposed (0 before any).
    fn local_bias(&mut self, model: &CostModel, region: usize) -> f64 {
        let proposed = &self.regions[region].proposed;
        let measured: Vec<(B::MicroKernel, usize, f64)> = self
            .journal
            .records
            .iter()
            .filter(|r| proposed.contains(&r.micro_kernel))
            .filter_map(|r| Some((r.micro_kernel, *self.index.get(&r.bindings)?, r.latency()?)))
            .collect();
        if measured.is_empty() {
            return 0.0;
        }
        let kernels: Vec<B::MicroKernel> = measured.iter().map(|m| m.0).collect();
        let pred = self.predict(model, &kernels);
        let logs: Vec<f64> = measured
            .iter()
            .zip(&pred)
            .map(|(&(_, i, l), p)| (l / p[i].max(1e-30)).ln())
            .filter(|x| x.is_finite())
            .collect();
        logs.iter().sum::<f64>() / logs.len().max(1) as f64
    }

    /// Choose this round's trials from the trust regions (after the seeds not measured
    /// yet); with the micro-kernel → region map the update after the round needs.
    pub(crate) fn choose_in_regions(
        &mut self,
        model: &CostModel,
        rng: &mut ChaCha8Rng,
        budget: usize,
    ) -> Vec<(B::MicroKernel, usize)> {
        if self.regions.is_empty() {
            self.start_regions(rng);
        }
        let t0 = Instant::now();
        let w: Vec<f64> = self.instances.iter().map(|x| x.weight).collect();
        // Current objective terms (infinite: nothing known of the instance yet).
        let mut cur: Vec<f64> = self.best_per_instance(model).iter().map(|b| b.0).collect();
        let done = self.journal.tried();
        let mut trials = self.unmeasured_seeds(&w, rng);
        let n_kernels = self
            .options
            .batch
            .min(budget.div_ceil(self.options.instances_per_kernel))
            .max(1);
        let slots = n_kernels.saturating_sub(trials.len() / self.options.instances_per_kernel);
        // Per region asked this round: its proposals and their calibrated predictions.
        type Proposals<K> = (Vec<K>, Vec<Vec<f64>>);
        let mut proposals: BTreeMap<usize, Proposals<B::MicroKernel>> = BTreeMap::new();
        let mut picked: BTreeSet<B::MicroKernel> = BTreeSet::new();
        self.time.search += t0.elapsed().as_secs_f64();
        for _ in 0..slots {
            // The bandit: a draw from each region's Beta(successes + 1, failures + 1).
            let draw = |(s, f): (usize, usize), rng: &mut ChaCha8Rng| -> f64 {
                Beta::new(s as f64 + 1.0, f as f64 + 1.0)
                    .expect("positive shapes")
                    .sample(rng)
            };
            let Some(r) = (0..self.regions.len())
                .map(|r| (r, draw(self.regions[r].record, rng)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(r, _)| r)
            else {
                break;
            };
            if let std::collections::btree_map::Entry::Vacant(slot) = proposals.entry(r) {
                let kernels = self.propose(r, rng);
                let bias = self.local_bias(model, r).exp();
                let pred: Vec<Vec<f64>> = self
                    .predict(model, &kernels)
                    .into_iter()
                    .map(|row| row.into_iter().map(|l| l * bias).collect())
                    .collect();
                slot.insert((kernels, pred));
            }
            let (kernels, pred) = &proposals[&r];
            // A draw of the surrogate for this slot (TuRBO's Thompson sampling): each
            // proposal's predictions scaled by a log-normal factor of the model's
            // uncertainty.
            let spread = LogNormal::new(0.0, SPREAD).expect("a positive spread");
            let draw: Vec<f64> = kernels.iter().map(|_| spread.sample(rng)).collect();
            // Where nothing is known, a candidate gains its predicted latency.
            let gain = |c: usize, i: usize, cur: &[f64]| {
                let p = pred[c][i] * draw[c];
                w[i] * if cur[i].is_finite() {
                    (cur[i] - p).max(0.0)
                } else {
                    p
                }
            };
            let score = |c: usize| (0..w.len()).map(|i| gain(c, i, &cur)).sum::<f64>();
            let Some(c) = (0..kernels.len())
                .filter(|&c| !picked.contains(&kernels[c]))
                .filter(|&c| {
                    (0..w.len())
                        .any(|i| !done.contains(&(kernels[c], self.instances[i].bindings.clone())))
                })
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
            else {
                continue;
            };
            let mk = kernels[c];
            picked.insert(mk);
            self.regions[r].proposed.insert(mk);
            let mut order: Vec<usize> = (0..w.len())
                .filter(|&i| !done.contains(&(mk, self.instances[i].bindings.clone())))
                .collect();
            order.sort_by(|&a, &b| gain(c, b, &cur).total_cmp(&gain(c, a, &cur)));
            for &i in order.iter().take(self.options.instances_per_kernel) {
                trials.push((mk, i));
            }
            for (i, x) in cur.iter_mut().enumerate() {
                *x = x.min(pred[c][i]);
            }
        }
        let t0 = Instant::now();
        let trials = self.fresh(trials, &done, budget);
        self.time.search += t0.elapsed().as_secs_f64();
        trials
    }

    /// After a round: each region that had micro-kernels measured in it succeeded if
    /// one of them beat the best latency known before the round (`before`) on some
    /// instance — its center moves to its best one by weighted latency gained, and it
    /// grows after [`SUCCESSES_TO_GROW`] successes in a row — else it failed, and
    /// shrinks after [`FAILURES_TO_SHRINK`] in a row; one shrunk to nothing restarts
    /// from a fresh sample.
    pub(crate) fn update_regions(
        &mut self,
        before: &[Option<(f64, B::MicroKernel)>],
        round: usize,
        rng: &mut ChaCha8Rng,
    ) {
        // Weighted latency each micro-kernel of the round gained over the bests before.
        let mut gained: BTreeMap<B::MicroKernel, f64> = BTreeMap::new();
        for r in self.journal.records.iter().filter(|r| r.round == round) {
            let (Some(l), Some(&i)) = (r.latency(), self.index.get(&r.bindings)) else {
                continue;
            };
            let old = before[i].map_or(f64::INFINITY, |b| b.0);
            if l < old {
                let g = if old.is_finite() { old - l } else { l };
                *gained.entry(r.micro_kernel).or_default() += self.instances[i].weight * g;
            } else {
                gained.entry(r.micro_kernel).or_default();
            }
        }
        for region in &mut self.regions {
            let mine: Vec<(B::MicroKernel, f64)> = gained
                .iter()
                .filter(|(mk, _)| region.proposed.contains(mk))
                .map(|(mk, g)| (*mk, *g))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let best = mine
                .iter()
                .copied()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .expect("not empty");
            if best.1 > 0.0 {
                region.center = best.0;
                region.record.0 += 1;
                region.streak = (region.streak.0 + 1, 0);
                if region.streak.0 >= SUCCESSES_TO_GROW {
                    region.length = (region.length * 2).min(LENGTH_MAX);
                    region.streak.0 = 0;
                }
            } else {
                region.record.1 += 1;
                region.streak = (0, region.streak.1 + 1);
                if region.streak.1 >= FAILURES_TO_SHRINK {
                    region.length /= 2;
                    region.streak.1 = 0;
                }
            }
            if region.length == 0 {
                *region = Region::new(self.backend.sample(rng));
            }
        }
    }
}
