//! `DFT`: the discrete Fourier transform along one axis of a real (`[…, 1]`) or complex
//! (`[…, 2]`: real and imaginary parts) signal — forward, inverse, one-sided (a real
//! signal's first `L/2 + 1` frequencies) and the inverse of a one-sided spectrum (a real
//! signal back), zero-padded or truncated to `dft_length` — as ONNX's reference
//! (NumPy's `fft`, `ifft`, `irfft`) computes it, in `f64` sums.
use super::{axis, fail, req, runtime_shape, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[OpSpec {
    name: "DFT",
    since: 17,
    infer: infer_dft,
    eval: eval_dft,
    eval_into: None,
}];

/// The transformed axis: the `axis` attribute (opset 17), the `axis` input (opset 20),
/// or the default where both opsets agree (axis 1 of a rank-3 signal; opset 17 means
/// 1 and opset 20 means -2 otherwise, and the node does not say which it is).
fn dft_axis(node: &Node, given: Option<i64>, rank: usize) -> Result<usize> {
    let a = match (node.ints("axis")?, given) {
        (Some(a), _) if a.len() == 1 => a[0],
        (Some(a), _) => return fail(node, format!("axis {a:?}: one axis")),
        (None, Some(a)) => a,
        (None, None) if rank == 3 => 1,
        (None, None) => {
            return fail(
                node,
                "no axis on a signal of rank other than 3: opset 17's default (1) and opset 20's (-2) differ; give the axis",
            )
        }
    };
    let a = axis(node, a, rank)?;
    if a + 1 == rank {
        return fail(
            node,
            "the last axis holds the real and imaginary parts, not a signal",
        );
    }
    Ok(a)
}

/// The inverse and one-sided flags.
fn flags(node: &Node) -> Result<(bool, bool)> {
    Ok((node.int("inverse", 0)? != 0, node.int("onesided", 0)? != 0))
}

fn infer_dft(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let r = x.rank();
    if r < 2 || !matches!(x.shape[r - 1].as_const(), Some(1 | 2)) {
        return fail(node, "a signal [..., 1] (real) or [..., 2] (complex)");
    }
    let (inverse, onesided) = flags(node)?;
    let mut shape = x.shape.to_vec();
    shape[r - 1] = Expr::Const(if inverse && onesided { 1 } else { 2 });
    // The length or the axis given at run time: the transformed axis (or, with the
    // axis unknown, every one but the last) a run-time dim.
    let late_axis = match ins.get(2).copied().flatten() {
        Some(_) => super::const_ints_or_late(node, ins, 2)?.is_none(),
        None => false,
    };
    let (length, late_length) = match ins.get(1).copied().flatten() {
        Some(_) => match super::sym_input_or_late(node, ins, 1)? {
            Some(l) => (
                Some(
                    l.first()
                        .cloned()
                        .ok_or_else(|| node.error("an empty dft_length"))?,
                ),
                false,
            ),
            None => (None, true),
        },
        None => (None, false),
    };
    if late_axis && (length.is_some() || late_length || onesided) {
        let last = shape[r - 1].clone();
        let shape = runtime_shape(node, 0, r, |d| (d == r - 1).then(|| last.clone()))?;
        return Ok(vec![Fact::new(x.dtype, shape)]);
    }
    // The transformed axis keeps its extent where no length and no side change it.
    if length.is_none() && !late_length && !onesided {
        return Ok(vec![Fact::new(x.dtype, shape)]);
    }
    let given = match ins.get(2).copied().flatten() {
        Some(_) => Some(
            *super::const_ints(node, ins, 2)?
                .first()
                .ok_or_else(|| node.error("an empty axis"))?,
        ),
        None => None,
    };
    let a = dft_axis(node, given, r)?;
    if late_length {
        let shape = runtime_shape(node, 0, r, |d| (d != a).then(|| shape[d].clone()))?;
        return Ok(vec![Fact::new(x.dtype, shape)]);
    }
    let n = x.shape[a].clone();
    let length = length.unwrap_or_else(|| match inverse && onesided {
        true => (n.clone() - 1) * 2,
        false => n.clone(),
    });
    shape[a] = match (inverse, onesided) {
        (false, true) => Expr::floor_div(length, Expr::Const(2)) + 1,
        _ => length,
    }
    .simplify();
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_dft(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let r = x.shape.len();
    let c = x.shape.last().copied().unwrap_or(0);
    if r < 2 || !matches!(c, 1 | 2) {
        return fail(node, "a signal [..., 1] (real) or [..., 2] (complex)");
    }
    let (inverse, onesided) = flags(node)?;
    let scalar = |i: usize| -> Result<Option<i64>> {
        match ins.get(i).copied().flatten() {
            None => Ok(None),
            Some(t) => match t.as_i64().map_err(|e| node.error(e))? {
                [v] => Ok(Some(*v)),
                v => fail(
                    node,
                    format!("input {i} must be one integer, not {}", v.len()),
                ),
            },
        }
    };
    let a = dft_axis(node, scalar(2)?, r)?;
    let n = x.shape[a];
    let length = match scalar(1)? {
        Some(l) if l >= 1 => l as usize,
        Some(l) => return fail(node, format!("dft_length {l}: 1 or more")),
        None if inverse && onesided => 2 * n.saturating_sub(1),
        None => n,
    };
    // Output along the axis: L values, L/2 + 1 one-sided, a real signal of L for irfft.
    let (out_len, out_c) = match (inverse, onesided) {
        (false, true) => (length / 2 + 1, 2),
        (true, true) => (length, 1),
        _ => (length, 2),
    };
    let outer: usize = x.shape[..a].iter().product();
    let inner: usize = x.shape[a + 1..r - 1].iter().product();
    let mut shape = x.shape.to_vec();
    shape[a] = out_len;
    shape[r - 1] = out_c;
    sized(node, &shape)?;
    if crate::tensor::numel(&[outer, inner, out_len, length])
        .map_or(true, |w| w > super::MAX_ELEMENTS)
    {
        return fail(node, "more work than one op may do");
    }
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let mut out = vec![0f32; shape.iter().product()];
    let tau = 2.0 * std::f64::consts::PI;
    // Sample k of line (o, i): the input's value (complex), zero past its end.
    let at = |o: usize, i: usize, k: usize| -> (f64, f64) {
        if k >= n {
            return (0.0, 0.0);
        }
        let p = ((o * n + k) * inner + i) * c;
        (v[p] as f64, if c == 2 { v[p + 1] as f64 } else { 0.0 })
    };
    for o in 0..outer {
        for i in 0..inner {
            for f in 0..out_len {
                let (mut re, mut im) = (0f64, 0f64);
                if inverse && onesided {
                    // irfft: the one-sided spectrum's Hermitian extension, inverted; the
                    // first and (even L) the Nyquist term count once, their imaginary
                    // parts dropped.
                    let half = length / 2 + 1;
                    for k in 0..half {
                        let (xr, xi) = at(o, i, k);
                        let angle = tau * (k * f) as f64 / length as f64;
                        let once = k == 0 || (length % 2 == 0 && k == length / 2);
                        let term = xr * angle.cos() - xi * angle.sin();
                        re += if once { xr * angle.cos() } else { 2.0 * term };
                    }
                    re /= length as f64;
                } else {
                    let sign = if inverse { 1.0 } else { -1.0 };
                    for k in 0..length.min(n) {
                        let (xr, xi) = at(o, i, k);
                        let angle = sign * tau * ((k * f) % length) as f64 / length as f64;
                        let (s, co) = angle.sin_cos();
                        re += xr * co - xi * s;
                        im += xr * s + xi * co;
                    }
                    if inverse {
                        re /= length as f64;
                        im /= length as f64;
                    }
                }
                let p = ((o * out_len + f) * inner + i) * out_c;
                out[p] = re as f32;
                if out_c == 2 {
                    out[p + 1] = im as f32;
                }
            }
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}
