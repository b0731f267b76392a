//! Shape plumbing: `Shape`, `Size`, `Reshape`, `Flatten`, `Unsqueeze`, `Squeeze`, `Expand`,
//! `Range`, `ConstantOfShape`, `Constant`. Shapes they compute from other shapes stay
//! expressions over the shape vars (folded at compile time), so the runtime only
//! evaluates expressions.
use super::{
    axis, broadcast_strides, const_ints_or_late, eval_via, fail, ints, late_fact, late_len, out_of,
    req, shaped, sized, sym_input_or_late, Dims, OpSpec,
};
use crate::fact::{broadcast, exact_quotient};
use crate::node::{Attr, Node};
use crate::Workers;
use crate::{DType, Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Shape",
        since: 1,
        infer: infer_shape,
        eval: eval_shape,
        eval_into: None,
    },
    OpSpec {
        name: "Size",
        since: 1,
        infer: infer_size,
        eval: eval_size,
        eval_into: None,
    },
    OpSpec {
        name: "Reshape",
        since: 5,
        infer: infer_reshape,
        eval: eval_reshape,
        eval_into: None,
    },
    OpSpec {
        name: "Flatten",
        since: 9,
        infer: infer_reshape,
        eval: eval_reshape,
        eval_into: None,
    },
    OpSpec {
        name: "Unsqueeze",
        since: 1,
        infer: infer_reshape,
        eval: eval_reshape,
        eval_into: None,
    },
    OpSpec {
        name: "Squeeze",
        since: 1,
        infer: infer_reshape,
        eval: eval_reshape,
        eval_into: None,
    },
    OpSpec {
        name: "Expand",
        since: 8,
        infer: infer_expand,
        eval: eval_expand,
        eval_into: Some(eval_expand_into),
    },
    OpSpec {
        name: "Range",
        since: 11,
        infer: infer_range,
        eval: eval_range,
        eval_into: Some(eval_range_into),
    },
    OpSpec {
        name: "ConstantOfShape",
        since: 9,
        infer: infer_constant_of_shape,
        eval: eval_constant_of_shape,
        eval_into: None,
    },
    OpSpec {
        name: "Constant",
        since: 9,
        infer: infer_constant,
        eval: eval_constant,
        eval_into: None,
    },
];

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

/// `Size`: the number of elements, a scalar (an expression over the shape vars).
fn infer_size(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let n = x.shape.iter().cloned().fold(Expr::Const(1), |a, d| a * d);
    Ok(vec![Fact::symbolic(vec![n], 0)])
}

