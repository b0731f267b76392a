//! `Resize` of the last two axes (nearest, linear and cubic modes; ViT interpolates its
//! position embeddings bicubically to the image's patch grid).
use super::{fail, req, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "Resize",
    since: 11,
    infer: infer_resize,
    eval: eval_resize,
    eval_into: None,
}];

/// The attributes of a `Resize` anyshape computes; any other value of one is refused
/// (it would change the result).
struct Attrs {
    mode: String,
    coordinates: String,
    nearest: String,
    cubic_a: f32,
    exclude_outside: bool,
}

fn attrs(node: &Node) -> Result<Attrs> {
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
    if node.int("antialias", 0)? != 0 {
        return fail(node, "antialias is not implemented");
    }
    if node.attrs.contains_key("axes") {
        return fail(
            node,
            "the axes attribute is not implemented (give every axis)",
        );
    }
    pick("keep_aspect_ratio_policy", "stretch", &["stretch"])?;
    Ok(Attrs {
        mode: pick("mode", "nearest", &["nearest", "linear", "cubic"])?,
        coordinates: pick(
            "coordinate_transformation_mode",
            "half_pixel",
            &[
                "half_pixel",
                "pytorch_half_pixel",
                "align_corners",
                "asymmetric",
            ],
        )?,
        nearest: pick(
            "nearest_mode",
            "round_prefer_floor",
            &["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"],
        )?,
        cubic_a: node.float("cubic_coeff_a", -0.75)?,
        exclude_outside: node.int("exclude_outside", 0)? != 0,
    })
}

/// The index `nearest_mode` rounds the source coordinate `x` to.
fn nearest(mode: &str, x: f32) -> isize {
    let f = x.floor();
    let frac = x - f;
    (match mode {
        "floor" => f,
        "ceil" => x.ceil(),
        "round_prefer_ceil" if frac >= 0.5 => f + 1.0,
        "round_prefer_ceil" => f,
        _ if frac > 0.5 => f + 1.0, // round_prefer_floor
        _ => f,
    }) as isize
}

