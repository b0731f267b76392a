//! Data movement: `Concat`, `Slice`, `Gather`, `GatherND`, `Transpose`, `Split`,
//! `ReverseSequence`. Their
//! output shapes are expressions over the shape vars like every other op's.
use super::{
    among, axis, const_ints_or_late, eval_via, fail, optional_ints, out_of, req, row_strides,
    runtime_shape, shaped, sym_input_or_late, Dims, OpSpec, Pair,
};
use crate::fact::exact_quotient;
use crate::node::Node;
use crate::Workers;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Concat",
        since: 4,
        infer: infer_concat,
        eval: eval_concat,
        eval_into: Some(eval_concat_into),
    },
    OpSpec {
        name: "Slice",
        since: 10,
        infer: infer_slice,
        eval: eval_slice,
        eval_into: Some(eval_slice_into),
    },
    OpSpec {
        name: "Gather",
        since: 1,
        infer: infer_gather,
        eval: eval_gather,
        eval_into: Some(eval_gather_into),
    },
    OpSpec {
        name: "GatherND",
        since: 11,
        infer: infer_gather_nd,
        eval: eval_gather_nd,
        eval_into: Some(eval_gather_nd_into),
    },
    OpSpec {
        name: "Transpose",
        since: 1,
        infer: infer_transpose,
        eval: eval_transpose,
        eval_into: Some(eval_transpose_into),
    },
    OpSpec {
        name: "ReverseSequence",
        since: 10,
        infer: super::infer_same,
        eval: eval_reverse_sequence,
        eval_into: None,
    },
    OpSpec {
        name: "Split",
        since: 2,
        infer: infer_split,
        eval: eval_split,
        eval_into: Some(eval_split_into),
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
    eval_via(node, ins, eval_concat_into)
}

/// The inputs concatenated along the axis: for each index of the axes before it (a
/// row of the output), each input's block in turn, copied whole — input by input, the
/// rows split over the workers.
fn eval_concat_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let first = *ins
        .iter()
        .flatten()
        .next()
        .ok_or_else(|| node.error("no inputs"))?;
    let r = first.shape.len();
    let a = axis(node, node.int("axis", 0)?, r)?;
    let mut shape: Dims = first.shape.iter().copied().collect();
    shape[a] = 0;
    for t in ins.iter().flatten() {
        if t.shape.len() != r
            || t.shape[..a] != first.shape[..a]
            || t.shape[a + 1..] != first.shape[a + 1..]
        {
            return fail(node, "inputs whose shapes differ off the axis");
        }
        shape[a] += t.shape[a];
    }
    let o = shaped(node, outs, 0, &shape)?;
    let row: usize = shape[a..].iter().product();
    let mut at = 0;
    for t in ins.iter().flatten() {
        let inner: usize = t.shape[a..].iter().product();
        o.data
            .as_mut_of(t.data)
            .ok_or_else(|| node.error("inputs of different element types"))?
            .rows(workers, [row, at, inner], &|o_| o_ * inner);
        at += inner;
    }
    Ok(())
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
    // Each optional input: absent (`Some(None)`), or its values (`None`: at run time).
    let optional = |i: usize| match ins.get(i).copied().flatten() {
        None => Ok(Some(None)),
        Some(_) => const_ints_or_late(node, ins, i).map(|v| v.map(Some)),
    };
    let (axes, steps) = (optional(3)?, optional(4)?);
    let (Some(starts), Some(ends), Some(axes), Some(steps)) = (
        sym_input_or_late(node, ins, 1)?,
        sym_input_or_late(node, ins, 2)?,
        axes.clone(),
        steps,
    ) else {
        // A bound, an axis or a step given at run time: the dims of the axes it may
        // slice are run-time dims.
        let known = axes.flatten();
        let shape = runtime_shape(node, 0, x.rank(), |a| {
            (!among(known.as_deref(), a, x.rank())).then(|| x.shape[a].clone())
        })?;
        return Ok(vec![Fact::new(x.dtype, shape)]);
    };
    let params = slice_params(node, x.rank(), starts, ends, axes, steps)?;
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
    eval_via(node, ins, eval_slice_into)
}

