//! `RotaryEmbedding` (opset 23): each head's first `rotary_embedding_dim` elements
//! rotated in pairs by the angles of its position — the halves paired (`x[i]` with
//! `x[i + d/2]`) or, `interleaved`, neighbours (`x[2i]` with `x[2i + 1]`) — with the
//! cosines and sines given as caches, looked up by `position_ids` or given per token.
//! The input is `[batch, heads, sequence, head]` or `[batch, sequence, heads·head]`
//! (with `num_heads`); the rest of each head passes through.
//!
//! And the internal `anyshape.RotateHalf` ([`ROTATE_HALF`]): `x·cos + rotate_half(x)·sin`
//! over the last axis, `rotate_half(x)` being `[-x[h..], x[..h]]` (`h` half the axis),
//! `cos` and `sin` broadcast to `x`'s shape — the form PyTorch's exporters write Hugging
//! Face's rotary embeddings in (a `Slice`, `Neg`, `Concat`, two `Mul`s and an `Add`),
//! which compiling rewrites into one pass over `x` (`anyshape_graph`'s `rotary.rs`).
use super::{broadcast_strides, broadcasts_to, fail, for_rows, req, OpSpec};
use crate::node::Node;
use crate::{DType, Data, Fact, Result, Tensor, TensorRef, Workers};

/// The internal op `x·cos + rotate_half(x)·sin` (see the module doc). It is no ONNX op:
/// a model that names it is refused at import.
pub const ROTATE_HALF: &str = "anyshape.RotateHalf";

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "RotaryEmbedding",
        since: 23,
        infer,
        eval,
        eval_into: None,
    },
    OpSpec {
        name: ROTATE_HALF,
        since: 1,
        infer: infer_half,
        eval: eval_half,
        eval_into: Some(eval_half_into),
    },
];

/// `x`'s element type and shape (the op checks the broadcast when it runs).
fn infer_half(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    for i in 1..3 {
        let f = req(node, ins, i)?;
        if f.dtype != DType::F32 || f.rank() > x.rank() {
            return fail(
                node,
                "cosines and sines in f32, of at most the input's rank",
            );
        }
    }
    if x.dtype != DType::F32 || x.rank() == 0 {
        return fail(node, "an f32 input of rank at least 1");
    }
    Ok(vec![Fact::new(x.dtype, x.shape.clone())])
}

fn eval_half(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    super::eval_via(node, ins, eval_half_into)
}