fn infer_resize(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    attrs(node)?;
    let x = req(node, ins, 0)?;
    if let Some(sizes) = ins.get(3).copied().flatten() {
        let s = sizes
            .sym
            .clone()
            .ok_or_else(|| node.error("sizes must be known at compile time"))?;
        if s.len() != x.rank() {
            return fail(node, "sizes of another rank than the input");
        }
        return Ok(vec![Fact::new(x.dtype, s)]);
    }
    let scales = ins
        .get(2)
        .copied()
        .flatten()
        .and_then(|f| f.value.clone())
        .ok_or_else(|| node.error("scales must be constants (or give sizes)"))?;
    let sc = scales.as_f32().map_err(|e| node.error(e))?;
    if sc.len() != x.rank() {
        return fail(node, "scales of another rank than the input");
    }
    let shape = x
        .shape
        .iter()
        .zip(sc)
        .map(|(d, &s)| match d.as_const() {
            Some(c) => Ok(Expr::Const((c as f32 * s).floor() as i64)),
            None if s == 1.0 => Ok(d.clone()),
            None => fail(node, "a non-unit scale of a symbolic dim"),
        })
        .collect::<Result<_>>()?;
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// Cubic convolution weights (Keys, with `a`) for the fractional offset `t`.
fn cubic(t: f32, a: f32) -> [f32; 4] {
    let w = |x: f32| {
        let x = x.abs();
        if x <= 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else if x < 2.0 {
            ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
        } else {
            0.0
        }
    };
    [w(t + 1.0), w(t), w(1.0 - t), w(2.0 - t)]
}

/// The source coordinate of output coordinate `o` (ONNX's coordinate transformation).
fn source(mode: &str, o: usize, scale: f32, len_in: usize, len_out: usize) -> f32 {
    let o = o as f32;
    match mode {
        "asymmetric" => o / scale,
        "align_corners" => {
            if len_out <= 1 {
                0.0
            } else {
                o * (len_in as f32 - 1.0) / (len_out as f32 - 1.0)
            }
        }
        "pytorch_half_pixel" if len_out <= 1 => 0.0,
        _ => (o + 0.5) / scale - 0.5,
    }
}

/// Resample one axis of `v` (shape `[outer, n, inner]`) to `m`.
fn resample(
    v: &[f32],
    outer: usize,
    n: usize,
    inner: usize,
    m: usize,
    weights: &dyn Fn(usize) -> Vec<(usize, f32)>,
) -> Vec<f32> {
    let mut out = vec![0f32; outer * m * inner];
    for j in 0..m {
        let w = weights(j);
        for o in 0..outer {
            for i in 0..inner {
                out[(o * m + j) * inner + i] =
                    w.iter().map(|&(k, c)| c * v[(o * n + k) * inner + i]).sum();
            }
        }
    }
    out
}

fn eval_resize(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let r = x.shape.len();
    let Attrs {
        mode,
        coordinates: ct,
        nearest: nearest_mode,
        cubic_a: a,
        exclude_outside: exclude,
    } = attrs(node)?;
    let (out_shape, scales): (Vec<usize>, Vec<f32>) =
        match (ins.get(3).copied().flatten(), ins.get(2).copied().flatten()) {
            (Some(s), _) => {
                let s = s.as_i64().map_err(|e| node.error(e))?;
                let shape: Vec<usize> = s.iter().map(|&d| d.max(0) as usize).collect();
                let sc = shape
                    .iter()
                    .zip(x.shape)
                    .map(|(&o, &i)| o as f32 / i.max(1) as f32)
                    .collect();
                (shape, sc)
            }
            (None, Some(sc)) => {
                let sc = sc.as_f32().map_err(|e| node.error(e))?.to_vec();
                (
                    x.shape
                        .iter()
                        .zip(&sc)
                        .map(|(&d, &s)| (d as f32 * s).floor() as usize)
                        .collect(),
                    sc,
                )
            }
            _ => return fail(node, "neither scales nor sizes"),
        };
    if out_shape.len() != r {
        return fail(node, "sizes of another rank than the input");
    }
    sized(node, &out_shape)?;
    let mut v = x.as_f32().map_err(|e| node.error(e))?.to_vec();
    let mut shape = x.shape.to_vec();
    for ax in 0..r {
        let (n, m) = (shape[ax], out_shape[ax]);
        if n == m {
            continue;
        }
        if n == 0 {
            return fail(node, "resizing an empty axis");
        }
        let outer: usize = shape[..ax].iter().product();
        let inner: usize = shape[ax + 1..].iter().product();
        let s = scales[ax];
        let weights = |j: usize| -> Vec<(usize, f32)> {
            let src = source(&ct, j, s, n, m);
            let clampi = |k: isize| k.clamp(0, n as isize - 1) as usize;
            match mode.as_str() {
                "nearest" => vec![(clampi(nearest(&nearest_mode, src)), 1.0)],
                "linear" => {
                    let src = src.max(0.0);
                    let f = src.floor();
                    let t = src - f;
                    vec![(clampi(f as isize), 1.0 - t), (clampi(f as isize + 1), t)]
                }
                _ => {
                    // cubic
                    let f = src.floor();
                    let w = cubic(src - f, a);
                    let mut taps: Vec<(usize, f32)> = Vec::new();
                    let mut total = 0.0;
                    for (k, &c) in w.iter().enumerate() {
                        let idx = f as isize - 1 + k as isize;
                        if exclude && (idx < 0 || idx >= n as isize) {
                            continue;
                        }
                        total += c;
                        taps.push((clampi(idx), c));
                    }
                    if exclude && total != 0.0 {
                        for t in taps.iter_mut() {
                            t.1 /= total;
                        }
                    }
                    taps
                }
            }
        };
        v = resample(&v, outer, n, inner, m, &weights);
        shape[ax] = m;
    }
    Ok(vec![Tensor::f32(shape, v)?])
}
