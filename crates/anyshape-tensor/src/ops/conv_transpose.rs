//! `ConvTranspose` (1-D over NCL as images of height 1, and 2-D; groups, dilations,
//! `output_padding`, `output_shape` and `SAME_*` placing the pads as ONNX's reference
//! does): each input element scattered into the output through the filters — a
//! reference loop, a host step.
use super::conv::{planar_shape, plane, spatial_axes};
use super::window::{Same, Window};
use super::{fail, per_channel, req, OpSpec, MAX_ELEMENTS};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "ConvTranspose",
    since: 11,
    infer: infer_conv_transpose,
    eval: eval_conv_transpose,
    eval_into: None,
}];

/// A transposed convolution's placement over `spatial` axes (a 1-D one as the width
/// of a 2-D one): its [`Window`] (strides, dilations, the pads given, `auto_pad`),
/// `output_padding` and the output extents asked for (`output_shape`, or the input's
/// times the stride with `SAME_*`), from which the pads follow ([`Transposed::pads`]).
struct Transposed {
    w: Window,
    extra: [usize; 2],
    shape: Option<[usize; 2]>,
    group: usize,
}

impl Transposed {
    fn of(node: &Node, spatial: usize) -> Result<Transposed> {
        let w = Window::of_rank(node, spatial)?;
        let axes = |name: &str, default: usize| -> Result<Option<[usize; 2]>> {
            match node.ints(name)? {
                None => Ok(None),
                Some(v) if v.len() == spatial && v.iter().all(|&x| x >= 0) => {
                    Ok(Some(match spatial {
                        1 => [default, v[0] as usize],
                        _ => [v[0] as usize, v[1] as usize],
                    }))
                }
                Some(v) => fail(node, format!("{name} {v:?}: {spatial} spatial axes")),
            }
        };
        let group = node.int("group", 1)?;
        if group < 1 {
            return fail(node, format!("group {group}: need 1 or more"));
        }
        Ok(Transposed {
            w,
            extra: axes("output_padding", 0)?.unwrap_or([0, 0]),
            shape: axes("output_shape", 1)?,
            group: group as usize,
        })
    }

    /// The pads (before, after) of axis `i` for an input extent `d` and a kernel of
    /// extent `k`: given, or those that make the output extent asked for (negative
    /// where it is more than the input makes: room after, as ONNX's reference places it).
    fn pads(&self, d: usize, k: usize, i: usize) -> (isize, isize) {
        let want = match (self.shape, self.w.same) {
            (Some(s), _) => s[i],
            (None, Some(_)) => d * self.w.strides[i],
            (None, None) => return (self.w.pads[i] as isize, self.w.after(i) as isize),
        };
        let total = self.full(d, k, i) as isize - want as isize;
        let half = total.div_euclid(2);
        match self.w.same {
            Some(Same::Upper) => (half, total - half),
            _ => (total - half, half),
        }
    }

    /// The extent of axis `i` before pads.
    fn full(&self, d: usize, k: usize, i: usize) -> usize {
        self.w.strides[i] * d.saturating_sub(1)
            + self.extra[i]
            + self.w.dilations[i] * (k.max(1) - 1)
            + 1
    }

    /// The output extent of axis `i`.
    fn out(&self, d: usize, k: usize, i: usize) -> Result<usize, String> {
        let (before, after) = self.pads(d, k, i);
        usize::try_from(self.full(d, k, i) as isize - before - after)
            .map_err(|_| "pads larger than the output".to_string())
    }
}

fn infer_conv_transpose(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let spatial = spatial_axes(node, x.rank())?;
    if w.rank() != x.rank() {
        return fail(node, "filters of another rank than the input");
    }
    let t = Transposed::of(node, spatial)?;
    let co = w.shape[1].clone() * Expr::Const(t.group as i64);
    let mut shape = vec![x.shape[0].clone(), co.simplify()];
    for a in 2..x.rank() {
        let i = a + 2 - x.rank();
        let k = w.shape[a]
            .as_const()
            .ok_or_else(|| node.error("a symbolic kernel size"))? as usize;
        shape.push(match (t.shape, t.w.same, x.shape[a].as_const()) {
            (Some(s), _, _) => Expr::Const(s[i] as i64),
            (None, Some(_), _) => (x.shape[a].clone() * t.w.strides[i] as i64).simplify(),
            (None, None, Some(d)) => {
                Expr::Const(t.out(d as usize, k, i).map_err(|e| node.error(e))? as i64)
            }
            (None, None, None) => {
                let span = t.w.dilations[i] * (k.max(1) - 1) + 1;
                ((x.shape[a].clone() - 1) * t.w.strides[i] as i64 + (t.extra[i] + span) as i64
                    - (t.w.pads[i] + t.w.after(i)) as i64)
                    .simplify()
            }
        });
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `ConvTranspose`: each input element scattered into the output through the
/// filters (`[ci, co / group, kh, kw]`), group by group, then the bias.
fn eval_conv_transpose(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let spatial = spatial_axes(node, x.shape.len())?;
    let t = Transposed::of(node, spatial)?;
    let g = t.group;
    if w.shape.len() != x.shape.len() || x.shape[1] != w.shape[0] || x.shape[1] % g != 0 {
        return fail(
            node,
            format!(
                "filters {:?} in {g} groups do not read an input {:?}",
                w.shape, x.shape
            ),
        );
    }
    let (n, ci) = (x.shape[0], x.shape[1]);
    let ([h, wd], [kh, kw]) = (plane(x.shape), plane(w.shape));
    let (cg, og) = (ci / g, w.shape[1]);
    let co = og * g;
    let err = |e: String| node.error(e);
    let (oh, ow) = (
        t.out(h, kh, 0).map_err(err)?,
        t.out(wd, kw, 1).map_err(err)?,
    );
    let (top, _) = t.pads(h, kh, 0);
    let (left, _) = t.pads(wd, kw, 1);
    let shape = planar_shape(node, [n, co], [oh, ow], spatial)?;
    let xv = x.as_f32().map_err(|e| node.error(e))?;
    let wv = w.as_f32().map_err(|e| node.error(e))?;
    let bias = ins
        .get(2)
        .copied()
        .flatten()
        .map(|_| per_channel(node, ins, 2, co))
        .transpose()?;
    // The work, not only the output, is bounded.
    if crate::tensor::numel(&[n, ci, h, wd, og, kh, kw]).map_or(true, |w| w > MAX_ELEMENTS) {
        return fail(node, "more work than one op may do");
    }
    let mut out = vec![0f32; n * co * oh * ow];
    for b in 0..n {
        for c in 0..ci {
            let grp = c / cg;
            for iy in 0..h {
                for ix in 0..wd {
                    let v = xv[((b * ci + c) * h + iy) * wd + ix];
                    for o in 0..og {
                        let oc = grp * og + o;
                        for u in 0..kh {
                            let y = (iy * t.w.strides[0] + u * t.w.dilations[0]) as isize - top;
                            if !(0..oh as isize).contains(&y) {
                                continue;
                            }
                            for q in 0..kw {
                                let xo =
                                    (ix * t.w.strides[1] + q * t.w.dilations[1]) as isize - left;
                                if (0..ow as isize).contains(&xo) {
                                    out[((b * co + oc) * oh + y as usize) * ow + xo as usize] +=
                                        v * wv[((c * og + o) * kh + u) * kw + q];
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(bias) = bias {
        for (i, plane) in out.chunks_mut((oh * ow).max(1)).enumerate() {
            let add = bias[i % co];
            plane.iter_mut().for_each(|e| *e += add);
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}
