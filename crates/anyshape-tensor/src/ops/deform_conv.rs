//! `DeformConv` (opset 19, 2-D): a convolution whose taps are moved by learned offsets
//! per output position (and weighted by a mask), each moved tap read bilinearly with
//! zeros outside the image — as ONNX's reference computes it. A reference loop, a host
//! step.
use super::{fail, req, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "DeformConv",
    since: 19,
    infer: infer_deform_conv,
    eval: eval_deform_conv,
    eval_into: None,
}];

fn infer_deform_conv(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, w, offset) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    if x.rank() != 4 || w.rank() != 4 || offset.rank() != 4 {
        return fail(node, "2-D only: x [N, C, H, W], filters [M, C/group, kH, kW], offsets [N, 2·kH·kW·groups, oH, oW]");
    }
    let shape = vec![
        x.shape[0].clone(),
        w.shape[0].clone(),
        offset.shape[2].clone(),
        offset.shape[3].clone(),
    ];
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// The image `plane` (`h` x `w`) read at the fractional pixel `(y, x)`: bilinear, zero
/// outside.
fn bilinear(plane: &[f32], h: usize, w: usize, y: f64, x: f64) -> f64 {
    let (y0, x0) = (y.floor(), x.floor());
    let (dy, dx) = (y - y0, x - x0);
    let mut v = 0.0;
    for (a, wy) in [(0, 1.0 - dy), (1, dy)] {
        for (b, wx) in [(0, 1.0 - dx), (1, dx)] {
            let (r, c) = (y0 as i64 + a, x0 as i64 + b);
            if (0..h as i64).contains(&r) && (0..w as i64).contains(&c) {
                v += plane[r as usize * w + c as usize] as f64 * wy * wx;
            }
        }
    }
    v
}

/// `DeformConv(x, w, offset, B, mask)`: output `(n, m, i, j)` sums, over its group's
/// channels and the filter's taps `(ki, kj)`, the filter times the mask times `x` read
/// at `(i·stride - pad + ki·dilation + Δy, j·stride - pad + kj·dilation + Δx)`, the
/// offsets `(Δy, Δx)` those of the channel's offset group, tap and position.
fn eval_deform_conv(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, w, offset) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let (&[n, ic, ih, iw], &[oc, icg, kh, kw], &[on, oo, oh, ow]) =
        (x.shape, w.shape, offset.shape)
    else {
        return fail(node, "2-D only: x [N, C, H, W], filters [M, C/group, kH, kW], offsets [N, 2·kH·kW·groups, oH, oW]");
    };
    let group = node.int("group", 1)?.max(1) as usize;
    let og = node.int("offset_group", 1)?.max(1) as usize;
    let ints = |name: &str, default: Vec<i64>| -> Result<Vec<i64>> {
        let v = node.ints(name)?.unwrap_or(default);
        match v.len() == 2 || (name == "pads" && v.len() == 4) {
            true => Ok(v),
            false => fail(node, format!("`{name}` has the wrong length")),
        }
    };
    let (strides, dil, pads) = (
        ints("strides", vec![1, 1])?,
        ints("dilations", vec![1, 1])?,
        ints("pads", vec![0, 0, 0, 0])?,
    );
    if let Some(k) = node.ints("kernel_shape")? {
        if k != [kh as i64, kw as i64] {
            return fail(node, "kernel_shape is not the filters'");
        }
    }
    if ic != icg * group || oc % group != 0 || ic % og != 0 || on != n || oo != og * kh * kw * 2 {
        return fail(
            node,
            "the channels, groups, offset groups and offsets do not agree",
        );
    }
    let taps = kh * kw;
    let mask = ins.get(4).copied().flatten();
    if mask.is_some_and(|m| m.shape != [n, og * taps, oh, ow]) {
        return fail(node, "the mask must be [N, offset_group·kH·kW, oH, oW]");
    }
    let bias = ins.get(3).copied().flatten();
    if bias.is_some_and(|b| b.shape != [oc]) {
        return fail(node, "the bias must have one value per output channel");
    }
    let xs = x.as_f32().map_err(|e| node.error(e))?;
    let ws = w.as_f32().map_err(|e| node.error(e))?;
    let offs = offset.as_f32().map_err(|e| node.error(e))?;
    let mask = mask
        .map(|m| m.as_f32())
        .transpose()
        .map_err(|e| node.error(e))?;
    let bias = bias
        .map(|b| b.as_f32())
        .transpose()
        .map_err(|e| node.error(e))?;
    super::sized(node, &[n, oc, oh, ow])?;
    let (ocg, icpo, plane) = (oc / group, ic / og, oh * ow);
    let mut out = vec![0f32; n * oc * plane];
    for b in 0..n {
        for m in 0..oc {
            let g = m / ocg;
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = bias.map_or(0.0, |v| v[m] as f64);
                    for c in g * icg..(g + 1) * icg {
                        let o = c / icpo;
                        let image = &xs[(b * ic + c) * ih * iw..][..ih * iw];
                        for t in 0..taps {
                            let (ki, kj) = (t / kw, t % kw);
                            let at = |d: usize| {
                                ((((b * og + o) * taps + t) * 2 + d) * plane) + i * ow + j
                            };
                            let y = (i as i64 * strides[0] - pads[0] + ki as i64 * dil[0]) as f64
                                + offs[at(0)] as f64;
                            let xx = (j as i64 * strides[1] - pads[1] + kj as i64 * dil[1]) as f64
                                + offs[at(1)] as f64;
                            let scale = mask.map_or(1.0, |mk| {
                                mk[((b * og + o) * taps + t) * plane + i * ow + j] as f64
                            });
                            let wv = ws[((m * icg + (c - g * icg)) * kh + ki) * kw + kj] as f64;
                            acc += wv * scale * bilinear(image, ih, iw, y, xx);
                        }
                    }
                    out[(b * oc + m) * plane + i * ow + j] = acc as f32;
                }
            }
        }
    }
    Ok(vec![Tensor::f32(vec![n, oc, oh, ow], out)?])
}
