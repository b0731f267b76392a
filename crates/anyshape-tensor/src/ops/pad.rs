//! Ops that make a larger (or cropped) tensor of the input's elements: `Pad` (constant,
//! edge, reflect and wrap modes; negative pads crop), `CenterCropPad` (a pad or crop about
//! the center) and `Tile`. All read each output
//! element's source coordinates axis by axis.
use super::{
    among, const_ints_or_late, fail, late_fact, req, runtime_shape, sized, sym_input_or_late,
    OpSpec,
};
use crate::node::Node;
use crate::{Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Pad",
        since: 11,
        infer: infer_pad,
        eval: eval_pad,
        eval_into: None,
    },
    OpSpec {
        name: "CenterCropPad",
        since: 18,
        infer: infer_center_crop_pad,
        eval: eval_center_crop_pad,
        eval_into: None,
    },
    OpSpec {
        name: "Tile",
        since: 6,
        infer: infer_tile,
        eval: eval_tile,
        eval_into: None,
    },
];

/// Each axis's `(begin, end)` pads: `pads` lists every begin, then every end, over
/// `axes` (all by default; negative count from the end).
fn axis_pads(
    node: &Node,
    pads: &[i64],
    axes: Option<Vec<i64>>,
    rank: usize,
) -> Result<Vec<(i64, i64)>> {
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&x| super::axis(node, x, rank))
            .collect::<Result<_>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return fail(
            node,
            format!(
                "{} pads for {} axes (it takes two per axis)",
                pads.len(),
                axes.len()
            ),
        );
    }
    let mut out = vec![(0, 0); rank];
    for (k, &a) in axes.iter().enumerate() {
        out[a] = (pads[k], pads[k + axes.len()]);
    }
    Ok(out)
}

/// The optional `axes` input (opset 18): absent (`Some(None)`), or its values
/// (`None`: given at run time).
fn pad_axes(node: &Node, ins: &[Option<&Fact>]) -> Result<Option<Option<Vec<i64>>>> {
    match ins.get(3).copied().flatten() {
        None => Ok(Some(None)),
        Some(_) => Ok(const_ints_or_late(node, ins, 3)?.map(Some)),
    }
}

