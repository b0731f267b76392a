//! Blocks moved between the channel axis and the spatial axes of an NCHW tensor:
//! `DepthToSpace` and `SpaceToDepth` (modes `DCR` and `CRD`). Each is a reshape to six
//! axes, a transpose and a reshape back, so the reference reads the input once through
//! strides.
use super::{fail, req, OpSpec};
use crate::fact::exact_quotient;
use crate::node::Node;
use crate::{strides, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "DepthToSpace",
        since: 13,
        infer,
        eval,
        eval_into: None,
    },
    OpSpec {
        name: "SpaceToDepth",
        since: 13,
        infer,
        eval,
        eval_into: None,
    },
];

/// The node's block size (positive) and whether its mode is `CRD` (else `DCR`).
fn block(node: &Node) -> Result<(usize, bool)> {
    let b = node.int("blocksize", 0)?;
    if b < 1 {
        return fail(node, format!("blocksize {b}: need a positive one"));
    }
    let crd = match node.string("mode", "DCR")?.as_str() {
        "DCR" => false,
        "CRD" => true,
        m => return fail(node, format!("mode `{m}`: DCR or CRD")),
    };
    Ok((b as usize, crd))
}

fn infer(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    if x.rank() != 4 {
        return fail(node, "an NCHW input (rank 4)");
    }
    let (b, _) = block(node)?;
    let b = Expr::Const(b as i64);
    let s = &x.shape;
    let divided = |d: &Expr, by: Expr, what: &str| {
        exact_quotient(std::slice::from_ref(d), &[by])
            .ok_or_else(|| node.error(format!("{what} ({d}) is not a multiple of the block")))
    };
    let shape = if node.op == "DepthToSpace" {
        vec![
            s[0].clone(),
            divided(&s[1], b.clone() * b.clone(), "the channels")?,
            s[2].clone() * b.clone(),
            s[3].clone() * b,
        ]
    } else {
        vec![
            s[0].clone(),
            s[1].clone() * b.clone() * b.clone(),
            divided(&s[2], b.clone(), "the height")?,
            divided(&s[3], b, "the width")?,
        ]
    };
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let [n, c, h, w] = match x.shape {
        &[n, c, h, w] => [n, c, h, w],
        _ => return fail(node, "an NCHW input (rank 4)"),
    };
    let (b, crd) = block(node)?;
    // The six-axis view of the input, the permutation onto the output's six axes, and
    // the output's shape.
    let (view, perm, out) = if node.op == "DepthToSpace" {
        if c % (b * b) != 0 {
            return fail(node, format!("{c} channels: not a multiple of {}", b * b));
        }
        let k = c / (b * b);
        let out = vec![n, k, h * b, w * b];
        if crd {
            (vec![n, k, b, b, h, w], [0, 1, 4, 2, 5, 3], out)
        } else {
            (vec![n, b, b, k, h, w], [0, 3, 4, 1, 5, 2], out)
        }
    } else {
        if h % b != 0 || w % b != 0 {
            return fail(node, format!("{h}x{w}: not a multiple of the block {b}"));
        }
        let out = vec![n, c * b * b, h / b, w / b];
        let view = vec![n, c, h / b, b, w / b, b];
        if crd {
            (view, [0, 1, 3, 5, 2, 4], out)
        } else {
            (view, [0, 3, 5, 1, 2, 4], out)
        }
    };
    let st = strides(&view);
    let shape: Vec<usize> = perm.iter().map(|&a| view[a]).collect();
    let walk: Vec<usize> = perm.iter().map(|&a| st[a]).collect();
    let data = super::strided(x.data, &shape, &walk);
    Ok(vec![Tensor::new(out, data)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;

    fn node(op: &str, mode: &str) -> Node {
        Node {
            name: "n".into(),
            op: op.into(),
            inputs: vec![Some(0)],
            outputs: vec![1],
            attrs: [
                ("blocksize".to_string(), Attr::Int(2)),
                ("mode".to_string(), Attr::Str(mode.into())),
            ]
            .into(),
        }
    }

    /// Against the element formulas of ONNX's definitions: DCR reads channel
    /// `(bh·b + bw)·C' + c`, CRD channel `c·b² + bh·b + bw`, for output (c, y, x) with
    /// `bh = y mod b`, `bw = x mod b`; and SpaceToDepth undoes DepthToSpace.
    #[test]
    fn blocks_move_as_onnx_defines() {
        let (n, c, h, w, b) = (2, 8, 3, 2, 2);
        let x: Vec<f32> = (0..n * c * h * w).map(|i| i as f32).collect();
        let t = Tensor::f32(vec![n, c, h, w], x.clone()).unwrap();
        for mode in ["DCR", "CRD"] {
            let y = eval(&node("DepthToSpace", mode), &[Some(t.view())]).unwrap();
            let y = &y[0];
            assert_eq!(y.shape, vec![n, c / 4, h * b, w * b]);
            let v = y.as_f32().unwrap();
            let k = c / 4;
            for i in 0..n {
                for ch in 0..k {
                    for yy in 0..h * b {
                        for xx in 0..w * b {
                            let (bh, bw) = (yy % b, xx % b);
                            let src = if mode == "DCR" {
                                (bh * b + bw) * k + ch
                            } else {
                                ch * b * b + bh * b + bw
                            };
                            let want = x[((i * c + src) * h + yy / b) * w + xx / b];
                            let got = v[((i * k + ch) * h * b + yy) * w * b + xx];
                            assert_eq!(got, want, "{mode} at {i},{ch},{yy},{xx}");
                        }
                    }
                }
            }
            let back = eval(&node("SpaceToDepth", mode), &[Some(y.view())]).unwrap();
            assert_eq!(back[0].as_f32().unwrap(), &x[..], "{mode} round trip");
        }
        let odd = Tensor::f32(vec![1, 6, 1, 1], vec![0.0; 6]).unwrap();
        assert!(eval(&node("DepthToSpace", "DCR"), &[Some(odd.view())]).is_err());
    }
}
