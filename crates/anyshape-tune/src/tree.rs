//! Training the dispatch tree (DietCode §4.3): a CART classifier from shape-var values
//! to the micro-kernel each instance voted for, grown greedily by Gini impurity and
//! pruned back where a split does not lower its training errors.
//!
//! Our own rather than a library's because the dispatch is part of the product and
//! shape values tie a lot: over a grid of image sizes every height comes with every
//! width. smartcore 0.7's CART (used before) tried a cut only where the samples on
//! either side of it, in sorted order, voted differently, so a cut between two values
//! shared by samples with mixed votes went untried. ResNet-50 tuned at the four
//! corners of 96..320 x 96..320 got a single leaf for 14 of its 24 tasks, dispatching
//! a quarter to half of the tuned sizes to a kernel they had not voted for. Here every
//! cut between two distinct values is tried, and where no cut lowers the impurity of an
//! impure node (votes that alternate like an XOR over the corners of a grid) the first
//! cut is taken anyway: the pruning removes it again where it does not pay off.
use anyshape_abi::{DispatchTree, Vote};

/// Train a dispatch tree (at most [`DispatchTree::MAX_DEPTH`] deep) on shape-var values
/// → vote; returns it with its training accuracy (the fraction of votes it dispatches
/// to the kernel they voted for). A var a vote does not bind counts as 0, as in
/// [`DispatchTree::select`].
pub fn train_tree(vars: &[String], votes: &[Vote]) -> (DispatchTree, f64) {
    let samples = Samples {
        x: votes
            .iter()
            .map(|v| {
                vars.iter()
                    .map(|n| v.bindings.get(n).unwrap_or(0))
                    .collect()
            })
            .collect(),
        y: votes.iter().map(|v| v.micro_kernel).collect(),
        classes: votes.iter().map(|v| v.micro_kernel + 1).max().unwrap_or(1),
    };
    let mut all: Vec<usize> = (0..votes.len()).collect();
    let tree = samples.grow(vars, &mut all, 0).tree;
    let accuracy = accuracy(&tree, votes);
    (tree, accuracy)
}

/// The fraction of `votes` that `tree` dispatches to the kernel they voted for (1
/// where there are none).
pub fn accuracy(tree: &DispatchTree, votes: &[Vote]) -> f64 {
    let hits = votes
        .iter()
        .filter(|v| tree.select(&v.bindings) == v.micro_kernel)
        .count();
    hits as f64 / votes.len().max(1) as f64
}

/// The training set: one row of shape-var values and one vote per instance.
struct Samples {
    x: Vec<Vec<i64>>,
    y: Vec<usize>,
    /// One more than the largest vote.
    classes: usize,
}

/// A grown subtree and how many of its samples it dispatches elsewhere than their vote.
struct Grown {
    tree: DispatchTree,
    errors: usize,
}

/// A cut of a node's samples: `var <= at` on one side.
struct Cut {
    var: usize,
    at: i64,
    /// The decrease of the weighted Gini impurity, times the node's sample count.
    gain: f64,
}

impl Samples {
    /// Votes per kernel among `idx`.
    fn counts(&self, idx: &[usize]) -> Vec<usize> {
        let mut c = vec![0; self.classes];
        for &i in idx {
            c[self.y[i]] += 1;
        }
        c
    }

    /// The subtree for samples `idx` at `depth`: a leaf where they agree, no cut
    /// separates them or the depth is spent, else the best cut and a subtree on each
    /// side, pruned back to a leaf where it errs as often as the leaf would.
    fn grow(&self, vars: &[String], idx: &mut [usize], depth: usize) -> Grown {
        let counts = self.counts(idx);
        // The most votes; among equals the kernel with most votes overall (the lower
        // index: a module lists its kernels most votes first).
        let majority = (0..self.classes)
            .max_by_key(|&k| (counts[k], std::cmp::Reverse(k)))
            .unwrap_or(0);
        let leaf = Grown {
            tree: DispatchTree::Leaf { kernel: majority },
            errors: idx.len() - counts[majority],
        };
        if leaf.errors == 0 || depth >= DispatchTree::MAX_DEPTH {
            return leaf;
        }
        let Some(cut) = self.best_cut(idx, &counts) else {
            return leaf;
        };
        let (var, at) = (cut.var, cut.at);
        let split = partition(idx, |i| self.x[i][var] <= at);
        let (le_idx, gt_idx) = idx.split_at_mut(split);
        let le = self.grow(vars, le_idx, depth + 1);
        let gt = self.grow(vars, gt_idx, depth + 1);
        if le.errors + gt.errors >= leaf.errors {
            return leaf;
        }
        Grown {
            errors: le.errors + gt.errors,
            tree: DispatchTree::Split {
                var: vars[var].clone(),
                at,
                le: Box::new(le.tree),
                gt: Box::new(gt.tree),
            },
        }
    }

