//! The pools — `MaxPool` (and its indices), `AveragePool`, `LpPool` over 1 to 3
//! spatial axes on their [`Window`], `MaxUnpool`, `GlobalAveragePool`, `GlobalMaxPool` —
//! as reference loops (host steps; averages and norms summed in `f64`).
use super::window::Window;
use super::{fail, req, shaped, sized, Dims, OpSpec, MAX_ELEMENTS};
use crate::node::Node;
use crate::{DType, Fact, Result, Tensor, TensorRef, Workers};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "MaxPool",
        since: 8,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: Some(eval_pool_into),
    },
    OpSpec {
        name: "AveragePool",
        since: 7,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: Some(eval_pool_into),
    },
    OpSpec {
        name: "LpPool",
        since: 11,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: Some(eval_pool_into),
    },
    OpSpec {
        name: "MaxUnpool",
        since: 11,
        infer: infer_unpool,
        eval: eval_unpool,
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

/// A pool's kernel extents (`kernel_shape`, one per spatial axis).
fn kernel(node: &Node, spatial: usize) -> Result<Dims> {
    match node.ints("kernel_shape")? {
        Some(v) if v.len() == spatial && v.iter().all(|&x| x > 0) => {
            Ok(v.iter().map(|&x| x as usize).collect())
        }
        Some(v) => fail(node, format!("kernel_shape {v:?}: {spatial} spatial axes")),
        None => fail(node, "kernel_shape is required"),
    }
}

/// The spatial axes of a pooled input of `rank`: 1 to 3 (NCL, NCHW, NCDHW).
fn pooled_axes(node: &Node, rank: usize) -> Result<usize> {
    match rank {
        3..=5 => Ok(rank - 2),
        r => fail(node, format!("an input of rank {r}: 1 to 3 spatial axes")),
    }
}

fn infer_pool(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let n = pooled_axes(node, x.rank())?;
    let (k, w) = (kernel(node, n)?, Window::of_axes(node, n)?);
    let mut shape = x.shape[..2].to_vec();
    for i in 0..n {
        shape.push(w.out_expr(&x.shape[2 + i], k[i] as i64, i));
    }
    let mut outs = vec![Fact::new(x.dtype, shape.clone())];
    if node.outputs.len() > 1 {
        if node.op != "MaxPool" {
            return fail(node, "one output");
        }
        outs.push(Fact::new(DType::I64, shape));
    }
    Ok(outs)
}

/// Each output position's window over 1 to 3 spatial axes: its taps inside the input
/// (per axis, the offsets `Window::inside` gives), the max, the average (over the taps
/// inside, or with `count_include_pad` over those inside the padded input) or the
/// p-norm; `MaxPool`'s second output the flat index of each maximum (`storage_order`
/// 0: row-major over the whole input, 1: the spatial axes column-major).
fn eval_pool(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    super::eval_via(node, ins, eval_pool_into)
}

/// The pool into kept outputs, each plane (an image's channel) one part of the work
/// where no indices are asked.
fn eval_pool_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let n = pooled_axes(node, x.shape.len())?;
    let (k, w) = (kernel(node, n)?, Window::of_axes(node, n)?);
    let max = node.op == "MaxPool";
    let p = match node.op.as_str() {
        "LpPool" => match node.int("p", 2)? {
            p if p >= 1 => Some(p as f64),
            p => return fail(node, format!("p {p}: need 1 or more")),
        },
        _ => None,
    };
    let with_indices = node.outputs.len() > 1;
    if with_indices && !max {
        return fail(node, "one output");
    }
    let column_major = node.int("storage_order", 0)? != 0;
    let include_pad = node.int("count_include_pad", 0)? != 0;
    let dims = &x.shape[2..];
    let images = x.shape[0] * x.shape[1];
    let area: usize = dims.iter().product();
    let w = w.at(dims, &k);
    let out: Dims = (0..n).map(|i| w.out(dims[i], k[i], i)).collect();
    let mut shape = x.shape[..2].to_vec();
    shape.extend(&out);
    sized(node, &shape)?;
    let points: usize = out.iter().product();
    let taps: usize = k.iter().product();
    // The work, not only the output, is bounded: a huge window over huge pads would
    // otherwise loop for ages on a small output.
    if crate::tensor::numel(&[images, points, taps]).map_or(true, |w| w > MAX_ELEMENTS) {
        return fail(
            node,
            format!("a window of {k:?} over an output of {out:?} is more work than one op may do"),
        );
    }
    let v = x.as_f32().map_err(|e| node.error(e))?;
    // The input's strides, and where an index output counts (column-major: reversed).
    let strides = crate::tensor::strides(dims);
    let index_strides: Vec<usize> = match column_major {
        true => (0..n).map(|i| dims[..i].iter().product()).collect(),
        false => strides.clone(),
    };
    // Fewer than three spatial axes are lifted to three (leading axes of one element,
    // one tap, nothing padded), so that one fixed loop nest walks every case: the
    // per-tap walk of a generic box cost ResNet-50's stem pool 20 ms of a 54 ms run.
    let lift = |v: &[usize], fill: usize| -> [usize; 3] {
        let mut a = [fill; 3];
        a[3 - n..].copy_from_slice(v);
        a
    };
    let (o3, st3, dl3) = (
        lift(&out, 1),
        lift(&w.strides[..n], 1),
        lift(&w.dilations[..n], 1),
    );
    let (pd3, s3, is3) = (
        lift(&w.pads[..n], 0),
        lift(&strides, 0),
        lift(&index_strides, 0),
    );
    // Per lifted axis and output index: the taps inside the input, and those inside
    // with the pads.
    let axis = |a: usize| a.checked_sub(3 - n);
    let inside3: Vec<Vec<std::ops::Range<usize>>> = (0..3)
        .map(|a| match axis(a) {
            Some(i) => (0..out[i]).map(|o| w.inside(o, k[i], i, dims[i])).collect(),
            None => std::iter::once(0..1).collect(),
        })
        .collect();
    let padded3: Vec<Vec<usize>> = (0..3)
        .map(|a| match axis(a) {
            Some(i) => (0..out[i])
                .map(|o| w.padded_taps(o, k[i], i, dims[i]))
                .collect(),
            None => vec![1],
        })
        .collect();
    // Along the last axis, which outputs each tap reaches (those whose window holds it
    // inside the input): a contiguous run of them.
    let cols = o3[2];
    let k_last = k[n - 1];
    let reach: Vec<std::ops::Range<usize>> = (0..k_last)
        .map(|u| {
            let hit = |c: &usize| inside3[2][*c].contains(&u);
            match ((0..cols).find(hit), (0..cols).rfind(hit)) {
                (Some(lo), Some(hi)) => lo..hi + 1,
                _ => 0..0,
            }
        })
        .collect();
    // One output row at a time: each tap of the window walks the row's outputs it
    // reaches (a strided run of the input), in the order of the taps, so that each
    // output sees its taps as a walk of its own window would.
    // A max without indices folds the window's input rows into one first (a
    // contiguous max, vectorized) and then takes each output's taps along it: a tap
    // per window column instead of one per window element (ResNet-50's stem pool
    // 1.5 -> 0.5 ms).
    let row_len = dims[n - 1];
    // A NaN-free plane's folded row may lie in a buffer with its pads as -inf, where
    // each output's taps are a fixed stride apart from `c * stride` (no range of taps
    // per output): where the pads and the window add little to the row.
    // (Saturating: a model's attributes may be huge.)
    let (pad, span) = (pd3[2], (k_last - 1).saturating_mul(dl3[2]) + 1);
    let padded_len = ((cols.max(1) - 1).saturating_mul(st3[2]))
        .saturating_add(span)
        .max(pad.saturating_add(row_len));
    let padded = padded_len <= 4 * row_len.max(16);
    let padded_len = if padded { padded_len } else { row_len };
    let plane = |img: usize, values: &mut [f32], mut indices: Option<&mut [i64]>| {
        let image = &v[img * area..][..area];
        let fold = max && !with_indices;
        // A plane without NaN (nearly always) folds with plain comparisons, one max
        // instruction per vector, no NaN noted per element, and takes each output's
        // taps from the padded row (ResNet-50's stem pool, Zen 3, per-step minima of
        // 6 alternating runs, three repeats: 0.82-1.03 -> 0.55-0.62 ms at 224 x 224,
        // 0.27-0.30 -> 0.18-0.20 ms at 96 x 96).
        let nan_free = fold && !image.iter().fold(false, |any, e| any | e.is_nan());
        // Where the folded row starts in `row_max`: after the pad where it is padded.
        let lead = if nan_free && padded { pad } else { 0 };
        let mut best = vec![(f32::NEG_INFINITY, None::<usize>); cols];
        let mut sums = vec![0f64; cols];
        let mut nans = vec![false; cols];
        let (mut row_max, mut row_nan) = match fold {
            true => (vec![f32::NEG_INFINITY; padded_len], vec![false; row_len]),
            false => (Vec::new(), Vec::new()),
        };
        let mut at = 0;
        for a in 0..o3[0] {
            for b in 0..o3[1] {
                let (ra, rb) = (&inside3[0][a], &inside3[1][b]);
                let pos = |i: usize, o: usize, u: usize| o * st3[i] + u * dl3[i] - pd3[i];
                if fold {
                    row_max.fill(f32::NEG_INFINITY);
                    if !nan_free {
                        row_nan.fill(false);
                    }
                    for ua in ra.clone() {
                        for ub in rb.clone() {
                            let start = pos(0, a, ua) * s3[0] + pos(1, b, ub) * s3[1];
                            let src = &image[start..][..row_len];
                            if nan_free {
                                for (m, &e) in row_max[lead..].iter_mut().zip(src) {
                                    *m = if e > *m { e } else { *m };
                                }
                                continue;
                            }
                            for ((m, f), &e) in row_max.iter_mut().zip(&mut row_nan).zip(src) {
                                *m = m.max(e);
                                *f |= e.is_nan();
                            }
                        }
                    }
                    if nan_free && padded {
                        let (step, dilation) = (st3[2], dl3[2]);
                        for (c, value) in values[at..at + cols].iter_mut().enumerate() {
                            let taps = row_max[c * step..].iter().step_by(dilation);
                            *value = taps.take(k_last).fold(f32::NEG_INFINITY, |m, &e| {
                                if e > m {
                                    e
                                } else {
                                    m
                                }
                            });
                        }
                        at += cols;
                        continue;
                    }
                    for (c, value) in values[at..at + cols].iter_mut().enumerate() {
                        let (mut m, mut nan) = (f32::NEG_INFINITY, false);
                        for uc in inside3[2][c].clone() {
                            let x = pos(2, c, uc);
                            m = m.max(row_max[x]);
                            nan |= !nan_free && row_nan[x];
                        }
                        *value = if nan { f32::NAN } else { m };
                    }
                    at += cols;
                    continue;
                }
                best.fill((f32::NEG_INFINITY, None));
                sums.fill(0.0);
                nans.fill(false);
                for ua in ra.clone() {
                    let (pa, ia) = (pos(0, a, ua) * s3[0], pos(0, a, ua) * is3[0]);
                    for ub in rb.clone() {
                        let (pb, ib) = (pa + pos(1, b, ub) * s3[1], ia + pos(1, b, ub) * is3[1]);
                        for (uc, cs) in reach.iter().enumerate() {
                            for c in cs.clone() {
                                let at = pos(2, c, uc);
                                let e = image[pb + at * s3[2]];
                                if with_indices {
                                    let m = &mut best[c];
                                    // NaN wins a max, as in onnxruntime.
                                    if e > m.0 || e.is_nan() || m.1.is_none() {
                                        *m = (e, Some(ib + at * is3[2]));
                                    }
                                } else if max {
                                    // Without indices, branch-free (a data-dependent
                                    // branch per tap mispredicts on activations: 2.6x
                                    // slower on ResNet-50's stem pool); a NaN noted
                                    // apart wins at the end.
                                    best[c].0 = best[c].0.max(e);
                                    nans[c] |= e.is_nan();
                                } else if let Some(p) = p {
                                    sums[c] += (e as f64).abs().powf(p);
                                } else {
                                    sums[c] += e as f64;
                                }
                            }
                        }
                    }
                }
                for c in 0..cols {
                    values[at] = if max && nans[c] {
                        f32::NAN
                    } else if max {
                        best[c].0
                    } else if let Some(p) = p {
                        sums[c].powf(1.0 / p) as f32
                    } else {
                        let count = match include_pad {
                            true => padded3[0][a] * padded3[1][b] * padded3[2][c],
                            false => ra.len() * rb.len() * inside3[2][c].len(),
                        };
                        (sums[c] / count.max(1) as f64) as f32
                    };
                    if let Some(indices) = indices.as_deref_mut() {
                        indices[at] = best[c].1.map_or(-1, |i| (img * area + i) as i64);
                    }
                    at += 1;
                }
            }
        }
    };
    let (values, indices) = match outs {
        [values, indices] if with_indices => (values, Some(indices)),
        [values] => (values, None),
        _ => return fail(node, format!("{} outputs given", outs.len())),
    };
    let values = shaped(node, std::slice::from_mut(values), 0, &shape)?
        .f32_mut()
        .map_err(|e| node.error(e))?;
    match indices {
        Some(indices) => {
            let indices = shaped(node, std::slice::from_mut(indices), 0, &shape)?
                .i64_mut()
                .map_err(|e| node.error(e))?;
            let planes = values
                .chunks_mut(points.max(1))
                .zip(indices.chunks_mut(points.max(1)));
            for (img, (values, indices)) in planes.enumerate().take(images) {
                plane(img, values, Some(indices));
            }
        }
        None => workers.chunks_mut(values, points, |img, values| plane(img, values, None)),
    }
    Ok(())
}

