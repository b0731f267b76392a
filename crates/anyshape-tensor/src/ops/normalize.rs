//! Normalizations: functions of each row along an axis (`Softmax`, `LogSoftmax`,
//! `Hardmax`, `LpNormalization`) and of groups of axes (`LayerNormalization`,
//! `RMSNormalization`, `InstanceNormalization`, `GroupNormalization`,
//! `BatchNormalization` at inference, `MeanVarianceNormalization`), and `LRN` (across
//! channels). The reference keeps its sums in `f64` or in
//! lanes of `f32`.
use super::{
    axis, broadcast_indices, eval_via, fail, infer_same, lane_sum, per_channel, req, shaped,
    split_at, Dims, OpSpec,
};
use crate::node::Node;
use crate::Workers;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "MeanVarianceNormalization",
        since: 13,
        infer: infer_same,
        eval: eval_mvn,
        eval_into: None,
    },
    OpSpec {
        name: "LRN",
        since: 13,
        infer: infer_same,
        eval: eval_lrn,
        eval_into: None,
    },
    OpSpec {
        name: "Softmax",
        since: 13,
        infer: infer_same,
        eval: eval_along_axis,
        eval_into: None,
    },
    OpSpec {
        name: "LogSoftmax",
        since: 13,
        infer: infer_same,
        eval: eval_along_axis,
        eval_into: None,
    },
    OpSpec {
        name: "Hardmax",
        since: 13,
        infer: infer_same,
        eval: eval_along_axis,
        eval_into: None,
    },
    OpSpec {
        name: "LpNormalization",
        since: 1,
        infer: infer_same,
        eval: eval_along_axis,
        eval_into: None,
    },
    OpSpec {
        name: "LayerNormalization",
        since: 17,
        infer: infer_layer_norm,
        eval: eval_layer_norm,
        eval_into: Some(eval_layer_norm_into),
    },
    OpSpec {
        name: "RMSNormalization",
        since: 23,
        infer: infer_same,
        eval: eval_rms_norm,
        eval_into: None,
    },
    OpSpec {
        name: "InstanceNormalization",
        since: 6,
        infer: infer_same,
        eval: eval_group_norm,
        eval_into: None,
    },
    OpSpec {
        name: "GroupNormalization",
        since: 21,
        infer: infer_same,
        eval: eval_group_norm,
        eval_into: None,
    },
    OpSpec {
        name: "BatchNormalization",
        since: 9,
        infer: infer_batch_norm,
        eval: eval_batch_norm,
        eval_into: None,
    },
];

/// A function of each row along `axis` (opset 13 on: the axis alone; before, the input
/// was flattened to 2-D at `axis`): `Softmax`, `LogSoftmax`, `Hardmax` (1 at the
/// row's first maximum), `LpNormalization` (`x / ‖row‖_p`, `p` 1 or 2).
fn eval_along_axis(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let a = axis(node, node.int("axis", -1)?, x.shape.len())?;
    let (outer, n, inner) = split_at(x.shape, a);
    let op = node.op.as_str();
    let p = node.int("p", 2)?;
    if op == "LpNormalization" && !matches!(p, 1 | 2) {
        return fail(node, format!("p = {p} (ONNX defines 1 and 2)"));
    }
    let mut out = vec![0f32; v.len()];
    let mut row = vec![0f64; n];
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * n + j) * inner + i;
            for (j, r) in row.iter_mut().enumerate() {
                *r = v[at(j)] as f64;
            }
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            match op {
                "Softmax" | "LogSoftmax" => {
                    let sum: f64 = row.iter().map(|&e| (e - max).exp()).sum();
                    for (j, &e) in row.iter().enumerate() {
                        out[at(j)] = if op == "Softmax" {
                            ((e - max).exp() / sum) as f32
                        } else {
                            (e - max - sum.ln()) as f32
                        };
                    }
                }
                "Hardmax" => {
                    if let Some(j) = row.iter().position(|&e| e == max) {
                        out[at(j)] = 1.0;
                    }
                }
                _ => {
                    let norm = if p == 1 {
                        row.iter().map(|e| e.abs()).sum::<f64>()
                    } else {
                        row.iter().map(|e| e * e).sum::<f64>().sqrt()
                    };
                    for (j, &e) in row.iter().enumerate() {
                        out[at(j)] = if norm == 0.0 { 0.0 } else { (e / norm) as f32 };
                    }
                }
            }
        }
    }
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