    /// The cut of `idx` that lowers the Gini impurity most (the first one tried where
    /// none lowers it), between two distinct values of a var at their midpoint
    /// (rounded down); `None` where every var has one value.
    fn best_cut(&self, idx: &[usize], counts: &[usize]) -> Option<Cut> {
        let n = idx.len() as f64;
        // Gini impurity times the sample count is `n - Σ c² / n`: a cut's gain is its
        // sides' `Σ c² / n` over the node's.
        let purity = |c: &[usize], n: f64| c.iter().map(|&c| (c * c) as f64).sum::<f64>() / n;
        let parent = purity(counts, n);
        let mut best: Option<Cut> = None;
        let mut order = idx.to_vec();
        let mut left = vec![0usize; self.classes];
        for var in 0..self.x.first().map_or(0, Vec::len) {
            order.sort_by_key(|&i| self.x[i][var]);
            left.iter_mut().for_each(|c| *c = 0);
            for (k, pair) in order.windows(2).enumerate() {
                left[self.y[pair[0]]] += 1;
                let (a, b) = (self.x[pair[0]][var], self.x[pair[1]][var]);
                if a == b {
                    continue;
                }
                let right: Vec<usize> = counts.iter().zip(&left).map(|(c, l)| c - l).collect();
                let nl = (k + 1) as f64;
                let gain = purity(&left, nl) + purity(&right, n - nl) - parent;
                if best.as_ref().is_none_or(|b| gain > b.gain + 1e-9 * n) {
                    // The midpoint, rounded down, without overflow.
                    let at = (i128::from(a) + i128::from(b)).div_euclid(2) as i64;
                    best = Some(Cut { var, at, gain });
                }
            }
        }
        best
    }
}

