//! `GridSample`: an image (`[n, c, d…]`, one to three spatial axes) sampled at the
//! points of a grid (`[n, o…, r]`, normalized coordinates in `[-1, 1]`, the last axis
//! `(x, y[, z])`), nearest, (bi/tri)linear or bicubic, with zeros, border or
//! reflection outside — as ONNX's reference computes it: the coordinates adjusted for
//! the padding mode, then each axis's taps and weights, a pixel outside read by the
//! padding mode again. `AffineGrid` makes such grids: each output position's normalized
//! coordinates through a batch of affine maps.
use super::{fail, late_len, req, runtime_shape, sized, sym_input_or_late, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "GridSample",
        since: 16,
        infer: infer_grid_sample,
        eval: eval_grid_sample,
        eval_into: None,
    },
    OpSpec {
        name: "AffineGrid",
        since: 20,
        infer: infer_affine_grid,
        eval: eval_affine_grid,
        eval_into: None,
    },
];

/// How the points between pixels are read.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

/// What lies outside the image.
#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

fn attributes(node: &Node) -> Result<(Mode, Padding, bool)> {
    // Opset 16 names the modes bilinear and bicubic; opset 20 on, linear and cubic.
    let mode = match node.string("mode", "linear")?.as_str() {
        "nearest" => Mode::Nearest,
        "linear" | "bilinear" => Mode::Linear,
        "cubic" | "bicubic" => Mode::Cubic,
        m => return fail(node, format!("mode `{m}` is not one ONNX defines")),
    };
    let padding = match node.string("padding_mode", "zeros")?.as_str() {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        m => return fail(node, format!("padding_mode `{m}` is not one ONNX defines")),
    };
    Ok((mode, padding, node.int("align_corners", 0)? != 0))
}