fn infer_layer_norm(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let a = axis(node, node.int("axis", -1)?, x.rank())?;
    let mut stat = x.shape[..a].to_vec();
    stat.extend(std::iter::repeat_n(Expr::Const(1), x.rank() - a));
    let mut outs = vec![Fact::new(x.dtype, x.shape.to_vec())];
    for _ in 1..node.outputs.len() {
        outs.push(Fact::new(x.dtype, stat.clone()));
    }
    Ok(outs)
}

fn eval_layer_norm(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    eval_via(node, ins, eval_layer_norm_into)
}

fn eval_layer_norm_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let scale = req(node, ins, 1)?.as_f32().map_err(|e| node.error(e))?;
    let bias = ins
        .get(2)
        .copied()
        .flatten()
        .map(|b| b.as_f32())
        .transpose()
        .map_err(|e| node.error(e))?;
    let eps = node.float("epsilon", 1e-5)?;
    let a = axis(node, node.int("axis", -1)?, x.shape.len())?;
    let n: usize = x.shape[a..].iter().product();
    if scale.len() != n || bias.is_some_and(|b| b.len() != n) {
        return fail(
            node,
            format!("scale and bias must have the {n} elements of the normalized axes"),
        );
    }
    let v = x.as_f32().map_err(|e| node.error(e))?;
    // The statistics' outputs (a mean and an inverse deviation per row), where asked.
    let mut stat: Dims = x.shape[..a].iter().copied().collect();
    stat.extend(std::iter::repeat_n(1, x.shape.len() - a));
    let (out, stats) = outs.split_at_mut(1.min(outs.len()));
    let out = shaped(node, out, 0, x.shape)?.f32_mut()?;
    for k in 0..stats.len().min(node.outputs.len().saturating_sub(1)) {
        // Rows of no elements: no mean, no deviation.
        shaped(node, stats, k, &stat)?.f32_mut()?.fill(f32::NAN);
    }
    // One row's normalization; its mean and inverse deviation.
    let norm = |row: &[f32], out: &mut [f32]| {
        let mean = lane_sum(row, |x| x) / n as f32;
        let var = lane_sum(row, |x| (x - mean) * (x - mean)) / n as f32;
        let inv = 1.0 / (var + eps).sqrt();
        match bias {
            Some(b) => {
                for (((y, &x), &g), &b) in out.iter_mut().zip(row).zip(scale).zip(b) {
                    *y = (x - mean) * inv * g + b;
                }
            }
            None => {
                for ((y, &x), &g) in out.iter_mut().zip(row).zip(scale) {
                    *y = (x - mean) * inv * g;
                }
            }
        }
        (mean, inv)
    };
    if stats.is_empty() {
        // Each row a chunk of the work (the workers group them into parts).
        let n = n.max(1);
        workers.chunks_mut(out, n, |r, out| {
            norm(&v[r * n..][..n], out);
        });
        return Ok(());
    }
    let rows = v.chunks_exact(n.max(1)).zip(out.chunks_exact_mut(n.max(1)));
    for (r, (row, out)) in rows.enumerate() {
        let (mean, inv) = norm(row, out);
        for (k, s) in stats.iter_mut().enumerate() {
            s.f32_mut()?[r] = if k == 0 { mean } else { inv };
        }
    }
    Ok(())
}

fn infer_batch_norm(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let mut outs = vec![x.clone()];
    outs[0].value = None;
    outs[0].sym = None;
    // Training mode's running statistics, per channel.
    if let (Some(c), true) = (x.shape.get(1), node.outputs.len() > 1) {
        outs.extend((0..2).map(|_| Fact::new(x.dtype, vec![c.clone()])));
    }
    Ok(outs)
}

