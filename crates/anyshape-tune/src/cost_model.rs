//! The micro-kernel cost model `Cost(S, M) = f_MK(features(M)) · f_occ(S, M) · f_pad(S, M)`
//! (a throughput: useful FLOP/s, higher is better).
//!
//! - `f_MK`: gradient-boosted trees (`forust-ml`) on the micro-kernel's features, trained
//!   on `ln(measured throughput / (f_occ · f_pad))` so that a measurement on any instance
//!   teaches the shape-generic part; samples are weighted by their instance's shape weight.
//! - `f_occ = k · x / ceil_by(x, slots) + (1 − k)` with `x` the number of micro-kernel
//!   instances (tasks) the program runs and `slots` how many run at once (the cores on
//!   CPU; SMs × resident blocks per SM on GPU, TSCompiler's waves); `k` is fitted to the
//!   measurements.
//! - `f_pad` = useful work / padded work over every padded axis (spatial and reduction).
//!
//! What tasks, slots and padding are for a micro-kernel on an instance is the backend's
//! to say ([`crate::Backend::adaptation`]); the model is the same on every backend.
pub use anyshape_codegen::Adaptation;
use forust_ml::objective::ObjectiveType;
use forust_ml::{GradientBooster, Matrix};

/// Below this many samples the trees are not trained and `f_MK` is a constant.
const MIN_TRAINING_SAMPLES: usize = 12;

/// One measured program, as the cost model sees it.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Features of the micro-kernel.
    pub features: Vec<f64>,
    /// How the instance maps onto the micro-kernel.
    pub adaptation: Adaptation,
    /// Measured useful throughput, FLOP/s.
    pub throughput: f64,
    /// The instance's shape weight.
    pub weight: f64,
}

/// The trained cost model.
pub struct CostModel {
    booster: Option<GradientBooster>,
    /// Constant `ln f_MK` used while untrained.
    base: f64,
    /// The fitted occupancy slope.
    pub k: f64,
    /// Training samples used.
    pub samples: usize,
}

impl CostModel {
    /// A model with no data: `f_MK` constant, `k = 1`.
    pub fn untrained() -> CostModel {
        CostModel {
            booster: None,
            base: 0.0,
            k: 1.0,
            samples: 0,
        }
    }

    /// `f_occ` of an adaptation.
    pub fn f_occ(&self, a: Adaptation) -> f64 {
        occupancy(self.k, a)
    }

    /// `ln f_MK` for each feature vector.
    pub fn ln_f_mk(&self, features: &[Vec<f64>]) -> Vec<f64> {
        match &self.booster {
            None => vec![self.base; features.len()],
            Some(b) if !features.is_empty() => with_matrix(features, |m| b.predict(m, false)),
            Some(_) => vec![],
        }
    }

    /// Predicted throughput (FLOP/s) from `ln f_MK` and the adaptation.
    pub fn throughput(&self, ln_f_mk: f64, a: Adaptation) -> f64 {
        ln_f_mk.exp() * self.f_occ(a) * a.pad
    }

    /// Fit `f_MK` and `k` to measured samples.
    pub fn fit(samples: &[Sample], seed: u64) -> CostModel {
        let mut model = CostModel::untrained();
        model.samples = samples.len();
        if samples.is_empty() {
            return model;
        }
        let mean_w = samples.iter().map(|s| s.weight).sum::<f64>() / samples.len() as f64;
        let weights: Vec<f64> = samples
            .iter()
            .map(|s| (s.weight / mean_w.max(1e-12)).max(0.05))
            .collect();
        let labels = |k: f64| -> Vec<f64> {
            samples
                .iter()
                .map(|s| (s.throughput / (occupancy(k, s.adaptation) * s.adaptation.pad)).ln())
                .collect()
        };
        let feats: Vec<Vec<f64>> = samples.iter().map(|s| s.features.clone()).collect();
        let fit_trees = |y: &[f64]| -> Option<GradientBooster> {
            if samples.len() < MIN_TRAINING_SAMPLES {
                return None;
            }
            let mut b = GradientBooster::default()
                .set_objective_type(ObjectiveType::SquaredLoss)
                .set_iterations(120)
                .set_learning_rate(0.1)
                .set_max_depth(5)
                .set_min_leaf_weight(1.0)
                .set_initialize_base_score(true)
                .set_parallel(false)
                .set_seed(seed);
            with_matrix(&feats, |m| b.fit(m, y, &weights, None)).ok()?;
            Some(b)
        };
        // Fit the trees with k = 1; choose the k whose occupancy term best explains what
        // the trees leave unexplained (up to a constant, which the trees absorb); refit
        // the trees with it, and once more.
        model.base = weighted_mean(&labels(1.0), &weights);
        model.booster = fit_trees(&labels(1.0));
        for _ in 0..2 {
            let pred = model.ln_f_mk(&feats);
            let err = |k: f64| -> f64 {
                let r: Vec<f64> = samples
                    .iter()
                    .zip(&pred)
                    .map(|(s, p)| {
                        s.throughput.ln()
                            - p
                            - occupancy(k, s.adaptation).ln()
                            - s.adaptation.pad.ln()
                    })
                    .collect();
                let mean = weighted_mean(&r, &weights);
                r.iter()
                    .zip(&weights)
                    .map(|(x, w)| w * (x - mean).powi(2))
                    .sum()
            };
            // From k = 1 down, a smaller k must explain clearly more: where occupancy
            // never varies (many more tasks than slots) k stays 1.
            let mut best = (1.0, err(1.0));
            for k in (0..20).rev().map(|i| i as f64 / 20.0) {
                let e = err(k);
                if e < best.1 * (1.0 - 1e-6) {
                    best = (k, e);
                }
            }
            model.k = best.0;
            let yk = labels(model.k);
            model.base = weighted_mean(&yk, &weights);
            model.booster = fit_trees(&yk);
        }
        model
    }
}

