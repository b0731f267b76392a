//! `Resize` as ONNX's reference computes it: nearest, linear and cubic modes (linear and
//! cubic with `antialias`), every coordinate transformation (`tf_crop_and_resize` with
//! its region and extrapolation value), a subset of the axes, sizes kept to the aspect
//! ratio; separable, one axis at a time, in f64. ViT interpolates its position
//! embeddings bicubically to the image's patch grid. Scales or sizes given at run time
//! make the resized axes run-time dims.
use super::{axis, fail, req, runtime_shape, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Resize",
        since: 11,
        infer: infer_resize,
        eval: eval_resize,
        eval_into: None,
    },
    // Opset 9's `Upsample(x, scales)`: `Resize` with asymmetric coordinates (nearest:
    // rounded down, the input repeated).
    OpSpec {
        name: "Upsample",
        since: 9,
        infer: infer_resize,
        eval: eval_resize,
        eval_into: None,
    },
];

/// The attributes of a `Resize`; a value anyshape does not know is refused.
struct Attrs {
    mode: String,
    coordinates: String,
    nearest: String,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
    extrapolation: f64,
    /// `stretch`, `not_larger` or `not_smaller` (with sizes).
    aspect: String,
    /// The axes scales, sizes and the region are given for (all where absent).
    axes: Option<Vec<usize>>,
}

fn attrs(node: &Node, rank: usize) -> Result<Attrs> {
    let pick = |name: &str, default: &str, known: &[&str]| -> Result<String> {
        let v = node.string(name, default)?;
        if known.contains(&v.as_str()) {
            Ok(v)
        } else {
            fail(
                node,
                format!(
                    "{name} `{v}` is not one anyshape computes ({})",
                    known.join(", ")
                ),
            )
        }
    };
    let mode = pick("mode", "nearest", &["nearest", "linear", "cubic"])?;
    let antialias = node.int("antialias", 0)? != 0;
    if antialias && mode == "nearest" {
        return fail(node, "antialias is for the linear and cubic modes");
    }
    let axes = match node.ints("axes")? {
        None => None,
        Some(a) => {
            let v: Vec<usize> = a
                .iter()
                .map(|&x| axis(node, x, rank))
                .collect::<Result<_>>()?;
            if (1..v.len()).any(|i| v[..i].contains(&v[i])) {
                return fail(node, "an axis is given twice");
            }
            Some(v)
        }
    };
    if node.op == "Upsample" {
        return Ok(Attrs {
            coordinates: "asymmetric".into(),
            nearest: "floor".into(),
            cubic_a: -0.75,
            exclude_outside: false,
            extrapolation: 0.0,
            aspect: "stretch".into(),
            mode: pick("mode", "nearest", &["nearest", "linear"])?,
            antialias: false,
            axes: None,
        });
    }
    Ok(Attrs {
        coordinates: pick(
            "coordinate_transformation_mode",
            "half_pixel",
            &[
                "half_pixel",
                "half_pixel_symmetric",
                "pytorch_half_pixel",
                "align_corners",
                "asymmetric",
                "tf_crop_and_resize",
            ],
        )?,
        nearest: pick(
            "nearest_mode",
            "round_prefer_floor",
            &["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"],
        )?,
        cubic_a: node.float("cubic_coeff_a", -0.75)? as f64,
        exclude_outside: node.int("exclude_outside", 0)? != 0,
        extrapolation: node.float("extrapolation_value", 0.0)? as f64,
        aspect: pick(
            "keep_aspect_ratio_policy",
            "stretch",
            &["stretch", "not_larger", "not_smaller"],
        )?,
        mode,
        antialias,
        axes,
    })
}

/// An optional input that is given and not empty (an empty `scales` beside `sizes`).
fn given<T: Copy>(ins: &[Option<T>], i: usize, empty: impl Fn(T) -> bool) -> Option<T> {
    ins.get(i).copied().flatten().filter(|&t| !empty(t))
}

/// Where the scales and the sizes are among the inputs (`Upsample`: scales second).
fn scales_sizes(node: &Node) -> (usize, usize) {
    match node.op.as_str() {
        "Upsample" => (1, usize::MAX),
        _ => (2, 3),
    }
}

