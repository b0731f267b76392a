//! The `ai.onnx.ml` domain's ops anyshape knows (named `ai.onnx.ml.…`), as ONNX's
//! reference computes them: `Binarizer`, `ArrayFeatureExtractor` and opset 5's
//! `TreeEnsemble` (interior nodes comparing one feature each — set membership too —,
//! leaves weighting targets, the trees' weights summed, averaged, or their minimum or
//! maximum taken). Host steps.
use super::{fail, req, OpSpec};
use crate::node::{Attr, Node};
use crate::{Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "ai.onnx.ml.Binarizer",
        since: 1,
        infer: super::infer_same,
        eval: eval_binarizer,
        eval_into: None,
    },
    OpSpec {
        name: "ai.onnx.ml.ArrayFeatureExtractor",
        since: 1,
        infer: infer_feature_extractor,
        eval: eval_feature_extractor,
        eval_into: None,
    },
    OpSpec {
        name: "ai.onnx.ml.TreeEnsemble",
        since: 5,
        infer: infer_tree_ensemble,
        eval: eval_tree_ensemble,
        eval_into: None,
    },
];

/// `Binarizer(x)`: 1 where `x` is above `threshold`, else 0, in `x`'s type.
fn eval_binarizer(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let t = node.float("threshold", 0.0)?;
    let data = match x.data {
        DataRef::F32(v) => Data::F32(v.iter().map(|&e| (e > t) as u8 as f32).collect()),
        DataRef::I64(v) => Data::I64(v.iter().map(|&e| ((e as f32) > t) as i64).collect()),
        DataRef::Bool(_) => return fail(node, "unsupported for bool"),
    };
    Ok(vec![Tensor::new(x.shape.to_vec(), data)?])
}

fn infer_feature_extractor(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, y) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let picked = y
        .shape
        .iter()
        .fold(Expr::Const(1), |p, d| p * d.clone())
        .simplify();
    let shape = match x.rank() {
        0 => return fail(node, "a tensor of rank 1 or more"),
        1 => vec![Expr::Const(1), picked],
        r => x.shape[..r - 1].iter().cloned().chain([picked]).collect(),
    };
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `ArrayFeatureExtractor(x, indices)`: the elements of `x`'s last axis at `indices`
/// (a vector comes out as one row, as onnxruntime does).
fn eval_feature_extractor(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let idx = super::ints(node, ins, 1)?;
    let Some(&last) = x.shape.last() else {
        return fail(node, "a tensor of rank 1 or more");
    };
    let picks: Vec<usize> = idx
        .iter()
        .map(|&i| {
            usize::try_from(i)
                .ok()
                .filter(|&i| i < last)
                .ok_or_else(|| node.error(format!("index {i} outside a last axis of {last}")))
        })
        .collect::<Result<_>>()?;
    let rows = x.len() / last.max(1);
    let flat: Vec<usize> = (0..rows)
        .flat_map(|r| picks.iter().map(move |&p| r * last + p))
        .collect();
    let shape = match x.shape.len() {
        1 => vec![1, picks.len()],
        r => x.shape[..r - 1]
            .iter()
            .copied()
            .chain([picks.len()])
            .collect(),
    };
    Ok(vec![Tensor::new(shape, x.data.pick(&flat))?])
}

fn infer_tree_ensemble(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    if x.rank() != 2 {
        return fail(node, "X must be [N, features]");
    }
    let targets = node.int("n_targets", 0)?;
    if targets < 1 {
        return fail(node, "n_targets must be positive");
    }
    Ok(vec![Fact::new(
        x.dtype,
        vec![x.shape[0].clone(), Expr::Const(targets)],
    )])
}

/// An integer-list attribute, as given or as a tensor.
fn ints(node: &Node, name: &str) -> Result<Vec<i64>> {
    match node.attrs.get(name) {
        Some(Attr::Tensor(t)) => Ok(t.as_i64().map_err(|e| node.error(e))?.to_vec()),
        _ => node
            .ints(name)?
            .ok_or_else(|| node.error(format!("needs `{name}`"))),
    }
}

/// A float-tensor attribute, if given.
fn floats(node: &Node, name: &str) -> Result<Option<Vec<f32>>> {
    match node.attrs.get(name) {
        None => Ok(None),
        Some(Attr::Tensor(t)) => Ok(Some(t.as_f32().map_err(|e| node.error(e))?.to_vec())),
        Some(Attr::Floats(v)) => Ok(Some(v.clone())),
        Some(_) => fail(node, format!("`{name}` must be a float tensor")),
    }
}

/// An interior node's test of its feature's value.
enum Test {
    /// A comparison with the split (mode 0 to 5).
    Compare(i64, f32),
    /// Membership in a set (mode 6).
    Member(Vec<f32>),
}

