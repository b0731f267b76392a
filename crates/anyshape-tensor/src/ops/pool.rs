//! Sliding windows over NCHW images (and NCL sequences, as images of height 1): the
//! window that `Conv` and the pools share
//! (strides, pads, dilations and the output extent they give, symbolic or concrete),
//! and the pools — `MaxPool`, `AveragePool`, `LpPool`, `GlobalAveragePool`,
//! `GlobalMaxPool` — as reference loops (host steps; averages and norms summed in `f64`).
use super::{fail, req, sized, OpSpec, MAX_ELEMENTS};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "MaxPool",
        since: 8,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: None,
    },
    OpSpec {
        name: "AveragePool",
        since: 7,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: None,
    },
    OpSpec {
        name: "LpPool",
        since: 11,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: None,
    },
    OpSpec {
        name: "GlobalAveragePool",
        since: 1,
        infer: infer_global,
        eval: eval_global,
        eval_into: None,
    },
    OpSpec {
        name: "GlobalMaxPool",
        since: 1,
        infer: infer_global,
        eval: eval_global,
        eval_into: None,
    },
];

/// How `auto_pad` `SAME_*` places a window's pads: their sum follows from the input's
/// extent, the odd one after (`Upper`) or before (`Lower`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Same {
    /// `SAME_UPPER`.
    Upper,
    /// `SAME_LOWER`.
    Lower,
}

/// A 2-D window's placement: strides, pads (top, left, bottom, right), dilations.
#[derive(Clone, Debug)]
pub struct Window {
    /// Steps between windows along height and width.
    pub strides: [usize; 2],
    /// Pads before and after: top, left, bottom, right.
    pub pads: [usize; 4],
    /// Steps between a window's taps along height and width.
    pub dilations: [usize; 2],
    /// `auto_pad` `SAME_*`: the output extent is the input's over the stride, rounded
    /// up, and the pads follow from the input's extent ([`Window::at`]).
    pub same: Option<Same>,
    /// `ceil_mode` (pools): the output extent rounds up, a last window kept where it
    /// starts inside the input or its leading pad.
    pub ceil: bool,
}

impl Window {
    /// The window attributes of `node` over two spatial axes (absent: strides and
    /// dilations 1, no pads).
    pub fn of(node: &Node) -> Result<Window> {
        Window::of_rank(node, 2)
    }

    /// The same over `spatial` axes, 1 or 2: a 1-D window is a 2-D one over a height
    /// of 1 (its attributes those of the width).
    pub fn of_rank(node: &Node, spatial: usize) -> Result<Window> {
        let same = match node.string("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "VALID" => None,
            "SAME_UPPER" => Some(Same::Upper),
            "SAME_LOWER" => Some(Same::Lower),
            other => return fail(node, format!("auto_pad {other} is not one ONNX defines")),
        };
        if !matches!(spatial, 1 | 2) {
            return fail(
                node,
                format!("{spatial} spatial axes: 1-D and 2-D windows only"),
            );
        }
        let axes = |name: &str| -> Result<[usize; 2]> {
            match node.ints(name)? {
                None => Ok([1, 1]),
                Some(v) if v.len() == spatial && v.iter().all(|&x| x > 0) => Ok([
                    v[..spatial - 1].first().map_or(1, |&h| h as usize),
                    v[spatial - 1] as usize,
                ]),
                Some(v) => fail(node, format!("{name} {v:?}: {spatial} spatial axes")),
            }
        };
        // VALID and SAME_* ignore the pads given.
        let pads = match node.ints("pads")? {
            _ if same.is_some() || node.string("auto_pad", "NOTSET")? == "VALID" => [0; 4],
            None => [0; 4],
            Some(v) if v.len() == 2 * spatial && v.iter().all(|&x| x >= 0) => match spatial {
                1 => [0, v[0] as usize, 0, v[1] as usize],
                _ => [v[0] as usize, v[1] as usize, v[2] as usize, v[3] as usize],
            },
            Some(v) => return fail(node, format!("pads {v:?}: {spatial} spatial axes")),
        };
        Ok(Window {
            strides: axes("strides")?,
            pads,
            dilations: axes("dilations")?,
            same,
            ceil: node.int("ceil_mode", 0)? != 0,
        })
    }

