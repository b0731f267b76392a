//! `LinearAttention` (opset 27): the recurrent attention of linear-attention and
//! DeltaNet models. Per key/value head a `d_k x d_v` state runs over the tokens: decayed
//! by `exp(decay)` (`gated`, `gated_delta`), corrected by the delta rule (`delta`,
//! `gated_delta`: the value minus what the state retrieves for the key, times `beta`),
//! then the key's outer product with the value added; each query head (grouped over the
//! key/value heads) reads `scale · qᵀ S`. The state carries over from `past_state` and
//! out as `present_state`, as a decoder's cache does. Computed in f32 as ONNX's reference
//! does, token by token (`chunk_size` is a tuning hint without effect on the output).
use super::{fail, req, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "LinearAttention",
    since: 27,
    infer: infer_linear_attention,
    eval: eval_linear_attention,
    eval_into: None,
}];

/// The heads and the update rule.
struct Rule {
    q_heads: usize,
    kv_heads: usize,
    gating: bool,
    delta: bool,
}

fn rule(node: &Node) -> Result<Rule> {
    let (q, kv) = (node.int("q_num_heads", 0)?, node.int("kv_num_heads", 0)?);
    if q <= 0 || kv <= 0 || q % kv != 0 {
        return fail(
            node,
            format!("q_num_heads ({q}) must be a positive multiple of kv_num_heads ({kv})"),
        );
    }
    let (gating, delta) = match node.string("update_rule", "gated_delta")?.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        other => {
            return fail(
                node,
                format!("update_rule `{other}`: linear, gated, delta or gated_delta"),
            )
        }
    };
    Ok(Rule {
        q_heads: q as usize,
        kv_heads: kv as usize,
        gating,
        delta,
    })
}

/// An optional input's presence must match the rule: `decay` with gating, `beta` with
/// the delta rule.
fn check_inputs(node: &Node, r: &Rule, decay: bool, beta: bool) -> Result<()> {
    if decay != r.gating {
        return fail(
            node,
            "the decay input is given exactly with a gated update rule",
        );
    }
    if beta != r.delta {
        return fail(
            node,
            "the beta input is given exactly with a delta update rule",
        );
    }
    Ok(())
}

fn infer_linear_attention(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (q, k, v) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let r = rule(node)?;
    let given = |i: usize| ins.get(i).copied().flatten().is_some();
    check_inputs(node, &r, given(4), given(5))?;
    if q.rank() != 3 || k.rank() != 3 || v.rank() != 3 {
        return fail(
            node,
            "query, key and value must be [batch, tokens, heads·size]",
        );
    }
    let size = |e: &Expr, heads: usize, what: &str| match e.as_const() {
        Some(n) if n > 0 && (n as usize).is_multiple_of(heads) => Ok(Expr::Const(n / heads as i64)),
        _ => fail(
            node,
            format!("the {what}'s last axis must be a known multiple of its heads"),
        ),
    };
    let (dk, dv) = (
        size(&q.shape[2], r.q_heads, "query")?,
        size(&v.shape[2], r.kv_heads, "value")?,
    );
    let out = vec![
        q.shape[0].clone(),
        q.shape[1].clone(),
        (dv.clone() * Expr::Const(r.q_heads as i64)).simplify(),
    ];
    let state = vec![q.shape[0].clone(), Expr::Const(r.kv_heads as i64), dk, dv];
    Ok(vec![Fact::new(q.dtype, out), Fact::new(q.dtype, state)])
}

/// An f32 input's elements.
fn floats<'a>(node: &Node, t: TensorRef<'a>) -> Result<&'a [f32]> {
    t.as_f32().map_err(|e| node.error(e))
}

