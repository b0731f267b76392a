//! ONNX's `Attention` (opset 23 on): scaled dot-product attention of queries, keys
//! and values as one op — heads in the inputs (`[batch, heads, sequence, dim]`) or
//! merged (`[batch, sequence, heads·dim]` with `q_num_heads`/`kv_num_heads`), a
//! past key/value appended (`present_key`/`present_value`), grouped-query heads
//! (each key/value head read by consecutive query heads), a boolean or additive mask
//! (shorter than the keys: padded with "masked"), causal masking aligned to the end
//! (the past before the queries), sliding windows, the keys' unpadded lengths
//! (`nonpad_kv_seqlen`), a soft cap of the scores, and the scores at one of four
//! points as an output. A query row with every key masked attends to nothing (0), as
//! the ONNX reference defines. A host step, computed in `f64`.
use super::{fail, req, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "Attention",
    since: 23,
    infer: infer_attention,
    eval: eval_attention,
    eval_into: None,
}];

/// The heads a merged (rank-3) input holds: attribute `name`, which it needs.
fn heads(node: &Node, name: &str) -> Result<i64> {
    match node.int(name, 0)? {
        h if h > 0 => Ok(h),
        _ => fail(node, format!("{name} is required for inputs of rank 3")),
    }
}

/// `[batch, heads, sequence, dim]` of a rank-3 or rank-4 input's shape, given the heads
/// of a rank-3 one.
fn split<T: Clone>(s: &[T], h: T, div: impl Fn(&T, &T) -> T) -> [T; 4] {
    match s {
        [b, n, d] => [b.clone(), h.clone(), n.clone(), div(d, &h)],
        _ => [s[0].clone(), s[1].clone(), s[2].clone(), s[3].clone()],
    }
}

fn infer_attention(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (q, k, v) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let rank = q.rank();
    if !matches!(rank, 3 | 4) || k.rank() != rank || v.rank() != rank {
        return fail(node, "Q, K and V of rank 3, or all of rank 4");
    }
    let (qh, kvh) = if rank == 3 {
        (
            Expr::Const(heads(node, "q_num_heads")?),
            Expr::Const(heads(node, "kv_num_heads")?),
        )
    } else {
        (q.shape[1].clone(), k.shape[1].clone())
    };
    let div = |a: &Expr, b: &Expr| Expr::floor_div(a.clone(), b.clone()).simplify();
    let [b, _, sq, _] = split(&q.shape, qh.clone(), div);
    let [_, _, skv, hd] = split(&k.shape, kvh.clone(), div);
    let [_, _, _, vd] = split(&v.shape, kvh.clone(), div);
    let past = match ins.get(4).copied().flatten() {
        Some(p) if p.rank() == 4 => p.shape[2].clone(),
        Some(_) => return fail(node, "past_key of rank 4"),
        None => Expr::Const(0),
    };
    let total = (past + skv).simplify();
    let y = if rank == 3 {
        vec![b.clone(), sq.clone(), (qh.clone() * vd.clone()).simplify()]
    } else {
        vec![b.clone(), qh.clone(), sq.clone(), vd.clone()]
    };
    let mut outs = vec![
        Fact::new(q.dtype, y),
        Fact::new(q.dtype, vec![b.clone(), kvh.clone(), total.clone(), hd]),
        Fact::new(q.dtype, vec![b.clone(), kvh, total.clone(), vd]),
        Fact::new(q.dtype, vec![b, qh, sq, total]),
    ];
    outs.truncate(node.outputs.len());
    Ok(outs)
}

/// A `[batch, heads, sequence, dim]` view of a rank-3 or rank-4 input.
struct Heads<'a> {
    v: &'a [f32],
    dims: [usize; 4],
    merged: bool,
}

impl Heads<'_> {
    fn at(&self, b: usize, h: usize, s: usize, d: usize) -> f32 {
        let [_, hs, n, dd] = self.dims;
        self.v[if self.merged {
            ((b * n + s) * hs + h) * dd + d
        } else {
            ((b * hs + h) * n + s) * dd + d
        }]
    }
}

fn view<'a>(node: &Node, t: TensorRef<'a>, heads: usize) -> Result<Heads<'a>> {
    let v = t.as_f32().map_err(|e| node.error(e))?;
    let merged = t.shape.len() == 3;
    if merged && (heads == 0 || !t.shape[2].is_multiple_of(heads)) {
        return fail(
            node,
            format!("a hidden size of {} over {heads} heads", t.shape[2]),
        );
    }
    Ok(Heads {
        v,
        dims: split(t.shape, heads, |a, b| a / b),
        merged,
    })
}