    /// This window over an input of extents `sizes` under a kernel of extents `k`, its
    /// pads concrete (those `SAME_*` gives at these extents).
    pub fn at(&self, sizes: [usize; 2], k: [usize; 2]) -> Window {
        let mut w = self.clone();
        if let Some(same) = self.same {
            for i in 0..2 {
                let out = sizes[i].div_ceil(self.strides[i]);
                let span = self.dilations[i] * (k[i].max(1) - 1) + 1;
                let total = ((out.max(1) - 1) * self.strides[i] + span).saturating_sub(sizes[i]);
                let (before, after) = match same {
                    Same::Upper => (total / 2, total - total / 2),
                    Same::Lower => (total - total / 2, total / 2),
                };
                w.pads[i] = before;
                w.pads[i + 2] = after;
            }
            w.same = None;
        }
        w
    }

    /// The output extent of spatial axis `i` (0: height, 1: width) of input extent `d`
    /// under a kernel of extent `k`, as an expression.
    pub fn out_expr(&self, d: &Expr, k: i64, i: usize) -> Expr {
        let s = Expr::Const(self.strides[i] as i64);
        if self.same.is_some() {
            return Expr::ceil_div(d.clone(), s).simplify();
        }
        let span = (self.dilations[i] as i64) * (k - 1) + 1;
        let padded = d.clone() + (self.pads[i] + self.pads[i + 2]) as i64 - span;
        if self.ceil {
            // The last window starts before the input's end and its leading pad's.
            let last = Expr::floor_div(d.clone() + self.pads[i] as i64 - 1, s.clone());
            return (Expr::min(Expr::ceil_div(padded, s), last) + 1).simplify();
        }
        (Expr::floor_div(padded, s) + 1).simplify()
    }

    /// The same for concrete extents (0 where the window does not fit).
    pub fn out(&self, d: usize, k: usize, i: usize) -> usize {
        let s = self.strides[i];
        if self.same.is_some() {
            return d.div_ceil(s);
        }
        let span = self.dilations[i] * (k.max(1) - 1) + 1;
        let room = (d + self.pads[i] + self.pads[i + 2]) as isize - span as isize;
        let s = s as isize;
        let out = if self.ceil {
            // A last window may reach past the padded input (ceil), but starts inside it.
            let last = (d as isize + self.pads[i] as isize - 1).div_euclid(s);
            (-(-room).div_euclid(s)).min(last) + 1
        } else {
            room.div_euclid(s) + 1
        };
        out.max(0) as usize
    }

    /// How many of the `k` taps of output position `o` of axis `i` fall inside the
    /// input of `extent` with its pads.
    pub fn padded_taps(&self, o: usize, k: usize, i: usize, extent: usize) -> usize {
        let end = extent + self.pads[i] + self.pads[i + 2];
        (0..k)
            .filter(|&u| o * self.strides[i] + u * self.dilations[i] < end)
            .count()
    }

    /// The kernel offsets at which output position `o` of axis `i` (0: rows, 1:
    /// columns) reads inside an input of `extent` (a window of `k` taps): the others
    /// fall in the padding.
    pub fn inside(&self, o: usize, k: usize, i: usize, extent: usize) -> std::ops::Range<usize> {
        let start = o * self.strides[i];
        let d = self.dilations[i];
        // Tap u reads start + u·d - pad, inside where pad <= start + u·d < pad + extent.
        let lo = self.pads[i].saturating_sub(start).div_ceil(d).min(k);
        let hi = (self.pads[i] + extent)
            .saturating_sub(start)
            .div_ceil(d)
            .clamp(lo, k);
        lo..hi
    }
}

/// A pool's kernel extent (`kernel_shape`, over `spatial` axes: a 1-D one of height
/// 1), refusing what is not implemented: the indices output of `MaxPool`.
fn kernel(node: &Node, spatial: usize) -> Result<[usize; 2]> {
    if node.outputs.len() > 1 {
        return fail(node, "the indices output is not supported");
    }
    match node.ints("kernel_shape")? {
        Some(v) if v.len() == spatial && v.iter().all(|&x| x > 0) => match spatial {
            1 => Ok([1, v[0] as usize]),
            _ => Ok([v[0] as usize, v[1] as usize]),
        },
        Some(v) => fail(node, format!("kernel_shape {v:?}: {spatial} spatial axes")),
        None => fail(node, "kernel_shape is required"),
    }
}

