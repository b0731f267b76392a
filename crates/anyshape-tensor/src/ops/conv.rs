//! Convolutions: `Conv` (2-D over NCHW, 1-D over NCL as images of height 1, grouped
//! and depthwise) as a reference (patches × filters through the `gemm` crate, group by
//! group: a host step where no kernel runs it), `ConvTranspose` (the same shapes, each
//! input element scattered through the filters: a host step) and `anyshape.Im2Col`, the
//! patches of each image as the columns of a matrix — the host step before a
//! `conv_columns` kernel, which fusion makes of a `Conv` over constant filters. The
//! internal op is no ONNX op: a model that names it is refused at import.
use super::pool::{planar_shape, plane, spatial_axes, Window};
use super::{fail, req, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Conv",
        since: 11,
        infer: infer_conv,
        eval: eval_conv,
        eval_into: None,
    },
    OpSpec {
        name: "ConvTranspose",
        since: 11,
        infer: infer_conv_transpose,
        eval: eval_conv_transpose,
        eval_into: None,
    },
    OpSpec {
        name: IM2COL,
        since: 1,
        infer: infer_im2col,
        eval: eval_im2col,
        eval_into: None,
    },
];

/// The internal op that lays out a convolution's input patches as columns: input
/// `x` `[n, ci, h, w]`, the convolution's window attributes and its `kernel_shape`;
/// output `[n, ci·kh·kw, oh·ow]`.
pub const IM2COL: &str = "anyshape.Im2Col";

/// A convolution's window ([`Window`]) over `spatial` axes, and its groups.
fn conv_window(node: &Node, spatial: usize) -> Result<(Window, usize)> {
    let group = node.int("group", 1)?;
    if group < 1 {
        return fail(node, format!("group {group}: need 1 or more"));
    }
    Ok((Window::of_rank(node, spatial)?, group as usize))
}