/// Rows of the last axis, blocks of them split over the `workers`; `cos` and `sin`
/// read through their broadcast strides.
fn eval_half_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let (x, cos, sin) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let shape = x.shape;
    let d = shape.last().copied().unwrap_or(0);
    if shape.is_empty() || d % 2 != 0 {
        return fail(
            node,
            format!("an input {shape:?}: a last axis of even length"),
        );
    }
    for c in [cos.shape, sin.shape] {
        if c.len() > shape.len() || !broadcasts_to(shape, &[shape, c]) {
            return fail(
                node,
                format!("cosines or sines {c:?} do not broadcast to {shape:?}"),
            );
        }
    }
    let [out] = outs else {
        return fail(node, "one output");
    };
    let (Data::F32(y), true) = (&mut out.data, out.shape == shape) else {
        return fail(
            node,
            format!("an f32 output of the input's shape {shape:?}"),
        );
    };
    let err = |e| node.error(e);
    let (xv, cv, sv) = (
        x.as_f32().map_err(err)?,
        cos.as_f32().map_err(err)?,
        sin.as_f32().map_err(err)?,
    );
    let r = shape.len();
    let (tc, ts) = (
        broadcast_strides(cos.shape, r),
        broadcast_strides(sin.shape, r),
    );
    let (ic, is) = (tc[r - 1], ts[r - 1]);
    if d == 0 {
        return Ok(());
    }
    let h = d / 2;
    let rows_per_chunk = crate::workers::CHUNK.div_ceil(d);
    workers.chunks_mut(y, rows_per_chunk * d, |i, y| {
        let first = i * rows_per_chunk;
        let mut at = 0;
        for_rows(shape, [&tc, &ts], first..first + y.len() / d, |[oc, os]| {
            let row = &mut y[at..at + d];
            let xr = &xv[(first * d + at)..(first * d + at + d)];
            at += d;
            if (ic, is) == (1, 1) {
                // Halves zipped, so that the loops vectorize.
                let (xl, xh) = xr.split_at(h);
                let (cl, ch) = cv[oc..oc + d].split_at(h);
                let (sl, sh) = sv[os..os + d].split_at(h);
                let (lo, hi) = row.split_at_mut(h);
                for ((((o, &a), &b), &c), &s) in lo.iter_mut().zip(xl).zip(xh).zip(cl).zip(sl) {
                    *o = a * c - b * s;
                }
                for ((((o, &a), &b), &c), &s) in hi.iter_mut().zip(xl).zip(xh).zip(ch).zip(sh) {
                    *o = b * c + a * s;
                }
            } else {
                for (j, o) in row.iter_mut().enumerate() {
                    let turned = if j < h { -xr[j + h] } else { xr[j - h] };
                    *o = xr[j] * cv[oc + j * ic] + turned * sv[os + j * is];
                }
            }
        });
    });
    Ok(())
}

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

    /// `anyshape.RotateHalf` element by element from its definition, for tables of the
    /// input's shape, broadcast along rows, and broadcast along the last axis (the
    /// strided path), split over two threads or not; odd last axes and tables that do
    /// not broadcast are refused.
    #[test]
    fn rotate_half_by_its_definition() {
        let node = Node {
            name: "r".into(),
            op: ROTATE_HALF.into(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: vec![3],
            attrs: Default::default(),
        };
        let shape = [2usize, 3, 700, 8]; // past 16K elements: two parts
        let n: usize = shape.iter().product();
        let x = Tensor::f32(
            shape.to_vec(),
            (0..n).map(|i| (i as f32 * 0.7).sin()).collect(),
        )
        .unwrap();
        let two = crate::workers::Two;
        for table in [vec![2, 3, 700, 8], vec![700, 8], vec![1, 700, 1], vec![8]] {
            let len: usize = table.iter().product();
            let t = |k: f32| {
                let v = (0..len).map(|i| (i as f32 * k).cos()).collect();
                Tensor::f32(table.clone(), v).unwrap()
            };
            let (c, sn) = (t(0.3), t(0.11));
            let ins = [Some(x.view()), Some(c.view()), Some(sn.view())];
            let serial = eval_half(&node, &ins).unwrap();
            let mut split = vec![Tensor::zeros(DType::F32, shape.to_vec()).unwrap()];
            eval_half_into(&node, &ins, &mut split, Workers::new(&two)).unwrap();
            assert_eq!(serial[0], split[0], "{table:?}");
            let (xv, y) = (x.as_f32().unwrap(), serial[0].as_f32().unwrap());
            let strides = broadcast_strides(&table, 4);
            for (i, &got) in y.iter().enumerate() {
                let mut at = [0usize; 4];
                let mut rest = i;
                for d in (0..4).rev() {
                    at[d] = rest % shape[d];
                    rest /= shape[d];
                }
                let ti: usize = (0..4).map(|d| at[d] * strides[d]).sum();
                let j = at[3];
                let turned = if j < 4 { -xv[i + 4] } else { xv[i - 4] };
                let (cv, sv) = (c.as_f32().unwrap()[ti], sn.as_f32().unwrap()[ti]);
                assert_eq!(got, xv[i] * cv + turned * sv, "{table:?} at {at:?}");
            }
        }
        let odd = Tensor::f32(vec![2, 3], vec![0.0; 6]).unwrap();
        let c = Tensor::f32(vec![3], vec![0.0; 3]).unwrap();
        let e = eval_half(&node, &[Some(odd.view()), Some(c.view()), Some(c.view())]);
        assert!(e.unwrap_err().to_string().contains("even"));
        let wrong = Tensor::f32(vec![3, 8], vec![0.0; 24]).unwrap();
        let e = eval_half(
            &node,
            &[Some(x.view()), Some(wrong.view()), Some(wrong.view())],
        );
        assert!(e.unwrap_err().to_string().contains("broadcast"));
    }
}