/// `TreeEnsemble(X)` (ai.onnx.ml opset 5): each row through each tree from its root —
/// an interior node sends it to its true child where its feature passes the node's
/// test (or is NaN where missing values track true) —, each leaf reached adding its
/// weight to its target: summed, averaged over the trees, or the minimum or maximum
/// kept.
fn eval_tree_ensemble(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let &[n, f] = x.shape else {
        return fail(node, "X must be [N, features]");
    };
    let xs = x.as_f32().map_err(|e| node.error(e))?;
    if node.int("post_transform", 0)? != 0 {
        return fail(node, "a post transform (its reference applies none)");
    }
    let targets = node.int("n_targets", 0)?.max(0) as usize;
    let (feature, modes) = (ints(node, "nodes_featureids")?, ints(node, "nodes_modes")?);
    let splits = floats(node, "nodes_splits")?.ok_or_else(|| node.error("needs `nodes_splits`"))?;
    let (true_ids, false_ids) = (
        ints(node, "nodes_truenodeids")?,
        ints(node, "nodes_falsenodeids")?,
    );
    let (true_leaf, false_leaf) = (
        ints(node, "nodes_trueleafs")?,
        ints(node, "nodes_falseleafs")?,
    );
    let (leaf_target, roots) = (ints(node, "leaf_targetids")?, ints(node, "tree_roots")?);
    let leaf_weight =
        floats(node, "leaf_weights")?.ok_or_else(|| node.error("needs `leaf_weights`"))?;
    let missing = node.ints("nodes_missing_value_tracks_true")?;
    let m = feature.len();
    if [
        modes.len(),
        splits.len(),
        true_ids.len(),
        false_ids.len(),
        true_leaf.len(),
        false_leaf.len(),
    ]
    .iter()
    .any(|&l| l != m)
        || leaf_target.len() != leaf_weight.len()
        || missing.as_ref().is_some_and(|v| v.len() != m)
    {
        return fail(
            node,
            "the nodes' and the leaves' attributes differ in length",
        );
    }
    let check = |i: i64, len: usize, what: &str| {
        usize::try_from(i)
            .ok()
            .filter(|&i| i < len)
            .ok_or_else(|| node.error(format!("{what} {i} outside {len}")))
    };
    // Each membership node's set: the membership values up to the next NaN, taken in
    // the order the reference builds the trees (each root, a node before its true
    // subtree before its false one).
    let members = floats(node, "membership_values")?.unwrap_or_default();
    let mut sets = members.split(|v| v.is_nan());
    let mut set_of: Vec<Option<Vec<f32>>> = vec![None; m];
    let mut stack: Vec<usize> = Vec::new();
    for &root in roots.iter().rev() {
        stack.push(check(root, m, "a tree root")?);
    }
    let mut seen = vec![false; m];
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        if modes[i] == 6 {
            let s = sets
                .next()
                .ok_or_else(|| node.error("a membership node without its set"))?;
            set_of[i] = Some(s.to_vec());
        }
        if false_leaf[i] == 0 {
            stack.push(check(false_ids[i], m, "a node")?);
        }
        if true_leaf[i] == 0 {
            stack.push(check(true_ids[i], m, "a node")?);
        }
    }
    let tests: Vec<Test> = (0..m)
        .map(|i| match modes[i] {
            0..=5 => Ok(Test::Compare(modes[i], splits[i])),
            6 => Ok(Test::Member(set_of[i].take().unwrap_or_default())),
            k => fail(node, format!("node mode {k} is not one ONNX defines")),
        })
        .collect::<Result<_>>()?;
    let aggregate = node.int("aggregate_function", 1)?;
    let init = match aggregate {
        0 | 1 => 0.0,
        2 => f32::MAX,
        3 => f32::MIN,
        a => {
            return fail(
                node,
                format!("aggregate function {a} is not one ONNX defines"),
            )
        }
    };
    let mut out = vec![init; n * targets];
    for r in 0..n {
        let row = &xs[r * f..][..f];
        for &root in &roots {
            // A tree whose root's children are the same leaf is that leaf.
            let mut at = check(root, m, "a tree root")?;
            let mut leaf =
                (true_leaf[at] != 0 && false_leaf[at] != 0 && true_ids[at] == false_ids[at])
                    .then(|| true_ids[at]);
            let mut steps = 0;
            while leaf.is_none() {
                let v = row[check(feature[at], f, "a feature")?];
                let pass = (missing.as_ref().is_some_and(|t| t[at] != 0) && v.is_nan())
                    || match &tests[at] {
                        Test::Compare(0, s) => v <= *s,
                        Test::Compare(1, s) => v < *s,
                        Test::Compare(2, s) => v >= *s,
                        Test::Compare(3, s) => v > *s,
                        Test::Compare(4, s) => v == *s,
                        Test::Compare(_, s) => v != *s,
                        Test::Member(set) => set.contains(&v),
                    };
                let (next, is_leaf) = match pass {
                    true => (true_ids[at], true_leaf[at]),
                    false => (false_ids[at], false_leaf[at]),
                };
                match is_leaf != 0 {
                    true => leaf = Some(next),
                    false => at = check(next, m, "a node")?,
                }
                steps += 1;
                if steps > m {
                    return fail(node, "a tree with a cycle");
                }
            }
            let l = check(leaf.unwrap_or(0), leaf_weight.len(), "a leaf")?;
            let t = check(leaf_target[l], targets, "a target")?;
            let w = leaf_weight[l];
            let o = &mut out[r * targets + t];
            *o = match aggregate {
                0 => *o + w / roots.len() as f32,
                1 => *o + w,
                2 => o.min(w),
                _ => o.max(w),
            };
        }
    }
    Ok(vec![Tensor::f32(vec![n, targets], out)?])
}
