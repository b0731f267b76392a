//! Data movement and shape plumbing: `Shape`, `Reshape`, `Flatten`, `Unsqueeze`,
//! `Squeeze`, `Concat`, `Slice`, `Gather`, `GatherND`, `Expand`, `Range`,
//! `ConstantOfShape`, `Transpose`, `Split`, `Constant`. Shapes they compute from other
//! shapes stay expressions over the shape vars (folded at compile time), so the
//! runtime only evaluates expressions.
use super::{axis, broadcast_shape, broadcast_strides, const_ints, fail, req, sized, OpSpec};
use crate::fact::{broadcast, exact_quotient};
use crate::node::{Attr, Node};
use crate::tensor::strides;
use crate::{Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Shape",
        since: 1,
        infer: infer_shape,
        eval: eval_shape,
    },
    OpSpec {
        name: "Reshape",
        since: 5,
        infer: infer_reshape,
        eval: eval_reshape,
    },
    OpSpec {
        name: "Flatten",
        since: 9,
        infer: infer_reshape,
        eval: eval_reshape,
    },
    OpSpec {
        name: "Unsqueeze",
        since: 1,
        infer: infer_reshape,
        eval: eval_reshape,
    },
    OpSpec {
        name: "Squeeze",
        since: 1,
        infer: infer_reshape,
        eval: eval_reshape,
    },
    OpSpec {
        name: "Concat",
        since: 4,
        infer: infer_concat,
        eval: eval_concat,
    },
    OpSpec {
        name: "Slice",
        since: 10,
        infer: infer_slice,
        eval: eval_slice,
    },
    OpSpec {
        name: "Gather",
        since: 1,
        infer: infer_gather,
        eval: eval_gather,
    },
    OpSpec {
        name: "GatherND",
        since: 11,
        infer: infer_gather_nd,
        eval: eval_gather_nd,
    },
    OpSpec {
        name: "Expand",
        since: 8,
        infer: infer_expand,
        eval: eval_expand,
    },
    OpSpec {
        name: "Range",
        since: 11,
        infer: infer_range,
        eval: eval_range,
    },
    OpSpec {
        name: "ConstantOfShape",
        since: 9,
        infer: infer_constant_of_shape,
        eval: eval_constant_of_shape,
    },
    OpSpec {
        name: "Transpose",
        since: 1,
        infer: infer_transpose,
        eval: eval_transpose,
    },
    OpSpec {
        name: "Split",
        since: 2,
        infer: infer_split,
        eval: eval_split,
    },
    OpSpec {
        name: "Constant",
        since: 9,
        infer: infer_constant,
        eval: eval_constant,
    },
];

/// The symbolic elements of input `i` (a shape vector), which the op needs.
fn sym_input(node: &Node, ins: &[Option<&Fact>], i: usize) -> Result<Vec<Expr>> {
    let f = req(node, ins, i)?;
    f.sym.clone().ok_or_else(|| {
        node.error(format!(
            "input {i} (a shape) could not be computed at compile time from the inputs' dims"
        ))
    })
}

/// The concrete integers of input `i`.
fn ints(node: &Node, ins: &[Option<TensorRef>], i: usize) -> Result<Vec<i64>> {
    Ok(req(node, ins, i)?
        .as_i64()
        .map_err(|e| node.error(e))?
        .to_vec())
}