/// The extents `[h, w]` of the trailing spatial axes of `shape` (an NCL tensor's or a
/// 1-D kernel's as a height of 1).
pub(super) fn plane(shape: &[usize]) -> [usize; 2] {
    match shape {
        [.., h, w] if shape.len() == 4 => [*h, *w],
        [.., w] => [1, *w],
        [] => [1, 1],
    }
}

/// `[n, c]` and the output extents `[oh, ow]` as the shape of an output over `spatial`
/// axes (a 1-D one without its height), checked against [`MAX_ELEMENTS`].
pub(super) fn planar_shape(
    node: &Node,
    nc: [usize; 2],
    [oh, ow]: [usize; 2],
    spatial: usize,
) -> Result<Vec<usize>> {
    let mut shape = nc.to_vec();
    if spatial == 2 {
        shape.push(oh);
    }
    shape.push(ow);
    sized(node, &shape)?;
    Ok(shape)
}

/// The spatial axes of a pooled or convolved input of `rank`: 1 (NCL) or 2 (NCHW).
pub(super) fn spatial_axes(node: &Node, rank: usize) -> Result<usize> {
    match rank {
        3 | 4 => Ok(rank - 2),
        r => fail(
            node,
            format!("an input of rank {r}: 1-D (NCL) and 2-D (NCHW) windows only"),
        ),
    }
}

