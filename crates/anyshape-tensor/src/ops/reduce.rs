//! Reductions and scans over axes: the `Reduce*` family (sum, mean, max, min, product,
//! L1 and L2 norms, sum of squares, log-sum, log-sum-exp), `ArgMax`, `ArgMin`, `TopK`,
//! `CumSum`. The reference accumulates floats in `f64`.
use super::{
    axis, const_ints_or_late, fail, infer_same, late_fact, late_len, req, runtime_shape, split_at,
    OpSpec,
};
use crate::node::Node;
use crate::Workers;
use crate::{DType, Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "ReduceSum",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceMean",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceMax",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceMin",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceProd",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceL1",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceL2",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceSumSquare",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceLogSum",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ReduceLogSumExp",
        since: 1,
        infer: infer_reduce,
        eval: eval_reduce,
        eval_into: Some(eval_reduce_into),
    },
    OpSpec {
        name: "ArgMax",
        since: 11,
        infer: infer_arg,
        eval: eval_arg,
        eval_into: None,
    },
    OpSpec {
        name: "ArgMin",
        since: 11,
        infer: infer_arg,
        eval: eval_arg,
        eval_into: None,
    },
    OpSpec {
        name: "TopK",
        since: 11,
        infer: infer_top_k,
        eval: eval_top_k,
        eval_into: None,
    },
    OpSpec {
        name: "CumSum",
        since: 11,
        infer: infer_same,
        eval: eval_cumsum,
        eval_into: None,
    },
];

/// The reduced axes: an attribute, or (ReduceSum from opset 13, the others from opset
/// 18) an input.
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
    let keep = node.int("keepdims", 1)? != 0;
    let input = match ins.get(1).copied().flatten() {
        None => None,
        Some(_) => match const_ints_or_late(node, ins, 1)? {
            Some(a) => Some(a),
            // Axes given at run time (an empty list is known: no axes).
            None => match late_len(node, ins, 1)? {
                0 => Some(vec![]),
                n => {
                    let rank = match keep {
                        true => x.rank(),
                        false => x
                            .rank()
                            .checked_sub(n)
                            .ok_or_else(|| node.error(format!("{n} axes for rank {}", x.rank())))?,
                    };
                    return late_fact(node, x.dtype, rank);
                }
            },
        },
    };
    let axes = reduce_axes(node, input, x.rank())?;
    let shape = (0..x.rank())
        .filter_map(|i| match (axes.contains(&i), keep) {
            (true, true) => Some(Expr::Const(1)),
            (true, false) => None,
            _ => Some(x.shape[i].clone()),
        })
        .collect();
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// Which group of a reduction each input element belongs to.
enum Groups {
    /// The reduced axes are the trailing ones: each group is a run of this many
    /// consecutive elements (an RMS norm's rows).
    Runs(usize),
    /// Each element's group, in the input's order.
    Offsets(Vec<usize>),
}

impl Groups {
    /// The groups of a tensor of shape `shape` reduced over `axes` (sorted), and the
    /// output's shape with the reduced axes kept as axes of one element.
    fn of(shape: &[usize], axes: &[usize]) -> (Groups, Vec<usize>) {
        let out: Vec<usize> = (0..shape.len())
            .map(|i| if axes.contains(&i) { 1 } else { shape[i] })
            .collect();
        let trailing = axes
            .iter()
            .enumerate()
            .all(|(k, &a)| a == shape.len() - axes.len() + k);
        if trailing {
            let run = axes.iter().map(|&a| shape[a]).product();
            return (Groups::Runs(run), out);
        }
        let mut strides = crate::tensor::strides(&out);
        for &a in axes {
            strides[a] = 0;
        }
        (Groups::Offsets(super::strided_walk(shape, &strides)), out)
    }

    /// The group of element `i`.
    fn at(&self, i: usize) -> usize {
        match self {
            Groups::Runs(n) => i / n,
            Groups::Offsets(o) => o[i],
        }
    }
}

/// Folds the elements of each of `n_out` groups, starting from `init`.
fn fold<T: Copy, A: Copy>(
    v: &[T],
    groups: &Groups,
    n_out: usize,
    init: A,
    f: impl Fn(A, T) -> A,
) -> Vec<A> {
    match groups {
        Groups::Runs(0) => vec![init; n_out],
        Groups::Runs(n) => v
            .chunks_exact(*n)
            .map(|run| run.iter().fold(init, |a, &x| f(a, x)))
            .collect(),
        Groups::Offsets(o) => {
            let mut acc = vec![init; n_out];
            for (&x, &g) in v.iter().zip(o) {
                acc[g] = f(acc[g], x);
            }
            acc
        }
    }
}