fn eval_slice_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    _: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let r = x.shape.len();
    let (Some(starts), Some(ends)) = (optional_ints(node, ins, 1)?, optional_ints(node, ins, 2)?)
    else {
        return fail(node, "starts and ends are required");
    };
    let (axes, steps) = (optional_ints(node, ins, 3)?, optional_ints(node, ins, 4)?);
    let n = starts.len();
    if ends.len() != n || axes.is_some_and(|a| a.len() != n) || steps.is_some_and(|s| s.len() != n)
    {
        return fail(node, "starts, ends, axes and steps differ in length");
    }
    let mut start: Dims = smallvec::smallvec![0; r];
    let mut step: smallvec::SmallVec<[i64; 8]> = smallvec::smallvec![1; r];
    let mut shape: Dims = x.shape.iter().copied().collect();
    for i in 0..n {
        let a = axis(node, axes.map_or(i as i64, |v| v[i]), r)?;
        let st = steps.map_or(1, |v| v[i]);
        if st == 0 {
            return fail(node, "a step of 0");
        }
        let d = x.shape[a] as i64;
        let (s, e) = slice_bounds(d, starts[i], ends[i], st);
        let len = if st > 0 {
            (e - s + st - 1).max(0) / st
        } else {
            (s - e - st - 1).max(0) / -st
        };
        // A start of -1 (a backward slice that is empty) reads nothing.
        start[a] = s.max(0) as usize;
        step[a] = st;
        shape[a] = len as usize;
    }
    let st = row_strides(x.shape);
    let count: usize = shape.iter().product();
    let o = out_of(node, outs, 0, &shape, x.data)?;
    if count == 0 {
        return Ok(());
    }
    // A strided read from the first element picked (backward steps walk back).
    let base: isize = (0..r).map(|d| (start[d] * st[d]) as isize).sum();
    let walk: smallvec::SmallVec<[isize; 8]> =
        (0..r).map(|d| step[d] as isize * st[d] as isize).collect();
    match o {
        Pair::F32(v, d) => walk_signed(v, base, &shape, &walk, d),
        Pair::I64(v, d) => walk_signed(v, base, &shape, &walk, d),
        Pair::Bool(v, d) => walk_signed(v, base, &shape, &walk, d),
    }
    Ok(())
}

/// `v` read from `base` with `strides` (negative for backward steps) over the shape
/// `out` (of at least one element) into `dst`, row by row.
fn walk_signed<T: Copy>(v: &[T], base: isize, out: &[usize], strides: &[isize], dst: &mut [T]) {
    let r = out.len();
    if r == 0 {
        dst[0] = v[base as usize];
        return;
    }
    let (inner, step) = (out[r - 1], strides[r - 1]);
    let mut counter: Dims = smallvec::smallvec![0; r - 1];
    let mut at = base;
    for row in dst.chunks_exact_mut(inner) {
        if step == 1 {
            let a = at as usize;
            row.copy_from_slice(&v[a..a + inner]);
        } else {
            for (j, o) in row.iter_mut().enumerate() {
                *o = v[(at + j as isize * step) as usize];
            }
        }
        for d in (0..r - 1).rev() {
            counter[d] += 1;
            at += strides[d];
            if counter[d] < out[d] {
                break;
            }
            at -= strides[d] * out[d] as isize;
            counter[d] = 0;
        }
    }
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
    eval_via(node, ins, eval_gather_into)
}

/// For each index of the axes before `axis` and each index given, the data's block
/// after the axis at that index, copied whole (an embedding's rows).
fn eval_gather_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    _: Workers,
) -> Result<()> {
    let (x, i) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let a = axis(node, node.int("axis", 0)?, x.shape.len())?;
    let idx = i.as_i64().map_err(|e| node.error(e))?;
    let outer: usize = x.shape[..a].iter().product();
    let inner: usize = x.shape[a + 1..].iter().product();
    let d = x.shape[a] as i64;
    let mut shape: Dims = x.shape[..a].iter().copied().collect();
    shape.extend(i.shape.iter().copied());
    shape.extend(x.shape[a + 1..].iter().copied());
    let mut o = out_of(node, outs, 0, &shape, x.data)?;
    let mut to = 0;
    for o_ in 0..outer {
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
            o.copy((o_ * d as usize + k as usize) * inner, to, inner);
            to += inner;
        }
    }
    Ok(())
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
    eval_via(node, ins, eval_gather_nd_into)
}

/// For each index tuple (per batch of the first `batch_dims` axes), the data's block
/// after the indexed axes, copied whole.
fn eval_gather_nd_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    _: Workers,
) -> Result<()> {
    let (x, i) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let b = node.int("batch_dims", 0)?.max(0) as usize;
    let idx = i.as_i64().map_err(|e| node.error(e))?;
    let k = *i.shape.last().ok_or_else(|| node.error("scalar indices"))?;
    if b + k > x.shape.len() || b >= i.shape.len() {
        return fail(node, "indices deeper than the data");
    }
    let batch: usize = x.shape[..b].iter().product();
    let per_batch: usize = i.shape[b..i.shape.len() - 1].iter().product();
    let inner: usize = x.shape[b + k..].iter().product();
    let xs = row_strides(x.shape);
    let mut shape: Dims = i.shape[..i.shape.len() - 1].iter().copied().collect();
    shape.extend(x.shape[b + k..].iter().copied());
    let mut o = out_of(node, outs, 0, &shape, x.data)?;
    let mut to = 0;
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
            o.copy(off, to, inner);
            to += inner;
        }
    }
    Ok(())
}

