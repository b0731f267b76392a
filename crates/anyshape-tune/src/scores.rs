//! Latencies of micro-kernels on instances, as the search and the votes see them: the
//! best measurement where measured, the cost model's prediction elsewhere; the model
//! trained from the records; the vote round's table.
use crate::journal::BackendRecord;
use crate::{Backend, CostModel, Sample, Tuner};
use anyshape_codegen::ContractionKernel;
use std::collections::{BTreeSet, HashMap};
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
    /// vote round, whose close calls are timed three times) only its measurements count
    /// (infinite elsewhere: a pair the round screened out), and the median of each
    /// pair's measurements instead of the best (the upper one of an even count): each measurement
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
        if round.is_some() {
            // A vote round's table holds its measurements only: a pair it screened out
            // is no contender (see `vote_round.rs`).
            latency.iter_mut().for_each(|row| row.fill(f64::INFINITY));
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

    /// The latency table of `Tuner::scores_with` under a model trained on every record.
    pub fn scores(&mut self, kernels: Option<&[B::MicroKernel]>) -> ScoreTable<B::MicroKernel> {
        let records = self.journal.records.clone();
        let model = self.train(&records, self.options.seed);
        self.scores_with(&model, kernels, None)
    }

    /// The latency table of `kernels` from the trials of one `round` only: measurements
    /// taken side by side, each pair's median (see `Tuner::scores_with`), not the
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

    /// Best latency per instance over the known kernels (see `Tuner::scores_with`),
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
pub(crate) fn upper_median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples
        .get(samples.len() / 2)
        .copied()
        .unwrap_or(f64::INFINITY)
}
