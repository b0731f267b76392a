//! Reductions, normalizations and scans over axes: `Softmax`, `LayerNormalization`,
//! `BatchNormalization` (inference), `ReduceMean`, `ReduceSum`, `ArgMax`, `ArgMin`,
//! `CumSum`. The reference accumulates floats in `f64`.
use super::{axis, const_ints, fail, req, OpSpec};
use crate::node::Node;
use crate::{DType, Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Softmax",
        since: 13,
        infer: infer_same,
        eval: eval_softmax,
    },
    OpSpec {
        name: "LayerNormalization",
        since: 17,
        infer: infer_layer_norm,
        eval: eval_layer_norm,
    },
    OpSpec {
        name: "BatchNormalization",
        since: 9,
        infer: infer_same,
        eval: eval_batch_norm,
    },
    OpSpec {
        name: "ReduceMean",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
    },
    OpSpec {
        name: "ReduceSum",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
    },
    OpSpec {
        name: "ArgMax",
        since: 11,
        infer: infer_arg,
        eval: eval_arg,
    },
    OpSpec {
        name: "ArgMin",
        since: 11,
        infer: infer_arg,
        eval: eval_arg,
    },
    OpSpec {
        name: "CumSum",
        since: 11,
        infer: infer_same,
        eval: eval_cumsum,
    },
];

fn infer_same(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.to_vec())])
}

/// `(outer, n, inner)` of a tensor seen along `a`.
fn split_at(shape: &[usize], a: usize) -> (usize, usize, usize) {
    (
        shape[..a].iter().product(),
        shape[a],
        shape[a + 1..].iter().product(),
    )
}

fn eval_softmax(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    // Opset 13 on: the axis alone (before, the input was flattened to 2-D at `axis`).
    let a = axis(node, node.int("axis", -1)?, x.shape.len())?;
    let (outer, n, inner) = split_at(x.shape, a);
    let mut out = vec![0f32; v.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            let max = (0..n).map(|j| v[at(j)]).fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = (0..n).map(|j| ((v[at(j)] - max) as f64).exp()).sum();
            for j in 0..n {
                out[at(j)] = (((v[at(j)] - max) as f64).exp() / sum) as f32;
            }
        }
    }
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

fn infer_layer_norm(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", -1)?, x.rank())?;
    let mut stat = x.shape[..a].to_vec();
    stat.extend(std::iter::repeat_n(Expr::Const(1), x.rank() - a));
    let mut outs = vec![Fact::new(x.dtype, x.shape.to_vec())];
    for _ in 1..node.outputs.len() {
        outs.push(Fact::new(x.dtype, stat.clone()));
    }
    Ok(outs)
}

fn eval_layer_norm(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let scale = req(node, ins, 1)?.as_f32().map_err(|e| node.error(e))?;
    let bias = ins
        .get(2)
        .copied()
        .flatten()
        .map(|b| b.as_f32())
        .transpose()
        .map_err(|e| node.error(e))?;
    let eps = node.float("epsilon", 1e-5)?;
    let a = axis(node, node.int("axis", -1)?, x.shape.len())?;
    let rows: usize = x.shape[..a].iter().product();
    let n: usize = x.shape[a..].iter().product();
    if scale.len() != n || bias.is_some_and(|b| b.len() != n) {
        return fail(
            node,
            format!("scale and bias must have the {n} elements of the normalized axes"),
        );
    }
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let mut out = vec![0f32; v.len()];
    let (mut means, mut invs) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
    for (row, out) in v.chunks_exact(n.max(1)).zip(out.chunks_exact_mut(n.max(1))) {
        let mean = lane_sum(row, |x| x) / n as f32;
        let var = lane_sum(row, |x| (x - mean) * (x - mean)) / n as f32;
        let inv = 1.0 / (var + eps).sqrt();
        match bias {
            Some(b) => {
                for (((y, &x), &g), &b) in out.iter_mut().zip(row).zip(scale).zip(b) {
                    *y = (x - mean) * inv * g + b;
                }
            }
            None => {
                for ((y, &x), &g) in out.iter_mut().zip(row).zip(scale) {
                    *y = (x - mean) * inv * g;
                }
            }
        }
        means.push(mean);
        invs.push(inv);
    }
    // Rows of no elements: no mean, no deviation.
    means.resize(rows, f32::NAN);
    invs.resize(rows, f32::NAN);
    let mut stat: Vec<usize> = x.shape[..a].to_vec();
    stat.extend(std::iter::repeat_n(1, x.shape.len() - a));
    let mut outs = vec![Tensor::f32(x.shape.to_vec(), out)?];
    if node.outputs.len() > 1 {
        outs.push(Tensor::f32(stat.clone(), means)?);
    }
    if node.outputs.len() > 2 {
        outs.push(Tensor::f32(stat, invs)?);
    }
    Ok(outs)
}

