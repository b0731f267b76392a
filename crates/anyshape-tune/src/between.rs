//! The dispatch between tuned values. A model's tasks are searched and voted on a
//! spread of each dim's values (`--tune-values`); a tree trained on those votes alone
//! cuts between them by ranges, so a value between two tuned ones runs whatever the
//! cut gives it, however its rows fall on that kernel's tiles (BERT-base's FFN at 16
//! rows ran the 11-row kernel voted at 15 as 11 + 5 rows, 31 % slower than the 8-row
//! one; Zen 4). Here every value of the dims (up to [`EVERY_VALUE_INSTANCES`]
//! instances a task) gets a vote too: each voted micro-kernel's latency at the nearest
//! tuned instance, scaled by the useful work over DietCode's `f_pad · f_occ` at the two
//! instances — the padding of its tiles and how evenly its tasks fill the cores — and
//! the least of them, where the nearest instance's own vote is not within the
//! tolerance of it.
use crate::model::EVERY_VALUE_INSTANCES;
use crate::{instance_count, instances, Backend, CostModel, Instance, Result, Tuner, Votes};
use anyshape_abi::Vote;
use anyshape_ir::{Bindings, ShapeVar};
use std::collections::HashMap;

/// The votes a task's dispatch tree learns from: the tuned instances' own, and at every
/// other instance of `dims` (where they hold at most 1,024) the
/// voted micro-kernel estimated fastest (see the module doc; such a vote is
/// `measured: false`, its latency the estimate); the tuned votes alone where the dims
/// hold more or nothing was timed.
pub fn between<B: Backend>(
    tuner: &Tuner<B>,
    votes: &Votes<B::MicroKernel>,
    dims: &[ShapeVar],
    tolerance: f64,
) -> Result<Vec<Vote>> {
    let tuned = tuner.instances();
    if instance_count(dims) > EVERY_VALUE_INSTANCES
        || votes.latency.len() != votes.micro_kernels.len()
        || tuned.is_empty()
    {
        return Ok(votes.votes.clone());
    }
    let every = instances(tuner.workload(), dims)?;
    let own: HashMap<&Bindings, &Vote> = votes.votes.iter().map(|v| (&v.bindings, v)).collect();
    // The useful work over each kernel's `f_occ · f_pad` on an instance (the cost
    // model's throughput with `f_MK` left out).
    let model = CostModel::untrained();
    let cost = |k: usize, x: &Instance| {
        let a = tuner
            .backend
            .adaptation(tuner.workload(), &votes.micro_kernels[k], &x.bound);
        x.flops / model.throughput(0.0, a)
    };
    Ok(every
        .iter()
        .map(|x| {
            if let Some(v) = own.get(&x.bindings) {
                return (*v).clone();
            }
            let near = nearest(tuned, &x.bindings);
            let estimate: Vec<f64> = (0..votes.micro_kernels.len())
                .map(|k| {
                    let (at, here) = (cost(k, &tuned[near]), cost(k, x));
                    let scale = if at > 0.0 && here > 0.0 && here.is_finite() {
                        here / at
                    } else {
                        1.0
                    };
                    votes.latency[k][near] * scale
                })
                .collect();
            let best = estimate.iter().copied().fold(f64::INFINITY, f64::min);
            let neighbour = votes.votes[near].micro_kernel;
            let micro_kernel = if estimate[neighbour] <= best * (1.0 + tolerance) {
                neighbour
            } else {
                (0..estimate.len())
                    .find(|&k| estimate[k] <= best)
                    .unwrap_or(neighbour)
            };
            Vote {
                bindings: x.bindings.clone(),
                micro_kernel,
                latency_seconds: Some(estimate[micro_kernel]).filter(|l| l.is_finite()),
                measured: false,
            }
        })
        .collect())
}

/// The tuned instance nearest `x`: the least sum over the vars of the distance of
/// their logarithms (a step from 1 to 2 weighs as one from 256 to 512; the spread
/// values are geometric too); the first of equals.
fn nearest(tuned: &[Instance], x: &Bindings) -> usize {
    let log = |v: i64| (v.max(0) as f64).ln_1p();
    let distance = |b: &Bindings| -> f64 {
        x.iter()
            .map(|(name, v)| (log(v) - log(b.get(name).unwrap_or(0))).abs())
            .sum()
    };
    (0..tuned.len())
        .min_by(|&a, &b| distance(&tuned[a].bindings).total_cmp(&distance(&tuned[b].bindings)))
        .expect("tuned instances")
}