fn infer_pool(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let spatial = spatial_axes(node, x.rank())?;
    let (k, w) = (kernel(node, spatial)?, Window::of_rank(node, spatial)?);
    let mut shape = x.shape[..2].to_vec();
    if spatial == 2 {
        shape.push(w.out_expr(&x.shape[2], k[0] as i64, 0));
    }
    shape.push(w.out_expr(&x.shape[x.rank() - 1], k[1] as i64, 1));
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_pool(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let spatial = spatial_axes(node, x.shape.len())?;
    let (k, w) = (kernel(node, spatial)?, Window::of_rank(node, spatial)?);
    let max = node.op == "MaxPool";
    let p = match node.op.as_str() {
        "LpPool" => match node.int("p", 2)? {
            p if p >= 1 => Some(p as f64),
            p => return fail(node, format!("p {p}: need 1 or more")),
        },
        _ => None,
    };
    let include_pad = node.int("count_include_pad", 0)? != 0;
    // A 1-D input as images of height 1.
    let [h, wd] = plane(x.shape);
    let images = x.shape[0] * x.shape[1];
    let w = w.at([h, wd], k);
    let (oh, ow) = (w.out(h, k[0], 0), w.out(wd, k[1], 1));
    let shape = planar_shape(node, [x.shape[0], x.shape[1]], [oh, ow], spatial)?;
    // The work, not only the output, is bounded: a huge window over huge pads would
    // otherwise loop for ages on a small output.
    if crate::tensor::numel(&[images, oh, ow, k[0], k[1]]).map_or(true, |w| w > MAX_ELEMENTS) {
        return fail(
            node,
            format!(
                "a {}x{} window over a {oh}x{ow} output is more work than one op may do",
                k[0], k[1]
            ),
        );
    }
    let v = x.as_f32().map_err(|e| node.error(e))?;
    // Each output position's window rows and columns inside the image.
    let rows: Vec<std::ops::Range<usize>> = (0..oh).map(|y| w.inside(y, k[0], 0, h)).collect();
    let cols: Vec<std::ops::Range<usize>> = (0..ow).map(|xo| w.inside(xo, k[1], 1, wd)).collect();
    let mut out = Vec::with_capacity(images * oh * ow);
    for img in v.chunks((h * wd).max(1)).take(images) {
        for (y, ry) in rows.iter().enumerate() {
            for (xo, rx) in cols.iter().enumerate() {
                let first = |o: usize, u: usize, i: usize| {
                    o * w.strides[i] + u * w.dilations[i] - w.pads[i]
                };
                let taps = ry.clone().flat_map(|u| {
                    let r = first(y, u, 0);
                    rx.clone().map(move |q| (r, q))
                });
                out.push(if max {
                    // NaN wins a max, as in onnxruntime.
                    taps.fold(f32::NEG_INFINITY, |best, (r, q)| {
                        let e = img[r * wd + first(xo, q, 1)];
                        if e > best || e.is_nan() {
                            e
                        } else {
                            best
                        }
                    })
                } else if let Some(p) = p {
                    // The p-norm of the taps inside (the padding adds zeros).
                    let sum: f64 = taps
                        .map(|(r, q)| (img[r * wd + first(xo, q, 1)] as f64).abs().powf(p))
                        .sum();
                    sum.powf(1.0 / p) as f32
                } else {
                    let sum: f64 = taps
                        .map(|(r, q)| img[r * wd + first(xo, q, 1)] as f64)
                        .sum();
                    // With the pads: the taps inside the padded input (a ceil-mode
                    // window may reach past it).
                    let count = if include_pad {
                        w.padded_taps(y, k[0], 0, h) * w.padded_taps(xo, k[1], 1, wd)
                    } else {
                        ry.len() * rx.len()
                    };
                    (sum / count.max(1) as f64) as f32
                });
            }
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}

fn infer_global(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    if x.rank() < 3 {
        return fail(node, "an input of rank 3 or more (N, C, spatial axes)");
    }
    let mut shape = x.shape.to_vec();
    shape[2..].fill(Expr::Const(1));
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_global(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    if x.shape.len() < 3 {
        return fail(node, "an input of rank 3 or more (N, C, spatial axes)");
    }
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let area: usize = x.shape[2..].iter().product();
    let images = x.shape[0] * x.shape[1];
    let out: Vec<f32> = if area == 0 {
        vec![f32::NAN; images]
    } else if node.op == "GlobalMaxPool" {
        v.chunks(area)
            .map(|c| {
                c.iter().copied().fold(
                    f32::NEG_INFINITY,
                    |a, e| if e > a || e.is_nan() { e } else { a },
                )
            })
            .collect()
    } else {
        v.chunks(area)
            .map(|c| (c.iter().map(|&e| e as f64).sum::<f64>() / area as f64) as f32)
            .collect()
    };
    let mut shape = x.shape.to_vec();
    shape[2..].fill(1);
    Ok(vec![Tensor::f32(shape, out)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;
    use anyshape_ir::Bindings;

    /// A window's output extent as an expression over a symbolic input extent is the
    /// concrete one at every extent (1 to 40) where the window fits, for pads given, `SAME_*` and
    /// `ceil_mode`, over strides, dilations and kernels; and `SAME_*`'s pads make the
    /// output the input over the stride, the odd pad after (upper) or before (lower).
    #[test]
    fn symbolic_and_concrete_extents_agree() {
        for auto_pad in ["NOTSET", "SAME_UPPER", "SAME_LOWER"] {
            for ceil in [0, 1] {
                for (k, s, dil, pads) in [
                    (3, 2, 1, [1, 0]),
                    (2, 3, 2, [0, 2]),
                    (1, 1, 1, [0, 0]),
                    (4, 1, 3, [2, 1]),
                ] {
                    let node = Node {
                        name: "pool".into(),
                        op: "MaxPool".into(),
                        inputs: vec![],
                        outputs: vec![],
                        attrs: [
                            ("auto_pad".to_string(), Attr::Str(auto_pad.into())),
                            ("ceil_mode".to_string(), Attr::Int(ceil)),
                            ("strides".to_string(), Attr::Ints(vec![s])),
                            ("dilations".to_string(), Attr::Ints(vec![dil])),
                            ("pads".to_string(), Attr::Ints(pads.to_vec())),
                        ]
                        .into(),
                    };
                    let w = Window::of_rank(&node, 1).unwrap();
                    let e = w.out_expr(&Expr::var("d"), k, 1);
                    for d in 1..=40usize {
                        let b = Bindings::from_pairs([("d", d as i64)]);
                        let out = w.out(d, k as usize, 1);
                        let case = format!("{auto_pad} ceil {ceil} k {k} s {s} dil {dil} d {d}");
                        // Where the window does not fit, the expression is not positive
                        // (the instance is refused).
                        match out {
                            0 => assert!(e.eval(&b).unwrap() <= 0, "{case}"),
                            _ => assert_eq!(e.eval(&b).unwrap(), out as i64, "{case}"),
                        }
                        let at = w.at([1, d], [1, k as usize]);
                        assert_eq!(at.out(d, k as usize, 1), out, "{case}");
                        if auto_pad != "NOTSET" {
                            assert_eq!(out, d.div_ceil(s as usize), "{case}");
                            let (before, after) = (at.pads[1], at.pads[3]);
                            assert!(before.abs_diff(after) <= 1, "{case}");
                            assert_eq!(
                                before > after,
                                auto_pad == "SAME_LOWER" && before != after,
                                "{case}"
                            );
                        }
                    }
                }
            }
        }
    }
}
