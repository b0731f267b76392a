//! Votes (DietCode §4.3): every instance votes for a micro-kernel, a micro-kernel within
//! a tolerance of an instance's best may take its vote so that few are chosen; the
//! dispatch tree learns shape-var values → vote from them (`tree.rs`).
use crate::{Backend, Result, ScoreTable, TuneError, Tuner};
use anyshape_abi::Vote;
use anyshape_codegen::ContractionKernel;
use anyshape_ir::Bindings;

/// The outcome of voting.
#[derive(Clone, Debug)]
pub struct Votes<K = ContractionKernel> {
    /// The chosen micro-kernels, most votes first.
    pub micro_kernels: Vec<K>,
    /// One vote per instance (indices into `micro_kernels`).
    pub votes: Vec<Vote>,
    /// Seconds, `[micro_kernel][instance]`, measured or predicted (infinite where the
    /// program failed): what the votes were taken on, and what the dispatch between
    /// tuned values scales (`between.rs`); empty where nothing was timed (an untuned
    /// module's defaults).
    pub latency: Vec<Vec<f64>>,
}

/// How votes are taken.
#[derive(Clone, Copy, Debug)]
pub struct VoteOptions {
    /// A micro-kernel within this fraction of an instance's best may take its vote.
    pub tolerance: f64,
    /// At most this many micro-kernels in the module.
    pub max_kernels: usize,
    /// Measure the candidate micro-kernels before the final vote (else every pair is
    /// the cost model's prediction).
    pub measure: bool,
    /// With `measure`: measure each candidate on every other instance first and on the
    /// ones between only where it came within this fraction of the best at a
    /// neighbour (see `vote_round.rs`); `None`: every candidate on every instance.
    pub screen_within: Option<f64>,
    /// With `measure`: candidates measured within this fraction of an instance's best
    /// are close calls, timed again (see [`Tuner::retime`]).
    pub retime_within: f64,
    /// With `measure`: how many more times each close call is timed.
    pub retimes: usize,
}

impl Default for VoteOptions {
    fn default() -> Self {
        VoteOptions {
            tolerance: 0.02,
            max_kernels: 8,
            measure: true,
            // BERT-base at --trials 8 (Zen 5): the seeds measured on every tuned value
            // were most of the compile; a kernel 30 % off the best on both sides of a
            // value is not its winner.
            screen_within: Some(0.3),
            // batch_matmul_nn on Zen 4 (128 instances, 16 candidates): one measurement
            // per pair put some votes 21 % off the best (timed minutes later); the
            // minimum of two, 11 %. A margin of 10-25 % and a second re-timing changed
            // nothing there. Now a close call is timed three times and its median
            // counts (see `Tuner::scores_with`): robust to one slow spell and to one
            // lucky run of a kernel whose speed depends on where its buffers lie.
            retime_within: 0.15,
            retimes: 2,
        }
    }
}

impl VoteOptions {
    /// How many times one micro-kernel may be measured on one instance in a vote
    /// round: once, `retimes` more as a close call, and `retimes` more in the second
    /// phase of [`Tuner::retime`].
    pub fn most_measurements(&self) -> usize {
        1 + 2 * self.retimes
    }
}

/// Take the votes of a tuning run: candidates by a cover of the measured-or-predicted
/// table and the sketch's seeds, measured where they may win (with `measure`; see
/// [`Tuner::measure_votes`]) and the close calls re-timed, then the final cover and
/// votes over the measured table.
/// `on_trial` hears the record count after each new trial.
pub fn elect<B: Backend>(
    tuner: &mut Tuner<B>,
    options: &VoteOptions,
    on_trial: &mut dyn FnMut(usize),
) -> Result<Votes<B::MicroKernel>> {
    let weights: Vec<f64> = tuner.instances().iter().map(|x| x.weight).collect();
    let bindings: Vec<Bindings> = tuner
        .instances()
        .iter()
        .map(|x| x.bindings.clone())
        .collect();
    let (round, candidates) = match tuner.vote_round().filter(|_| options.measure) {
        // The records end with a vote round (a resumed run): vote on it again, measuring
        // only what it lacks, so that the same records give the same module.
        Some((round, candidates)) => (Some(round), candidates),
        None => {
            let table = tuner.scores(None);
            let picked = cover(&table, &weights, options.tolerance, options.max_kernels);
            let mut candidates: Vec<B::MicroKernel> =
                picked.iter().map(|&k| table.kernels[k]).collect();
            if !options.measure {
                let table = tuner.scores(Some(&candidates));
                let chosen = cover(&table, &weights, options.tolerance, options.max_kernels);
                return vote(&table, &chosen, &bindings, options.tolerance);
            }
            // The seeds are measured too: the search measured each on a few instances
            // and its model may not foresee where one wins (the narrow seed at sequence
            // 8-16 of BERT-base's FFN, measured only on 1, 45, 77).
            for s in tuner.seeds() {
                if !candidates.contains(&s) {
                    candidates.push(s);
                }
            }
            // In the order a resumed run finds them in the round (the micro-kernels'
            // own), so that its table, cover and votes are this run's even where
            // candidates tie.
            candidates.sort();
            (None, candidates)
        }
    };
    let round = tuner.measure_votes(&candidates, round, options.screen_within, on_trial)?;
    retime(tuner, &candidates, round, options, on_trial)?;
    let table = tuner.scores_in_round(&candidates, round);
    let chosen = cover(&table, &weights, options.tolerance, options.max_kernels);
    vote(&table, &chosen, &bindings, options.tolerance)
}