fn infer_grid_sample(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, grid) = (req(node, ins, 0)?, req(node, ins, 1)?);
    attributes(node)?;
    let r = x.rank().saturating_sub(2);
    if !(1..=3).contains(&r) || grid.rank() != r + 2 {
        return fail(
            node,
            "an image of 1 to 3 spatial axes and a grid of its rank ([n, o…, r])",
        );
    }
    let mut shape = vec![x.shape[0].clone(), x.shape[1].clone()];
    shape.extend(grid.shape[1..=r].iter().cloned());
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `x` reflected into `[lo, hi]`, as ONNX's reference does.
fn reflect(x: f32, lo: f32, hi: f32) -> f32 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    // How far past the bound, in whole ranges (each one flips the direction) and the rest.
    let fold = |dx: f32| {
        let n = (dx / range) as i64;
        (n % 2 == 0, dx - n as f32 * range)
    };
    if x < lo {
        let (even, r) = fold(lo - x);
        if even {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let (even, r) = fold(x - hi);
        if even {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

/// The bicubic weights of the four taps around a point `t` past the second.
fn cubic(t: f32) -> [f32; 4] {
    let a = -0.75f32;
    let w = |x: f32| {
        let x = x.abs();
        if x <= 1.0 {
            ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
        } else {
            ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
        }
    };
    [w(t + 1.0), w(t), w(1.0 - t), w(2.0 - t)]
}

fn eval_grid_sample(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, grid) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let (mode, padding, align) = attributes(node)?;
    let r = x.shape.len().saturating_sub(2);
    if !(1..=3).contains(&r)
        || grid.shape.len() != r + 2
        || grid.shape[0] != x.shape[0]
        || grid.shape[r + 1] != r
    {
        return fail(
            node,
            format!(
                "an image {:?} and a grid {:?}: [n, c, d…] and [n, o…, {r}]",
                x.shape, grid.shape
            ),
        );
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    let dims = &x.shape[2..];
    let mut shape = vec![n, c];
    shape.extend(&grid.shape[1..=r]);
    sized(node, &shape)?;
    let points: usize = grid.shape[1..=r].iter().product();
    let area: usize = dims.iter().product();
    let xv = x.as_f32().map_err(|e| node.error(e))?;
    let gv = grid.as_f32().map_err(|e| node.error(e))?;
    // Each axis's extent where coordinates are reflected or clamped.
    let border = |i: usize| match align {
        true => (0.0, dims[i] as f32 - 1.0),
        false => (-0.5, dims[i] as f32 - 0.5),
    };
    let mut out = vec![0f32; n * c * points];
    // Per axis: the taps (pixel indices) and weights of the point being sampled.
    let mut taps: Vec<Vec<(i64, f32)>> = vec![Vec::with_capacity(4); r];
    for b in 0..n {
        for p in 0..points {
            // The grid's last axis is (x, y, z): the image's axes reversed.
            let at = &gv[(b * points + p) * r..][..r];
            for (i, axis) in taps.iter_mut().enumerate() {
                let g = at[r - 1 - i];
                let d = dims[i] as f32;
                let mut v = match align {
                    true => (g + 1.0) / 2.0 * (d - 1.0),
                    false => ((g + 1.0) * d - 1.0) / 2.0,
                };
                if mode == Mode::Nearest {
                    v = v.round_ties_even();
                }
                let (lo, hi) = border(i);
                if v < lo || v > hi {
                    v = match padding {
                        Padding::Border => v.clamp(0.0, d - 1.0),
                        Padding::Reflection => reflect(v, lo, hi),
                        Padding::Zeros => v,
                    };
                }
                axis.clear();
                match mode {
                    Mode::Nearest => axis.push((v as i64, 1.0)),
                    Mode::Linear => {
                        let f = v.floor();
                        axis.push((f as i64, 1.0 - (v - f)));
                        axis.push((f as i64 + 1, v - f));
                    }
                    Mode::Cubic => {
                        let f = v.floor();
                        for (k, w) in cubic(v - f).into_iter().enumerate() {
                            axis.push((f as i64 - 1 + k as i64, w));
                        }
                    }
                }
            }
            // A tap outside: zero, or read at the clamped or reflected index.
            let pixel = |i: usize, t: i64| -> Option<usize> {
                let d = dims[i] as i64;
                if (0..d).contains(&t) {
                    return Some(t as usize);
                }
                match padding {
                    Padding::Zeros => None,
                    Padding::Border => Some(t.clamp(0, d - 1) as usize),
                    Padding::Reflection => {
                        let (lo, hi) = border(i);
                        Some((reflect(t as f32, lo, hi) as i64).clamp(0, d - 1) as usize)
                    }
                }
            };
            // Every combination of the axes' taps: its weight and its pixel's offset.
            let mut corners: Vec<(f32, Option<usize>)> = vec![(1.0, Some(0))];
            for (i, axis) in taps.iter().enumerate() {
                let stride: usize = dims[i + 1..].iter().product();
                corners = corners
                    .iter()
                    .flat_map(|&(w, off)| {
                        axis.iter().map(move |&(t, tw)| {
                            (w * tw, off.zip(pixel(i, t)).map(|(o, q)| o + q * stride))
                        })
                    })
                    .collect();
            }
            for ch in 0..c {
                let image = &xv[(b * c + ch) * area..][..area];
                out[(b * c + ch) * points + p] = corners
                    .iter()
                    .filter_map(|&(w, off)| off.map(|o| w * image[o]))
                    .sum();
            }
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}

fn infer_affine_grid(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let theta = req(node, ins, 0)?;
    let size = sym_input_or_late(node, ins, 1)?;
    let r = match &size {
        Some(s) => s.len(),
        None => late_len(node, ins, 1)?,
    };
    if !(r == 4 || r == 5) || theta.rank() != 3 {
        return fail(
            node,
            "theta [N, 2, 3] with a size [N, C, H, W], or [N, 3, 4] with [N, C, D, H, W]",
        );
    }
    // [N, (D,) H, W, 2 or 3]: N is theta's, the rest the size's.
    let shape = runtime_shape(node, 0, r, |d| match d {
        0 => Some(theta.shape[0].clone()),
        _ if d == r - 1 => Some(anyshape_ir::Expr::Const(r as i64 - 2)),
        _ => size.as_ref().map(|s| s[d + 1].clone()),
    })?;
    Ok(vec![Fact::new(theta.dtype, shape)])
}

/// `AffineGrid(theta, size)`: for each of `N` affine maps (`[N, 2, 3]` or `[N, 3, 4]`)
/// and each position of an image of `size`'s spatial extents, the map applied to the
/// position's normalized coordinates `(x, y[, z], 1)` (pixel centers in `[-1, 1]`, or
/// corners with `align_corners`), as ONNX's reference computes it.
fn eval_affine_grid(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let theta = req(node, ins, 0)?;
    let size = super::ints(node, ins, 1)?;
    let s = size.len().saturating_sub(2);
    let &[n, rows, cols] = theta.shape else {
        return fail(node, "theta must be [N, 2, 3] or [N, 3, 4]");
    };
    if !(s == 2 || s == 3) || rows != s || cols != s + 1 || size[0] != n as i64 {
        return fail(
            node,
            "theta [N, 2, 3] with a size [N, C, H, W], or [N, 3, 4] with [N, C, D, H, W]",
        );
    }
    if size.iter().any(|&d| d < 0) {
        return fail(node, "a negative extent");
    }
    let dims: Vec<usize> = size[2..].iter().map(|&d| d as usize).collect();
    let mut shape = vec![n];
    shape.extend(&dims);
    shape.push(s);
    let points = sized(node, &shape)? / s.max(1);
    let corners = node.int("align_corners", 0)? != 0;
    let coordinate = |i: usize, d: usize| -> f64 {
        match corners {
            true if d == 1 => -1.0,
            true => -1.0 + 2.0 * i as f64 / (d - 1) as f64,
            false => (2 * i + 1) as f64 / d as f64 - 1.0,
        }
    };
    let t = theta.as_f32().map_err(|e| node.error(e))?;
    let per = points / n.max(1);
    let mut out = vec![0f32; points * s];
    let mut homo = vec![1f64; s + 1];
    for p in 0..per {
        // The position's coordinates, x along the last axis first.
        let mut rest = p;
        for a in (0..s).rev() {
            homo[s - 1 - a] = coordinate(rest % dims[a], dims[a]);
            rest /= dims[a];
        }
        for b in 0..n {
            let m = &t[b * s * (s + 1)..][..s * (s + 1)];
            for j in 0..s {
                let v: f64 = (0..=s).map(|k| m[j * (s + 1) + k] as f64 * homo[k]).sum();
                out[(b * per + p) * s + j] = v as f32;
            }
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}
