//! Convolutions: `Conv` (2-D over NCHW, 1-D over NCL as images of height 1, grouped
//! and depthwise) as a reference (patches × filters through the `gemm` crate, group by
//! group: a host step where no kernel runs it) and `anyshape.Im2Col`, the
//! patches of each image as the columns of a matrix — the host step before a
//! `conv_packed` kernel, which fusion makes of a `Conv` over constant filters. The
//! internal op is no ONNX op: a model that names it is refused at import.
use super::window::Window;
use super::{fail, req, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef, Workers};
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
        name: IM2COL,
        since: 1,
        infer: infer_im2col,
        eval: eval_im2col,
        eval_into: Some(eval_im2col_into),
    },
];

/// The internal op that lays out a convolution's input patches as columns: input
/// `x` `[n, ci, h, w]`, the convolution's window attributes and its `kernel_shape`;
/// output `[n, ci·kh·kw, oh·ow]`.
pub const IM2COL: &str = "anyshape.Im2Col";

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
            for (i, rows) in cols.chunks_exact_mut((kw * p).max(1)).enumerate() {
                let plane = &image[i / kh * h * wd..][..h * wd];
                columns(plane, [h, wd], i % kh, kw, &c, [oh, ow], rows);
            }
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

/// The patches of one input channel `plane` (`h × w`) at kernel row `u`: `kw` rows of
/// the `(ci·kh·kw) × (oh·ow)` matrix of an image's patches, row-major into `rows` (zero
/// where a patch reaches into the padding) — with the other channels' and kernel
/// rows', what a convolution multiplies its filters with. Each output row of a row is
/// a zero run, the input row's elements at the stride (a plain copy at stride 1), and
/// a zero run.
fn columns(
    plane: &[f32],
    [h, wd]: [usize; 2],
    u: usize,
    kw: usize,
    c: &Window,
    [oh, ow]: [usize; 2],
    rows: &mut [f32],
) {
    let p = oh * ow;
    let (sy, sx) = (c.strides[0], c.strides[1]);
    for q in 0..kw {
        let row = &mut rows[q * p..][..p];
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
            let start = (first as isize * sx as isize + off) as usize;
            out[..first].fill(0.0);
            out[end..].fill(0.0);
            let dst = &mut out[first..end];
            match (sx, dst.split_last_mut()) {
                (1, _) => dst.copy_from_slice(&src[start..start + dst.len()]),
                // Every other element, as pairs: the compiler vectorizes it (a stride-2
                // layout took 3x longer per element than a stride-1 copy through
                // `step_by`).
                (2, Some((last, body))) => {
                    for (o, pair) in body.iter_mut().zip(src[start..].chunks_exact(2)) {
                        *o = pair[0];
                    }
                    *last = src[start + 2 * body.len()];
                }
                _ => {
                    for (o, &v) in dst.iter_mut().zip(src[start..].iter().step_by(sx)) {
                        *o = v;
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
    super::eval_via(node, ins, eval_im2col_into)
}

/// The patches into a kept tensor: a run's convolutions allocate and zero no columns
/// (every element is written, the pads' as zeros), which took ResNet-50's 20 layouts
/// ~5 ms of a 33 ms run at 224 x 224 with fresh buffers.
fn eval_im2col_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let &[n, ci, h, wd] = x.shape else {
        return fail(node, "an NCHW input");
    };
    let [kh, kw] = kernel_shape(node)?;
    let c = Window::of(node)?.at(&[h, wd], &[kh, kw]);
    let (oh, ow) = (c.out(h, kh, 0), c.out(wd, kw, 1));
    let (k, p) = (ci * kh * kw, oh * ow);
    let xv = x.as_f32().map_err(|e| node.error(e))?;
    let cols = super::shaped(node, outs, 0, &[n, k, p])?
        .f32_mut()
        .map_err(|e| node.error(e))?;
    // Each kernel row of each input channel of each image makes its own rows: one
    // part of the work (a stem's three channels are 21 parts of a 7 x 7 kernel).
    let plane = h * wd;
    workers.chunks_mut(&mut cols[..n * k * p], kw * p, |i, rows| {
        let x = &xv[i / kh * plane..][..plane];
        columns(x, [h, wd], i % kh, kw, &c, [oh, ow], rows)
    });
    Ok(())
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
    /// dilations, rows as long as the input's, output rows short and long (16 or more),
    /// bias or none, batch 2, a kernel as large as the image, groups
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
            // Rows as long as the input's at stride 1: dilated, and pads only before
            // along one axis and after along the other.
            (
                [1, 3, 8, 6],
                [4, 3, 3],
                [1, 1],
                [2, 2, 2, 2],
                [2, 2],
                1,
                true,
            ),
            (
                [2, 2, 6, 7],
                [3, 3, 3],
                [1, 1],
                [0, 2, 2, 0],
                [1, 1],
                1,
                false,
            ),
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
            // Output rows of 16 or more elements: stride 1 padded, and strided (the
            // every-other-element copy of stride 2), dilated, padded unevenly.
            (
                [1, 2, 5, 37],
                [3, 3, 3],
                [1, 1],
                [1, 1, 1, 1],
                [1, 1],
                1,
                true,
            ),
            (
                [2, 2, 4, 40],
                [2, 2, 3],
                [1, 2],
                [0, 2, 1, 1],
                [1, 2],
                1,
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
