//! `CausalConvWithState` (opset 27): the causal depthwise 1-D convolution of Mamba's and
//! Gated DeltaNet's blocks, with the carry a decoder passes from step to step — each
//! channel's `k - 1` last positions before the input (`past_state`, zeros without it)
//! in, the `k - 1` last positions of that padded input out (`present_state`), an
//! optional bias and a fused SiLU.
use super::{fail, req, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "CausalConvWithState",
    since: 27,
    infer: infer_causal_conv,
    eval: eval_causal_conv,
    eval_into: None,
}];

/// Whether the output passes through SiLU (`silu`, or its alias `swish`).
fn silu(node: &Node) -> Result<bool> {
    match node.string("activation", "none")?.as_str() {
        "none" => Ok(false),
        "silu" | "swish" => Ok(true),
        other => fail(node, format!("activation `{other}`: none, silu or swish")),
    }
}

fn infer_causal_conv(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    silu(node)?;
    if x.rank() != 3 || w.rank() != 3 {
        return fail(
            node,
            "the input must be [batch, channels, length] and the weight [channels, 1, k]",
        );
    }
    let k = match w.shape[2].as_const() {
        Some(k) if k >= 1 => k,
        _ => {
            return fail(
                node,
                "the kernel length (the weight's last axis) must be known",
            )
        }
    };
    let state = vec![x.shape[0].clone(), x.shape[1].clone(), Expr::Const(k - 1)];
    Ok(vec![
        Fact::new(x.dtype, x.shape.to_vec()),
        Fact::new(x.dtype, state),
    ])
}

fn eval_causal_conv(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let activation = silu(node)?;
    let (&[b, c, l], &[wc, 1, k]) = (x.shape, w.shape) else {
        return fail(
            node,
            "the input must be [batch, channels, length] and the weight [channels, 1, k]",
        );
    };
    if wc != c || k == 0 {
        return fail(node, format!("a weight of {:?} for {c} channels", w.shape));
    }
    let bias = match ins.get(2).copied().flatten() {
        Some(t) if t.shape == [c] => Some(t.as_f32().map_err(|e| node.error(e))?),
        Some(t) => return fail(node, format!("a bias of {:?} for {c} channels", t.shape)),
        None => None,
    };
    let past = match ins.get(3).copied().flatten() {
        Some(t) if t.shape == [b, c, k - 1] => Some(t.as_f32().map_err(|e| node.error(e))?),
        Some(t) => {
            return fail(
                node,
                format!(
                    "a past state of {:?} where [{b}, {c}, {}] is needed",
                    t.shape,
                    k - 1
                ),
            )
        }
        None => None,
    };
    let (xv, wv) = (
        x.as_f32().map_err(|e| node.error(e))?,
        w.as_f32().map_err(|e| node.error(e))?,
    );
    let span = l + k - 1;
    sized(node, &[b, c, span])?;
    let mut out = vec![0f32; b * c * l];
    let mut state = vec![0f32; b * c * (k - 1)];
    // One channel's padded input: its past (or zeros), then its input.
    let mut padded = vec![0f32; span];
    for row in 0..b * c {
        let ch = row % c;
        match past {
            Some(p) => padded[..k - 1].copy_from_slice(&p[row * (k - 1)..][..k - 1]),
            None => padded[..k - 1].fill(0.0),
        }
        padded[k - 1..].copy_from_slice(&xv[row * l..][..l]);
        let taps = &wv[ch * k..][..k];
        for (t, o) in out[row * l..][..l].iter_mut().enumerate() {
            let sum: f64 = taps
                .iter()
                .zip(&padded[t..t + k])
                .map(|(&a, &v)| a as f64 * v as f64)
                .sum();
            let y = (sum + bias.map_or(0.0, |bv| bv[ch] as f64)) as f32;
            *o = match activation {
                true => y / (1.0 + (-y).exp()),
                false => y,
            };
        }
        state[row * (k - 1)..][..k - 1].copy_from_slice(&padded[l..]);
    }
    Ok(vec![
        Tensor::f32(vec![b, c, l], out)?,
        Tensor::f32(vec![b, c, k - 1], state)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;

    /// Worked by hand: one channel, kernel [1, 2, 3], past [10, 20], input [1, 2].
    #[test]
    fn convolves_over_the_past_and_keeps_the_last_positions() {
        let node = Node {
            name: "c".into(),
            op: "CausalConvWithState".into(),
            inputs: vec![Some(0), Some(1), None, Some(3)],
            outputs: vec![4, 5],
            attrs: [("activation".to_string(), Attr::Str("none".into()))].into(),
        };
        let x = Tensor::f32(vec![1, 1, 2], vec![1.0, 2.0]).unwrap();
        let w = Tensor::f32(vec![1, 1, 3], vec![1.0, 2.0, 3.0]).unwrap();
        let past = Tensor::f32(vec![1, 1, 2], vec![10.0, 20.0]).unwrap();
        let outs = eval_causal_conv(
            &node,
            &[Some(x.view()), Some(w.view()), None, Some(past.view())],
        )
        .unwrap();
        // [10, 20, 1]·[1, 2, 3] = 53; [20, 1, 2]·[1, 2, 3] = 28.
        assert_eq!(outs[0].as_f32().unwrap(), [53.0, 28.0]);
        assert_eq!(outs[1].as_f32().unwrap(), [1.0, 2.0]);
    }
}