fn occupancy(k: f64, a: Adaptation) -> f64 {
    let x = a.tasks.max(1.0);
    let slots = a.slots.max(1.0);
    let ceil_by = (x / slots).ceil() * slots;
    k * x / ceil_by + (1.0 - k)
}

fn weighted_mean(y: &[f64], w: &[f64]) -> f64 {
    y.iter().zip(w).map(|(a, b)| a * b).sum::<f64>() / w.iter().sum::<f64>().max(1e-12)
}

/// Call `f` with the rows laid out as the column-major matrix `forust-ml` reads.
fn with_matrix<R>(rows: &[Vec<f64>], f: impl FnOnce(&Matrix<f64>) -> R) -> R {
    let cols = rows.first().map_or(0, Vec::len);
    let mut data = Vec::with_capacity(rows.len() * cols);
    for c in 0..cols {
        data.extend(rows.iter().map(|r| r[c]));
    }
    f(&Matrix::new(&data, rows.len(), cols))
}

/// Spearman rank correlation of two equally long series.
pub fn spearman(a: &[f64], b: &[f64]) -> f64 {
    fn ranks(x: &[f64]) -> Vec<f64> {
        let mut idx: Vec<usize> = (0..x.len()).collect();
        idx.sort_by(|&i, &j| x[i].total_cmp(&x[j]));
        let mut r = vec![0.0; x.len()];
        let mut i = 0;
        while i < idx.len() {
            let mut j = i;
            while j + 1 < idx.len() && x[idx[j + 1]] == x[idx[i]] {
                j += 1;
            }
            for &t in &idx[i..=j] {
                r[t] = (i + j) as f64 / 2.0;
            }
            i = j + 1;
        }
        r
    }
    let (ra, rb) = (ranks(a), ranks(b));
    let n = a.len() as f64;
    let (ma, mb) = (ra.iter().sum::<f64>() / n, rb.iter().sum::<f64>() / n);
    let cov: f64 = ra.iter().zip(&rb).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = ra.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = rb.iter().map(|y| (y - mb).powi(2)).sum();
    cov / (va * vb).sqrt().max(1e-300)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_of_monotone_series() {
        assert!((spearman(&[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0, 25.0, 100.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
    }

    #[test]
    fn fits_k_and_learns_a_feature() {
        // Throughput = 10 * feature * f_occ(k = 0.6) * pad: the model must recover both.
        let mut samples = Vec::new();
        for i in 0..200 {
            let f = 1.0 + (i % 7) as f64;
            let tasks = 1.0 + (i % 13) as f64;
            let pad = 0.5 + (i % 5) as f64 / 10.0;
            let adaptation = Adaptation {
                tasks,
                slots: 4.0,
                pad,
            };
            let throughput = 10.0 * f * occupancy(0.6, adaptation) * pad;
            samples.push(Sample {
                features: vec![f, (i % 3) as f64],
                adaptation,
                throughput,
                weight: 1.0,
            });
        }
        let m = CostModel::fit(&samples, 1);
        assert!((m.k - 0.6).abs() <= 0.1, "k = {}", m.k);
        let pred: Vec<f64> = samples
            .iter()
            .map(|s| {
                m.throughput(
                    m.ln_f_mk(std::slice::from_ref(&s.features))[0],
                    s.adaptation,
                )
            })
            .collect();
        let truth: Vec<f64> = samples.iter().map(|s| s.throughput).collect();
        assert!(spearman(&pred, &truth) > 0.95);
    }
}