fn infer_resize(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let r = x.rank();
    let a = attrs(node, r)?;
    let axes = a.axes.clone().unwrap_or_else(|| (0..r).collect());
    let empty = |f: &Fact| f.shape.first().and_then(Expr::as_const) == Some(0);
    // Each resized axis's extent where the compile can tell it; a run-time dim else.
    let (sc, sz) = scales_sizes(node);
    let extents: Vec<Option<Expr>> = match (given(ins, sz, empty), given(ins, sc, empty)) {
        (Some(sizes), _) => match (&sizes.sym, a.aspect.as_str()) {
            (Some(s), "stretch") if s.len() == axes.len() => s.iter().cloned().map(Some).collect(),
            (Some(_), "stretch") => return fail(node, "one size per resized axis"),
            _ => vec![None; axes.len()],
        },
        (None, Some(scales)) => match &scales.value {
            Some(t) => {
                let sc = t.as_f32().map_err(|e| node.error(e))?;
                if sc.len() != axes.len() {
                    return fail(node, "one scale per resized axis");
                }
                axes.iter()
                    .zip(sc)
                    .map(|(&ax, &s)| scaled(&x.shape[ax], s))
                    .collect()
            }
            None => vec![None; axes.len()],
        },
        (None, None) => return fail(node, "neither scales nor sizes"),
    };
    let shape = runtime_shape(node, 0, r, |d| match axes.iter().position(|&ax| ax == d) {
        None => Some(x.shape[d].clone()),
        Some(i) => extents[i].clone(),
    })?;
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `floor(d · s)` as an expression: where `d` is known, or `s` is whole (a symbolic
/// extent scaled by a fraction is a run-time dim).
fn scaled(d: &Expr, s: f32) -> Option<Expr> {
    match d.as_const() {
        Some(c) => Some(Expr::Const((c as f32 * s).floor() as i64)),
        None if s >= 0.0 && s.fract() == 0.0 => Some(d.clone() * Expr::Const(s as i64)),
        None => None,
    }
}

/// The coefficients of the taps around a source coordinate whose fractional part is
/// `ratio` (1 where the coordinate is whole), at `scale` (ONNX's `_*_coeffs`).
fn coefficients(a: &Attrs, ratio: f64, scale: f64) -> Vec<f64> {
    let cubic = |x: f64| {
        let (x, c) = (x.abs(), a.cubic_a);
        if x <= 1.0 {
            ((c + 2.0) * x - (c + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            ((c * x - 5.0 * c) * x + 8.0 * c) * x - 4.0 * c
        } else {
            0.0
        }
    };
    let normalized = |v: Vec<f64>| {
        let total: f64 = v.iter().sum();
        v.into_iter().map(|c| c / total).collect()
    };
    let s = scale.min(1.0);
    match (a.mode.as_str(), a.antialias) {
        ("nearest", _) => {
            let up = match a.nearest.as_str() {
                _ if ratio == 1.0 => true,
                "round_prefer_floor" => ratio > 0.5,
                "round_prefer_ceil" => ratio >= 0.5,
                "floor" => false,
                _ => true, // ceil
            };
            vec![(!up) as u8 as f64, up as u8 as f64]
        }
        ("linear", false) => vec![1.0 - ratio, ratio],
        ("linear", true) => {
            let start = (-1.0 / s).floor() as i64 + 1;
            normalized(
                (start..2 - start)
                    .map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0))
                    .collect(),
            )
        }
        (_, false) => vec![
            cubic(ratio + 1.0),
            cubic(ratio),
            cubic(1.0 - ratio),
            cubic(2.0 - ratio),
        ],
        (_, true) => {
            let start = (-2.0 / s).floor() as i64 + 1;
            normalized(
                (start..2 - start)
                    .map(|i| cubic(s * (i as f64 - ratio)))
                    .collect(),
            )
        }
    }
}

/// One axis's resampling: per output position, its taps (source index, weight), or
/// `None` where it lies outside `tf_crop_and_resize`'s region.
struct AxisPlan {
    taps: Vec<Option<Vec<(usize, f64)>>>,
}

impl AxisPlan {
    /// The taps of `m` outputs from `n` inputs at `scale`; `roi` is the axis's region
    /// (`tf_crop_and_resize`).
    fn new(a: &Attrs, n: usize, m: usize, scale: f64, roi: (f64, f64)) -> AxisPlan {
        let (nf, mf) = (n as f64, scale * n as f64);
        let taps = (0..m)
            .map(|j| {
                let y = j as f64;
                let x = match a.coordinates.as_str() {
                    "align_corners" if mf == 1.0 => 0.0,
                    "align_corners" => y * (nf - 1.0) / (mf - 1.0),
                    "asymmetric" => y / scale,
                    "tf_crop_and_resize" => {
                        let x = match mf == 1.0 {
                            true => (roi.1 - roi.0) * (nf - 1.0) / 2.0,
                            false => y * (roi.1 - roi.0) * (nf - 1.0) / (mf - 1.0),
                        } + roi.0 * (nf - 1.0);
                        if x < 0.0 || x > nf - 1.0 {
                            return None;
                        }
                        x
                    }
                    "pytorch_half_pixel" if mf == 1.0 => -0.5,
                    "half_pixel_symmetric" => {
                        let offset = nf / 2.0 * (1.0 - m as f64 / mf);
                        offset + (y + 0.5) / scale - 0.5
                    }
                    _ => (y + 0.5) / scale - 0.5,
                };
                let whole = x.floor();
                let ratio = if x == whole { 1.0 } else { x - whole };
                let mut c = coefficients(a, ratio, scale);
                let k = c.len() as i64;
                let pad = (k + 1) / 2;
                let padded = x + pad as f64;
                let (p, frac) = (padded.floor(), padded - padded.floor());
                let offset = match k % 2 {
                    0 if frac == 0.0 => -(k / 2),
                    0 => -(k / 2) + 1,
                    _ if frac <= 0.5 => -((k - 1) / 2),
                    _ => -((k - 1) / 2) + 1,
                };
                let start = p as i64 + offset - pad;
                let outside = |i: i64| i < 0 || i >= n as i64;
                if a.exclude_outside {
                    for (t, w) in c.iter_mut().enumerate() {
                        if outside(start + t as i64) {
                            *w = 0.0;
                        }
                    }
                    let total: f64 = c.iter().sum();
                    let total = if total == 0.0 { 1.0 } else { total };
                    c.iter_mut().for_each(|w| *w /= total);
                }
                Some(
                    c.into_iter()
                        .enumerate()
                        .map(|(t, w)| ((start + t as i64).clamp(0, n as i64 - 1) as usize, w))
                        .collect(),
                )
            })
            .collect();
        AxisPlan { taps }
    }

    /// Resample `v` (shape `[outer, n, inner]`) along its middle axis.
    fn apply(&self, v: &[f64], outer: usize, n: usize, inner: usize, fill: f64) -> Vec<f64> {
        let m = self.taps.len();
        let mut out = vec![0f64; outer * m * inner];
        for (j, taps) in self.taps.iter().enumerate() {
            for o in 0..outer {
                for i in 0..inner {
                    out[(o * m + j) * inner + i] = match taps {
                        None => fill,
                        Some(t) => t.iter().map(|&(k, c)| c * v[(o * n + k) * inner + i]).sum(),
                    };
                }
            }
        }
        out
    }
}

fn eval_resize(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let r = x.shape.len();
    let a = attrs(node, r)?;
    let axes = a.axes.clone().unwrap_or_else(|| (0..r).collect());
    let empty = |t: TensorRef| t.is_empty();
    // Every axis's scale and extent (1 and its own where it is not resized).
    let mut scales = vec![1f64; r];
    let mut out: Vec<usize> = x.shape.to_vec();
    let (sc, sz) = scales_sizes(node);
    match (given(ins, sz, empty), given(ins, sc, empty)) {
        (Some(s), _) => {
            let s = s.as_i64().map_err(|e| node.error(e))?;
            if s.len() != axes.len() || s.iter().any(|&d| d < 0) {
                return fail(node, "one size, not negative, per resized axis");
            }
            for (&ax, &d) in axes.iter().zip(s) {
                scales[ax] = d as f64 / x.shape[ax] as f64;
                out[ax] = d as usize;
            }
            if a.aspect != "stretch" {
                let pick = axes.iter().map(|&ax| scales[ax]);
                let scale = match a.aspect.as_str() {
                    "not_larger" => pick.fold(f64::INFINITY, f64::min),
                    _ => pick.fold(f64::NEG_INFINITY, f64::max),
                };
                for &ax in &axes {
                    scales[ax] = scale;
                    out[ax] = (scale * x.shape[ax] as f64 + 0.5) as usize;
                }
            }
        }
        (None, Some(sc)) => {
            let sc = sc.as_f32().map_err(|e| node.error(e))?;
            if sc.len() != axes.len() || sc.iter().any(|&s| !(s > 0.0 && s.is_finite())) {
                return fail(node, "one scale, positive and finite, per resized axis");
            }
            for (&ax, &s) in axes.iter().zip(sc) {
                scales[ax] = s as f64;
                out[ax] = (x.shape[ax] as f32 * s).floor() as usize;
            }
        }
        (None, None) => return fail(node, "neither scales nor sizes"),
    }
    sized(node, &out)?;
    // The region per axis (start, end), as fractions of it.
    let mut roi = vec![(0f64, 1f64); r];
    if a.coordinates == "tf_crop_and_resize" {
        let given = given(ins, 1, empty)
            .ok_or_else(|| node.error("tf_crop_and_resize needs the region (roi)"))?
            .as_f32()
            .map_err(|e| node.error(e))?;
        if given.len() != 2 * axes.len() {
            return fail(node, "the region has a start and an end per resized axis");
        }
        for (i, &ax) in axes.iter().enumerate() {
            roi[ax] = (given[i] as f64, given[axes.len() + i] as f64);
        }
    }
    let mut v: Vec<f64> = x
        .as_f32()
        .map_err(|e| node.error(e))?
        .iter()
        .map(|&f| f as f64)
        .collect();
    let mut shape = x.shape.to_vec();
    for &ax in &axes {
        let (n, m) = (shape[ax], out[ax]);
        let whole = (roi[ax].0 - 0.0).abs() < 1e-9 && (roi[ax].1 - 1.0).abs() < 1e-9;
        if (scales[ax] - 1.0).abs() <= 1e-9 && n == m && whole {
            continue;
        }
        if n == 0 && m > 0 {
            return fail(node, "resizing an empty axis");
        }
        let outer: usize = shape[..ax].iter().product();
        let inner: usize = shape[ax + 1..].iter().product();
        let plan = AxisPlan::new(&a, n, m, scales[ax], roi[ax]);
        v = plan.apply(&v, outer, n, inner, a.extrapolation);
        shape[ax] = m;
    }
    Ok(vec![Tensor::f32(
        shape,
        v.into_iter().map(|f| f as f32).collect(),
    )?])
}