fn eval_size(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    Ok(vec![Tensor::scalar_i64(
        x.shape.iter().product::<usize>() as i64
    )])
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
    // A target shape or axes given at run time: the rank is known, the dims are not.
    let late = |rank: Option<usize>| -> Result<Vec<Fact>> {
        let rank = rank.ok_or_else(|| node.error("more axes than the input's rank"))?;
        late_fact(node, x.dtype, rank)
    };
    let target = if node.op == "Reshape" {
        match sym_input_or_late(node, ins, 1)? {
            Some(t) => Some(t),
            None => return late(Some(late_len(node, ins, 1)?)),
        }
    } else {
        None
    };
    let axes = match node.op.as_str() {
        "Unsqueeze" | "Squeeze" if ins.get(1).copied().flatten().is_some() => {
            match const_ints_or_late(node, ins, 1)? {
                Some(a) => squeeze_axes(node, Some(a))?,
                None if node.op == "Unsqueeze" => {
                    return late(Some(x.rank() + late_len(node, ins, 1)?))
                }
                None => return late(x.rank().checked_sub(late_len(node, ins, 1)?)),
            }
        }
        "Unsqueeze" | "Squeeze" => squeeze_axes(node, None)?,
        _ => None,
    };
    if node.op == "Squeeze" && axes.is_none() && x.shape.iter().any(Expr::has_runtime_dims) {
        return fail(
            node,
            "a Squeeze of every axis of extent 1 where an extent is known only at run time (its rank would be too): give the axes",
        );
    }
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
        Some(ints(node, ins, 1)?.to_vec())
    } else {
        None
    };
    let axes = match node.op.as_str() {
        "Unsqueeze" | "Squeeze" if ins.get(1).copied().flatten().is_some() => {
            squeeze_axes(node, Some(ints(node, ins, 1)?.to_vec()))?
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

fn infer_expand(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let Some(target) = sym_input_or_late(node, ins, 1)? else {
        let rank = x.rank().max(late_len(node, ins, 1)?);
        return late_fact(node, x.dtype, rank);
    };
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
    eval_via(node, ins, eval_expand_into)
}

fn eval_expand_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let target = req(node, ins, 1)?.as_i64().map_err(|e| node.error(e))?;
    // The broadcast of the input's shape and the target's.
    let r = x.shape.len().max(target.len());
    let mut out: Dims = smallvec::smallvec![1; r];
    for (k, o) in out.iter_mut().enumerate() {
        let a = (k + x.shape.len()).checked_sub(r).map_or(1, |i| x.shape[i]);
        let t = (k + target.len())
            .checked_sub(r)
            .map_or(1, |i| target[i].max(0) as usize);
        *o = match (a, t) {
            _ if a == t => a,
            (1, _) => t,
            (_, 1) => a,
            _ => return fail(node, format!("{:?} does not expand to {target:?}", x.shape)),
        };
    }
    let strides = broadcast_strides(x.shape, r);
    out_of(node, outs, 0, &out, x.data)?.walk(&out, &strides, workers);
    Ok(())
}

fn infer_range(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let dtype = req(node, ins, 0)?.dtype;
    // Bounds computed at run time, or a step that is not a positive constant: the
    // length is a run-time dim.
    let late = || late_fact(node, dtype, 1);
    let sym = |i: usize| -> Result<Option<Vec<Expr>>> { Ok(req(node, ins, i)?.sym.clone()) };
    let (Some(start), Some(limit), Some(delta)) = (sym(0)?, sym(1)?, sym(2)?) else {
        return late();
    };
    let (Some(s), Some(l), Some(d)) = (start.first(), limit.first(), delta.first()) else {
        return fail(node, "start, limit and delta must be scalars");
    };
    let len = match d.as_const() {
        Some(1) => (l.clone() - s.clone()).simplify(),
        Some(c) if c > 0 => Expr::ceil_div(l.clone() - s.clone(), Expr::Const(c)).simplify(),
        _ => return late(),
    };
    Ok(vec![Fact::new(
        dtype,
        vec![Expr::max(len, Expr::Const(0)).simplify()],
    )])
}

/// The number of elements of `Range(start, limit, delta)`.
fn range_len(node: &Node, start: f64, limit: f64, delta: f64) -> Result<usize> {
    if delta == 0.0 || !(limit - start).is_finite() {
        return fail(node, "a step of 0 or an infinite range");
    }
    let n = ((limit - start) / delta).ceil().max(0.0) as usize;
    sized(node, &[n])
}

/// The scalars of a `Range` as `f64`s, and its element type.
fn range_params(node: &Node, ins: &[Option<TensorRef>]) -> Result<([f64; 3], DType)> {
    let mut p = [0f64; 3];
    let dtype = req(node, ins, 0)?.dtype();
    for (i, p) in p.iter_mut().enumerate() {
        let t = req(node, ins, i)?;
        *p = match t.data {
            DataRef::I64([v]) if dtype == DType::I64 => *v as f64,
            DataRef::F32([v]) if dtype == DType::F32 => *v as f64,
            _ => return fail(node, "start, limit and delta must be scalars of one type"),
        };
    }
    Ok((p, dtype))
}

fn eval_range(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let ([s, l, d], dtype) = range_params(node, ins)?;
    let mut outs = [Tensor::zeros(dtype, vec![range_len(node, s, l, d)?])?];
    eval_range_into(node, ins, &mut outs, Workers::SERIAL)?;
    Ok(outs.into())
}

fn eval_range_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    _: Workers,
) -> Result<()> {
    let ([s, l, d], _) = range_params(node, ins)?;
    let n = range_len(node, s, l, d)?;
    match &mut shaped(node, outs, 0, &[n])?.data {
        Data::I64(v) => {
            // Exact integers (not through `f64`).
            let int = |i| Ok::<_, crate::TensorError>(ints(node, ins, i)?[0]);
            let (s, d) = (int(0)?, int(2)?);
            for (i, o) in v.iter_mut().enumerate() {
                *o = s + i as i64 * d;
            }
        }
        Data::F32(v) => {
            let (s, d) = (s as f32, d as f32);
            for (i, o) in v.iter_mut().enumerate() {
                *o = s + i as f32 * d;
            }
        }
        Data::Bool(_) => return fail(node, "a range of booleans"),
    }
    Ok(())
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
    let v = fill_value(node)?;
    let Some(shape) = sym_input_or_late(node, ins, 0)? else {
        let rank = late_len(node, ins, 0)?;
        return late_fact(node, v.dtype(), rank);
    };
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