fn dims_as_i64(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// `[start, end)` of `Shape` (opset 15), clamped.
fn shape_range(node: &Node, rank: usize) -> Result<(usize, usize)> {
    let r = rank as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    Ok((clamp(node.int("start", 0)?), clamp(node.int("end", r)?)))
}

fn infer_shape(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let (s, e) = shape_range(node, x.rank())?;
    Ok(vec![Fact::symbolic(x.shape[s..e.max(s)].to_vec(), 1)])
}

fn eval_shape(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let (s, e) = shape_range(node, x.shape.len())?;
    let d = dims_as_i64(&x.shape[s..e.max(s)]);
    Ok(vec![Tensor::i64(vec![d.len()], d)?])
}

/// The output shape of the reshaping ops (`Reshape`, `Flatten`, `Unsqueeze`,
/// `Squeeze`) from the input's shape and the target (given as expressions).
fn reshaped<T: Clone + PartialEq + std::fmt::Debug>(
    node: &Node,
    input: &[T],
    target: Option<&[T]>,
    axes: Option<&[i64]>,
    one: T,
    as_int: impl Fn(&T) -> Option<i64>,
    quotient: impl Fn(&[T], &[T]) -> Option<T>,
) -> Result<Vec<T>> {
    match node.op.as_str() {
        "Reshape" => {
            let target = target.expect("Reshape has a target");
            let allowzero = node.int("allowzero", 0)? != 0;
            let mut out: Vec<Option<T>> = Vec::new();
            for (i, t) in target.iter().enumerate() {
                out.push(match as_int(t) {
                    Some(0) if !allowzero => Some(
                        input
                            .get(i)
                            .cloned()
                            .ok_or_else(|| node.error("0 copies a dim the input does not have"))?,
                    ),
                    Some(-1) => None,
                    Some(v) if v < -1 => return fail(node, format!("target dim {v}")),
                    _ => Some(t.clone()),
                });
            }
            let unknown = out.iter().filter(|d| d.is_none()).count();
            if unknown > 1 {
                return fail(node, "more than one -1 in the target shape");
            }
            if unknown == 1 {
                let known: Vec<T> = out.iter().flatten().cloned().collect();
                let q = quotient(input, &known).ok_or_else(|| {
                    node.error(format!(
                        "cannot infer the -1 of the target {target:?} from the input {input:?}"
                    ))
                })?;
                for d in out.iter_mut() {
                    if d.is_none() {
                        *d = Some(q.clone());
                    }
                }
            }
            Ok(out.into_iter().flatten().collect())
        }
        "Flatten" => {
            let a = node.int("axis", 1)?;
            let r = input.len() as i64;
            let a = (if a < 0 { a + r } else { a }).clamp(0, r) as usize;
            let left = quotient(&input[..a], &[]).expect("a product");
            let right = quotient(&input[a..], &[]).expect("a product");
            Ok(vec![left, right])
        }
        "Unsqueeze" => {
            let axes = axes.ok_or_else(|| node.error("no axes"))?;
            let r = input.len() + axes.len();
            let mut ax: Vec<usize> = axes
                .iter()
                .map(|&a| axis(node, a, r))
                .collect::<Result<_>>()?;
            ax.sort();
            ax.dedup();
            let mut out = Vec::with_capacity(r);
            let mut it = input.iter();
            for i in 0..r {
                if ax.contains(&i) {
                    out.push(one.clone());
                } else {
                    out.push(
                        it.next()
                            .ok_or_else(|| node.error("repeated axes"))?
                            .clone(),
                    );
                }
            }
            Ok(out)
        }
        _ => {
            // Squeeze: the given axes (which must be 1), or every dim that is 1.
            let r = input.len();
            let ax: Vec<usize> = match axes {
                Some(a) => a.iter().map(|&a| axis(node, a, r)).collect::<Result<_>>()?,
                None => (0..r).filter(|&i| as_int(&input[i]) == Some(1)).collect(),
            };
            for &a in &ax {
                if as_int(&input[a]).is_some_and(|v| v != 1) {
                    return fail(node, format!("axis {a} is {:?}, not 1", input[a]));
                }
            }
            Ok((0..r)
                .filter(|i| !ax.contains(i))
                .map(|i| input[i].clone())
                .collect())
        }
    }
}

/// The axes of `Unsqueeze`/`Squeeze`: an attribute before opset 13, an input after.
fn squeeze_axes(node: &Node, from_input: Option<Vec<i64>>) -> Result<Option<Vec<i64>>> {
    match node.ints("axes")? {
        Some(a) => Ok(Some(a)),
        None => Ok(from_input),
    }
}

fn infer_reshape(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let target = if node.op == "Reshape" {
        Some(sym_input(node, ins, 1)?)
    } else {
        None
    };
    let axes = match node.op.as_str() {
        "Unsqueeze" | "Squeeze" if ins.get(1).copied().flatten().is_some() => {
            squeeze_axes(node, Some(const_ints(node, ins, 1)?))?
        }
        "Unsqueeze" | "Squeeze" => squeeze_axes(node, None)?,
        _ => None,
    };
    let shape = reshaped(
        node,
        &x.shape,
        target.as_deref(),
        axes.as_deref(),
        Expr::Const(1),
        Expr::as_const,
        exact_quotient,
    )?;
    // Reshaping a shape vector keeps its elements.
    let mut f = Fact::new(x.dtype, shape.clone());
    if let Some(s) = &x.sym {
        if shape.len() <= 1 {
            f = Fact::symbolic(s.clone(), shape.len());
        }
    }
    Ok(vec![f])
}

fn eval_reshape(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let target = if node.op == "Reshape" {
        Some(ints(node, ins, 1)?)
    } else {
        None
    };
    let axes = match node.op.as_str() {
        "Unsqueeze" | "Squeeze" if ins.get(1).copied().flatten().is_some() => {
            squeeze_axes(node, Some(ints(node, ins, 1)?))?
        }
        "Unsqueeze" | "Squeeze" => squeeze_axes(node, None)?,
        _ => None,
    };
    let input = dims_as_i64(x.shape);
    let shape = reshaped(
        node,
        &input,
        target.as_deref(),
        axes.as_deref(),
        1i64,
        |v| Some(*v),
        |num, den| {
            let n: i64 = num.iter().product();
            let d: i64 = den.iter().product();
            (d != 0 && n % d == 0).then(|| n / d)
        },
    )?;
    let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    Ok(vec![x.reshaped(shape).map_err(|e| node.error(e))?])
}

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
    let outer: usize = first.shape[..a].iter().product();
    let mut shape = first.shape.to_vec();
    shape[a] = parts
        .iter()
        .map(|t| t.shape.get(a).copied().unwrap_or(0))
        .sum();
    let mut order = Vec::new();
    let mut offsets = Vec::new();
    let mut base = 0;
    for t in &parts {
        if t.shape.len() != r
            || t.shape[..a] != first.shape[..a]
            || t.shape[a + 1..] != first.shape[a + 1..]
        {
            return fail(node, "inputs whose shapes differ off the axis");
        }
        offsets.push(base);
        base += t.len();
    }
    let all = concat_data(node, &parts)?;
    for o in 0..outer {
        for (t, &off) in parts.iter().zip(&offsets) {
            let inner: usize = t.shape[a..].iter().product();
            order.extend(off + o * inner..off + (o + 1) * inner);
        }
    }
    Ok(vec![Tensor::new(shape, all.pick(&order))?])
}

