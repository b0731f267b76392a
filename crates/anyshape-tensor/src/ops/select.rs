//! Ops whose output extent is what their data selects — `NonZero`, `Compress`,
//! `Unique`, `NonMaxSuppression` — as ONNX's reference computes them. That extent is a
//! run-time dim ([`anyshape_ir::Expr::runtime_dim`]): their steps run on the host and
//! the runtime binds it from what they make. And the internal `anyshape.IfSelect`, an
//! `If` whose condition is known at run time only: the taken branch's values.
use super::{axis, fail, req, runtime_shape, OpSpec};
use crate::node::Node;
use crate::{DType, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;
use std::cmp::Ordering;

/// The internal op of an `If` whose condition is known only at run time (the importer
/// inlines both branches before it): `IfSelect(cond, then…, else…)` gives the values of
/// the branch `cond` takes.
pub const IF_SELECT: &str = "anyshape.IfSelect";

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "NonZero",
        since: 9,
        infer: infer_non_zero,
        eval: eval_non_zero,
        eval_into: None,
    },
    OpSpec {
        name: "Compress",
        since: 11,
        infer: infer_compress,
        eval: eval_compress,
        eval_into: None,
    },
    OpSpec {
        name: "Unique",
        since: 11,
        infer: infer_unique,
        eval: eval_unique,
        eval_into: None,
    },
    OpSpec {
        name: IF_SELECT,
        since: 1,
        infer: infer_if_select,
        eval: eval_if_select,
        eval_into: None,
    },
    OpSpec {
        name: "NonMaxSuppression",
        since: 11,
        infer: infer_nms,
        eval: eval_nms,
        eval_into: None,
    },
];

/// Each element of `x` widened to f64 (the order and equality these ops compare by).
fn wide(x: DataRef) -> Vec<f64> {
    match x {
        DataRef::F32(v) => v.iter().map(|&f| f as f64).collect(),
        DataRef::I64(v) => v.iter().map(|&i| i as f64).collect(),
        DataRef::Bool(v) => v.iter().map(|&b| b as u8 as f64).collect(),
    }
}

fn infer_non_zero(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let r = x.rank();
    let shape = runtime_shape(node, 0, 2, |a| (a == 0).then_some(Expr::Const(r as i64)))?;
    Ok(vec![Fact::new(DType::I64, shape)])
}

/// `NonZero(x)`: the indices of `x`'s non-zero elements, one row per axis, in
/// row-major order.
fn eval_non_zero(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let v = wide(x.data);
    let at: Vec<usize> = (0..v.len()).filter(|&i| v[i] != 0.0).collect();
    let r = x.shape.len();
    let strides = crate::tensor::strides(x.shape);
    let mut out = vec![0i64; r * at.len()];
    for (k, &i) in at.iter().enumerate() {
        for a in 0..r {
            out[a * at.len() + k] = ((i / strides[a]) % x.shape[a]) as i64;
        }
    }
    Ok(vec![Tensor::i64(vec![r, at.len()], out)?])
}

/// The `axis` attribute of `Compress` and `Unique`: `None` (absent) flattens.
fn optional_axis(node: &Node, rank: usize) -> Result<Option<usize>> {
    match node.attrs.contains_key("axis") {
        true => Ok(Some(axis(node, node.int("axis", 0)?, rank)?)),
        false => Ok(None),
    }
}

/// The flat indices of the slices `picks` (in order) of a tensor viewed as
/// `[outer, n, inner]`, along its middle axis.
fn slice_indices(outer: usize, n: usize, inner: usize, picks: &[usize]) -> Vec<usize> {
    let mut idx = Vec::with_capacity(outer * picks.len() * inner);
    for o in 0..outer {
        for &k in picks {
            idx.extend((0..inner).map(|i| (o * n + k) * inner + i));
        }
    }
    idx
}