/// `Reduce*(x, axes)`: each group of elements over `axes` (all by default; none with
/// `noop_with_empty_axes`) reduced to one. Floats in `f64`; integers (sum, max, min,
/// product) wrap. An empty group gives the reduction's identity (`-inf` for max and
/// the log-sums, `inf` for min, 1 for the product, 0 otherwise), as ONNX defines.
fn eval_reduce(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let input = super::optional_ints(node, ins, 1)?.map(<[i64]>::to_vec);
    let r = x.shape.len();
    let axes = reduce_axes(node, input, r)?;
    let (groups, out_full) = Groups::of(x.shape, &axes);
    let n_out: usize = out_full.iter().product();
    let op = node.op.as_str();
    let data = match x.data {
        DataRef::F32(v) => {
            let count = axes.iter().map(|&a| x.shape[a]).product::<usize>() as f64;
            let sum = |g: fn(f64) -> f64| match groups {
                // Runs summed in eight independent lanes (they vectorize).
                Groups::Runs(n) if n > 0 => v
                    .chunks_exact(n)
                    .map(|run| super::lane_sum(run, |x| g(x as f64)))
                    .collect(),
                _ => fold(v, &groups, n_out, 0.0, |a, e| a + g(e as f64)),
            };
            let nan_or = |a: f64, e: f64, pick: fn(f64, f64) -> f64| {
                if a.is_nan() || e.is_nan() {
                    f64::NAN
                } else {
                    pick(a, e)
                }
            };
            let out: Vec<f64> = match op {
                "ReduceSum" => sum(|e| e),
                "ReduceMean" => sum(|e| e).into_iter().map(|s| s / count).collect(),
                "ReduceL1" => sum(f64::abs),
                "ReduceL2" => sum(|e| e * e).into_iter().map(f64::sqrt).collect(),
                "ReduceSumSquare" => sum(|e| e * e),
                "ReduceLogSum" => sum(|e| e).into_iter().map(f64::ln).collect(),
                "ReduceProd" => fold(v, &groups, n_out, 1.0, |a, e| a * e as f64),
                "ReduceMax" => fold(v, &groups, n_out, f64::NEG_INFINITY, |a, e| {
                    nan_or(a, e as f64, f64::max)
                }),
                "ReduceMin" => fold(v, &groups, n_out, f64::INFINITY, |a, e| {
                    nan_or(a, e as f64, f64::min)
                }),
                "ReduceLogSumExp" => {
                    let max = fold(v, &groups, n_out, f64::NEG_INFINITY, |a, e| a.max(e as f64));
                    // Shifted by each group's maximum (no overflow); an infinite one as 0.
                    let shift: Vec<f64> = max
                        .iter()
                        .map(|&m| if m.is_finite() { m } else { 0.0 })
                        .collect();
                    let mut acc = vec![0f64; n_out];
                    for (i, &e) in v.iter().enumerate() {
                        let g = groups.at(i);
                        acc[g] += (e as f64 - shift[g]).exp();
                    }
                    acc.iter().zip(&shift).map(|(s, m)| s.ln() + m).collect()
                }
                _ => return fail(node, "unsupported for float"),
            };
            Data::F32(out.into_iter().map(|f| f as f32).collect())
        }
        DataRef::I64(v) => Data::I64(match op {
            "ReduceSum" => fold(v, &groups, n_out, 0, i64::wrapping_add),
            "ReduceProd" => fold(v, &groups, n_out, 1, i64::wrapping_mul),
            "ReduceMax" => fold(v, &groups, n_out, i64::MIN, i64::max),
            "ReduceMin" => fold(v, &groups, n_out, i64::MAX, i64::min),
            _ => return fail(node, "unsupported for int64"),
        }),
        // Opset 20's boolean max and min: any and all (true and false where empty).
        DataRef::Bool(v) => Data::Bool(match op {
            "ReduceMax" => fold(v, &groups, n_out, false, |a, b| a | b),
            "ReduceMin" => fold(v, &groups, n_out, true, |a, b| a & b),
            _ => return fail(node, "unsupported for bool"),
        }),
    };
    let shape = if node.int("keepdims", 1)? != 0 {
        out_full
    } else {
        (0..r)
            .filter(|i| !axes.contains(i))
            .map(|i| x.shape[i])
            .collect()
    };
    Ok(vec![Tensor::new(shape, data)?])
}