/// The data of `parts` one after another.
fn concat_data(node: &Node, parts: &[TensorRef]) -> Result<Data> {
    fn all<'a, T: Clone + 'a>(
        node: &Node,
        parts: &[TensorRef<'a>],
        get: impl Fn(&TensorRef<'a>) -> Result<&'a [T]>,
    ) -> Result<Vec<T>> {
        Ok(parts
            .iter()
            .map(get)
            .collect::<Result<Vec<_>>>()
            .map_err(|e| node.error(e))?
            .concat())
    }
    Ok(match parts[0].data {
        DataRef::F32(_) => Data::F32(all(node, parts, TensorRef::as_f32)?),
        DataRef::I64(_) => Data::I64(all(node, parts, TensorRef::as_i64)?),
        DataRef::Bool(_) => Data::Bool(all(node, parts, TensorRef::as_bool)?),
    })
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
    let axes = ins
        .get(3)
        .copied()
        .flatten()
        .map(|_| ints(node, ins, 3))
        .transpose()?;
    let steps = ins
        .get(4)
        .copied()
        .flatten()
        .map(|_| ints(node, ins, 4))
        .transpose()?;
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

fn infer_expand(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let target = sym_input(node, ins, 1)?;
    let shape = broadcast(&x.shape, &target).map_err(|e| node.error(e))?;
    if let (Some(sym), true) = (&x.sym, shape.len() <= 1) {
        let n = shape.first().and_then(|d| d.as_const()).unwrap_or(1) as usize;
        if sym.len() == n || sym.len() == 1 {
            let v = (0..n)
                .map(|i| {
                    if sym.len() == 1 {
                        sym[0].clone()
                    } else {
                        sym[i].clone()
                    }
                })
                .collect();
            return Ok(vec![Fact::symbolic(v, shape.len())]);
        }
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_expand(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let target: Vec<usize> = ints(node, ins, 1)?
        .iter()
        .map(|&d| d.max(0) as usize)
        .collect();
    let out = broadcast_shape(x.shape, &target)
        .ok_or_else(|| node.error(format!("{:?} does not expand to {target:?}", x.shape)))?;
    sized(node, &out)?;
    let data = super::strided(x.data, &out, &broadcast_strides(x.shape, out.len()));
    Ok(vec![Tensor::new(out, data)?])
}

fn infer_range(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let start = sym_input(node, ins, 0)?;
    let limit = sym_input(node, ins, 1)?;
    let delta = sym_input(node, ins, 2)?;
    let (Some(s), Some(l), Some(d)) = (start.first(), limit.first(), delta.first()) else {
        return fail(node, "start, limit and delta must be scalars");
    };
    let len = match d.as_const() {
        Some(1) => (l.clone() - s.clone()).simplify(),
        Some(c) if c > 0 => Expr::ceil_div(l.clone() - s.clone(), Expr::Const(c)).simplify(),
        _ => return fail(node, "a symbolic range needs a positive constant step"),
    };
    let dtype = req(node, ins, 0)?.dtype;
    Ok(vec![Fact::new(
        dtype,
        vec![Expr::max(len, Expr::Const(0)).simplify()],
    )])
}

fn eval_range(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (s, l, d) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    match (&s.data, &l.data, &d.data) {
        (DataRef::I64(s), DataRef::I64(l), DataRef::I64(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            if d == 0 {
                return fail(node, "a step of 0");
            }
            let n = ((l as f64 - s as f64) / d as f64).ceil().max(0.0) as usize;
            sized(node, &[n])?;
            let v: Vec<i64> = (0..n as i64).map(|i| s + i * d).collect();
            Ok(vec![Tensor::i64(vec![n], v)?])
        }
        (DataRef::F32(s), DataRef::F32(l), DataRef::F32(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            if d == 0.0 || !(l - s).is_finite() {
                return fail(node, "a step of 0 or an infinite range");
            }
            let n = ((l - s) / d).ceil().max(0.0) as usize;
            sized(node, &[n])?;
            let v: Vec<f32> = (0..n).map(|i| s + i as f32 * d).collect();
            Ok(vec![Tensor::f32(vec![n], v)?])
        }
        _ => fail(node, "mixed element types"),
    }
}

/// The fill value of `ConstantOfShape` (a float 0 by default).
fn fill_value(node: &Node) -> Result<Tensor> {
    match node.attrs.get("value") {
        Some(Attr::Tensor(t)) if t.len() == 1 => Ok(t.clone()),
        None => Tensor::f32(vec![1], vec![0.0]),
        _ => fail(node, "`value` must be a one-element tensor"),
    }
}

fn infer_constant_of_shape(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let shape = sym_input(node, ins, 0)?;
    let v = fill_value(node)?;
    // A shape vector filled with a constant stays symbolic.
    if let (Data::I64(c), 1) = (&v.data, shape.len()) {
        if let Some(n) = shape[0].as_const() {
            return Ok(vec![Fact::symbolic(
                vec![Expr::Const(c[0]); n.max(0) as usize],
                1,
            )]);
        }
    }
    Ok(vec![Fact::new(v.dtype(), shape)])
}

fn eval_constant_of_shape(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let shape: Vec<usize> = ints(node, ins, 0)?
        .iter()
        .map(|&d| d.max(0) as usize)
        .collect();
    let v = fill_value(node)?;
    let n = sized(node, &shape)?;
    Ok(vec![Tensor::new(shape, v.data.filled(0, n))?])
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

/// The tensor of a `Constant`.
fn constant(node: &Node) -> Result<Tensor> {
    match node.attrs.iter().next() {
        Some((k, Attr::Tensor(t))) if k == "value" => Ok(t.clone()),
        Some((k, Attr::Float(f))) if k == "value_float" => Tensor::f32(vec![], vec![*f]),
        Some((k, Attr::Int(i))) if k == "value_int" => Ok(Tensor::scalar_i64(*i)),
        Some((k, Attr::Floats(f))) if k == "value_floats" => Tensor::f32(vec![f.len()], f.clone()),
        Some((k, Attr::Ints(i))) if k == "value_ints" => Tensor::i64(vec![i.len()], i.clone()),
        _ => fail(
            node,
            "a Constant needs one of value, value_float, value_int, value_floats, value_ints",
        ),
    }
}

fn infer_constant(node: &Node, _: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    Ok(vec![Fact::known(constant(node)?)])
}

fn eval_constant(node: &Node, _: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    Ok(vec![constant(node)?])
}
