//! `DFT`: the discrete Fourier transform along one axis of a real (`[…, 1]`) or complex
//! (`[…, 2]`: real and imaginary parts) signal — forward, inverse, one-sided (a real
//! signal's first `L/2 + 1` frequencies) and the inverse of a one-sided spectrum (a real
//! signal back), zero-padded or truncated to `dft_length` — as ONNX's reference
//! (NumPy's `fft`, `ifft`, `irfft`) computes it, in `f64` sums; and `STFT`, the
//! transform of each windowed frame of a signal.
use super::{axis, fail, req, runtime_shape, sized, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "DFT",
        since: 17,
        infer: infer_dft,
        eval: eval_dft,
        eval_into: None,
    },
    OpSpec {
        name: "STFT",
        since: 17,
        infer: infer_stft,
        eval: eval_stft,
        eval_into: None,
    },
];

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
    super::bounded_work(node, &[outer, inner, out_len, length])?;
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
                    (re, im) = frequency(length, length.min(n), f, sign, |k| at(o, i, k));
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

/// Frequency `f` of a signal of `length` samples, `at(k)` (real, imaginary) for the
/// first `count` and zero after: `Σ x_k e^{sign·2πi·kf/length}`, in `f64`.
fn frequency(
    length: usize,
    count: usize,
    f: usize,
    sign: f64,
    at: impl Fn(usize) -> (f64, f64),
) -> (f64, f64) {
    let (mut re, mut im) = (0f64, 0f64);
    for k in 0..count {
        let (xr, xi) = at(k);
        let angle = sign * std::f64::consts::TAU * ((k * f) % length) as f64 / length as f64;
        let (s, co) = angle.sin_cos();
        re += xr * co - xi * s;
        im += xr * s + xi * co;
    }
    (re, im)
}

/// `STFT`'s frame length: the input, or the window's; `None` where neither is given
/// (the signal's then).
fn frame_length(node: &Node, given: Option<i64>, window: Option<usize>) -> Result<Option<usize>> {
    match (given, window) {
        (Some(l), Some(w)) if l != w as i64 => {
            fail(node, format!("a frame of {l} with a window of {w}"))
        }
        (Some(l), _) if l <= 0 => fail(node, format!("a frame length of {l}")),
        (Some(l), _) => Ok(Some(l as usize)),
        (None, w) => Ok(w),
    }
}

fn infer_stft(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    if x.rank() != 3 || !matches!(x.shape[2].as_const(), Some(1 | 2)) {
        return fail(
            node,
            "a signal [batch, length, 1] (real) or [batch, length, 2] (complex)",
        );
    }
    let scalar = |i: usize| -> Result<Option<i64>> {
        Ok(match ins.get(i).copied().flatten() {
            None => None,
            Some(_) => super::const_ints_or_late(node, ins, i)?.and_then(|v| v.first().copied()),
        })
    };
    let step = scalar(1)?;
    let given = match ins.get(3).copied().flatten() {
        Some(_) => match scalar(3)? {
            Some(l) => Some(l),
            None => return stft_late(node, x),
        },
        None => None,
    };
    let window = match ins.get(2).copied().flatten() {
        Some(w) => match w.shape.first().and_then(Expr::as_const) {
            Some(n) => Some(n as usize),
            None => return stft_late(node, x),
        },
        None => None,
    };
    let (Some(step), Some(len)) = (step, frame_length(node, given, window)?) else {
        return stft_late(node, x);
    };
    if step <= 0 {
        return fail(node, format!("a frame step of {step}"));
    }
    let frames = Expr::floor_div(x.shape[1].clone() - len as i64, Expr::Const(step)) + 1;
    let onesided = node.int("onesided", 1)? != 0;
    let bins = if onesided { len / 2 + 1 } else { len };
    let shape = vec![
        x.shape[0].clone(),
        frames.simplify(),
        Expr::Const(bins as i64),
        Expr::Const(2),
    ];
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `STFT`'s output where its step or frame is given at run time.
fn stft_late(node: &Node, x: &Fact) -> Result<Vec<Fact>> {
    let shape = runtime_shape(node, 0, 4, |d| match d {
        0 => Some(x.shape[0].clone()),
        3 => Some(Expr::Const(2)),
        _ => None,
    })?;
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `STFT(signal, frame_step, window, frame_length)`: for each frame of the signal (one
/// every `frame_step`, as many as fit), the DFT of the frame times the window (ones
/// where none is given): `[batch, frames, bins, 2]`, the first `L/2 + 1` bins where
/// `onesided`, in `f64` sums.
fn eval_stft(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let &[b, n, c @ (1 | 2)] = x.shape else {
        return fail(
            node,
            "a signal [batch, length, 1] (real) or [batch, length, 2] (complex)",
        );
    };
    let step = match super::ints(node, ins, 1)? {
        [s] if *s > 0 => *s as usize,
        _ => return fail(node, "the frame step must be one positive integer"),
    };
    let window = ins
        .get(2)
        .copied()
        .flatten()
        .map(|w| w.as_f32())
        .transpose()
        .map_err(|e| node.error(e))?;
    let given = match ins.get(3).copied().flatten() {
        Some(_) => match super::ints(node, ins, 3)? {
            [l] => Some(*l),
            _ => return fail(node, "the frame length must be one integer"),
        },
        None => None,
    };
    let len = frame_length(node, given, window.map(|w| w.len()))?.unwrap_or(n);
    if len > n || len == 0 {
        return fail(node, format!("a frame of {len} over a signal of {n}"));
    }
    let frames = (n - len) / step + 1;
    let onesided = node.int("onesided", 1)? != 0;
    if onesided && c == 2 {
        return fail(node, "a one-sided transform of a complex signal");
    }
    let bins = if onesided { len / 2 + 1 } else { len };
    let shape = vec![b, frames, bins, 2];
    sized(node, &shape)?;
    super::bounded_work(node, &[b, frames, bins, len])?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let mut out = vec![0f32; b * frames * bins * 2];
    for bi in 0..b {
        for f in 0..frames {
            for k in 0..bins {
                let (re, im) = frequency(len, len, k, -1.0, |t| {
                    let at = (bi * n + f * step + t) * c;
                    let w = window.map_or(1.0, |w| w[t] as f64);
                    let xi = if c == 2 { v[at + 1] as f64 * w } else { 0.0 };
                    (v[at] as f64 * w, xi)
                });
                let o = ((bi * frames + f) * bins + k) * 2;
                out[o] = re as f32;
                out[o + 1] = im as f32;
            }
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}