/// `BatchNormalization`: `(x - mean) / sqrt(var + epsilon) · scale + B` per channel
/// (axis 1), from the running statistics at inference; in training mode (opset 14's
/// three outputs) from the batch's own (its variance biased), the running ones updated
/// by `momentum` as outputs.
fn eval_batch_norm(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let training = node.int("training_mode", 0)? != 0;
    if node.outputs.len() > 1 && !training {
        return fail(
            node,
            "the running statistics are outputs in training mode only",
        );
    }
    let x = req(node, ins, 0)?;
    if x.shape.len() < 2 {
        return fail(node, "an input of rank 2 or more (N, C, ...)");
    }
    let c = x.shape[1];
    let channel = |i: usize| per_channel(node, ins, i, c);
    let (scale, bias, running_mean, running_var) =
        (channel(1)?, channel(2)?, channel(3)?, channel(4)?);
    let eps = node.float("epsilon", 1e-5)? as f64;
    let inner: usize = x.shape[2..].iter().product();
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let at = |i: usize| (i / inner.max(1)) % c;
    let (mean, var): (Vec<f64>, Vec<f64>) = match training {
        false => (
            running_mean.iter().map(|&m| m as f64).collect(),
            running_var.iter().map(|&m| m as f64).collect(),
        ),
        true => {
            let per = (v.len() / c.max(1)).max(1) as f64;
            let mut sum = vec![0f64; c];
            for (i, &e) in v.iter().enumerate() {
                sum[at(i)] += e as f64;
            }
            let mean: Vec<f64> = sum.iter().map(|s| s / per).collect();
            let mut sq = vec![0f64; c];
            for (i, &e) in v.iter().enumerate() {
                sq[at(i)] += (e as f64 - mean[at(i)]).powi(2);
            }
            (mean, sq.iter().map(|s| s / per).collect())
        }
    };
    let out = v
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let ch = at(i);
            let inv = 1.0 / (var[ch] + eps).sqrt();
            ((e as f64 - mean[ch]) * inv * scale[ch] as f64 + bias[ch] as f64) as f32
        })
        .collect();
    let mut outs = vec![Tensor::f32(x.shape.to_vec(), out)?];
    if node.outputs.len() > 1 {
        let m = node.float("momentum", 0.9)? as f64;
        let run = |old: &[f32], new: &[f64]| -> Vec<f32> {
            old.iter()
                .zip(new)
                .map(|(&o, &n)| (o as f64 * m + n * (1.0 - m)) as f32)
                .collect()
        };
        outs.push(Tensor::f32(vec![c], run(running_mean, &mean))?);
        outs.push(Tensor::f32(vec![c], run(running_var, &var))?);
    }
    Ok(outs)
}

/// `RMSNormalization(x, scale)`: each group of the axes from `axis` on divided by its
/// root mean square (`sqrt(mean(x²) + epsilon)`) and multiplied by `scale`, which
/// broadcasts to those axes.
fn eval_rms_norm(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let scale = req(node, ins, 1)?;
    let a = axis(node, node.int("axis", -1)?, x.shape.len())?;
    let eps = node.float("epsilon", 1e-5)? as f64;
    let normalized = &x.shape[a..];
    if scale.shape.len() > normalized.len()
        || super::broadcast_shape(scale.shape, normalized).as_deref() != Some(normalized)
    {
        return fail(
            node,
            format!(
                "the scale's shape {:?} does not broadcast to the normalized axes {normalized:?}",
                scale.shape
            ),
        );
    }
    let g = scale.as_f32().map_err(|e| node.error(e))?;
    let g: Vec<f32> = broadcast_indices(scale.shape, normalized)
        .into_iter()
        .map(|i| g[i])
        .collect();
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let n = g.len().max(1);
    let mut out = vec![0f32; v.len()];
    for (row, out) in v.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ms = row.iter().map(|&e| e as f64 * e as f64).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((y, &e), &s) in out.iter_mut().zip(row).zip(&g) {
            *y = (e as f64 * inv * s as f64) as f32;
        }
    }
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