/// A reduction into a given output: the sums' family over trailing axes of floats
/// (an RMS norm's mean of squares on a decoder's step) in place, as [`eval_reduce`]
/// computes them; other forms evaluated and copied.
fn eval_reduce_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let r = x.shape.len();
    let given = match node.int_list("axes")? {
        Some(a) => Some(a),
        None => super::optional_ints(node, ins, 1)?,
    };
    // Whether the trailing-axes path sums squares (`None`: not a sum it takes).
    let squares = match node.op.as_str() {
        "ReduceSum" | "ReduceMean" if r < 64 => Some(false),
        "ReduceL2" | "ReduceSumSquare" if r < 64 => Some(true),
        _ => None,
    };
    let given = given.filter(|a| !a.is_empty());
    if let (DataRef::F32(v), Some(axes), Some(squares)) = (x.data, given, squares) {
        let (mut mask, mut lo) = (0u64, r);
        for &a in axes {
            let a = axis(node, a, r)?;
            mask |= 1 << a;
            lo = lo.min(a);
        }
        let n: usize = x.shape[lo..].iter().product();
        if mask == ((1u64 << r) - 1) & !((1u64 << lo) - 1) && n > 0 {
            let mut shape: super::Dims = x.shape[..lo].iter().copied().collect();
            if node.int("keepdims", 1)? != 0 {
                shape.extend(std::iter::repeat_n(1, r - lo));
            }
            let o = super::shaped(node, outs, 0, &shape)?.f32_mut()?;
            let (mean, root) = (node.op == "ReduceMean", node.op == "ReduceL2");
            // Each output sums a run of `n`: runs in blocks over the workers, each sum
            // one inlined loop (a function pointer per element took an RMS norm's
            // mean 0.25 ms a row block of 256 x 768).
            workers.chunks_mut_weighted(o, 1, n, |i, o| {
                let sum = match squares {
                    true => super::lane_sum(&v[i * n..][..n], |x| x as f64 * x as f64),
                    false => super::lane_sum(&v[i * n..][..n], |x| x as f64),
                };
                o[0] = match (mean, root) {
                    (true, _) => sum / n as f64,
                    (_, true) => sum.sqrt(),
                    _ => sum,
                } as f32;
            });
            return Ok(());
        }
    }
    let t = eval_reduce(node, ins)?.remove(0);
    let o = super::shaped(node, outs, 0, &t.shape)?;
    match o.data.as_mut_of(t.data.view()) {
        Some(mut p) => p.copy(0, 0, t.len()),
        None => return fail(node, "the output's type is not the input's"),
    }
    Ok(())
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

fn infer_top_k(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", -1)?, x.rank())?;
    let k = match const_ints_or_late(node, ins, 1)?.as_deref() {
        Some(&[k]) if k >= 0 => Some(k),
        // K given at run time: a run-time dim, shared by both outputs.
        None => None,
        _ => return fail(node, "K must be one integer, not negative"),
    };
    let mut shape = x.shape.to_vec();
    shape[a] = match k {
        Some(k) => Expr::Const(k),
        None => runtime_shape(node, 0, a + 1, |_| None)?.remove(a),
    };
    Ok(vec![
        Fact::new(x.dtype, shape.clone()),
        Fact::new(DType::I64, shape),
    ])
}

/// `TopK(x, K)`: along `axis`, the `K` largest (or, with `largest=0`, smallest)
/// elements and their indices, in order (ties: the lower index first).
fn eval_top_k(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", -1)?, x.shape.len())?;
    let k = match super::ints(node, ins, 1)? {
        [k] if *k >= 0 && *k as usize <= x.shape[a] => *k as usize,
        _ => {
            return fail(
                node,
                format!("K must be one integer in [0, {}]", x.shape[a]),
            )
        }
    };
    let largest = node.int("largest", 1)? != 0;
    let (outer, n, inner) = split_at(x.shape, a);
    let wide: Vec<f64> = match x.data {
        DataRef::F32(v) => v.iter().map(|&f| f as f64).collect(),
        DataRef::I64(v) => v.iter().map(|&i| i as f64).collect(),
        DataRef::Bool(_) => return fail(node, "unsupported for bool"),
    };
    let mut picked = vec![0usize; outer * k * inner];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            order.clear();
            order.extend(0..n);
            // A stable sort: equal elements keep the lower index first.
            order.sort_by(|&p, &q| {
                let (p, q) = (wide[at(p)], wide[at(q)]);
                let c = p.partial_cmp(&q).unwrap_or(std::cmp::Ordering::Equal);
                if largest {
                    c.reverse()
                } else {
                    c
                }
            });
            for (r, &j) in order[..k].iter().enumerate() {
                picked[(o * k + r) * inner + i] = j;
            }
        }
    }
    let flat: Vec<usize> = picked
        .iter()
        .enumerate()
        .map(|(p, &j)| {
            let (o, i) = (p / (k * inner), p % inner);
            (o * n + j) * inner + i
        })
        .collect();
    let mut shape = x.shape.to_vec();
    shape[a] = k;
    Ok(vec![
        Tensor::new(shape.clone(), x.data.pick(&flat))?,
        Tensor::i64(shape, picked.into_iter().map(|j| j as i64).collect())?,
    ])
}