fn infer_compress(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let shape = match optional_axis(node, x.rank())? {
        Some(a) => runtime_shape(node, 0, x.rank(), |d| (d != a).then(|| x.shape[d].clone()))?,
        None => runtime_shape(node, 0, 1, |_| None)?,
    };
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `Compress(x, condition)`: the slices of `x` along `axis` (its elements, flattened,
/// without one) whose entry of `condition` is true; entries past the axis's end are
/// an error, a shorter condition drops the rest.
fn eval_compress(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let c = req(node, ins, 1)?.as_bool().map_err(|e| node.error(e))?;
    let a = optional_axis(node, x.shape.len())?;
    let ((outer, n, inner), mut shape) = match a {
        Some(a) => (super::split_at(x.shape, a), x.shape.to_vec()),
        None => ((1, x.len(), 1), vec![x.len()]),
    };
    if c.len() > n {
        return fail(
            node,
            format!("a condition of {} entries for {n} slices", c.len()),
        );
    }
    let kept: Vec<usize> = (0..c.len()).filter(|&i| c[i]).collect();
    shape[a.unwrap_or(0)] = kept.len();
    Ok(vec![Tensor::new(
        shape,
        x.data.pick(&slice_indices(outer, n, inner, &kept)),
    )?])
}

fn infer_unique(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let a = optional_axis(node, x.rank())?;
    let y = match a {
        Some(a) => runtime_shape(node, 0, x.rank(), |d| (d != a).then(|| x.shape[d].clone()))?,
        None => runtime_shape(node, 0, 1, |_| None)?,
    };
    let u = y[a.unwrap_or(0)].clone();
    let n = match a {
        Some(a) => x.shape[a].clone(),
        None => x.shape.iter().fold(Expr::Const(1), |p, d| p * d.clone()),
    };
    Ok(vec![
        Fact::new(x.dtype, y),
        Fact::new(DType::I64, vec![u.clone()]),
        Fact::new(DType::I64, vec![n]),
        Fact::new(DType::I64, vec![u]),
    ])
}

/// `Unique(x)`: the distinct slices of `x` along `axis` (its elements, flattened,
/// without one), sorted (lexicographically) or in the order they first occur; the
/// index of each one's first occurrence, each slice's unique one, and their counts.
fn eval_unique(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let a = optional_axis(node, x.shape.len())?;
    let (outer, n, inner) = match a {
        Some(a) => super::split_at(x.shape, a),
        None => (1, x.len(), 1),
    };
    let v = wide(x.data);
    let slice = |k: usize| -> Vec<f64> {
        (0..outer)
            .flat_map(|o| (0..inner).map(move |i| (o * n + k) * inner + i))
            .map(|i| v[i])
            .collect()
    };
    let slices: Vec<Vec<f64>> = (0..n).map(slice).collect();
    let order = |p: &Vec<f64>, q: &Vec<f64>| {
        p.iter()
            .zip(q)
            .map(|(a, b)| a.total_cmp(b))
            .find(|o| *o != Ordering::Equal)
            .unwrap_or(Ordering::Equal)
    };
    // Slices by value (stable: each run's first is the first occurrence).
    let mut by_value: Vec<usize> = (0..n).collect();
    by_value.sort_by(|&p, &q| order(&slices[p], &slices[q]));
    let mut firsts: Vec<usize> = Vec::new();
    let mut group = vec![0usize; n];
    for (k, &s) in by_value.iter().enumerate() {
        if k == 0 || order(&slices[by_value[k - 1]], &slices[s]) != Ordering::Equal {
            firsts.push(s);
        }
        group[s] = firsts.len() - 1;
    }
    // Sorted, or in the order of first occurrence.
    let rank: Vec<usize> = match node.int("sorted", 1)? != 0 {
        true => (0..firsts.len()).collect(),
        false => {
            let mut by_first: Vec<usize> = (0..firsts.len()).collect();
            by_first.sort_by_key(|&g| firsts[g]);
            let mut rank = vec![0; firsts.len()];
            for (r, &g) in by_first.iter().enumerate() {
                rank[g] = r;
            }
            rank
        }
    };
    let u = firsts.len();
    let mut first = vec![0i64; u];
    let mut counts = vec![0i64; u];
    for (g, &f) in firsts.iter().enumerate() {
        first[rank[g]] = f as i64;
    }
    let inverse: Vec<i64> = (0..n).map(|s| rank[group[s]] as i64).collect();
    for &i in &inverse {
        counts[i as usize] += 1;
    }
    let picks: Vec<usize> = first.iter().map(|&k| k as usize).collect();
    let idx = slice_indices(outer, n, inner, &picks);
    let shape = match a {
        Some(a) => {
            let mut s = x.shape.to_vec();
            s[a] = u;
            s
        }
        None => vec![u],
    };
    let y = Tensor::new(shape, x.data.pick(&idx))?;
    let mut outs = vec![
        y,
        Tensor::i64(vec![u], first)?,
        Tensor::i64(vec![n], inverse)?,
        Tensor::i64(vec![u], counts)?,
    ];
    outs.truncate(node.outputs.len().max(1));
    Ok(outs)
}

fn infer_nms(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    req(node, ins, 0)?;
    req(node, ins, 1)?;
    let shape = runtime_shape(node, 0, 2, |a| (a == 1).then_some(Expr::Const(3)))?;
    Ok(vec![Fact::new(DType::I64, shape)])
}

/// The first element of optional scalar input `i`, if given and not empty.
fn first<'a>(ins: &[Option<TensorRef<'a>>], i: usize) -> Option<TensorRef<'a>> {
    ins.get(i).copied().flatten().filter(|t| !t.is_empty())
}

