//! Data movement: `Concat`, `Slice`, `Gather`, `GatherND`, `Transpose`, `Split`. Their
//! output shapes are expressions over the shape vars like every other op's.
use super::{axis, const_ints, fail, ints, req, sized, sym_input, OpSpec};
use crate::fact::exact_quotient;
use crate::node::Node;
use crate::tensor::strides;
use crate::{Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Concat",
        since: 4,
        infer: infer_concat,
        eval: eval_concat,
        eval_into: None,
    },
    OpSpec {
        name: "Slice",
        since: 10,
        infer: infer_slice,
        eval: eval_slice,
        eval_into: None,
    },
    OpSpec {
        name: "Gather",
        since: 1,
        infer: infer_gather,
        eval: eval_gather,
        eval_into: None,
    },
    OpSpec {
        name: "GatherND",
        since: 11,
        infer: infer_gather_nd,
        eval: eval_gather_nd,
        eval_into: None,
    },
    OpSpec {
        name: "Transpose",
        since: 1,
        infer: infer_transpose,
        eval: eval_transpose,
        eval_into: None,
    },
    OpSpec {
        name: "Split",
        since: 2,
        infer: infer_split,
        eval: eval_split,
        eval_into: None,
    },
];

fn infer_concat(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let first = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", 0)?, first.rank())?;
    let mut shape = first.shape.to_vec();
    let mut total = Expr::Const(0);
    for f in ins.iter().flatten() {
        if f.rank() != shape.len() {
            return fail(node, "inputs of different ranks");
        }
        total = total + f.shape[a].clone();
    }
    shape[a] = total.simplify();
    if shape.len() == 1 {
        let syms: Option<Vec<Vec<Expr>>> = ins.iter().flatten().map(|f| f.sym.clone()).collect();
        if let Some(s) = syms {
            return Ok(vec![Fact::symbolic(s.concat(), 1)]);
        }
    }
    Ok(vec![Fact::new(first.dtype, shape)])
}

fn eval_concat(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let parts: Vec<TensorRef> = ins.iter().flatten().copied().collect();
    let first = parts.first().ok_or_else(|| node.error("no inputs"))?;
    let r = first.shape.len();
    let a = axis(node, node.int("axis", 0)?, r)?;
    let mut shape = first.shape.to_vec();
    shape[a] = 0;
    for t in &parts {
        if t.shape.len() != r
            || t.shape[..a] != first.shape[..a]
            || t.shape[a + 1..] != first.shape[a + 1..]
        {
            return fail(node, "inputs whose shapes differ off the axis");
        }
        if t.dtype() != first.dtype() {
            return fail(node, "inputs of different element types");
        }
        shape[a] += t.shape[a];
    }
    sized(node, &shape)?;
    let data = match first.data {
        DataRef::F32(_) => Data::F32(interleave(&parts, a, |t| t.as_f32())?),
        DataRef::I64(_) => Data::I64(interleave(&parts, a, |t| t.as_i64())?),
        DataRef::Bool(_) => Data::Bool(interleave(&parts, a, |t| t.as_bool())?),
    };
    Ok(vec![Tensor::new(shape, data)?])
}