/// The additive bias (0 or `-inf` for a boolean, the value for an additive mask) of
/// `mask` at `(b, h, i, j)`, its shape broadcast right-aligned to `[B, H, Sq, total]`
/// and its last axis padded with "masked" up to `total`.
fn mask_bias(mask: &TensorRef, b: usize, h: usize, i: usize, j: usize) -> Result<f64> {
    let s = mask.shape;
    let full = [b, h, i, j];
    let lead = 4 - s.len();
    if j >= s[s.len() - 1] {
        return Ok(f64::NEG_INFINITY);
    }
    let mut at = 0;
    for (a, &d) in s.iter().enumerate() {
        let x = if d == 1 { 0 } else { full[lead + a] };
        at = at * d + x;
    }
    Ok(match mask.data {
        crate::DataRef::Bool(v) => {
            if v[at] {
                0.0
            } else {
                f64::NEG_INFINITY
            }
        }
        crate::DataRef::F32(v) => v[at] as f64,
        crate::DataRef::I64(_) => {
            return Err(crate::TensorError::Unsupported("an integer mask".into()))
        }
    })
}

fn eval_attention(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (qt, kt, vt) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let rank = qt.shape.len();
    if !matches!(rank, 3 | 4) || kt.shape.len() != rank || vt.shape.len() != rank {
        return fail(node, "Q, K and V of rank 3, or all of rank 4");
    }
    let (qh, kvh) = if rank == 3 {
        (
            heads(node, "q_num_heads")? as usize,
            heads(node, "kv_num_heads")? as usize,
        )
    } else {
        (qt.shape[1], kt.shape[1])
    };
    let (q, k, v) = (
        view(node, qt, qh)?,
        view(node, kt, kvh)?,
        view(node, vt, kvh)?,
    );
    let [nb, _, sq, hd] = q.dims;
    let [_, _, skv, khd] = k.dims;
    let vd = v.dims[3];
    if k.dims[0] != nb || v.dims[0] != nb || v.dims[2] != skv || khd != hd {
        return fail(
            node,
            "Q, K and V disagree in batch, key length or head size",
        );
    }
    if kvh == 0 || qh % kvh != 0 || v.dims[1] != kvh {
        return fail(node, format!("{qh} query heads over {kvh} key/value heads"));
    }
    let group = qh / kvh;
    let mask = ins.get(3).copied().flatten();
    if mask.is_some_and(|m| m.shape.is_empty() || m.shape.len() > 4) {
        return fail(node, "a mask of rank 1 to 4");
    }
    let (pk, pv) = (ins.get(4).copied().flatten(), ins.get(5).copied().flatten());
    let past = match (pk, pv) {
        (None, None) => 0,
        (Some(a), Some(b))
            if a.shape.len() == 4
                && a.shape == [nb, kvh, a.shape[2], hd]
                && b.shape == [nb, kvh, a.shape[2], vd] =>
        {
            a.shape[2]
        }
        _ => {
            return fail(
                node,
                "past_key and past_value given together, as [batch, kv heads, past, dim]",
            )
        }
    };
    let nonpad = match ins.get(6).copied().flatten() {
        None => None,
        Some(_) if past > 0 => return fail(node, "nonpad_kv_seqlen with a past"),
        Some(t) => match t.as_i64().map_err(|e| node.error(e))? {
            n if n.len() == nb => Some(n.to_vec()),
            _ => return fail(node, "nonpad_kv_seqlen: one length per batch row"),
        },
    };
    let total = past + skv;
    sized(node, &[nb, qh, sq, total])?;
    if let Some(m) = mask {
        let full = [nb, qh, sq, total];
        let lead = 4 - m.shape.len();
        let fits =
            m.shape.iter().enumerate().all(|(a, &d)| {
                d == 1 || d == full[lead + a] || (a + 1 == m.shape.len() && d < total)
            });
        if !fits {
            return fail(
                node,
                format!(
                    "a mask of shape {:?} does not broadcast to {full:?}",
                    m.shape
                ),
            );
        }
    }
    // The present caches: the past, then the new keys (values).
    let present = |p: Option<TensorRef>, x: &Heads, d: usize| -> Result<Vec<f32>> {
        let pv = p
            .map(|t| t.as_f32())
            .transpose()
            .map_err(|e| node.error(e))?;
        let mut out = Vec::with_capacity(nb * kvh * total * d);
        for b in 0..nb {
            for h in 0..kvh {
                if let Some(pv) = pv {
                    out.extend_from_slice(&pv[(b * kvh + h) * past * d..][..past * d]);
                }
                for s in 0..skv {
                    out.extend((0..d).map(|e| x.at(b, h, s, e)));
                }
            }
        }
        Ok(out)
    };
    let (keys, values) = (present(pk, &k, hd)?, present(pv, &v, vd)?);
    let scale = match node.float("scale", 0.0)? {
        0.0 => 1.0 / (hd as f64).sqrt(),
        s => s as f64,
    };
    let softcap = node.float("softcap", 0.0)? as f64;
    let causal = node.int("is_causal", 0)? != 0;
    let (left, right) = (
        node.int("left_window_size", -1)?,
        node.int("right_window_size", -1)?,
    );
    let mode = node.int("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return fail(node, format!("qk_matmul_output_mode {mode}"));
    }
    let mut y = vec![0f32; nb * qh * sq * vd];
    let mut qk_out = vec![0f32; nb * qh * sq * total];
    let mut row = vec![0f64; total];
    let mut bias = vec![0f64; total];
    for b in 0..nb {
        // Where the queries sit among the keys: after the past, or (an external cache)
        // at the end of the unpadded keys.
        let offset = match &nonpad {
            Some(n) => n[b] - sq as i64,
            None => past as i64,
        };
        for h in 0..qh {
            let kh = h / group;
            for i in 0..sq {
                for j in 0..total {
                    let mut x = match mask {
                        Some(m) => mask_bias(&m, b, h, i, j).map_err(|e| node.error(e))?,
                        None => 0.0,
                    };
                    let diff = i as i64 + offset - j as i64;
                    if (causal && diff < 0)
                        || (left >= 0 && diff > left)
                        || (right >= 0 && -diff > right)
                        || nonpad.as_ref().is_some_and(|n| j as i64 >= n[b])
                    {
                        x = f64::NEG_INFINITY;
                    }
                    bias[j] = x;
                    let dot: f64 = (0..hd)
                        .map(|e| {
                            q.at(b, h, i, e) as f64
                                * keys[((b * kvh + kh) * total + j) * hd + e] as f64
                        })
                        .sum();
                    let mut s = dot * scale;
                    if softcap > 0.0 {
                        s = softcap * (s / softcap).tanh();
                    }
                    row[j] = s;
                }
                let at = ((b * qh + h) * sq + i) * total;
                if mode < 2 {
                    for j in 0..total {
                        qk_out[at + j] = row[j] as f32;
                    }
                }
                for j in 0..total {
                    row[j] += bias[j];
                }
                if mode == 2 {
                    for j in 0..total {
                        qk_out[at + j] = row[j] as f32;
                    }
                }
                // Softmax; a row whose bias masks every key attends to nothing.
                let masked = bias.iter().all(|&x| x == f64::NEG_INFINITY);
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let shift = if max == f64::NEG_INFINITY { 0.0 } else { max };
                let sum: f64 = row.iter().map(|&x| (x - shift).exp()).sum();
                for x in row.iter_mut() {
                    *x = if masked || sum == 0.0 {
                        0.0
                    } else {
                        (*x - shift).exp() / sum
                    };
                }
                if mode == 3 {
                    for j in 0..total {
                        qk_out[at + j] = row[j] as f32;
                    }
                }
                for e in 0..vd {
                    let ctx: f64 = (0..total)
                        .map(|j| row[j] * values[((b * kvh + kh) * total + j) * vd + e] as f64)
                        .sum();
                    let o = if rank == 3 {
                        ((b * sq + i) * qh + h) * vd + e
                    } else {
                        ((b * qh + h) * sq + i) * vd + e
                    };
                    y[o] = ctx as f32;
                }
            }
        }
    }
    let y_shape = if rank == 3 {
        vec![nb, sq, qh * vd]
    } else {
        vec![nb, qh, sq, vd]
    };
    let mut outs = vec![
        Tensor::f32(y_shape, y)?,
        Tensor::f32(vec![nb, kvh, total, hd], keys)?,
        Tensor::f32(vec![nb, kvh, total, vd], values)?,
        Tensor::f32(vec![nb, qh, sq, total], qk_out)?,
    ];
    outs.truncate(node.outputs.len());
    Ok(outs)
}