fn infer_pad(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let axes = pad_axes(node, ins)?;
    let (Some(given), Some(axes)) = (const_ints_or_late(node, ins, 1)?, axes.clone()) else {
        // Pads or axes given at run time: the dims of the axes it may pad are run-time
        // dims.
        let known = axes.flatten();
        let shape = runtime_shape(node, 0, x.rank(), |a| {
            (!among(known.as_deref(), a, x.rank())).then(|| x.shape[a].clone())
        })?;
        return Ok(vec![Fact::new(x.dtype, shape)]);
    };
    let pads = axis_pads(node, &given, axes, x.rank())?;
    let shape = x
        .shape
        .iter()
        .zip(&pads)
        .map(|(d, &(b, e))| d.clone() + Expr::Const(b + e))
        .collect();
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// Where output coordinate `o` of an axis of `d` elements padded by `begin` reads:
/// `Some` input coordinate, or `None` for the constant.
fn source(o: i64, begin: i64, d: i64, mode: &str) -> Option<i64> {
    let c = o - begin;
    if (0..d).contains(&c) {
        return Some(c);
    }
    match mode {
        "edge" => Some(c.clamp(0, d - 1)),
        "wrap" => Some(c.rem_euclid(d)),
        "reflect" if d == 1 => Some(0),
        "reflect" => {
            let period = 2 * (d - 1);
            let r = c.rem_euclid(period);
            Some(if r < d { r } else { period - r })
        }
        _ => None,
    }
}

/// For each element of a tensor of shape `out` (row-major), its source coordinates'
/// flat offset in a tensor of shape `inp`, or `None`; `coord(axis, o)` maps one axis.
fn gather_by_axis(
    inp: &[usize],
    out: &[usize],
    coord: impl Fn(usize, i64) -> Option<i64>,
) -> Vec<Option<usize>> {
    let st = crate::strides(inp);
    let n: usize = out.iter().product();
    let mut v = Vec::with_capacity(n);
    let mut counter = vec![0usize; out.len()];
    for _ in 0..n {
        let mut at = Some(0usize);
        for (a, &c) in counter.iter().enumerate() {
            at = match (at, coord(a, c as i64)) {
                (Some(at), Some(s)) => Some(at + s as usize * st[a]),
                _ => None,
            };
        }
        v.push(at);
        for d in (0..out.len()).rev() {
            counter[d] += 1;
            if counter[d] < out[d] {
                break;
            }
            counter[d] = 0;
        }
    }
    v
}

/// `Pad(data, pads, constant_value, axes)`.
fn eval_pad(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let axes = super::optional_ints(node, ins, 3)?.map(<[i64]>::to_vec);
    let pads = axis_pads(node, super::ints(node, ins, 1)?, axes, x.shape.len())?;
    let mode = node.string("mode", "constant")?;
    if !matches!(mode.as_str(), "constant" | "edge" | "reflect" | "wrap") {
        return fail(node, format!("mode `{mode}` is not one ONNX defines"));
    }
    let value = ins.get(2).copied().flatten().filter(|t| !t.is_empty());
    Ok(vec![padded(node, x, &pads, &mode, value)?])
}

/// `x` padded by `pads` (before and after, per axis; negative ones crop) in `mode`,
/// with `value` (0 where not given) in constant mode.
fn padded(
    node: &Node,
    x: TensorRef,
    pads: &[(i64, i64)],
    mode: &str,
    value: Option<TensorRef>,
) -> Result<Tensor> {
    let mut out = Vec::with_capacity(x.shape.len());
    for (a, (&d, &(b, e))) in x.shape.iter().zip(pads).enumerate() {
        let n = d as i64 + b + e;
        if n < 0 {
            return fail(
                node,
                format!("pads crop axis {a} ({d} elements) below zero"),
            );
        }
        if mode != "constant" && d == 0 && n > 0 {
            return fail(node, format!("mode `{mode}` pads an empty axis {a}"));
        }
        out.push(n as usize);
    }
    sized(node, &out)?;
    let src = gather_by_axis(x.shape, &out, |a, o| {
        source(o, pads[a].0, x.shape[a] as i64, mode)
    });
    fn fill<T: Copy>(v: &[T], src: &[Option<usize>], value: T) -> Vec<T> {
        src.iter().map(|s| s.map_or(value, |i| v[i])).collect()
    }
    let data = match (x.data, value.map(|t| t.data)) {
        (DataRef::F32(v), None) => Data::F32(fill(v, &src, 0.0)),
        (DataRef::F32(v), Some(DataRef::F32(c))) => Data::F32(fill(v, &src, c[0])),
        (DataRef::I64(v), None) => Data::I64(fill(v, &src, 0)),
        (DataRef::I64(v), Some(DataRef::I64(c))) => Data::I64(fill(v, &src, c[0])),
        (DataRef::Bool(v), None) => Data::Bool(fill(v, &src, false)),
        (DataRef::Bool(v), Some(DataRef::Bool(c))) => Data::Bool(fill(v, &src, c[0])),
        _ => return fail(node, "the constant value's type is not the data's"),
    };
    Tensor::new(out, data)
}

/// `CenterCropPad`'s axes (the attribute, or every axis).
fn crop_axes(node: &Node, rank: usize) -> Result<Vec<usize>> {
    match node.ints("axes")? {
        Some(a) => a.iter().map(|&x| super::axis(node, x, rank)).collect(),
        None => Ok((0..rank).collect()),
    }
}

fn infer_center_crop_pad(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let axes = crop_axes(node, x.rank())?;
    let target = sym_input_or_late(node, ins, 1)?;
    if target.as_ref().is_some_and(|t| t.len() != axes.len()) {
        return fail(node, "one extent per axis");
    }
    let shape = runtime_shape(node, 0, x.rank(), |d| {
        match axes.iter().position(|&a| a == d) {
            None => Some(x.shape[d].clone()),
            Some(i) => target.as_ref().map(|t| t[i].clone()),
        }
    })?;
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `CenterCropPad(x, shape)`: each of `axes` cropped or padded (with zeros) about its
/// center to its extent in `shape` (an odd difference: one more before the center
/// cropped, one more after it padded).
fn eval_center_crop_pad(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let axes = crop_axes(node, x.shape.len())?;
    let target = super::ints(node, ins, 1)?;
    if target.len() != axes.len() || target.iter().any(|&t| t < 0) {
        return fail(node, "one extent, not negative, per axis");
    }
    let mut pads = vec![(0i64, 0i64); x.shape.len()];
    for (&a, &t) in axes.iter().zip(target) {
        let d = x.shape[a] as i64;
        let before = match t < d {
            true => -((d - t) / 2),
            false => (t - d) / 2,
        };
        pads[a] = (before, t - d - before);
    }
    Ok(vec![padded(node, x, &pads, "constant", None)?])
}

fn infer_tile(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let Some(reps) = sym_input_or_late(node, ins, 1)? else {
        return late_fact(node, x.dtype, x.rank());
    };
    if reps.len() != x.rank() {
        return fail(node, "one repeat count per axis");
    }
    let shape = x
        .shape
        .iter()
        .zip(reps)
        .map(|(d, r)| d.clone() * r)
        .collect();
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `Tile(x, repeats)`: `x` repeated `repeats[a]` times along each axis `a`.
fn eval_tile(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let reps = super::ints(node, ins, 1)?;
    if reps.len() != x.shape.len() || reps.iter().any(|&r| r < 0) {
        return fail(node, "one repeat count (not negative) per axis");
    }
    let out: Vec<usize> = x
        .shape
        .iter()
        .zip(reps)
        .map(|(&d, &r)| d.saturating_mul(r as usize))
        .collect();
    sized(node, &out)?;
    let src = gather_by_axis(x.shape, &out, |a, o| Some(o % x.shape[a] as i64));
    let idx: Vec<usize> = src.into_iter().map(|s| s.expect("always inside")).collect();
    Ok(vec![Tensor::new(out, x.data.pick(&idx))?])
}