fn unpooled(w: &Window, d: &Expr, k: usize, i: usize) -> Expr {
    ((d.clone() - 1) * w.strides[i] as i64 + k as i64 - (w.pads[i] + w.after(i)) as i64).simplify()
}

fn infer_unpool(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let n = pooled_axes(node, x.rank())?;
    if ins.get(2).copied().flatten().is_some() {
        // An output shape given at run time: run-time dims but the batch and channels.
        let s = super::sym_input_or_late(node, ins, 2)?;
        if s.as_ref().is_some_and(|s| s.len() != x.rank()) {
            return fail(node, "an output_shape of another rank than the input");
        }
        let shape = super::runtime_shape(node, 0, x.rank(), |d| match &s {
            Some(s) => Some(s[d].clone()),
            None => (d < 2).then(|| x.shape[d].clone()),
        })?;
        return Ok(vec![Fact::new(x.dtype, shape)]);
    }
    let (k, w) = (kernel(node, n)?, Window::of_axes(node, n)?);
    let mut shape = x.shape[..2].to_vec();
    for i in 0..n {
        shape.push(unpooled(&w, &x.shape[2 + i], k[i], i));
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `MaxUnpool`: zeros, each input value written at its index (a flat index into the
/// output, as `MaxPool`'s indices are into its input).
fn eval_unpool(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, idx) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let n = pooled_axes(node, x.shape.len())?;
    // The indices address the extents the pooled input came from; an output shape
    // given holds those at its start (as ONNX's reference places them).
    let (k, w) = (kernel(node, n)?, Window::of_axes(node, n)?);
    let mut inferred = x.shape[..2].to_vec();
    for i in 0..n {
        let d = x.shape[2 + i];
        let e = (d.max(1) - 1) * w.strides[i] + k[i];
        inferred.push(e.saturating_sub(w.pads[i] + w.after(i)));
    }
    let shape: Vec<usize> = match ins.get(2).copied().flatten() {
        Some(_) => super::ints(node, ins, 2)?
            .iter()
            .map(|&d| d.max(0) as usize)
            .collect(),
        None => inferred.clone(),
    };
    if shape.len() != x.shape.len() || idx.shape != x.shape {
        return fail(
            node,
            "indices of the input's shape and an output of its rank",
        );
    }
    if shape.iter().zip(&inferred).any(|(o, i)| o < i) {
        return fail(
            node,
            format!("an output shape {shape:?} smaller than the unpooled {inferred:?}"),
        );
    }
    let total = sized(node, &inferred)?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let ix = idx.as_i64().map_err(|e| node.error(e))?;
    let mut unpooled = vec![0f32; total];
    for (&e, &i) in v.iter().zip(ix) {
        match usize::try_from(i).ok().filter(|&i| i < total) {
            Some(i) => unpooled[i] = e,
            None => {
                return fail(
                    node,
                    format!("index {i} outside an output of {total} elements"),
                )
            }
        }
    }
    let out = match shape == inferred {
        true => unpooled,
        false => {
            let mut out = vec![0f32; sized(node, &shape)?];
            let (from, to) = (crate::strides(&inferred), crate::strides(&shape));
            for (i, &e) in unpooled.iter().enumerate() {
                let at: usize = (0..shape.len())
                    .map(|a| (i / from[a]) % inferred[a] * to[a])
                    .sum();
                out[at] = e;
            }
            out
        }
    };
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
    use crate::node::Attr;
    use crate::{Node, Tensor};

    /// A 2-D `MaxPool` node.
    fn max_pool(k: [i64; 2], s: [i64; 2], d: [i64; 2], pads: [i64; 4]) -> Node {
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("kernel_shape".to_string(), Attr::Ints(k.to_vec()));
        attrs.insert("strides".to_string(), Attr::Ints(s.to_vec()));
        attrs.insert("dilations".to_string(), Attr::Ints(d.to_vec()));
        attrs.insert("pads".to_string(), Attr::Ints(pads.to_vec()));
        Node {
            name: "p".into(),
            op: "MaxPool".into(),
            inputs: vec![],
            outputs: vec![0],
            attrs,
        }
    }

    /// `MaxPool` equals each window's maximum taken tap by tap (a NaN in the window
    /// wins; padding never does) — windows whole inside, cut by the pads on either
    /// side or wholly in them, strides 1 to 30, dilations 1 and 2, planes with and
    /// without a NaN (the latter fold with plain comparisons).
    #[test]
    fn max_pool_is_each_windows_maximum() {
        let (h, w) = (9, 13);
        for nan in [false, true] {
            let x: Vec<f32> = (0..2 * h * w)
                .map(|i| match nan && i % 37 == 5 {
                    true => f32::NAN,
                    false => ((i * 29 % 71) as f32 - 35.0) / 7.0,
                })
                .collect();
            let xt = Tensor::f32(vec![1, 2, h, w], x.clone()).unwrap();
            for (k, s, d, p) in [
                ([3, 3], [2, 2], [1, 1], [1, 1, 1, 1]),
                ([3, 3], [1, 1], [1, 1], [0, 0, 0, 0]),
                ([2, 4], [1, 3], [1, 1], [0, 2, 1, 1]),
                ([3, 3], [2, 1], [2, 2], [2, 1, 0, 2]),
                ([1, 5], [1, 2], [1, 1], [0, 0, 0, 0]),
                // Pads of several rows' length (the NaN-free row then keeps the
                // taps' ranges per output), windows wholly in the pads.
                ([3, 3], [1, 20], [1, 1], [0, 0, 0, 80]),
                ([1, 3], [1, 30], [1, 1], [0, 70, 0, 0]),
            ] {
                let node = max_pool(k, s, d, p);
                let got = (super::super::op("MaxPool").unwrap().eval)(&node, &[Some(xt.view())])
                    .unwrap()
                    .remove(0);
                let [oh, ow] = [got.shape[2], got.shape[3]];
                let at = |a: usize, o: usize, u: usize, extent: usize| {
                    let i = (o * s[a] as usize + u * d[a] as usize) as i64 - p[a];
                    (0..extent as i64).contains(&i).then_some(i as usize)
                };
                for (i, &g) in got.as_f32().unwrap().iter().enumerate() {
                    let (plane, y, xo) = (i / (oh * ow), i / ow % oh, i % ow);
                    let mut want = f32::NEG_INFINITY;
                    for u in 0..k[0] as usize {
                        for v in 0..k[1] as usize {
                            if let (Some(iy), Some(ix)) = (at(0, y, u, h), at(1, xo, v, w)) {
                                let e = x[(plane * h + iy) * w + ix];
                                want = if e.is_nan() || want.is_nan() {
                                    f32::NAN
                                } else {
                                    want.max(e)
                                };
                            }
                        }
                    }
                    assert!(
                        g == want || (g.is_nan() && want.is_nan()),
                        "k {k:?} s {s:?} d {d:?} pads {p:?} nan {nan}: output {i} {g} where {want}"
                    );
                }
            }
        }
    }
}
