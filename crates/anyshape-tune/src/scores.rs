//! Latencies of micro-kernels on instances, as the search and the votes see them: the
//! best measurement where measured, the cost model's prediction elsewhere; the model
//! trained from the records; the vote round's table.
use crate::journal::BackendRecord;
use crate::{Backend, CostModel, Result, Sample, Tuner};
use anyshape_codegen::ContractionKernel;
use anyshape_ir::Bindings;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// Latency of micro-kernels on every instance, measured or predicted.
#[derive(Clone, Debug)]
pub struct ScoreTable<K = ContractionKernel> {
    /// The micro-kernels (rows).
    pub kernels: Vec<K>,
    /// Seconds, `[kernel][instance]`; infinite where the program failed.
    pub latency: Vec<Vec<f64>>,
    /// Whether each entry was measured (else predicted by the cost model).
    pub measured: Vec<Vec<bool>>,
}

impl<B: Backend> Tuner<B> {
    /// Best measured latency per instance, and the micro-kernel that gave it.
    pub(crate) fn measured_best(&self) -> Vec<Option<(f64, B::MicroKernel)>> {
        let mut best: Vec<Option<(f64, B::MicroKernel)>> = vec![None; self.instances.len()];
        for r in &self.journal.records {
            if let (Some(lat), Some(&i)) = (r.latency(), self.index.get(&r.bindings)) {
                if best[i].is_none_or(|(b, _)| lat < b) {
                    best[i] = Some((lat, r.micro_kernel));
                }
            }
        }
        best
    }

    pub(crate) fn samples(&mut self, records: &[BackendRecord<B>]) -> Vec<Sample> {
        let ok: Vec<(B::MicroKernel, usize, f64)> = records
            .iter()
            .filter_map(|r| Some((r.micro_kernel, *self.index.get(&r.bindings)?, r.latency()?)))
            .collect();
        let feats = self.features_of(&ok.iter().map(|x| x.0).collect::<Vec<_>>());
        ok.iter()
            .zip(feats)
            .map(|(&(mk, i, lat), features)| {
                let inst = &self.instances[i];
                Sample {
                    features,
                    adaptation: self.backend.adaptation(&self.workload, &mk, &inst.bound),
                    throughput: inst.flops / lat,
                    weight: inst.weight,
                }
            })
            .collect()
    }

    /// The cost model trained on `records` and on what the task's family shares.
    pub(crate) fn train(&mut self, records: &[BackendRecord<B>], seed: u64) -> CostModel {
        let own = self.samples(records);
        let samples = self.with_shared(own);
        let t0 = Instant::now();
        let model = CostModel::fit(&samples, seed);
        self.time.model += t0.elapsed().as_secs_f64();
        model
    }

    /// Predicted latency of every micro-kernel on every instance: `[kernel][instance]`.
    pub(crate) fn predict(&mut self, model: &CostModel, mks: &[B::MicroKernel]) -> Vec<Vec<f64>> {
        let feats = self.features_of(mks);
        let t0 = Instant::now();
        let ln = model.ln_f_mk(&feats);
        let out = mks
            .iter()
            .zip(ln)
            .map(|(mk, l)| {
                self.instances
                    .iter()
                    .map(|x| {
                        x.flops
                            / model
                                .throughput(
                                    l,
                                    self.backend.adaptation(&self.workload, mk, &x.bound),
                                )
                                .max(1e-30)
                    })
                    .collect()
            })
            .collect();
        self.time.model += t0.elapsed().as_secs_f64();
        out
    }