/// The permutation of a `Transpose` (reversed axes by default).
fn perm(node: &Node, rank: usize) -> Result<Dims> {
    let p: Dims = match node.int_list("perm")? {
        Some(p) => p
            .iter()
            .map(|&a| axis(node, a, rank))
            .collect::<Result<_>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen: smallvec::SmallVec<[bool; 8]> = smallvec::smallvec![false; rank];
    for &a in &p {
        if std::mem::replace(&mut seen[a], true) {
            return fail(node, format!("{p:?} is not a permutation of {rank} axes"));
        }
    }
    if p.len() != rank {
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
    eval_via(node, ins, eval_transpose_into)
}

fn eval_transpose_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let p = perm(node, x.shape.len())?;
    let st = row_strides(x.shape);
    let out: Dims = p.iter().map(|&a| x.shape[a]).collect();
    let permuted: Dims = p.iter().map(|&a| st[a]).collect();
    out_of(node, outs, 0, &out, x.data)?.walk(&out, &permuted, workers);
    Ok(())
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
        (Some(_), _) => match sym_input_or_late(node, ins, 1)? {
            Some(s) => Some(s),
            // Sizes given at run time: each part's extent along the axis.
            None => {
                return (0..node.outputs.len())
                    .map(|o| {
                        let shape = runtime_shape(node, o, x.rank(), |d| {
                            (d != a).then(|| x.shape[d].clone())
                        })?;
                        Ok(Fact::new(x.dtype, shape))
                    })
                    .collect()
            }
        },
        (None, Some(s)) => Some(s.into_iter().map(Expr::Const).collect()),
        _ => None,
    };
    let n = node.outputs.len();
    // An extent only the run tells, split in parts: each part's too.
    if given.is_none() && x.shape[a].has_runtime_dims() {
        return (0..n)
            .map(|o| {
                let shape =
                    runtime_shape(node, o, x.rank(), |d| (d != a).then(|| x.shape[d].clone()))?;
                Ok(Fact::new(x.dtype, shape))
            })
            .collect();
    }
    // Opset 18's `num_outputs` over a known extent: the last part may be smaller.
    let uneven = match (&given, x.shape[a].as_const()) {
        (None, Some(d)) if node.attrs.contains_key("num_outputs") && n > 0 => {
            let chunk = (d as usize).div_ceil(n);
            Some(
                (0..n)
                    .map(|k| Expr::Const(chunk.min((d as usize).saturating_sub(k * chunk)) as i64))
                    .collect(),
            )
        }
        _ => None,
    };
    let sizes = split_sizes(node, x.shape[a].clone(), given.or(uneven), n, |d, k| {
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
    eval_via(node, ins, eval_split_into)
}

/// Each output's part of the axis: for each index of the axes before it, its block
/// copied whole.
fn eval_split_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", 0)?, x.shape.len())?;
    let given = match (optional_ints(node, ins, 1)?, node.int_list("split")?) {
        (Some(s), _) | (None, Some(s)) => Some(s),
        _ => None,
    };
    let n = node.outputs.len();
    let dim = x.shape[a];
    if given.is_some_and(|g| g.len() != n) {
        return fail(
            node,
            format!("{} sizes for {n} outputs", given.map_or(0, <[i64]>::len)),
        );
    }
    // Opset 18's `num_outputs` lets the last part be smaller; the others must be even.
    let uneven = node.attrs.contains_key("num_outputs");
    if given.is_none() && (n == 0 || (dim % n != 0 && !uneven)) {
        return fail(node, "the axis does not split evenly");
    }
    let chunk = dim.div_ceil(n.max(1));
    let inner: usize = x.shape[a + 1..].iter().product();
    let mut at = 0usize;
    for k in 0..n {
        let s = given.map_or(chunk.min(dim.saturating_sub(k * chunk)), |g| {
            g[k].max(0) as usize
        });
        if at + s > dim {
            return fail(node, "the sizes exceed the axis");
        }
        let mut shape: Dims = x.shape.iter().copied().collect();
        shape[a] = s;
        let row = s * inner;
        out_of(node, outs, k, &shape, x.data)?
            .rows(workers, [row, 0, row], &|o_| (o_ * dim + at) * inner);
        at += s;
    }
    Ok(())
}

/// `ReverseSequence`: along the time axis, each batch entry's first `sequence_lens[b]`
/// elements reversed, the rest copied.
fn eval_reverse_sequence(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, lens) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let r = x.shape.len();
    let (t, b) = (
        axis(node, node.int("time_axis", 0)?, r)?,
        axis(node, node.int("batch_axis", 1)?, r)?,
    );
    if r < 2 || t == b || t > 1 || b > 1 {
        return fail(
            node,
            "time and batch axes 0 and 1 of an input of rank 2 or more",
        );
    }
    let lens = lens.as_i64().map_err(|e| node.error(e))?;
    let (steps, batch) = (x.shape[t], x.shape[b]);
    if lens.len() != batch || lens.iter().any(|&l| l < 0 || l as usize > steps) {
        return fail(
            node,
            format!("sequence_lens {lens:?} for {batch} sequences of {steps}"),
        );
    }
    let inner: usize = x.shape[2..].iter().product();
    let st = row_strides(x.shape);
    let mut out = x.to_tensor();
    let mut pair = out
        .data
        .as_mut_of(x.data)
        .ok_or_else(|| node.error("the output's element type is not the input's"))?;
    for (j, &l) in lens.iter().enumerate() {
        for i in 0..l as usize {
            let from = i * st[t] + j * st[b];
            let to = (l as usize - 1 - i) * st[t] + j * st[b];
            pair.copy(from, to, inner);
        }
    }
    Ok(vec![out])
}
