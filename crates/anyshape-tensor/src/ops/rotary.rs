//! `RotaryEmbedding` (opset 23): each head's first `rotary_embedding_dim` elements
//! rotated in pairs by the angles of its position — the halves paired (`x[i]` with
//! `x[i + d/2]`) or, `interleaved`, neighbours (`x[2i]` with `x[2i + 1]`) — with the
//! cosines and sines given as caches, looked up by `position_ids` or given per token.
//! The input is `[batch, heads, sequence, head]` or `[batch, sequence, heads·head]`
//! (with `num_heads`); the rest of each head passes through.
use super::{fail, req, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "RotaryEmbedding",
    since: 23,
    infer,
    eval,
    eval_into: None,
}];

fn infer(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    req(node, ins, 1)?;
    req(node, ins, 2)?;
    match x.rank() {
        4 => {}
        3 if node.int("num_heads", 0)? > 0 => {}
        3 => return fail(node, "a 3-D input needs num_heads"),
        r => return fail(node, format!("a rank-{r} input: rank 3 or 4")),
    }
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

fn eval(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let (cos, sin) = (req(node, ins, 1)?, req(node, ins, 2)?);
    let positions = ins.get(3).copied().flatten();
    let v = x.as_f32().map_err(|e| node.error(e))?;
    // Batch, sequence, heads, head size, and the element strides of the sequence and
    // head axes (the input's layout, read in place).
    let (b, s, h, d, seq_stride, head_stride) = match *x.shape {
        [b, h, s, d] => (b, s, h, d, d, s * d),
        [b, s, hidden] => {
            let h = node.int("num_heads", 0)?;
            if h <= 0 || hidden % h as usize != 0 {
                return fail(
                    node,
                    format!("{hidden} elements a token over num_heads {h}"),
                );
            }
            let h = h as usize;
            (b, s, h, hidden / h, hidden, hidden / h)
        }
        _ => return fail(node, "an input of rank 3 or 4"),
    };
    let rot = match node.int("rotary_embedding_dim", 0)? {
        0 => d,
        r if r > 0 && r as usize <= d && r % 2 == 0 => r as usize,
        r => return fail(node, format!("rotary_embedding_dim {r} for heads of {d}")),
    };
    let half = rot / 2;
    let interleaved = node.int("interleaved", 0)? != 0;
    let (cv, sv) = (
        cos.as_f32().map_err(|e| node.error(e))?,
        sin.as_f32().map_err(|e| node.error(e))?,
    );
    if cos.shape != sin.shape || cos.shape.last() != Some(&half) {
        return fail(
            node,
            format!(
                "caches of shapes {:?} and {:?}: both [.., {half}] (half the rotated elements)",
                cos.shape, sin.shape
            ),
        );
    }
    // The cache row of token (batch i, position t).
    let row: Box<dyn Fn(usize, usize) -> Result<usize>> = match positions {
        Some(p) => {
            let ids = p.as_i64().map_err(|e| node.error(e))?;
            if p.shape != [b, s] || cos.shape.len() != 2 {
                return fail(
                    node,
                    "position_ids [batch, sequence] and caches [positions, half]",
                );
            }
            let rows = cos.shape[0];
            Box::new(move |i, t| {
                let id = ids[i * s + t];
                usize::try_from(id)
                    .ok()
                    .filter(|&r| r < rows)
                    .ok_or_else(|| node.error(format!("position {id} outside the caches' {rows}")))
            })
        }
        None => {
            if cos.shape != [b, s, half] {
                return fail(node, "without position_ids, caches [batch, sequence, half]");
            }
            Box::new(move |i, t| Ok(i * s + t))
        }
    };
    let mut out = v.to_vec();
    for i in 0..b {
        for t in 0..s {
            let r = row(i, t)? * half;
            let (c, sn) = (&cv[r..r + half], &sv[r..r + half]);
            for head in 0..h {
                let at = i * h * s * d + head * head_stride + t * seq_stride;
                // In 4-D the batch stride is h·s·d either way; in 3-D the same (s·hidden).
                let x = &v[at..at + d];
                let y = &mut out[at..at + d];
                for k in 0..half {
                    let (p, q) = if interleaved {
                        (2 * k, 2 * k + 1)
                    } else {
                        (k, k + half)
                    };
                    y[p] = c[k] * x[p] - sn[k] * x[q];
                    y[q] = sn[k] * x[p] + c[k] * x[q];
                }
            }
        }
    }
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;

    fn node(attrs: &[(&str, i64)]) -> Node {
        Node {
            name: "n".into(),
            op: "RotaryEmbedding".into(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: vec![3],
            attrs: attrs
                .iter()
                .map(|&(k, v)| (k.to_string(), Attr::Int(v)))
                .collect(),
        }
    }

    /// A 3-D input equals its 4-D form (heads split and moved), a rotation keeps each
    /// pair's norm, the part past `rotary_embedding_dim` passes through, and angle 0
    /// leaves the input as it is.
    #[test]
    fn rotations_by_position() {
        let (b, s, h, d) = (1, 3, 2, 4);
        let x3: Vec<f32> = (0..b * s * h * d)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let angle = |t: usize, k: usize| t as f32 * (k as f32 + 1.0) * 0.3;
        let cos: Vec<f32> = (0..s * 2).map(|i| angle(i / 2, i % 2).cos()).collect();
        let sin: Vec<f32> = (0..s * 2).map(|i| angle(i / 2, i % 2).sin()).collect();
        let (cos, sin) = (
            Tensor::f32(vec![b, s, 2], cos).unwrap(),
            Tensor::f32(vec![b, s, 2], sin).unwrap(),
        );
        let t3 = Tensor::f32(vec![b, s, h * d], x3.clone()).unwrap();
        let y3 = eval(
            &node(&[("num_heads", 2)]),
            &[Some(t3.view()), Some(cos.view()), Some(sin.view())],
        )
        .unwrap();
        // [b, s, h, d] -> [b, h, s, d]
        let mut x4 = vec![0.0; x3.len()];
        for t in 0..s {
            for hh in 0..h {
                for k in 0..d {
                    x4[(hh * s + t) * d + k] = x3[(t * h + hh) * d + k];
                }
            }
        }
        let t4 = Tensor::f32(vec![b, h, s, d], x4).unwrap();
        let y4 = eval(
            &node(&[]),
            &[Some(t4.view()), Some(cos.view()), Some(sin.view())],
        )
        .unwrap();
        let (y3, y4) = (y3[0].as_f32().unwrap(), y4[0].as_f32().unwrap());
        for t in 0..s {
            for hh in 0..h {
                for k in 0..d {
                    assert_eq!(y3[(t * h + hh) * d + k], y4[(hh * s + t) * d + k]);
                }
                // Pairs (k, k + 2) keep their norm; position 0 is the identity.
                for k in 0..2 {
                    let at = (t * h + hh) * d;
                    let n = |v: &[f32]| v[at + k].hypot(v[at + k + 2]);
                    assert!((n(y3) - n(&x3)).abs() < 1e-6);
                    if t == 0 {
                        assert_eq!(y3[at + k], x3[at + k]);
                    }
                }
            }
        }
        // Half the head rotated, interleaved: elements 2 and 3 pass through.
        let one = |v: f32| Tensor::f32(vec![b, s, 1], vec![v; s]).unwrap();
        let (c, sn) = (one(0.0), one(1.0));
        let y = eval(
            &node(&[
                ("num_heads", 2),
                ("rotary_embedding_dim", 2),
                ("interleaved", 1),
            ]),
            &[Some(t3.view()), Some(c.view()), Some(sn.view())],
        )
        .unwrap();
        let y = y[0].as_f32().unwrap();
        for at in (0..x3.len()).step_by(d) {
            assert_eq!((y[at], y[at + 1]), (-x3[at + 1], x3[at]));
            assert_eq!(&y[at + 2..at + 4], &x3[at + 2..at + 4]);
        }
    }
}
