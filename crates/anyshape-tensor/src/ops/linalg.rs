//! Contractions: `MatMul` (numpy semantics: batched, broadcast, 1-D operands) and
//! `Gemm`; and `Det` (each square matrix's determinant, by LU with partial pivoting in
//! `f64`). The loops accumulate in `f32` in the order a plain loop nest would.
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
        eval_into: None,
    },
    OpSpec {
        name: "Det",
        since: 11,
        infer: infer_det,
        eval: eval_det,
        eval_into: None,
    },
    OpSpec {
        name: "Gemm",
        since: 7,
        infer: infer_gemm,
        eval: eval_gemm,
        eval_into: None,
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

fn infer_det(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    if x.rank() < 2 {
        return fail(node, "matrices [*, M, M]");
    }
    Ok(vec![Fact::new(x.dtype, x.shape[..x.rank() - 2].to_vec())])
}

fn eval_det(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let r = x.shape.len();
    if r < 2 || x.shape[r - 1] != x.shape[r - 2] {
        return fail(
            node,
            format!("square matrices [*, M, M], not {:?}", x.shape),
        );
    }
    let m = x.shape[r - 1];
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let count: usize = x.shape[..r - 2].iter().product();
    if m == 0 {
        // The determinant of an empty matrix is 1.
        return Ok(vec![Tensor::f32(
            x.shape[..r - 2].to_vec(),
            vec![1.0; count],
        )?]);
    }
    let mut out = Vec::with_capacity(count);
    let mut a = vec![0f64; m * m];
    for matrix in v.chunks_exact(m * m).take(count) {
        for (d, &s) in a.iter_mut().zip(matrix) {
            *d = s as f64;
        }
        let mut det = 1f64;
        for c in 0..m {
            let p = (c..m)
                .max_by(|&i, &j| a[i * m + c].abs().total_cmp(&a[j * m + c].abs()))
                .unwrap_or(c);
            if a[p * m + c] == 0.0 {
                det = 0.0;
                break;
            }
            if p != c {
                for k in 0..m {
                    a.swap(p * m + k, c * m + k);
                }
                det = -det;
            }
            det *= a[c * m + c];
            for i in c + 1..m {
                let f = a[i * m + c] / a[c * m + c];
                for k in c..m {
                    a[i * m + k] -= f * a[c * m + k];
                }
            }
        }
        out.push(det as f32);
    }
    Ok(vec![Tensor::f32(x.shape[..r - 2].to_vec(), out)?])
}