/// Reorder `idx` so that those where `left` holds come first; returns their count.
fn partition(idx: &mut [usize], left: impl Fn(usize) -> bool) -> usize {
    let mut k = 0;
    for j in 0..idx.len() {
        if left(idx[j]) {
            idx.swap(k, j);
            k += 1;
        }
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_ir::Bindings;

    fn votes(points: &[(i64, i64, usize)]) -> Vec<Vote> {
        points
            .iter()
            .map(|&(h, w, k)| Vote {
                bindings: Bindings::from_pairs([("height", h), ("width", w)]),
                micro_kernel: k,
                latency_seconds: Some(1.0),
                measured: true,
            })
            .collect()
    }

    fn vars() -> Vec<String> {
        vec!["height".into(), "width".into()]
    }

    /// The votes of tuned ResNet-50 tasks at the corners of 96..320 x 96..320, which
    /// smartcore's CART fitted with a single leaf: every corner is dispatched to its
    /// vote, with the cut halfway between the tuned values.
    #[test]
    fn every_corner_of_a_grid_gets_its_vote() {
        for corners in [
            [1, 0, 0, 0], // the smallest image apart
            [0, 0, 0, 1], // the largest apart
            [1, 0, 0, 2], // three kernels
            [1, 0, 0, 1], // an XOR: no single cut lowers the impurity
            [2, 0, 0, 1],
        ] {
            let v = votes(&[
                (96, 96, corners[0]),
                (96, 320, corners[1]),
                (320, 96, corners[2]),
                (320, 320, corners[3]),
            ]);
            let (tree, accuracy) = train_tree(&vars(), &v);
            assert_eq!(accuracy, 1.0, "{corners:?}: {tree:?}");
            assert!(tree.depth() <= 2, "{corners:?}: {tree:?}");
            let at = |h, w| tree.select(&Bindings::from_pairs([("height", h), ("width", w)]));
            assert_eq!(at(208, 208), corners[0], "{tree:?}");
            assert_eq!(at(209, 209), corners[3], "{tree:?}");
        }
    }

    /// A vote decided by the image's area (small images on another kernel) over a
    /// whole grid: each height comes with every width, so the votes at one height mix.
    #[test]
    fn a_product_of_vars_is_learned_exactly() {
        let mut points = Vec::new();
        for h in (1..=20).map(|i| 16 * i) {
            for w in (1..=20).map(|i| 16 * i) {
                points.push((h, w, usize::from(h * w > 48 * 48)));
            }
        }
        let (tree, accuracy) = train_tree(&vars(), &votes(&points));
        assert_eq!(accuracy, 1.0, "{tree:?}");
        // One region per step of the staircase, a few cuts each.
        assert!(tree.leaves() <= 12, "{}", tree.leaves());
    }

    /// Samples with the same values and different votes cannot be told apart: the
    /// majority takes them, and no cut is made for them alone.
    #[test]
    fn identical_values_with_mixed_votes_get_the_majority() {
        let v = votes(&[(8, 8, 1), (8, 8, 1), (8, 8, 0), (9, 9, 0)]);
        let (tree, accuracy) = train_tree(&vars(), &v);
        assert_eq!(accuracy, 0.75);
        let at = |h, w| tree.select(&Bindings::from_pairs([("height", h), ("width", w)]));
        assert_eq!((at(8, 8), at(9, 9)), (1, 0), "{tree:?}");
        // Among equal counts, the kernel with more votes overall (the lower index).
        let (tie, _) = train_tree(&vars(), &votes(&[(8, 8, 1), (8, 8, 0)]));
        assert_eq!(tie, DispatchTree::Leaf { kernel: 0 });
        // No votes: kernel 0, as a module always has one.
        assert_eq!(train_tree(&vars(), &[]).0, DispatchTree::Leaf { kernel: 0 });
    }

    /// A split whose sides both err as the leaf would is pruned: cuts taken on no gain
    /// stay only where they pay off further down.
    #[test]
    fn splits_that_do_not_pay_are_pruned() {
        // Each height holds both votes at the same width: the cut on height gains
        // nothing, and nothing below it can tell the samples apart.
        let v = votes(&[(1, 1, 0), (1, 1, 1), (2, 1, 0), (2, 1, 1)]);
        let (tree, accuracy) = train_tree(&vars(), &v);
        assert_eq!((tree, accuracy), (DispatchTree::Leaf { kernel: 0 }, 0.5));
        // Votes that alternate along width, the same at every height: no cut on height.
        let mut points = Vec::new();
        for h in [10, 20, 30] {
            for (j, w) in [10, 20, 30, 40].into_iter().enumerate() {
                points.push((h, w, j % 2));
            }
        }
        let (tree, accuracy) = train_tree(&vars(), &votes(&points));
        assert_eq!(accuracy, 1.0);
        assert_eq!(tree.vars(), vec!["width".to_string()], "{tree:?}");
    }

    /// Cuts between extreme values: the midpoint does not overflow.
    #[test]
    fn extreme_values_are_cut_without_overflow() {
        let v = votes(&[(i64::MAX, 1, 0), (i64::MAX - 2, 1, 1)]);
        let (tree, accuracy) = train_tree(&vars(), &v);
        assert_eq!(accuracy, 1.0, "{tree:?}");
        let v = votes(&[(i64::MIN, 1, 0), (i64::MAX, 1, 1)]);
        assert_eq!(train_tree(&vars(), &v).1, 1.0);
    }

    /// Votes that alternate from one value to the next need a split between every pair:
    /// the tree is cut at its depth limit (so the module's loader reads it) and still
    /// dispatches every instance to one of the voted kernels.
    #[test]
    fn alternating_votes_give_a_bounded_tree() {
        let votes: Vec<Vote> = (1..=1000)
            .map(|t| Vote {
                bindings: Bindings::from_pairs([("T", t)]),
                micro_kernel: (t % 2) as usize,
                latency_seconds: Some(1.0),
                measured: true,
            })
            .collect();
        let (tree, accuracy) = train_tree(&["T".into()], &votes);
        assert!(tree.depth() <= DispatchTree::MAX_DEPTH, "{}", tree.depth());
        assert!(tree.max_kernel() <= 1 && accuracy > 0.5, "{accuracy}");
        let json = serde_json::to_string(&tree).unwrap();
        assert_eq!(serde_json::from_str::<DispatchTree>(&json).unwrap(), tree);
    }
}