fn eval_linear_attention(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (q, k, v) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let r = rule(node)?;
    let opt = |i: usize| ins.get(i).copied().flatten();
    let (past, decay, beta) = (opt(3), opt(4), opt(5));
    check_inputs(node, &r, decay.is_some(), beta.is_some())?;
    let (&[b, t, qw], &[kb, kt, kw], &[vb, vt, vw]) = (q.shape, k.shape, v.shape) else {
        return fail(
            node,
            "query, key and value must be [batch, tokens, heads·size]",
        );
    };
    let (hq, hkv) = (r.q_heads, r.kv_heads);
    if qw % hq != 0 || vw % hkv != 0 || (kb, kt, vb, vt) != (b, t, b, t) {
        return fail(
            node,
            "query, key and value disagree on the batch, tokens or head sizes",
        );
    }
    let (dk, dv, group) = (qw / hq, vw / hkv, hq / hkv);
    if kw != hkv * dk {
        return fail(
            node,
            format!("the key's last axis ({kw}) is not kv_num_heads x {dk}"),
        );
    }
    let (qv, kv, vv) = (floats(node, q)?, floats(node, k)?, floats(node, v)?);
    // The decay per (batch, token, kv head, key row): one per head or one per element.
    let decay = match decay {
        Some(d) if d.shape == [b, t, hkv] => Some((floats(node, d)?, 1)),
        Some(d) if d.shape == [b, t, hkv * dk] => Some((floats(node, d)?, dk)),
        Some(d) => return fail(node, format!("a decay of {:?}", d.shape)),
        None => None,
    };
    let beta = match beta {
        Some(x) if x.shape == [b, t, hkv] => Some((floats(node, x)?, hkv)),
        Some(x) if x.shape == [b, t, 1] => Some((floats(node, x)?, 1)),
        Some(x) => return fail(node, format!("a beta of {:?}", x.shape)),
        None => None,
    };
    sized(node, &[b, hkv, dk, dv])?;
    let mut state = match past {
        Some(p) if p.shape == [b, hkv, dk, dv] => floats(node, p)?.to_vec(),
        Some(p) => {
            return fail(
                node,
                format!(
                    "a past state of {:?} where [{b}, {hkv}, {dk}, {dv}] is needed",
                    p.shape
                ),
            )
        }
        None => vec![0f32; b * hkv * dk * dv],
    };
    // An unset (or zero) scale is 1/√d_k.
    let scale = match node.float("scale", 0.0)? {
        0.0 => 1.0 / (dk as f32).sqrt(),
        s => s,
    };
    let mut out = vec![0f32; b * t * hq * dv];
    let mut v_t = vec![0f32; dv];
    for bi in 0..b {
        for ti in 0..t {
            let row = bi * t + ti;
            for h in 0..hkv {
                let s = &mut state[(bi * hkv + h) * dk * dv..][..dk * dv];
                let key = &kv[row * hkv * dk + h * dk..][..dk];
                v_t.copy_from_slice(&vv[row * hkv * dv + h * dv..][..dv]);
                if let Some((d, per)) = decay {
                    for i in 0..dk {
                        let g = d[row * hkv * per + h * per + if per == 1 { 0 } else { i }].exp();
                        s[i * dv..][..dv].iter_mut().for_each(|x| *x *= g);
                    }
                }
                if let Some((bt, per)) = beta {
                    let w = bt[row * per + if per == 1 { 0 } else { h }];
                    for (m, x) in v_t.iter_mut().enumerate() {
                        let retrieved: f32 = (0..dk).map(|i| s[i * dv + m] * key[i]).sum();
                        *x = w * (*x - retrieved);
                    }
                }
                for (i, &ki) in key.iter().enumerate() {
                    for (x, &vm) in s[i * dv..][..dv].iter_mut().zip(&v_t) {
                        *x += ki * vm;
                    }
                }
                // The query heads of this key/value head read the updated state.
                for g in 0..group {
                    let hq_i = h * group + g;
                    let query = &qv[row * hq * dk + hq_i * dk..][..dk];
                    let o = &mut out[row * hq * dv + hq_i * dv..][..dv];
                    for (m, x) in o.iter_mut().enumerate() {
                        let dot: f32 = (0..dk).map(|i| query[i] * s[i * dv + m]).sum();
                        *x = scale * dot;
                    }
                }
            }
        }
    }
    Ok(vec![
        Tensor::f32(vec![b, t, hq * dv], out)?,
        Tensor::f32(vec![b, hkv, dk, dv], state)?,
    ])
}