/// The elements of `parts` concatenated along axis `a`: for each index of the axes
/// before it, each part's block in turn, copied whole.
fn interleave<'a, T: Copy + 'a>(
    parts: &[TensorRef<'a>],
    a: usize,
    get: impl Fn(&TensorRef<'a>) -> Result<&'a [T]>,
) -> Result<Vec<T>> {
    let outer: usize = parts[0].shape[..a].iter().product();
    let blocks = parts
        .iter()
        .map(|t| Ok((get(t)?, t.shape[a..].iter().product::<usize>())))
        .collect::<Result<Vec<(&[T], usize)>>>()?;
    let mut out = Vec::with_capacity(blocks.iter().map(|b| b.0.len()).sum());
    for o in 0..outer {
        for &(data, inner) in &blocks {
            out.extend_from_slice(&data[o * inner..(o + 1) * inner]);
        }
    }
    Ok(out)
}

/// Bounds at least this large mean "to the end".
const TO_END: i64 = i64::MAX / 4;

/// One axis of a `Slice`: the start and the length, symbolic.
fn slice_axis(
    node: &Node,
    dim: &Expr,
    start: &Expr,
    end: &Expr,
    step: i64,
) -> Result<(Expr, Expr)> {
    let norm = |v: &Expr| -> Expr {
        match v.as_const() {
            Some(c) if c >= TO_END => dim.clone(),
            Some(c) if c < 0 => (dim.clone() + c).simplify(),
            _ => v.clone(),
        }
    };
    if let (Some(d), Some(s), Some(e)) = (dim.as_const(), start.as_const(), end.as_const()) {
        let (s, e) = slice_bounds(d, s, e, step);
        let len = if step > 0 {
            (e - s + step - 1).max(0) / step
        } else {
            (s - e - step - 1).max(0) / -step
        };
        return Ok((Expr::Const(s), Expr::Const(len)));
    }
    if step != 1 {
        return fail(node, "a symbolic slice with a step other than 1");
    }
    let (s, e) = (norm(start), norm(end));
    let e = if e == *dim {
        e
    } else {
        Expr::min(e, dim.clone())
    };
    Ok((s.clone(), (e - s).simplify()))
}

/// Concrete `Slice` bounds, clamped as ONNX says.
fn slice_bounds(dim: i64, start: i64, end: i64, step: i64) -> (i64, i64) {
    let norm = |v: i64| if v < 0 { v + dim } else { v };
    let (s, e) = (norm(start), norm(end));
    if step > 0 {
        (s.clamp(0, dim), e.clamp(0, dim))
    } else {
        (s.clamp(-1, dim - 1), e.clamp(-1, dim - 1))
    }
}

/// `(axes, starts, ends, steps)` of a `Slice` (inputs since opset 10).
fn slice_params<T: Clone>(
    node: &Node,
    rank: usize,
    starts: Vec<T>,
    ends: Vec<T>,
    axes: Option<Vec<i64>>,
    steps: Option<Vec<i64>>,
) -> Result<Vec<(usize, T, T, i64)>> {
    let n = starts.len();
    if ends.len() != n {
        return fail(node, "starts and ends differ in length");
    }
    let axes = axes.unwrap_or_else(|| (0..n as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; n]);
    if axes.len() != n || steps.len() != n {
        return fail(node, "axes or steps differ in length from starts");
    }
    (0..n)
        .map(|i| {
            if steps[i] == 0 {
                return fail(node, "a step of 0");
            }
            Ok((
                axis(node, axes[i], rank)?,
                starts[i].clone(),
                ends[i].clone(),
                steps[i],
            ))
        })
        .collect()
}

fn infer_slice(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let axes = ins
        .get(3)
        .copied()
        .flatten()
        .map(|_| const_ints(node, ins, 3))
        .transpose()?;
    let steps = ins
        .get(4)
        .copied()
        .flatten()
        .map(|_| const_ints(node, ins, 4))
        .transpose()?;
    let params = slice_params(
        node,
        x.rank(),
        sym_input(node, ins, 1)?,
        sym_input(node, ins, 2)?,
        axes,
        steps,
    )?;
    let mut shape = x.shape.to_vec();
    let mut picks: Vec<(usize, Expr, Expr, i64)> = Vec::new();
    for (a, s, e, step) in params {
        let (start, len) = slice_axis(node, &x.shape[a], &s, &e, step)?;
        shape[a] = len.clone();
        picks.push((a, start, len, step));
    }
    if let (Some(sym), 1) = (&x.sym, x.rank()) {
        if let [(0, start, len, step)] = picks.as_slice() {
            if let (Some(s), Some(l)) = (start.as_const(), len.as_const()) {
                let v: Vec<Expr> = (0..l)
                    .map(|i| sym[(s + i * step) as usize].clone())
                    .collect();
                return Ok(vec![Fact::symbolic(v, 1)]);
            }
        }
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_slice(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let axes = super::optional_ints(node, ins, 3)?;
    let steps = super::optional_ints(node, ins, 4)?;
    let params = slice_params(
        node,
        x.shape.len(),
        ints(node, ins, 1)?,
        ints(node, ins, 2)?,
        axes,
        steps,
    )?;
    let r = x.shape.len();
    let mut start = vec![0i64; r];
    let mut step = vec![1i64; r];
    let mut shape = x.shape.to_vec();
    for (a, s, e, st) in params {
        let d = x.shape[a] as i64;
        let (s, e) = slice_bounds(d, s, e, st);
        let len = if st > 0 {
            (e - s + st - 1).max(0) / st
        } else {
            (s - e - st - 1).max(0) / -st
        };
        start[a] = s;
        step[a] = st;
        shape[a] = len as usize;
    }
    let st = strides(x.shape);
    let n: usize = shape.iter().product();
    if n > 0 && step.iter().all(|&s| s > 0) {
        // Forward steps: a strided read from the first element, row by row.
        let base: usize = (0..r).map(|d| start[d] as usize * st[d]).sum();
        let walk: Vec<usize> = (0..r).map(|d| step[d] as usize * st[d]).collect();
        let from = match x.data {
            DataRef::F32(v) => DataRef::F32(&v[base..]),
            DataRef::I64(v) => DataRef::I64(&v[base..]),
            DataRef::Bool(v) => DataRef::Bool(&v[base..]),
        };
        let data = super::strided(from, &shape, &walk);
        return Ok(vec![Tensor::new(shape, data)?]);
    }
    let mut idx = Vec::with_capacity(n);
    let mut counter = vec![0usize; r];
    for _ in 0..n {
        let flat: i64 = (0..r)
            .map(|d| (start[d] + counter[d] as i64 * step[d]) * st[d] as i64)
            .sum();
        idx.push(flat as usize);
        for d in (0..r).rev() {
            counter[d] += 1;
            if counter[d] < shape[d] {
                break;
            }
            counter[d] = 0;
        }
    }
    Ok(vec![Tensor::new(shape, x.data.pick(&idx))?])
}

fn infer_gather(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, i) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let a = axis(node, node.int("axis", 0)?, x.rank())?;
    let mut shape = x.shape[..a].to_vec();
    shape.extend(i.shape.iter().cloned());
    shape.extend(x.shape[a + 1..].iter().cloned());
    if let (Some(sym), Some(idx), 1) = (&x.sym, &i.value, x.rank()) {
        let idx = idx.as_i64().map_err(|e| node.error(e))?;
        let n = sym.len() as i64;
        let picked: Option<Vec<Expr>> = idx
            .iter()
            .map(|&k| {
                let k = if k < 0 { k + n } else { k };
                sym.get(usize::try_from(k).ok()?).cloned()
            })
            .collect();
        let picked = picked.ok_or_else(|| node.error("an index out of range"))?;
        return Ok(vec![Fact::symbolic(picked, i.rank())]);
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_gather(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, i) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let a = axis(node, node.int("axis", 0)?, x.shape.len())?;
    let idx = i.as_i64().map_err(|e| node.error(e))?;
    let outer: usize = x.shape[..a].iter().product();
    let inner: usize = x.shape[a + 1..].iter().product();
    let d = x.shape[a] as i64;
    sized(node, &[outer, idx.len(), inner])?;
    let mut order = Vec::with_capacity(outer * idx.len() * inner);
    for o in 0..outer {
        for &given in idx {
            let k = if given < 0 { given + d } else { given };
            if !(0..d).contains(&k) {
                return fail(
                    node,
                    format!(
                        "index {given} is out of range [-{d}, {d}) of axis {a} of its data (shape {:?})",
                        x.shape
                    ),
                );
            }
            let base = (o * d as usize + k as usize) * inner;
            order.extend(base..base + inner);
        }
    }
    let mut shape = x.shape[..a].to_vec();
    shape.extend(i.shape.iter());
    shape.extend(&x.shape[a + 1..]);
    Ok(vec![Tensor::new(shape, x.data.pick(&order))?])
}

fn infer_gather_nd(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, i) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let b = node.int("batch_dims", 0)? as usize;
    let k = i
        .shape
        .last()
        .and_then(|e| e.as_const())
        .ok_or_else(|| node.error("the last dim of the indices must be a constant"))?
        as usize;
    if b + k > x.rank() || i.rank() == 0 {
        return fail(node, "indices deeper than the data");
    }
    let mut shape = i.shape[..i.rank() - 1].to_vec();
    shape.extend(x.shape[b + k..].iter().cloned());
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_gather_nd(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, i) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let b = node.int("batch_dims", 0)? as usize;
    let idx = i.as_i64().map_err(|e| node.error(e))?;
    let k = *i.shape.last().ok_or_else(|| node.error("scalar indices"))?;
    if b + k > x.shape.len() || b >= i.shape.len() {
        return fail(node, "indices deeper than the data");
    }
    let batch: usize = x.shape[..b].iter().product();
    let per_batch: usize = i.shape[b..i.shape.len() - 1].iter().product();
    let inner: usize = x.shape[b + k..].iter().product();
    let xs = strides(x.shape);
    let mut order = Vec::new();
    for bi in 0..batch {
        let base = bi * x.shape[b..].iter().product::<usize>();
        for p in 0..per_batch {
            let at = (bi * per_batch + p) * k;
            let mut off = base;
            for j in 0..k {
                let d = x.shape[b + j] as i64;
                let given = idx[at + j];
                let v = if given < 0 { given + d } else { given };
                if !(0..d).contains(&v) {
                    return fail(
                        node,
                        format!(
                            "index {given} is out of range [-{d}, {d}) of axis {} of its data",
                            b + j
                        ),
                    );
                }
                off += v as usize * xs[b + j];
            }
            order.extend(off..off + inner);
        }
    }
    let mut shape = i.shape[..i.shape.len() - 1].to_vec();
    shape.extend(&x.shape[b + k..]);
    Ok(vec![Tensor::new(shape, x.data.pick(&order))?])
}

/// The permutation of a `Transpose` (reversed axes by default).
fn perm(node: &Node, rank: usize) -> Result<Vec<usize>> {
    let p: Vec<usize> = match node.ints("perm")? {
        Some(p) => p
            .iter()
            .map(|&a| axis(node, a, rank))
            .collect::<Result<_>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut sorted = p.clone();
    sorted.sort();
    if sorted != (0..rank).collect::<Vec<_>>() {
        return fail(node, format!("{p:?} is not a permutation of {rank} axes"));
    }
    Ok(p)
}

fn infer_transpose(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let p = perm(node, x.rank())?;
    Ok(vec![Fact::new(
        x.dtype,
        p.iter().map(|&a| x.shape[a].clone()).collect(),
    )])
}

fn eval_transpose(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let p = perm(node, x.shape.len())?;
    let st = strides(x.shape);
    let out: Vec<usize> = p.iter().map(|&a| x.shape[a]).collect();
    let permuted: Vec<usize> = p.iter().map(|&a| st[a]).collect();
    let data = super::strided(x.data, &out, &permuted);
    Ok(vec![Tensor::new(out, data)?])
}

/// The sizes of a `Split` along its axis of `dim`, as `T`s.
fn split_sizes<T: Clone>(
    node: &Node,
    dim: T,
    given: Option<Vec<T>>,
    outputs: usize,
    div: impl Fn(T, usize) -> Option<T>,
) -> Result<Vec<T>> {
    if let Some(g) = given {
        if g.len() != outputs {
            return fail(node, format!("{} sizes for {outputs} outputs", g.len()));
        }
        return Ok(g);
    }
    let part = div(dim, outputs).ok_or_else(|| node.error("the axis does not split evenly"))?;
    Ok(vec![part; outputs])
}

fn infer_split(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", 0)?, x.rank())?;
    let given = match (ins.get(1).copied().flatten(), node.ints("split")?) {
        (Some(_), _) => Some(sym_input(node, ins, 1)?),
        (None, Some(s)) => Some(s.into_iter().map(Expr::Const).collect()),
        _ => None,
    };
    let n = node.outputs.len();
    let sizes = split_sizes(node, x.shape[a].clone(), given, n, |d, k| {
        exact_quotient(&[d], &[Expr::Const(k as i64)])
    })?;
    Ok(sizes
        .into_iter()
        .map(|s| {
            let mut shape = x.shape.to_vec();
            shape[a] = s;
            Fact::new(x.dtype, shape)
        })
        .collect())
}

fn eval_split(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", 0)?, x.shape.len())?;
    let given = match (ins.get(1).copied().flatten(), node.ints("split")?) {
        (Some(_), _) => Some(ints(node, ins, 1)?),
        (None, Some(s)) => Some(s),
        _ => None,
    };
    let n = node.outputs.len();
    let sizes = split_sizes(node, x.shape[a] as i64, given, n, |d, k| {
        (d % k as i64 == 0).then(|| d / k as i64)
    })?;
    let outer: usize = x.shape[..a].iter().product();
    let inner: usize = x.shape[a + 1..].iter().product();
    let mut out = Vec::new();
    let mut at = 0usize;
    for s in sizes {
        let s = s.max(0) as usize;
        if at + s > x.shape[a] {
            return fail(node, "the sizes exceed the axis");
        }
        let mut order = Vec::with_capacity(outer * s * inner);
        for o in 0..outer {
            let base = (o * x.shape[a] + at) * inner;
            order.extend(base..base + s * inner);
        }
        let mut shape = x.shape.to_vec();
        shape[a] = s;
        out.push(Tensor::new(shape, x.data.pick(&order))?);
        at += s;
    }
    Ok(out)
}