/// The sum of `f` over `xs` in eight independent partial sums (the loop vectorizes;
/// the partial sums also keep the rounding error of a long row small).
fn lane_sum(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a += f(x);
        }
    }
    acc.iter().sum::<f32>() + rest.iter().map(|&x| f(x)).sum::<f32>()
}

/// The reduced axes: an attribute, or (ReduceSum, and ReduceMean from opset 18) an input.
fn reduce_axes(node: &Node, from_input: Option<Vec<i64>>, rank: usize) -> Result<Vec<usize>> {
    let given = match node.ints("axes")? {
        Some(a) => Some(a),
        None => from_input,
    };
    match given {
        Some(a) if !a.is_empty() => {
            let mut v: Vec<usize> = a
                .iter()
                .map(|&x| axis(node, x, rank))
                .collect::<Result<_>>()?;
            v.sort();
            v.dedup();
            Ok(v)
        }
        _ if node.int("noop_with_empty_axes", 0)? != 0 => Ok(vec![]),
        _ => Ok((0..rank).collect()),
    }
}

fn infer_reduce(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let input = ins
        .get(1)
        .copied()
        .flatten()
        .map(|_| const_ints(node, ins, 1))
        .transpose()?;
    let axes = reduce_axes(node, input, x.rank())?;
    let keep = node.int("keepdims", 1)? != 0;
    let shape = (0..x.rank())
        .filter_map(|i| match (axes.contains(&i), keep) {
            (true, true) => Some(Expr::Const(1)),
            (true, false) => None,
            _ => Some(x.shape[i].clone()),
        })
        .collect();
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_reduce(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let input = ins
        .get(1)
        .copied()
        .flatten()
        .map(|t| t.as_i64().map(|v| v.to_vec()))
        .transpose()
        .map_err(|e| node.error(e))?;
    let r = x.shape.len();
    let axes = reduce_axes(node, input, r)?;
    let keep = node.int("keepdims", 1)? != 0;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let out_full: Vec<usize> = (0..r)
        .map(|i| if axes.contains(&i) { 1 } else { x.shape[i] })
        .collect();
    let n_out: usize = out_full.iter().product();
    let mut acc = vec![0f64; n_out];
    let st = crate::tensor::strides(&out_full);
    let mut counter = vec![0usize; r];
    for &val in v {
        let o: usize = (0..r)
            .map(|d| {
                if axes.contains(&d) {
                    0
                } else {
                    counter[d] * st[d]
                }
            })
            .sum();
        acc[o] += val as f64;
        for d in (0..r).rev() {
            counter[d] += 1;
            if counter[d] < x.shape[d] {
                break;
            }
            counter[d] = 0;
        }
    }
    let count: usize = axes.iter().map(|&a| x.shape[a]).product();
    let mean = node.op == "ReduceMean";
    let out: Vec<f32> = acc
        .iter()
        .map(|&s| {
            if mean {
                (s / count.max(1) as f64) as f32
            } else {
                s as f32
            }
        })
        .collect();
    let shape = if keep {
        out_full
    } else {
        (0..r)
            .filter(|i| !axes.contains(i))
            .map(|i| x.shape[i])
            .collect()
    };
    Ok(vec![Tensor::f32(shape, out)?])
}

/// Running sums of `v` seen as `(outer, n, inner)` along its middle axis into `out`:
/// from the end with `reverse`, each element left out of its own sum with `exclusive`.
fn scan<T: Copy>(
    v: &[T],
    (outer, n, inner): (usize, usize, usize),
    (exclusive, reverse): (bool, bool),
    zero: T,
    add: impl Fn(T, T) -> T,
    out: &mut [T],
) {
    for o in 0..outer {
        for i in 0..inner {
            let mut sum = zero;
            for k in 0..n {
                let j = if reverse { n - 1 - k } else { k };
                let at = (o * n + j) * inner + i;
                let before = sum;
                sum = add(sum, v[at]);
                out[at] = if exclusive { before } else { sum };
            }
        }
    }
}

/// `CumSum(x, axis)`: running sums along `axis` (a scalar or one-element input), with
/// the `exclusive` and `reverse` attributes.
fn eval_cumsum(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let a = match req(node, ins, 1)?.as_i64().map_err(|e| node.error(e))? {
        [a] => axis(node, *a, x.shape.len())?,
        v => return fail(node, format!("axis must be one integer, not {}", v.len())),
    };
    let how = (node.int("exclusive", 0)? != 0, node.int("reverse", 0)? != 0);
    let dims = split_at(x.shape, a);
    let data = match x.data {
        DataRef::F32(v) => {
            let wide: Vec<f64> = v.iter().map(|&f| f as f64).collect();
            let mut out = vec![0f64; v.len()];
            scan(&wide, dims, how, 0.0, |s, x| s + x, &mut out);
            Data::F32(out.into_iter().map(|f| f as f32).collect())
        }
        DataRef::I64(v) => {
            let mut out = vec![0i64; v.len()];
            scan(v, dims, how, 0, i64::wrapping_add, &mut out);
            Data::I64(out)
        }
        DataRef::Bool(_) => return fail(node, "unsupported for bool"),
    };
    Ok(vec![Tensor::new(x.shape.to_vec(), data)?])
}

/// `BatchNormalization` at inference: `(x - mean) / sqrt(var + epsilon) · scale + B`
/// per channel (axis 1), from the running statistics; training mode is refused.
fn eval_batch_norm(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    if node.int("training_mode", 0)? != 0 || node.outputs.len() > 1 {
        return fail(node, "training mode (batch statistics) is not supported");
    }
    let x = req(node, ins, 0)?;
    if x.shape.len() < 2 {
        return fail(node, "an input of rank 2 or more (N, C, ...)");
    }
    let c = x.shape[1];
    let channel = |i: usize| -> Result<&[f32]> {
        let v = req(node, ins, i)?.as_f32().map_err(|e| node.error(e))?;
        if v.len() != c {
            return fail(
                node,
                format!("input {i} must have the {c} channels' values"),
            );
        }
        Ok(v)
    };
    let (scale, bias, mean, var) = (channel(1)?, channel(2)?, channel(3)?, channel(4)?);
    let eps = node.float("epsilon", 1e-5)? as f64;
    let inner: usize = x.shape[2..].iter().product();
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let out = v
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let ch = (i / inner.max(1)) % c;
            let inv = 1.0 / (var[ch] as f64 + eps).sqrt();
            ((e as f64 - mean[ch] as f64) * inv * scale[ch] as f64 + bias[ch] as f64) as f32
        })
        .collect();
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

