//! Contractions: `MatMul` (numpy semantics: batched, broadcast, 1-D operands), `Gemm`
//! and 2-D `Conv` (ViT's patch embedding). The `MatMul` and `Gemm` loops accumulate in
//! `f32` in the order a plain loop nest would; `Conv` (a host step of models that run
//! it, 50 % of ViT-base as a loop nest) is patches × weights through the `gemm` crate.
use super::pool::Window;
use super::{broadcast_indices, broadcast_shape, fail, req, sized, OpSpec};
use crate::fact::broadcast;
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "MatMul",
        since: 1,
        infer: infer_matmul,
        eval: eval_matmul,
    },
    OpSpec {
        name: "Gemm",
        since: 7,
        infer: infer_gemm,
        eval: eval_gemm,
    },
    OpSpec {
        name: "Conv",
        since: 11,
        infer: infer_conv,
        eval: eval_conv,
    },
];

fn infer_matmul(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (a, b) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if a.rank() == 0 || b.rank() == 0 {
        return fail(node, "scalar operands");
    }
    let sa = if a.rank() == 1 {
        vec![Expr::Const(1), a.shape[0].clone()]
    } else {
        a.shape.to_vec()
    };
    let sb = if b.rank() == 1 {
        vec![b.shape[0].clone(), Expr::Const(1)]
    } else {
        b.shape.to_vec()
    };
    let (ra, rb) = (sa.len(), sb.len());
    let mut shape = broadcast(&sa[..ra - 2], &sb[..rb - 2]).map_err(|e| node.error(e))?;
    if a.rank() > 1 {
        shape.push(sa[ra - 2].clone());
    }
    if b.rank() > 1 {
        shape.push(sb[rb - 1].clone());
    }
    Ok(vec![Fact::new(a.dtype, shape)])
}

/// `C[m,n] = Σ_k A[m,k] B[k,n]` for row-major slices, accumulated into `c`.
fn gemm_into(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    for i in 0..m {
        let row = &mut c[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            let brow = &b[p * n..(p + 1) * n];
            for j in 0..n {
                row[j] += x * brow[j];
            }
        }
    }
}

fn eval_matmul(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let (x, y) = (
        a.as_f32().map_err(|e| node.error(e))?,
        b.as_f32().map_err(|e| node.error(e))?,
    );
    let sa = if a.shape.len() == 1 {
        vec![1, a.shape[0]]
    } else {
        a.shape.to_vec()
    };
    let sb = if b.shape.len() == 1 {
        vec![b.shape[0], 1]
    } else {
        b.shape.to_vec()
    };
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, k2, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 2], sb[rb - 1]);
    if k != k2 {
        return fail(node, format!("inner dims {k} and {k2} differ"));
    }
    let batch = broadcast_shape(&sa[..ra - 2], &sb[..rb - 2])
        .ok_or_else(|| node.error("batch dims do not broadcast"))?;
    let ia = broadcast_indices(&sa[..ra - 2], &batch);
    let ib = broadcast_indices(&sb[..rb - 2], &batch);
    let nb: usize = batch.iter().product();
    sized(node, &[nb, m, n])?;
    let mut out = vec![0f32; nb * m * n];
    for bi in 0..nb {
        gemm_into(
            &x[ia[bi] * m * k..(ia[bi] + 1) * m * k],
            &y[ib[bi] * k * n..(ib[bi] + 1) * k * n],
            &mut out[bi * m * n..(bi + 1) * m * n],
            m,
            n,
            k,
        );
    }
    let mut shape = batch;
    if a.shape.len() > 1 {
        shape.push(m);
    }
    if b.shape.len() > 1 {
        shape.push(n);
    }
    Ok(vec![Tensor::f32(shape, out)?])
}

fn infer_gemm(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (a, b) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if a.rank() != 2 || b.rank() != 2 {
        return fail(node, "Gemm takes 2-D operands");
    }
    let m = if node.int("transA", 0)? != 0 {
        &a.shape[1]
    } else {
        &a.shape[0]
    };
    let n = if node.int("transB", 0)? != 0 {
        &b.shape[0]
    } else {
        &b.shape[1]
    };
    Ok(vec![Fact::new(a.dtype, vec![m.clone(), n.clone()])])
}

/// A row-major 2-D matrix transposed.
fn transposed(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; x.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = x[i * cols + j];
        }
    }
    t
}