fn infer_conv(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let spatial = spatial_axes(node, x.rank())?;
    if w.rank() != x.rank() {
        return fail(node, "filters of another rank than the input");
    }
    let (c, group) = conv_window(node, spatial)?;
    if let (Some(cx), Some(cw)) = (x.shape[1].as_const(), w.shape[1].as_const()) {
        if cx != cw * group as i64 {
            return fail(
                node,
                format!(
                    "{cx} input channels where {group} groups of {cw} filters' channels read them"
                ),
            );
        }
    }
    let mut shape = vec![x.shape[0].clone(), w.shape[0].clone()];
    for a in 2..x.rank() {
        let k = w.shape[a]
            .as_const()
            .ok_or_else(|| node.error("a symbolic kernel size"))?;
        // A 1-D window is the width's of a 2-D one.
        shape.push(c.out_expr(&x.shape[a], k, a + 2 - x.rank()));
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_conv(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let spatial = spatial_axes(node, x.shape.len())?;
    let (c, group) = conv_window(node, spatial)?;
    if w.shape.len() != x.shape.len() || x.shape[1] != w.shape[1] * group {
        return fail(
            node,
            format!(
                "filters {:?} in {group} groups do not read an input {:?}",
                w.shape, x.shape
            ),
        );
    }
    // A 1-D convolution as a 2-D one over images of height 1.
    let (n, ci) = (x.shape[0], x.shape[1]);
    let ([h, wd], [kh, kw]) = (plane(x.shape), plane(w.shape));
    let co = w.shape[0];
    if kh == 0 || kw == 0 {
        return fail(node, "an empty kernel");
    }
    if co % group != 0 {
        return fail(node, format!("{co} filters in {group} groups"));
    }
    let c = c.at(&[h, wd], &[kh, kw]);
    let (oh, ow) = (c.out(h, kh, 0), c.out(wd, kw, 1));
    let xv = x.as_f32().map_err(|e| node.error(e))?;
    let wv = w.as_f32().map_err(|e| node.error(e))?;
    let bias = ins
        .get(2)
        .copied()
        .flatten()
        .map(|b| b.as_f32().map(|v| v.to_vec()))
        .transpose()
        .map_err(|e| node.error(e))?;
    let shape = planar_shape(node, [n, co], [oh, ow], spatial)?;
    if bias.as_ref().is_some_and(|v| v.len() != co) {
        return fail(
            node,
            format!("a bias of another length than the {co} output channels"),
        );
    }
    // Per image and group: the group's patches as the columns of a (cg·kh·kw) × (oh·ow)
    // matrix (zero where a patch reaches into the padding), then the group's weights ×
    // patches with the `gemm` crate: the output is NCHW as it comes out.
    let (cg, og) = (ci / group, co / group);
    let (k, p) = (cg * kh * kw, oh * ow);
    sized(node, &[k, p])?;
    let mut cols = vec![0f32; k * p];
    let mut out = vec![0f32; n * co * p];
    for b in 0..n {
        for g in 0..group {
            let image = &xv[(b * ci + g * cg) * h * wd..][..cg * h * wd];
            columns(image, [cg, h, wd], [kh, kw], &c, [oh, ow], 0, &mut cols);
            let dst = &mut out[(b * co + g * og) * p..][..og * p];
            if let Some(bias) = &bias {
                for (o, row) in dst.chunks_mut(p.max(1)).enumerate() {
                    row.fill(bias[g * og + o]);
                }
            }
            if og > 0 && p > 0 && k > 0 {
                let filters = &wv[g * og * k..][..og * k];
                // SAFETY: dst is og × p, filters og × k and cols k × p, all row-major,
                // as passed.
                unsafe {
                    gemm::gemm(
                        og,
                        p,
                        k,
                        dst.as_mut_ptr(),
                        1,
                        p as isize,
                        true,
                        filters.as_ptr(),
                        1,
                        k as isize,
                        cols.as_ptr(),
                        1,
                        p as isize,
                        1.0f32,
                        1.0f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                }
            }
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}

/// A transposed convolution's placement over `spatial` axes (a 1-D one as the width
/// of a 2-D one): strides, dilations, `output_padding`, the pads given (`pads`, or
/// none with `auto_pad`) and the output extents asked for (`output_shape`, or the
/// input's times the stride with `SAME_*`), from which the pads follow ([`Transposed::pads`]).
struct Transposed {
    strides: super::Dims,
    dilations: super::Dims,
    extra: [usize; 2],
    pads: super::Dims,
    same: Option<super::pool::Same>,
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
            strides: w.strides,
            dilations: w.dilations,
            extra: axes("output_padding", 0)?.unwrap_or([0, 0]),
            pads: w.pads,
            same: w.same,
            shape: axes("output_shape", 1)?,
            group: group as usize,
        })
    }

    /// The pads (before, after) of axis `i` for an input extent `d` and a kernel of
    /// extent `k`: given, or those that make the output extent asked for (negative
    /// where it is more than the input makes: room after, as ONNX's reference places it).
    fn pads(&self, d: usize, k: usize, i: usize) -> (isize, isize) {
        let want = match (self.shape, self.same) {
            (Some(s), _) => s[i],
            (None, Some(_)) => d * self.strides[i],
            (None, None) => return (self.pads[i] as isize, self.pads[i + 2] as isize),
        };
        let total = self.full(d, k, i) as isize - want as isize;
        let half = total.div_euclid(2);
        match self.same {
            Some(super::pool::Same::Upper) => (half, total - half),
            _ => (total - half, half),
        }
    }

    /// The extent of axis `i` before pads.
    fn full(&self, d: usize, k: usize, i: usize) -> usize {
        self.strides[i] * d.saturating_sub(1)
            + self.extra[i]
            + self.dilations[i] * (k.max(1) - 1)
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
        shape.push(match (t.shape, t.same, x.shape[a].as_const()) {
            (Some(s), _, _) => Expr::Const(s[i] as i64),
            (None, Some(_), _) => (x.shape[a].clone() * t.strides[i] as i64).simplify(),
            (None, None, Some(d)) => {
                Expr::Const(t.out(d as usize, k, i).map_err(|e| node.error(e))? as i64)
            }
            (None, None, None) => {
                let span = t.dilations[i] * (k.max(1) - 1) + 1;
                ((x.shape[a].clone() - 1) * t.strides[i] as i64 + (t.extra[i] + span) as i64
                    - (t.pads[i] + t.pads[i + 2]) as i64)
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
        .map(|_| super::per_channel(node, ins, 2, co))
        .transpose()?;
    // The work, not only the output, is bounded.
    if crate::tensor::numel(&[n, ci, h, wd, og, kh, kw]).map_or(true, |w| w > super::MAX_ELEMENTS) {
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
                            let y = (iy * t.strides[0] + u * t.dilations[0]) as isize - top;
                            if !(0..oh as isize).contains(&y) {
                                continue;
                            }
                            for q in 0..kw {
                                let xo = (ix * t.strides[1] + q * t.dilations[1]) as isize - left;
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

/// The patches of image `b` of `x` (`[n, ci, h, w]`) as the columns of a
/// `(ci·kh·kw) × (oh·ow)` matrix, row-major into `cols` (zero where a patch reaches
/// into the padding): what a convolution multiplies its filters with. Each output row
/// of a column row is a zero run, the input row's elements at the stride (a plain copy
/// at stride 1), and a zero run.
fn columns(
    x: &[f32],
    [ci, h, wd]: [usize; 3],
    [kh, kw]: [usize; 2],
    c: &Window,
    [oh, ow]: [usize; 2],
    b: usize,
    cols: &mut [f32],
) {
    let p = oh * ow;
    let (sy, sx) = (c.strides[0], c.strides[1]);
    for i in 0..ci {
        let plane = &x[(b * ci + i) * h * wd..][..h * wd];
        for u in 0..kh {
            for q in 0..kw {
                let row = &mut cols[((i * kh + u) * kw + q) * p..][..p];
                // The output columns whose input column is inside: ix = xo·sx + off.
                let off = (q * c.dilations[1]) as isize - c.pads[1] as isize;
                let first = if off >= 0 {
                    0
                } else {
                    ((-off) as usize).div_ceil(sx)
                };
                let end = if (wd as isize) <= off {
                    0
                } else {
                    ((wd as isize - off) as usize).div_ceil(sx)
                }
                .clamp(first.min(ow), ow);
                let first = first.min(end);
                for (y, out) in row.chunks_exact_mut(ow.max(1)).take(oh).enumerate() {
                    let iy = (y * sy + u * c.dilations[0]) as isize - c.pads[0] as isize;
                    if !(0..h as isize).contains(&iy) {
                        out.fill(0.0);
                        continue;
                    }
                    let src = &plane[iy as usize * wd..][..wd];
                    out[..first].fill(0.0);
                    out[end..].fill(0.0);
                    let start = (first as isize * sx as isize + off) as usize;
                    if sx == 1 {
                        out[first..end].copy_from_slice(&src[start..start + (end - first)]);
                    } else {
                        for (o, &v) in out[first..end]
                            .iter_mut()
                            .zip(src[start..].iter().step_by(sx))
                        {
                            *o = v;
                        }
                    }
                }
            }
        }
    }
}

/// The kernel extent `[kh, kw]` of an `anyshape.Im2Col` node.
fn kernel_shape(node: &Node) -> Result<[usize; 2]> {
    match node.ints("kernel_shape")? {
        Some(v) if v.len() == 2 && v.iter().all(|&x| x > 0) => Ok([v[0] as usize, v[1] as usize]),
        _ => fail(node, "kernel_shape: two positive extents"),
    }
}

fn infer_im2col(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    if x.rank() != 4 {
        return fail(node, "an NCHW input");
    }
    let c = Window::of(node)?;
    let [kh, kw] = kernel_shape(node)?;
    let k = x.shape[1].clone() * Expr::Const((kh * kw) as i64);
    let p = c.out_expr(&x.shape[2], kh as i64, 0) * c.out_expr(&x.shape[3], kw as i64, 1);
    Ok(vec![Fact::new(
        x.dtype,
        vec![x.shape[0].clone(), k.simplify(), p.simplify()],
    )])
}

fn eval_im2col(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let &[n, ci, h, wd] = x.shape else {
        return fail(node, "an NCHW input");
    };
    let [kh, kw] = kernel_shape(node)?;
    let c = Window::of(node)?.at(&[h, wd], &[kh, kw]);
    let (oh, ow) = (c.out(h, kh, 0), c.out(wd, kw, 1));
    let (k, p) = (ci * kh * kw, oh * ow);
    let mut cols = vec![0f32; sized(node, &[n, k, p])?];
    let xv = x.as_f32().map_err(|e| node.error(e))?;
    for (b, image) in cols.chunks_exact_mut((k * p).max(1)).enumerate().take(n) {
        columns(xv, [ci, h, wd], [kh, kw], &c, [oh, ow], b, image);
    }
    Ok(vec![Tensor::f32(vec![n, k, p], cols)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;

    /// The convolution as a plain loop nest (in `group`s: output channel `o` reads the
    /// input channels of its group), for the test.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        x: &[f32],
        [n, ci, h, wd]: [usize; 4],
        w: &[f32],
        [co, kh, kw]: [usize; 3],
        group: usize,
        bias: Option<&[f32]>,
        c: &Window,
        [oh, ow]: [usize; 2],
    ) -> Vec<f32> {
        let (cg, og) = (ci / group, co / group);
        let mut out = vec![0f32; n * co * oh * ow];
        for b in 0..n {
            for o in 0..co {
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut acc = bias.map_or(0.0, |v| v[o]);
                        for i in 0..cg {
                            let ch = o / og * cg + i;
                            for p in 0..kh {
                                for q in 0..kw {
                                    let iy = (y * c.strides[0] + p * c.dilations[0]) as isize
                                        - c.pads[0] as isize;
                                    let ix = (xo * c.strides[1] + q * c.dilations[1]) as isize
                                        - c.pads[1] as isize;
                                    if (0..h as isize).contains(&iy)
                                        && (0..wd as isize).contains(&ix)
                                    {
                                        acc += x
                                            [((b * ci + ch) * h + iy as usize) * wd + ix as usize]
                                            * w[((o * cg + i) * kh + p) * kw + q];
                                    }
                                }
                            }
                        }
                        out[((b * co + o) * oh + y) * ow + xo] = acc;
                    }
                }
            }
        }
        out
    }

    /// Patches × weights equals the loop nest: patchify (ViT), padding, strides,
    /// dilations, bias or none, batch 2, a kernel as large as the image, groups
    /// (depthwise too), and 1-D convolutions (NCL: `h` 0 marks one, run on the
    /// rank-3 input and compared with the 2-D loop over a height of 1).
    #[test]
    fn conv_matches_the_loop_nest() {
        /// Input NCHW, (out channels, kh, kw), strides, pads, dilations, group, with a
        /// bias.
        type Case = (
            [usize; 4],
            [usize; 3],
            [usize; 2],
            [usize; 4],
            [usize; 2],
            usize,
            bool,
        );
        let cases: &[Case] = &[
            (
                [1, 3, 32, 48],
                [8, 16, 16],
                [16, 16],
                [0; 4],
                [1, 1],
                1,
                true,
            ),
            (
                [2, 2, 7, 9],
                [3, 3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                1,
                false,
            ),
            (
                [2, 3, 11, 10],
                [4, 3, 2],
                [2, 3],
                [2, 0, 1, 3],
                [2, 1],
                1,
                true,
            ),
            ([1, 1, 5, 5], [2, 5, 5], [1, 1], [0; 4], [1, 1], 1, true),
            // Two groups of 2 channels into 3 filters each; depthwise with a multiplier.
            (
                [2, 4, 6, 7],
                [6, 3, 2],
                [1, 2],
                [1, 0, 1, 1],
                [1, 1],
                2,
                true,
            ),
            (
                [1, 5, 9, 9],
                [10, 3, 3],
                [2, 2],
                [1, 1, 1, 1],
                [1, 1],
                5,
                false,
            ),
            // 1-D: [n, c, 1, l] with its window along the width; depthwise and causal.
            (
                [2, 3, 0, 13],
                [6, 1, 4],
                [1, 2],
                [0, 3, 0, 0],
                [1, 1],
                3,
                true,
            ),
            (
                [1, 4, 0, 11],
                [2, 1, 3],
                [1, 1],
                [0, 2, 0, 1],
                [1, 2],
                1,
                false,
            ),
        ];
        for &(xs, [co, kh, kw], strides, pads, dilations, group, with_bias) in cases {
            let one_d = xs[2] == 0;
            let x4 = [xs[0], xs[1], xs[2].max(1), xs[3]];
            let cg = xs[1] / group;
            let x: Vec<f32> = (0..x4.iter().product::<usize>())
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let w: Vec<f32> = (0..co * cg * kh * kw)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 40.0)
                .collect();
            let bias: Vec<f32> = (0..co).map(|o| o as f32 * 0.5 - 1.0).collect();
            let ints = |v: &[usize]| Attr::Ints(v.iter().map(|&x| x as i64).collect());
            let (attrs, xshape, wshape) = if one_d {
                (
                    [
                        ("strides".to_string(), ints(&strides[1..])),
                        ("pads".to_string(), ints(&[pads[1], pads[3]])),
                        ("dilations".to_string(), ints(&dilations[1..])),
                        ("group".to_string(), Attr::Int(group as i64)),
                    ],
                    vec![xs[0], xs[1], xs[3]],
                    vec![co, cg, kw],
                )
            } else {
                (
                    [
                        ("strides".to_string(), ints(&strides)),
                        ("pads".to_string(), ints(&pads)),
                        ("dilations".to_string(), ints(&dilations)),
                        ("group".to_string(), Attr::Int(group as i64)),
                    ],
                    x4.to_vec(),
                    vec![co, cg, kh, kw],
                )
            };
            let node = Node {
                name: "conv".into(),
                op: "Conv".into(),
                inputs: vec![],
                outputs: vec![],
                attrs: attrs.into(),
            };
            let xt = Tensor::f32(xshape.clone(), x.clone()).unwrap();
            let wt = Tensor::f32(wshape, w.clone()).unwrap();
            let bt = Tensor::f32(vec![co], bias.clone()).unwrap();
            let ins = [
                Some(xt.view()),
                Some(wt.view()),
                with_bias.then(|| bt.view()),
            ];
            let got = eval_conv(&node, &ins).unwrap().remove(0);
            assert_eq!(got.shape.len(), xshape.len(), "{xs:?}");
            let (c, _) = conv_window(&node, xshape.len() - 2).unwrap();
            let [oh, ow] = match one_d {
                true => [1, got.shape[2]],
                false => [got.shape[2], got.shape[3]],
            };
            let want = naive(
                &x,
                x4,
                &w,
                [co, kh, kw],
                group,
                with_bias.then_some(&bias[..]),
                &c,
                [oh, ow],
            );
            let got = got.as_f32().unwrap();
            assert_eq!(got.len(), want.len());
            for (g, e) in got.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{xs:?}: {g} vs {e}"
                );
            }
        }
    }
}