/// Whether boxes `p` and `q` (corners, or centers and sizes with `center`) overlap
/// by more than `threshold` of their union.
fn suppresses(p: &[f32], q: &[f32], center: bool, threshold: f32) -> bool {
    let span = |b: &[f32], i: usize| -> (f32, f32) {
        match center {
            true => (b[i] - b[i + 2] / 2.0, b[i] + b[i + 2] / 2.0),
            false => (b[i].min(b[i + 2]), b[i].max(b[i + 2])),
        }
    };
    // Corners are (y1, x1, y2, x2); centers (x, y, w, h).
    let (xa, ya) = match center {
        true => (0, 1),
        false => (1, 0),
    };
    let (px, qx) = (span(p, xa), span(q, xa));
    let (ix0, ix1) = (px.0.max(qx.0), px.1.min(qx.1));
    if ix1 <= ix0 {
        return false;
    }
    let (py, qy) = (span(p, ya), span(q, ya));
    let (iy0, iy1) = (py.0.max(qy.0), py.1.min(qy.1));
    if iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    let area = |x: (f32, f32), y: (f32, f32)| (x.1 - x.0) * (y.1 - y.0);
    let (a1, a2) = (area(px, py), area(qx, qy));
    let union = a1 + a2 - inter;
    if inter <= 0.0 || a1 <= 0.0 || a2 <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > threshold
}

/// `NonMaxSuppression(boxes, scores, max_per_class, iou_threshold, score_threshold)`:
/// per batch item and class, boxes by decreasing score (ties: the lower index first)
/// above the score threshold, each kept unless it overlaps a kept one by more than the
/// IoU threshold, at most `max_per_class`; `[batch, class, box]` per kept box.
fn eval_nms(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let boxes = req(node, ins, 0)?;
    let scores = req(node, ins, 1)?;
    let (&[b, n, 4], &[sb, c, sn]) = (boxes.shape, scores.shape) else {
        return fail(
            node,
            "boxes must be [batch, boxes, 4] and scores [batch, classes, boxes]",
        );
    };
    if sb != b || sn != n {
        return fail(node, "the scores are not of the boxes' batch and count");
    }
    let boxes = boxes.as_f32().map_err(|e| node.error(e))?;
    let scores = scores.as_f32().map_err(|e| node.error(e))?;
    let most = match first(ins, 2) {
        Some(t) => t.as_i64().map_err(|e| node.error(e))?[0].max(0) as usize,
        None => 0,
    };
    let scalar = |i: usize| -> Result<Option<f32>> {
        first(ins, i)
            .map(|t| t.as_f32().map(|v| v[0]).map_err(|e| node.error(e)))
            .transpose()
    };
    let iou = scalar(3)?.unwrap_or(0.0);
    let min_score = scalar(4)?;
    let center = node.int("center_point_box", 0)? != 0;
    let mut out: Vec<i64> = Vec::new();
    for bi in 0..b {
        let bx = |i: usize| &boxes[(bi * n + i) * 4..][..4];
        for ci in 0..c {
            let s = &scores[(bi * c + ci) * n..][..n];
            let mut cand: Vec<usize> = (0..n)
                .filter(|&i| min_score.is_none_or(|t| s[i] > t))
                .collect();
            cand.sort_by(|&p, &q| s[q].total_cmp(&s[p]).then(p.cmp(&q)));
            let mut kept: Vec<usize> = Vec::new();
            for i in cand {
                if kept.len() >= most {
                    break;
                }
                if kept.iter().all(|&k| !suppresses(bx(i), bx(k), center, iou)) {
                    kept.push(i);
                    out.extend([bi as i64, ci as i64, i as i64]);
                }
            }
        }
    }
    let k = out.len() / 3;
    Ok(vec![Tensor::i64(vec![k, 3], out)?])
}

/// The number of values each branch of an `IfSelect` gives.
fn branch_width(node: &Node, inputs: usize) -> Result<usize> {
    match inputs {
        n if n >= 1 && (n - 1) % 2 == 0 => Ok((n - 1) / 2),
        _ => fail(node, "a condition and as many values of each branch"),
    }
}

fn infer_if_select(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let k = branch_width(node, ins.len())?;
    (0..k)
        .map(|i| {
            let (a, b) = (req(node, ins, 1 + i)?, req(node, ins, 1 + k + i)?);
            if a.dtype != b.dtype || a.rank() != b.rank() {
                return fail(
                    node,
                    format!("the branches' value {i} differ in type or rank"),
                );
            }
            // Dims the branches agree on; a run-time dim where they differ.
            let shape = runtime_shape(node, i, a.rank(), |d| {
                (a.shape[d] == b.shape[d]).then(|| a.shape[d].clone())
            })?;
            Ok(Fact::new(a.dtype, shape))
        })
        .collect()
}

/// `IfSelect(cond, then…, else…)`: the then values where `cond` holds, else the others.
fn eval_if_select(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let k = branch_width(node, ins.len())?;
    let cond = match req(node, ins, 0)?.as_bool().map_err(|e| node.error(e))? {
        [c] => *c,
        _ => return fail(node, "the condition must be one boolean"),
    };
    let from = if cond { 1 } else { 1 + k };
    (from..from + k)
        .map(|i| Ok(req(node, ins, i)?.to_tensor()))
        .collect()
}