/// [`Tuner::retime`] with the options' margin and count.
fn retime<B: Backend>(
    tuner: &mut Tuner<B>,
    candidates: &[B::MicroKernel],
    round: usize,
    options: &VoteOptions,
    on_trial: &mut dyn FnMut(usize),
) -> Result<usize> {
    tuner.retime(
        candidates,
        round,
        options.retime_within,
        options.retimes,
        on_trial,
    )
}

/// Greedy cover: pick micro-kernels (rows of `table`) until every instance has one within
/// `tolerance` of its best, each time the one that covers the most weight still uncovered;
/// at most `max_kernels`. Returns row indices in the order picked.
pub fn cover<K>(
    table: &ScoreTable<K>,
    weights: &[f64],
    tolerance: f64,
    max_kernels: usize,
) -> Vec<usize> {
    let n = weights.len();
    let best: Vec<f64> = (0..n)
        .map(|i| {
            table
                .latency
                .iter()
                .map(|l| l[i])
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let near = |k: usize, i: usize| {
        let l = table.latency[k][i];
        l.is_finite() && l <= best[i] * (1.0 + tolerance)
    };
    let mut open: Vec<bool> = (0..n).map(|i| best[i].is_finite()).collect();
    let mut picked = Vec::new();
    while open.iter().any(|&o| o) && picked.len() < max_kernels.max(1) {
        // Weight first; the count breaks ties between zero-weight instances.
        let gain = |k: usize| -> (f64, usize) {
            let mut w = 0.0;
            let mut c = 0;
            for i in (0..n).filter(|&i| open[i] && near(k, i)) {
                w += weights[i];
                c += 1;
            }
            (w, c)
        };
        let Some(k) = (0..table.kernels.len())
            .filter(|k| !picked.contains(k))
            .max_by(|&a, &b| {
                let (ga, gb) = (gain(a), gain(b));
                ga.0.total_cmp(&gb.0).then(ga.1.cmp(&gb.1))
            })
        else {
            break;
        };
        if gain(k).1 == 0 {
            break;
        }
        for (i, o) in open.iter_mut().enumerate() {
            *o &= !near(k, i);
        }
        picked.push(k);
    }
    picked
}

/// Votes over the rows `chosen` of `table`: each instance votes for the first chosen
/// micro-kernel within `tolerance` of its best among the chosen ones (so that large
/// regions of the domain agree), the fastest chosen one if none is. Unused kernels are
/// dropped.
pub fn vote<K: Copy>(
    table: &ScoreTable<K>,
    chosen: &[usize],
    instances: &[Bindings],
    tolerance: f64,
) -> Result<Votes<K>> {
    if chosen.is_empty() {
        return Err(TuneError::Environment(
            "no micro-kernel ran successfully on any instance: nothing to dispatch to (see the failures in the records)".into(),
        ));
    }
    let mut pick = Vec::with_capacity(instances.len());
    for i in 0..instances.len() {
        let best = chosen
            .iter()
            .map(|&k| table.latency[k][i])
            .fold(f64::INFINITY, f64::min);
        let k = chosen
            .iter()
            .copied()
            .find(|&k| table.latency[k][i] <= best * (1.0 + tolerance))
            .unwrap_or(chosen[0]);
        pick.push(k);
    }
    // Keep the kernels that got votes, most votes first.
    let mut used: Vec<(usize, usize)> = chosen
        .iter()
        .map(|&k| (pick.iter().filter(|&&p| p == k).count(), k))
        .filter(|&(c, _)| c > 0)
        .collect();
    used.sort_by_key(|u| std::cmp::Reverse(u.0));
    let order: Vec<usize> = used.iter().map(|u| u.1).collect();
    let votes = instances
        .iter()
        .zip(&pick)
        .enumerate()
        .map(|(i, (b, &k))| Vote {
            bindings: b.clone(),
            micro_kernel: order
                .iter()
                .position(|&o| o == k)
                .expect("voted kernels are kept"),
            latency_seconds: Some(table.latency[k][i]).filter(|l| l.is_finite()),
            measured: table.measured[k][i],
        })
        .collect();
    Ok(Votes {
        micro_kernels: order.iter().map(|&k| table.kernels[k]).collect(),
        votes,
        latency: order.iter().map(|&k| table.latency[k].clone()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train_tree;
    use anyshape_abi::DispatchTree;

    fn table(lat: Vec<Vec<f64>>) -> ScoreTable {
        let n = lat[0].len();
        ScoreTable {
            kernels: (0..lat.len())
                .map(|i| ContractionKernel {
                    mr: 1,
                    nr: 16,
                    mc: 8 * (i + 1),
                    nc: 16,
                    kc: 8,
                    uk: 1,
                    dot: false,
                    pf: false,
                    ia: false,
                    ib: false,
                    vm: false,
                    amx: false,
                })
                .collect(),
            measured: vec![vec![true; n]; lat.len()],
            latency: lat,
        }
    }

    #[test]
    fn tolerance_keeps_the_set_small_and_the_tree_learns_it() {
        // Kernel 0 is best on small T, kernel 2 on large T; kernel 1 is 1% off everywhere.
        let n = 40;
        let a: Vec<f64> = (0..n).map(|i| if i < 20 { 1.0 } else { 2.0 }).collect();
        let c: Vec<f64> = (0..n).map(|i| if i < 20 { 2.0 } else { 1.0 }).collect();
        let b: Vec<f64> = (0..n).map(|_| 1.01).collect();
        let t = table(vec![a, b, c]);
        let w = vec![1.0 / n as f64; n];
        // 2% tolerance: kernel 1 alone covers everything.
        assert_eq!(cover(&t, &w, 0.02, 8), vec![1]);
        // No tolerance: kernels 0 and 2.
        let mut strict = cover(&t, &w, 0.0, 8);
        strict.sort();
        assert_eq!(strict, vec![0, 2]);
        let inst: Vec<Bindings> = (0..n)
            .map(|i| Bindings::from_pairs([("T", i as i64 + 1)]))
            .collect();
        let v = vote(&t, &strict, &inst, 0.0).unwrap();
        assert_eq!(v.micro_kernels.len(), 2);
        let (tree, acc) = train_tree(&["T".into()], &v.votes);
        assert_eq!(acc, 1.0);
        assert_eq!(tree.depth(), 1);
        // Past the range, the tree extends its last region.
        let last = v.votes.last().unwrap().micro_kernel;
        assert_eq!(tree.select(&Bindings::from_pairs([("T", 1000)])), last);
        // One kernel: a single leaf.
        let one = vote(&t, &[1], &inst, 0.02).unwrap();
        let (leaf, acc) = train_tree(&["T".into()], &one.votes);
        assert_eq!((leaf, acc), (DispatchTree::Leaf { kernel: 0 }, 1.0));
    }

    #[test]
    fn failed_programs_never_get_votes() {
        let t = table(vec![vec![1.0, f64::INFINITY], vec![3.0, 3.0]]);
        let c = cover(&t, &[0.5, 0.5], 0.02, 8);
        let inst = [
            Bindings::from_pairs([("T", 1)]),
            Bindings::from_pairs([("T", 2)]),
        ];
        let v = vote(&t, &c, &inst, 0.02).unwrap();
        assert!(v.votes[1].latency_seconds.is_some_and(f64::is_finite));
        // Where every candidate failed, the vote still names one, with no latency.
        let t = table(vec![vec![1.0, f64::INFINITY], vec![3.0, f64::INFINITY]]);
        let c = cover(&t, &[0.5, 0.5], 0.02, 8);
        let v = vote(&t, &c, &inst, 0.02).unwrap();
        assert_eq!(v.votes[1].latency_seconds, None);
        let json = serde_json::to_string(&v.votes).unwrap();
        assert_eq!(serde_json::from_str::<Vec<Vote>>(&json).unwrap(), v.votes);
    }
}