    /// Micro-kernels measured successfully at least once.
    pub(crate) fn known(&self) -> Vec<B::MicroKernel> {
        self.journal
            .records
            .iter()
            .filter(|r| r.latency().is_some())
            .map(|r| r.micro_kernel)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Latency of `kernels` (all successfully measured ones when `None`) on every
    /// instance under `model`: the best measurement where measured, infinite where the
    /// program failed there, the model's prediction elsewhere. Within one `round` (a
    /// vote round, whose close calls are timed three times) the median of a pair's
    /// measurements counts instead (the upper one of an even count): each measurement
    /// is already a minimum over calls, so the best of them rewards a kernel whose speed
    /// depends on where its buffers lie for its one lucky run (batch_matmul_nn T = 101
    /// on an Emerald Rapids-class Xeon: the 12 x 32 tile measured 0.80 and 0.91 ms, the
    /// 4 x 64 one 0.83 and 0.84; the minimum voted for the first, which every later run
    /// measured 12 % slower), and the worst punishes a kernel for one slow spell.
    pub(crate) fn scores_with(
        &mut self,
        model: &CostModel,
        kernels: Option<&[B::MicroKernel]>,
        round: Option<usize>,
    ) -> ScoreTable<B::MicroKernel> {
        let kernels = kernels.map_or_else(|| self.known(), <[B::MicroKernel]>::to_vec);
        let mut latency = self.predict(model, &kernels);
        let mut measured = vec![vec![false; self.instances.len()]; kernels.len()];
        let row: HashMap<B::MicroKernel, usize> =
            kernels.iter().enumerate().map(|(k, mk)| (*mk, k)).collect();
        // Per measured pair (the search's tables span thousands of kernels).
        let mut samples: HashMap<(usize, usize), Vec<f64>> = HashMap::new();
        for r in self
            .journal
            .records
            .iter()
            .filter(|r| round.is_none_or(|n| r.round == n))
        {
            if let (Some(&k), Some(&i)) = (row.get(&r.micro_kernel), self.index.get(&r.bindings)) {
                samples
                    .entry((k, i))
                    .or_default()
                    .push(r.latency().unwrap_or(f64::INFINITY));
            }
        }
        for ((k, i), s) in samples {
            latency[k][i] = match round {
                Some(_) => upper_median(s),
                None => s.into_iter().fold(f64::INFINITY, f64::min),
            };
            measured[k][i] = true;
        }
        ScoreTable {
            kernels,
            latency,
            measured,
        }
    }

    /// The latency table of [`Tuner::scores_with`] under a model trained on every record.
    pub fn scores(&mut self, kernels: Option<&[B::MicroKernel]>) -> ScoreTable<B::MicroKernel> {
        let records = self.journal.records.clone();
        let model = self.train(&records, self.options.seed);
        self.scores_with(&model, kernels, None)
    }

    /// The last round, if it is a complete vote round (see [`Tuner::measure_everywhere`]):
    /// its records are marked as votes and measured every one of its micro-kernels on
    /// every instance; with those micro-kernels. (With one instance every search round
    /// measures its candidates everywhere: the mark tells them apart.)
    pub fn vote_round(&self) -> Option<(usize, Vec<B::MicroKernel>)> {
        let last = self.journal.records.iter().map(|r| r.round).max()?;
        let mut seen: BTreeMap<B::MicroKernel, BTreeSet<&Bindings>> = BTreeMap::new();
        for r in self.journal.records.iter().filter(|r| r.round == last) {
            if !r.vote {
                return None;
            }
            seen.entry(r.micro_kernel).or_default().insert(&r.bindings);
        }
        let everywhere =
            |s: &BTreeSet<&Bindings>| self.instances.iter().all(|x| s.contains(&x.bindings));
        let kernels: Vec<B::MicroKernel> = seen
            .iter()
            .filter(|(_, s)| everywhere(s))
            .map(|(mk, _)| *mk)
            .collect();
        (!kernels.is_empty() && kernels.len() == seen.len()).then_some((last, kernels))
    }

    /// Measure each of `kernels` on every instance in one round, interleaved by instance
    /// (all of them timed side by side, at the same time); returns the round.
    pub fn measure_everywhere(
        &mut self,
        kernels: &[B::MicroKernel],
        on_trial: &mut dyn FnMut(usize),
    ) -> Result<usize> {
        let trials: Vec<(B::MicroKernel, usize)> = kernels
            .iter()
            .flat_map(|mk| (0..self.instances.len()).map(move |i| (*mk, i)))
            .collect();
        let round = self.journal.next_round();
        self.measure(&trials, round, true, on_trial)?;
        Ok(round)
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
    /// [`Tuner::scores_with`]); they are told apart from the first measurement by their
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

    /// The latency table of `kernels` from the trials of one `round` only: measurements
    /// taken side by side, each pair's median (see [`Tuner::scores_with`]), not the
    /// minimum over every time a program ran, which favours programs measured more
    /// often.
    pub fn scores_in_round(
        &mut self,
        kernels: &[B::MicroKernel],
        round: usize,
    ) -> ScoreTable<B::MicroKernel> {
        let records = self.journal.records.clone();
        let model = self.train(&records, self.options.seed);
        self.scores_with(&model, Some(kernels), Some(round))
    }

    /// Best latency per instance over the known kernels (see [`Tuner::scores_with`]),
    /// with the micro-kernel and whether it was measured.
    pub(crate) fn best_per_instance(
        &mut self,
        model: &CostModel,
    ) -> Vec<(f64, B::MicroKernel, bool)> {
        let t = self.scores_with(model, None, None);
        (0..self.instances.len())
            .map(|i| {
                (0..t.kernels.len())
                    .filter(|&k| t.latency[k][i].is_finite())
                    .min_by(|&a, &b| t.latency[a][i].total_cmp(&t.latency[b][i]))
                    .map_or((f64::INFINITY, self.backend.default_kernel(), false), |k| {
                        (t.latency[k][i], t.kernels[k], t.measured[k][i])
                    })
            })
            .collect()
    }
}

/// The median of `samples` (the upper one of an even count); infinite for none.
fn upper_median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples
        .get(samples.len() / 2)
        .copied()
        .unwrap_or(f64::INFINITY)
}