fn eval_gemm(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return fail(node, "Gemm takes 2-D operands");
    }
    let alpha = node.float("alpha", 1.0)?;
    let beta = node.float("beta", 1.0)?;
    let (ta, tb) = (node.int("transA", 0)? != 0, node.int("transB", 0)? != 0);
    let x = a.as_f32().map_err(|e| node.error(e))?;
    let y = b.as_f32().map_err(|e| node.error(e))?;
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if tb {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return fail(node, format!("inner dims {k} and {k2} differ"));
    }
    sized(node, &[m, n])?;
    let x = if ta {
        transposed(x, a.shape[0], a.shape[1])
    } else {
        x.to_vec()
    };
    let y = if tb {
        transposed(y, b.shape[0], b.shape[1])
    } else {
        y.to_vec()
    };
    let mut out = vec![0f32; m * n];
    gemm_into(&x, &y, &mut out, m, n, k);
    for v in out.iter_mut() {
        *v *= alpha;
    }
    if let Some(c) = ins.get(2).copied().flatten() {
        let cv = c.as_f32().map_err(|e| node.error(e))?;
        if broadcast_shape(c.shape, &[m, n]).as_deref() != Some(&[m, n][..]) {
            return fail(
                node,
                format!("C of shape {:?} does not broadcast to [{m}, {n}]", c.shape),
            );
        }
        let ic = broadcast_indices(c.shape, &[m, n]);
        for (v, &i) in out.iter_mut().zip(&ic) {
            *v += beta * cv[i];
        }
    }
    Ok(vec![Tensor::f32(vec![m, n], out)?])
}

/// A convolution's window ([`Window`]); groups are refused.
fn conv_window(node: &Node) -> Result<Window> {
    if node.int("group", 1)? != 1 {
        return fail(node, "grouped convolutions are not supported yet");
    }
    Window::of(node)
}

fn infer_conv(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if x.rank() != 4 || w.rank() != 4 {
        return fail(node, "2-D convolutions (NCHW) only");
    }
    let c = conv_window(node)?;
    let kh = w.shape[2]
        .as_const()
        .ok_or_else(|| node.error("a symbolic kernel size"))?;
    let kw = w.shape[3]
        .as_const()
        .ok_or_else(|| node.error("a symbolic kernel size"))?;
    Ok(vec![Fact::new(
        x.dtype,
        vec![
            x.shape[0].clone(),
            w.shape[0].clone(),
            c.out_expr(&x.shape[2], kh, 0),
            c.out_expr(&x.shape[3], kw, 1),
        ],
    )])
}

