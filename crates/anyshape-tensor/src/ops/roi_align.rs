//! `RoiAlign` (opset 16): each region of interest of an image pooled to a fixed grid,
//! every bin the average (or the maximum) of bilinear samples — as ONNX's reference
//! computes it, its clamping at the borders included. A reference loop, a host step.
use super::{fail, req, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "RoiAlign",
    since: 16,
    infer: infer_roi_align,
    eval: eval_roi_align,
    eval_into: None,
}];

/// The output grid's extents.
fn grid(node: &Node) -> Result<(usize, usize)> {
    let (h, w) = (node.int("output_height", 1)?, node.int("output_width", 1)?);
    match h > 0 && w > 0 {
        true => Ok((h as usize, w as usize)),
        false => fail(node, "the output height and width must be positive"),
    }
}

fn infer_roi_align(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, idx) = (req(node, ins, 0)?, req(node, ins, 2)?);
    if x.rank() != 4 || idx.rank() != 1 {
        return fail(node, "an image [N, C, H, W] and one batch index per region");
    }
    let (h, w) = grid(node)?;
    let shape = vec![
        idx.shape[0].clone(),
        x.shape[1].clone(),
        Expr::Const(h as i64),
        Expr::Const(w as i64),
    ];
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// One bilinear sample's four pixels and their weights (all zero outside the image,
/// a border pixel repeated at the edges).
fn sample(h: usize, w: usize, y: f64, x: f64) -> [(usize, f64); 4] {
    if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 {
        return [(0, 0.0); 4];
    }
    let (mut y, mut x) = (y.max(0.0), x.max(0.0));
    let (mut y0, mut x0) = (y as usize, x as usize);
    let y1 = if y0 >= h - 1 {
        y0 = h - 1;
        y = y0 as f64;
        y0
    } else {
        y0 + 1
    };
    let x1 = if x0 >= w - 1 {
        x0 = w - 1;
        x = x0 as f64;
        x0
    } else {
        x0 + 1
    };
    let (ly, lx) = (y - y0 as f64, x - x0 as f64);
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    [
        (y0 * w + x0, hy * hx),
        (y0 * w + x1, hy * lx),
        (y1 * w + x0, ly * hx),
        (y1 * w + x1, ly * lx),
    ]
}

/// `RoiAlign(x, rois, batch_indices)`: for each region (`[x1, y1, x2, y2]` scaled by
/// `spatial_scale`, shifted half a pixel with `half_pixel`) and channel, each of the
/// `output_height` x `output_width` bins the average or maximum of its samples
/// (`sampling_ratio` per axis, or as many as the bin is pixels wide).
fn eval_roi_align(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, rois, idx) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let (&[n, c, h, w], &[r, 4], &[ri]) = (x.shape, rois.shape, idx.shape) else {
        return fail(
            node,
            "an image [N, C, H, W], regions [R, 4] and R batch indices",
        );
    };
    if ri != r || h == 0 || w == 0 {
        return fail(
            node,
            "one batch index per region, and an image that is not empty",
        );
    }
    let (oh, ow) = grid(node)?;
    let max = match node.string("mode", "avg")?.as_str() {
        "avg" => false,
        "max" => true,
        m => return fail(node, format!("mode `{m}` is neither avg nor max")),
    };
    let half = match node
        .string("coordinate_transformation_mode", "half_pixel")?
        .as_str()
    {
        "half_pixel" => true,
        "output_half_pixel" => false,
        m => {
            return fail(
                node,
                format!("coordinate_transformation_mode `{m}` is not one ONNX defines"),
            )
        }
    };
    let scale = node.float("spatial_scale", 1.0)? as f64;
    let ratio = node.int("sampling_ratio", 0)?;
    let xs = x.as_f32().map_err(|e| node.error(e))?;
    let boxes = rois.as_f32().map_err(|e| node.error(e))?;
    let batch = idx.as_i64().map_err(|e| node.error(e))?;
    super::sized(node, &[r, c, oh, ow])?;
    let mut out = vec![0f32; r * c * oh * ow];
    let offset = if half { 0.5 } else { 0.0 };
    for k in 0..r {
        let b = usize::try_from(batch[k])
            .ok()
            .filter(|&b| b < n)
            .ok_or_else(|| {
                node.error(format!("batch index {} outside a batch of {n}", batch[k]))
            })?;
        let bx = &boxes[k * 4..][..4];
        let (x0, y0) = (bx[0] as f64 * scale - offset, bx[1] as f64 * scale - offset);
        let (mut rw, mut rh) = (
            bx[2] as f64 * scale - offset - x0,
            bx[3] as f64 * scale - offset - y0,
        );
        if !half {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / oh as f64, rw / ow as f64);
        let per = |extent: f64, bins: usize| match ratio > 0 {
            true => ratio as usize,
            false => (extent / bins as f64).ceil().max(0.0) as usize,
        };
        let (gh, gw) = (per(rh, oh), per(rw, ow));
        let count = (gh * gw).max(1) as f64;
        for ch in 0..c {
            let plane = &xs[(b * c + ch) * h * w..][..h * w];
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc: Option<f64> = None;
                    for sy in 0..gh {
                        let y = y0 + i as f64 * bh + (sy as f64 + 0.5) * bh / gh as f64;
                        for sx in 0..gw {
                            let xx = x0 + j as f64 * bw + (sx as f64 + 0.5) * bw / gw as f64;
                            let taps = sample(h, w, y, xx);
                            let v = match max {
                                true => taps
                                    .iter()
                                    .map(|&(p, wt)| wt * plane[p] as f64)
                                    .fold(f64::NEG_INFINITY, f64::max),
                                false => taps.iter().map(|&(p, wt)| wt * plane[p] as f64).sum(),
                            };
                            acc = Some(match (acc, max) {
                                (None, _) => v,
                                (Some(a), true) => a.max(v),
                                (Some(a), false) => a + v,
                            });
                        }
                    }
                    let v = match max {
                        true => acc.unwrap_or(0.0),
                        false => acc.unwrap_or(0.0) / count,
                    };
                    out[((k * c + ch) * oh + i) * ow + j] = v as f32;
                }
            }
        }
    }
    Ok(vec![Tensor::f32(vec![r, c, oh, ow], out)?])
}