/// `InstanceNormalization(x, scale, B)` (a group per channel) and
/// `GroupNormalization(x, scale, bias)` (`num_groups` groups of channels): each group
/// of each sample, over its channels and spatial axes, brought to mean 0 and variance 1,
/// then scaled and shifted per channel (`x: [N, C, ...]`).
fn eval_group_norm(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    if x.shape.len() < 2 {
        return fail(node, "an input of rank 2 or more (N, C, ...)");
    }
    let c = x.shape[1];
    let groups = if node.op == "GroupNormalization" {
        let g = node.int("num_groups", 0)?;
        if g < 1 || c % g as usize != 0 {
            return fail(node, format!("num_groups {g} does not divide {c} channels"));
        }
        g as usize
    } else {
        c.max(1)
    };
    let channel = |i: usize| per_channel(node, ins, i, c);
    let (scale, bias) = (channel(1)?, channel(2)?);
    let eps = node.float("epsilon", 1e-5)? as f64;
    let spatial: usize = x.shape[2..].iter().product();
    let per_group = c / groups * spatial;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let mut out = vec![0f32; v.len()];
    for (gi, (row, out)) in v
        .chunks_exact(per_group.max(1))
        .zip(out.chunks_exact_mut(per_group.max(1)))
        .enumerate()
    {
        let mean = row.iter().map(|&e| e as f64).sum::<f64>() / per_group as f64;
        let var = row
            .iter()
            .map(|&e| (e as f64 - mean) * (e as f64 - mean))
            .sum::<f64>()
            / per_group as f64;
        let inv = 1.0 / (var + eps).sqrt();
        for (j, (y, &e)) in out.iter_mut().zip(row).enumerate() {
            let ch = (gi % groups) * (c / groups) + j / spatial.max(1);
            *y = ((e as f64 - mean) * inv * scale[ch] as f64 + bias[ch] as f64) as f32;
        }
    }
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

/// `MeanVarianceNormalization(X)`: `(X - E[X]) / (sqrt(E[X²] - E[X]²) + 1e-9)` over
/// `axes` (default batch and the spatial axes `[0, 2, 3]`), as ONNX's function body
/// computes it (sums in `f64`).
fn eval_mvn(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let r = x.shape.len();
    let axes: Vec<usize> = match node.ints("axes")? {
        Some(a) => a.iter().map(|&a| axis(node, a, r)).collect::<Result<_>>()?,
        None => vec![0, 2, 3],
    };
    if axes.iter().any(|&a| a >= r) {
        return fail(node, format!("axes {axes:?} for an input of rank {r}"));
    }
    // Each element's group: its index with the normalized axes dropped.
    let strides = crate::tensor::strides(x.shape);
    let kept: Vec<usize> = (0..r).filter(|a| !axes.contains(a)).collect();
    let groups: usize = kept.iter().map(|&a| x.shape[a]).product();
    let group = |i: usize| {
        kept.iter()
            .fold(0, |g, &a| g * x.shape[a] + i / strides[a] % x.shape[a])
    };
    let (mut sum, mut sq, mut count) =
        (vec![0f64; groups], vec![0f64; groups], vec![0usize; groups]);
    for (i, &e) in v.iter().enumerate() {
        let g = group(i);
        sum[g] += e as f64;
        sq[g] += e as f64 * e as f64;
        count[g] += 1;
    }
    let out = v
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            let g = group(i);
            let n = count[g].max(1) as f64;
            let mean = sum[g] / n;
            let std = (sq[g] / n - mean * mean).max(0.0).sqrt();
            ((e as f64 - mean) / (std + 1e-9)) as f32
        })
        .collect();
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

/// `LRN(X)`: each element over `bias + alpha/size · Σ x²` (the channels within
/// `size` around its own) to the power `beta`.
fn eval_lrn(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    if x.shape.len() < 2 {
        return fail(node, "an input of rank 2 or more (N, C, …)");
    }
    let size = node.int("size", 0)?;
    if size < 1 {
        return fail(node, "size must be given, 1 or more");
    }
    let (alpha, beta, bias) = (
        node.float("alpha", 1e-4)? as f64,
        node.float("beta", 0.75)? as f64,
        node.float("bias", 1.0)? as f64,
    );
    let (n, c) = (x.shape[0], x.shape[1]);
    let inner: usize = x.shape[2..].iter().product();
    let (before, after) = ((size as usize - 1) / 2, (size as usize - 1).div_ceil(2));
    let mut out = vec![0f32; v.len()];
    for b in 0..n {
        for ch in 0..c {
            let lo = ch.saturating_sub(before);
            let hi = (ch + after).min(c - 1);
            for i in 0..inner {
                let at = |k: usize| (b * c + k) * inner + i;
                let sq: f64 = (lo..=hi).map(|k| (v[at(k)] as f64).powi(2)).sum();
                out[at(ch)] =
                    (v[at(ch)] as f64 / (bias + alpha / size as f64 * sq).powf(beta)) as f32;
            }
        }
    }
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}
