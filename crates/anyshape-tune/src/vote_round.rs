//! The vote round: each candidate micro-kernel measured side by side with the others
//! on the instances where it may win, then the close calls timed again.
//!
//! Screening: every candidate is measured first on the **anchors** (every other
//! instance in order of work, both ends included), then on each instance between two
//! anchors only where it came within a margin of the best at one of them
//! ([`VoteOptions::screen_within`](crate::VoteOptions)): a kernel 30 % slower than the
//! best on both sides of an instance does not win it, and the slow candidates on the
//! large instances were most of a vote round's time. What the round measures follows
//! from its own records, so a resumed run measures only what is missing.
use crate::scores::upper_median;
use crate::{Backend, Result, Tuner};
use anyshape_ir::Bindings;
use std::collections::{BTreeMap, BTreeSet, HashMap};

impl<B: Backend> Tuner<B> {
    /// Which instances are the vote round's anchors, and each instance's neighbours in
    /// order of work (itself for an anchor): instances by work (then bindings), the
    /// even positions and the last one anchors.
    fn anchors(&self) -> Vec<(bool, [usize; 2])> {
        let mut order: Vec<usize> = (0..self.instances.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&self.instances[a], &self.instances[b]);
            x.flops
                .total_cmp(&y.flops)
                .then(x.bindings.cmp(&y.bindings))
        });
        let n = order.len();
        let mut out = vec![(true, [0, 0]); n];
        for (p, &i) in order.iter().enumerate() {
            out[i] = if p % 2 == 0 || p + 1 == n {
                (true, [i, i])
            } else {
                (false, [order[p - 1], order[p + 1]])
            };
        }
        out
    }

    /// The last round, if it is a vote round: its records are all marked as votes and
    /// every one of its micro-kernels was measured on every anchor (see
    /// [`Tuner::measure_votes`]); with those micro-kernels. (With one instance every
    /// search round measures its candidates everywhere: the mark tells them apart.)
    pub fn vote_round(&self) -> Option<(usize, Vec<B::MicroKernel>)> {
        let last = self.journal.records.iter().map(|r| r.round).max()?;
        let mut seen: BTreeMap<B::MicroKernel, BTreeSet<&Bindings>> = BTreeMap::new();
        for r in self.journal.records.iter().filter(|r| r.round == last) {
            if !r.vote {
                return None;
            }
            seen.entry(r.micro_kernel).or_default().insert(&r.bindings);
        }
        let anchors = self.anchors();
        let complete = |s: &BTreeSet<&Bindings>| {
            self.instances
                .iter()
                .zip(&anchors)
                .all(|(x, a)| !a.0 || s.contains(&x.bindings))
        };
        let kernels: Vec<B::MicroKernel> = seen
            .iter()
            .filter(|(_, s)| complete(s))
            .map(|(mk, _)| *mk)
            .collect();
        (!kernels.is_empty() && kernels.len() == seen.len()).then_some((last, kernels))
    }

    /// Measure `kernels` in vote round `round` (`None`: a new one; else the last one,
    /// resumed), interleaved by instance (all of an instance's candidates timed side by
    /// side): first on the anchors, then on each other instance those that measured
    /// within `screen` (a fraction) of the best at one of its two neighbouring anchors,
    /// or all of them where a neighbour has no successful measurement; with `screen`
    /// `None`, every kernel on every instance. Pairs the round already holds are not
    /// measured again. Returns the round.
    pub fn measure_votes(
        &mut self,
        kernels: &[B::MicroKernel],
        round: Option<usize>,
        screen: Option<f64>,
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<usize> {
        let round = round.unwrap_or_else(|| self.journal.next_round());
        let anchors = self.anchors();
        let everywhere = screen.is_none();
        let phase_a: Vec<(usize, usize)> = (0..kernels.len())
            .flat_map(|k| (0..self.instances.len()).map(move |i| (k, i)))
            .filter(|&(_, i)| everywhere || anchors[i].0)
            .collect();
        self.measure_missing(kernels, round, &phase_a, on_trial)?;
        let Some(within) = screen else {
            return Ok(round);
        };
        let first = self.first_measurements(kernels, round);
        let best: Vec<f64> = (0..self.instances.len())
            .map(|i| {
                (0..kernels.len())
                    .map(|k| first[k][i])
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let close =
            |k: usize, a: usize| best[a].is_infinite() || first[k][a] <= best[a] * (1.0 + within);
        let phase_b: Vec<(usize, usize)> = (0..kernels.len())
            .flat_map(|k| (0..self.instances.len()).map(move |i| (k, i)))
            .filter(|&(k, i)| {
                let (anchor, [a, b]) = anchors[i];
                !anchor && (close(k, a) || close(k, b))
            })
            .collect();
        self.measure_missing(kernels, round, &phase_b, on_trial)?;
        Ok(round)
    }

    /// Each pair's first latency in `round` (`[kernel][instance]`; infinite: failed or
    /// not measured).
    fn first_measurements(&self, kernels: &[B::MicroKernel], round: usize) -> Vec<Vec<f64>> {
        let row: HashMap<B::MicroKernel, usize> =
            kernels.iter().enumerate().map(|(k, mk)| (*mk, k)).collect();
        let mut first = vec![vec![None; self.instances.len()]; kernels.len()];
        for r in self.journal.records.iter().filter(|r| r.round == round) {
            if let (Some(&k), Some(&i)) = (row.get(&r.micro_kernel), self.index.get(&r.bindings)) {
                first[k][i].get_or_insert(r.latency().unwrap_or(f64::INFINITY));
            }
        }
        first
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|l| l.unwrap_or(f64::INFINITY))
                    .collect()
            })
            .collect()
    }

    /// Measure the `pairs` (kernel, instance) that `round` holds no record of, side by
    /// side; how many were measured.
    fn measure_missing(
        &mut self,
        kernels: &[B::MicroKernel],
        round: usize,
        pairs: &[(usize, usize)],
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<usize> {
        let done: BTreeSet<(B::MicroKernel, &Bindings)> = self
            .journal
            .records
            .iter()
            .filter(|r| r.round == round)
            .map(|r| (r.micro_kernel, &r.bindings))
            .collect();
        let trials: Vec<(B::MicroKernel, usize)> = pairs
            .iter()
            .map(|&(k, i)| (kernels[k], i))
            .filter(|(mk, i)| !done.contains(&(*mk, &self.instances[*i].bindings)))
            .collect();
        if !trials.is_empty() {
            self.measure(&trials, round, true, on_trial)?;
        }
        Ok(trials.len())
    }

    /// Re-time the close calls of vote round `round`: on each instance, every one of
    /// `kernels` whose first measurement in the round lies within `within` (a fraction)
    /// of the instance's best first measurement, when there are two or more, is measured
    /// again side by side with the others, `times` more times, a pass over all instances
    /// each (so that one slow spell of the machine does not decide them all). Then a
    /// second phase: where a kernel that was not re-timed now lies within `within` of
    /// the best median (a slow spell raised the close calls' medians above its one
    /// measurement: dense T = 5 and batch_matmul_nt T = 9 on an Emerald Rapids-class
    /// Xeon, where such a kernel took the vote and ran 15-18 % slower than the best),
    /// it and the instance's close calls are timed `times` more times side by side.
    /// The trials join the round, whose table takes each pair's median (see
    /// `Tuner::scores_with`); they are told apart from the first measurement by their
    /// order and count, so a resumed run computes the same close calls and measures
    /// only the re-timings that are missing. Returns how many trials it measured.
    pub fn retime(
        &mut self,
        kernels: &[B::MicroKernel],
        round: usize,
        within: f64,
        times: usize,
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<usize> {
        let row: HashMap<B::MicroKernel, usize> =
            kernels.iter().enumerate().map(|(k, mk)| (*mk, k)).collect();
        let n = self.instances.len();
        // Per pair: its latencies in the round, in order (infinite: failed).
        let mut runs = vec![vec![Vec::new(); n]; kernels.len()];
        for r in self.journal.records.iter().filter(|r| r.round == round) {
            if let (Some(&k), Some(&i)) = (row.get(&r.micro_kernel), self.index.get(&r.bindings)) {
                runs[k][i].push(r.latency().unwrap_or(f64::INFINITY));
            }
        }
        let first = |runs: &[Vec<Vec<f64>>], k: usize, i: usize| {
            runs[k][i].first().copied().unwrap_or(f64::INFINITY)
        };
        let mut close = Vec::new();
        for i in 0..n {
            let best = (0..kernels.len())
                .map(|k| first(&runs, k, i))
                .fold(f64::INFINITY, f64::min);
            let near: Vec<usize> = (0..kernels.len())
                .filter(|&k| {
                    first(&runs, k, i).is_finite() && first(&runs, k, i) <= best * (1.0 + within)
                })
                .collect();
            if near.len() >= 2 {
                close.extend(near.into_iter().map(|k| (k, i)));
            }
        }
        let mut measured = self.retime_passes(
            kernels,
            round,
            &close
                .iter()
                .map(|&pair| (pair, 1 + times))
                .collect::<Vec<_>>(),
            times,
            &mut runs,
            on_trial,
        )?;
        // Second phase: the medians of the first phase's measurements (each close
        // call's first 1 + times, the others' one) against the kernels left out.
        let median = |runs: &[Vec<Vec<f64>>], k: usize, i: usize, upto: usize| {
            upper_median(runs[k][i].iter().take(upto).copied().collect())
        };
        let mut again = Vec::new();
        for i in 0..n {
            let in_close = |k: usize| close.contains(&(k, i));
            let best = (0..kernels.len())
                .filter(|&k| in_close(k))
                .map(|k| median(&runs, k, i, 1 + times))
                .fold(f64::INFINITY, f64::min);
            if best.is_infinite() {
                // No close calls: one kernel stood clear, no median rose.
                continue;
            }
            let newcomers: Vec<usize> = (0..kernels.len())
                .filter(|&k| !in_close(k) && first(&runs, k, i) <= best * (1.0 + within))
                .collect();
            if !newcomers.is_empty() {
                again.extend(newcomers.iter().map(|&k| (k, i)));
                again.extend((0..kernels.len()).filter(|&k| in_close(k)).map(|k| (k, i)));
            }
        }
        // A newcomer has one measurement, a close call 1 + times: each gets `times` more.
        let again: Vec<((usize, usize), usize)> = again
            .into_iter()
            .map(|(k, i)| {
                (
                    (k, i),
                    1 + times + usize::from(close.contains(&(k, i))) * times,
                )
            })
            .collect();
        measured += self.retime_passes(kernels, round, &again, times, &mut runs, on_trial)?;
        Ok(measured)
    }

    /// `times` passes over `pairs` (kernel, instance), each with the count of
    /// measurements it is to reach: pass `p` measures, side by side, the pairs that have
    /// fewer than `target - times + p` (so each gains one per pass, and a resumed run
    /// measures only what is missing).
    fn retime_passes(
        &mut self,
        kernels: &[B::MicroKernel],
        round: usize,
        pairs: &[((usize, usize), usize)],
        times: usize,
        runs: &mut [Vec<Vec<f64>>],
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<usize> {
        let mut measured = 0;
        for pass in 1..=times {
            let due: Vec<(usize, usize)> = pairs
                .iter()
                .filter(|&&((k, i), target)| runs[k][i].len() + times < target + pass)
                .map(|&(pair, _)| pair)
                .collect();
            measured += self.measure_pairs(kernels, round, &due, runs, on_trial)?;
        }
        Ok(measured)
    }

    /// Measure `pairs` (kernel, instance) once more each, side by side, appending the
    /// latencies to `runs`; how many were measured.
    fn measure_pairs(
        &mut self,
        kernels: &[B::MicroKernel],
        round: usize,
        pairs: &[(usize, usize)],
        runs: &mut [Vec<Vec<f64>>],
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<usize> {
        if pairs.is_empty() {
            return Ok(0);
        }
        let trials: Vec<(B::MicroKernel, usize)> =
            pairs.iter().map(|&(k, i)| (kernels[k], i)).collect();
        let before = self.journal.records.len();
        self.measure(&trials, round, true, on_trial)?;
        for r in &self.journal.records[before..] {
            let k = kernels.iter().position(|mk| *mk == r.micro_kernel);
            if let (Some(k), Some(&i)) = (k, self.index.get(&r.bindings)) {
                runs[k][i].push(r.latency().unwrap_or(f64::INFINITY));
            }
        }
        Ok(trials.len())
    }
}