fn eval_conv(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if x.shape.len() != 4 || w.shape.len() != 4 || x.shape[1] != w.shape[1] {
        return fail(node, "2-D convolutions (NCHW) with matching channels only");
    }
    let c = conv_window(node)?;
    let (n, ci, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (co, kh, kw) = (w.shape[0], w.shape[2], w.shape[3]);
    if kh == 0 || kw == 0 {
        return fail(node, "an empty kernel");
    }
    let (oh, ow) = (c.out(h, kh, 0), c.out(wd, kw, 1));
    let xv = x.as_f32().map_err(|e| node.error(e))?;
    let wv = w.as_f32().map_err(|e| node.error(e))?;
    let bias = ins
        .get(2)
        .copied()
        .flatten()
        .map(|b| b.as_f32().map(|v| v.to_vec()))
        .transpose()
        .map_err(|e| node.error(e))?;
    sized(node, &[n, co, oh, ow])?;
    if bias.as_ref().is_some_and(|v| v.len() != co) {
        return fail(
            node,
            format!("a bias of another length than the {co} output channels"),
        );
    }
    // Per image: the patches as the columns of a (ci·kh·kw) × (oh·ow) matrix (zero
    // where a patch reaches into the padding), then weights × patches with the `gemm`
    // crate: the output is NCHW as it comes out.
    let (k, p) = (ci * kh * kw, oh * ow);
    sized(node, &[k, p])?;
    let mut cols = vec![0f32; k * p];
    let mut out = vec![0f32; n * co * p];
    for b in 0..n {
        for i in 0..ci {
            for u in 0..kh {
                for q in 0..kw {
                    let row = &mut cols[((i * kh + u) * kw + q) * p..][..p];
                    for y in 0..oh {
                        let iy =
                            (y * c.strides[0] + u * c.dilations[0]) as isize - c.pads[0] as isize;
                        for xo in 0..ow {
                            let ix = (xo * c.strides[1] + q * c.dilations[1]) as isize
                                - c.pads[1] as isize;
                            row[y * ow + xo] = if (0..h as isize).contains(&iy)
                                && (0..wd as isize).contains(&ix)
                            {
                                xv[((b * ci + i) * h + iy as usize) * wd + ix as usize]
                            } else {
                                0.0
                            };
                        }
                    }
                }
            }
        }
        let dst = &mut out[b * co * p..][..co * p];
        if let Some(bias) = &bias {
            for (o, row) in dst.chunks_mut(p.max(1)).enumerate() {
                row.fill(bias[o]);
            }
        }
        if co > 0 && p > 0 && k > 0 {
            // SAFETY: dst is co × p, wv co × k and cols k × p, all row-major, as passed.
            unsafe {
                gemm::gemm(
                    co,
                    p,
                    k,
                    dst.as_mut_ptr(),
                    1,
                    p as isize,
                    true,
                    wv.as_ptr(),
                    1,
                    k as isize,
                    cols.as_ptr(),
                    1,
                    p as isize,
                    1.0f32,
                    1.0f32,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            }
        }
    }
    Ok(vec![Tensor::f32(vec![n, co, oh, ow], out)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;

    /// The convolution as a plain loop nest, for the test.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        x: &[f32],
        [n, ci, h, wd]: [usize; 4],
        w: &[f32],
        [co, kh, kw]: [usize; 3],
        bias: Option<&[f32]>,
        c: &Window,
        [oh, ow]: [usize; 2],
    ) -> Vec<f32> {
        let mut out = vec![0f32; n * co * oh * ow];
        for b in 0..n {
            for o in 0..co {
                for y in 0..oh {
                    for xo in 0..ow {
                        let mut acc = bias.map_or(0.0, |v| v[o]);
                        for i in 0..ci {
                            for p in 0..kh {
                                for q in 0..kw {
                                    let iy = (y * c.strides[0] + p * c.dilations[0]) as isize
                                        - c.pads[0] as isize;
                                    let ix = (xo * c.strides[1] + q * c.dilations[1]) as isize
                                        - c.pads[1] as isize;
                                    if (0..h as isize).contains(&iy)
                                        && (0..wd as isize).contains(&ix)
                                    {
                                        acc += x
                                            [((b * ci + i) * h + iy as usize) * wd + ix as usize]
                                            * w[((o * ci + i) * kh + p) * kw + q];
                                    }
                                }
                            }
                        }
                        out[((b * co + o) * oh + y) * ow + xo] = acc;
                    }
                }
            }
        }
        out
    }

    /// Patches × weights equals the loop nest: patchify (ViT), padding, strides,
    /// dilations, bias or none, batch 2, a kernel as large as the image.
    #[test]
    fn conv_matches_the_loop_nest() {
        /// Input NCHW, (out channels, kh, kw), strides, pads, dilations, with a bias.
        type Case = (
            [usize; 4],
            [usize; 3],
            [usize; 2],
            [usize; 4],
            [usize; 2],
            bool,
        );
        let cases: &[Case] = &[
            ([1, 3, 32, 48], [8, 16, 16], [16, 16], [0; 4], [1, 1], true),
            ([2, 2, 7, 9], [3, 3, 3], [1, 1], [1, 1, 1, 1], [1, 1], false),
            (
                [2, 3, 11, 10],
                [4, 3, 2],
                [2, 3],
                [2, 0, 1, 3],
                [2, 1],
                true,
            ),
            ([1, 1, 5, 5], [2, 5, 5], [1, 1], [0; 4], [1, 1], true),
        ];
        for &(xs, [co, kh, kw], strides, pads, dilations, with_bias) in cases {
            let ci = xs[1];
            let x: Vec<f32> = (0..xs.iter().product::<usize>())
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let w: Vec<f32> = (0..co * ci * kh * kw)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 40.0)
                .collect();
            let bias: Vec<f32> = (0..co).map(|o| o as f32 * 0.5 - 1.0).collect();
            let ints = |v: &[usize]| Attr::Ints(v.iter().map(|&x| x as i64).collect());
            let node = Node {
                name: "conv".into(),
                op: "Conv".into(),
                inputs: vec![],
                outputs: vec![],
                attrs: [
                    ("strides".to_string(), ints(&strides)),
                    ("pads".to_string(), ints(&pads)),
                    ("dilations".to_string(), ints(&dilations)),
                ]
                .into(),
            };
            let xt = Tensor::f32(xs.to_vec(), x.clone()).unwrap();
            let wt = Tensor::f32(vec![co, ci, kh, kw], w.clone()).unwrap();
            let bt = Tensor::f32(vec![co], bias.clone()).unwrap();
            let ins = [
                Some(xt.view()),
                Some(wt.view()),
                with_bias.then(|| bt.view()),
            ];
            let got = eval_conv(&node, &ins).unwrap().remove(0);
            let c = conv_window(&node).unwrap();
            let [oh, ow] = [got.shape[2], got.shape[3]];
            let want = naive(
                &x,
                xs,
                &w,
                [co, kh, kw],
                with_bias.then_some(&bias[..]),
                &c,
                [oh, ow],
            );
            let got = got.as_f32().unwrap();
            assert_eq!(got.len(), want.len());
            for (g, e) in got.iter().zip(&want) {
                assert!(
                    (g - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{xs:?}: {g} vs {e}"
                );
            }
        }
    }
}