fn infer_arg(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", 0)?, x.rank())?;
    let mut shape = x.shape.to_vec();
    if node.int("keepdims", 1)? != 0 {
        shape[a] = Expr::Const(1);
    } else {
        shape.remove(a);
    }
    Ok(vec![Fact::new(DType::I64, shape)])
}

/// `ArgMax` / `ArgMin` along `axis`: the index of the first extreme element (the last
/// with `select_last_index`); a NaN is the extreme, as in NumPy.
fn eval_arg(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", 0)?, x.shape.len())?;
    let last = node.int("select_last_index", 0)? != 0;
    let max = node.op == "ArgMax";
    let (outer, n, inner) = split_at(x.shape, a);
    if n == 0 {
        return fail(node, "an empty axis has no extreme element");
    }
    let wide: Vec<f64> = match x.data {
        DataRef::F32(v) => v.iter().map(|&f| f as f64).collect(),
        DataRef::I64(v) => v.iter().map(|&i| i as f64).collect(),
        DataRef::Bool(_) => return fail(node, "unsupported for bool"),
    };
    let better = |e: f64, best: f64| {
        if best.is_nan() {
            false
        } else if e.is_nan() {
            true
        } else if max {
            e > best || (last && e == best)
        } else {
            e < best || (last && e == best)
        }
    };
    let mut out = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| wide[(o * n + j) * inner + i];
            let mut best = 0;
            for j in 1..n {
                if better(at(j), at(best)) {
                    best = j;
                }
            }
            out.push(best as i64);
        }
    }
    let mut shape = x.shape.to_vec();
    if node.int("keepdims", 1)? != 0 {
        shape[a] = 1;
    } else {
        shape.remove(a);
    }
    Ok(vec![Tensor::i64(shape, out)?])
}
