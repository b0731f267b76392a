//! The reference implementation every program is checked against: a direct loop over
//! the iteration domain in f64, plus the bound on rounding error used to compare.
use anyshape_ir::{
    bf16_bits, bf16_pair, bf16_unpair, bf16_value, i8_quad, i8_quantize, i8_row_scale, i8_unquad,
    AttentionAxes, AttentionSpec, AxisKind, BoundWorkload, Normalization, OpClass, Precision,
    Workload,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Bytes of an instance's buffers: every input and the output, in f32.
pub fn buffer_bytes(bound: &BoundWorkload) -> u128 {
    bound.lens.iter().map(|&n| n as u128 * 4).sum()
}

/// Deterministic random inputs in `[-1, 1)` for an instance of `w`, every input (a
/// bf16 contraction's second operand in panels as words of two such values rounded to
/// bfloat16; an i8 one's as words of four 8-bit values in `[-127, 127]`).
pub fn random_inputs(w: &Workload, bound: &BoundWorkload, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..w.inputs.len())
        .map(|t| {
            let words = (t == 1 && words(w)).then_some(w.precision);
            (0..bound.lens[t])
                .map(|_| match words {
                    Some(Precision::I8) => {
                        i8_quad(std::array::from_fn(|_| rng.random_range(-127..=127)))
                    }
                    Some(_) => bf16_pair(rng.random_range(-1.0..1.0), rng.random_range(-1.0..1.0)),
                    None => rng.random_range(-1.0f32..1.0),
                })
                .collect()
        })
        .collect()
}

/// The reference result of an instance and, per output element, a bound on the error
/// an f32 program may make (rounding in its reductions, propagated through its
/// epilogue).
#[derive(Clone, Debug)]
pub struct Reference {
    /// Expected output (epilogue applied).
    pub output: Vec<f64>,
    /// The error allowed per output element.
    pub tolerance: Vec<f64>,
}

/// Compute the reference output of `w` on `inputs` by its class's semantics
/// ([`anyshape_ir::OpClass`]), in f64, then its epilogue.
pub fn reference_output(w: &Workload, bound: &BoundWorkload, inputs: &[&[f32]]) -> Reference {
    let (mut output, mut tolerance) = match w.class {
        OpClass::Contraction => contraction(w, bound, inputs),
        OpClass::Normalization { kind, axis } => normalize(w, bound, inputs[0], axis, kind),
        OpClass::Attention(spec) => attention(w, bound, inputs, spec),
    };
    let spatial = w.output_axes();
    if !w.epilogue.is_empty() && !spatial.iter().any(|&a| bound.extents[a] == 0) {
        let out_t = w.inputs.len();
        let mut point = vec![0i64; w.axes.len()];
        loop {
            let o = bound.offset(out_t, &point) as usize;
            let operand = |t: usize| inputs[t][bound.offset(t, &point) as usize] as f64;
            let (y, tol) = w
                .epilogue
                .apply_with_bound(output[o], tolerance[o], &operand);
            output[o] = y;
            tolerance[o] = tol;
            if !advance(&mut point, &spatial, &bound.extents) {
                break;
            }
        }
    }
    Reference { output, tolerance }
}

/// Whether `w`'s second operand holds words of its precision's groups (a bf16 or i8
/// contraction's weights in panels; a bf16 one read in pairs holds `f32` elements,
/// rounded as they are read).
fn words(w: &Workload) -> bool {
    !w.precision.is_f32() && w.inputs[1].panels.is_some()
}

/// A contraction: for every point of the iteration domain, the product of the two
/// operands added to the output element it maps to. The tolerance of an element is the
/// worst-case rounding of summing its terms in f32: `(terms + 2) · eps · Σ|terms|`. In
/// bf16 each point of the domain is a pair: the first operand's element and the next
/// one, each rounded to bfloat16, times the two halves of the second operand's word
/// (or its element and the next, rounded likewise). In i8 a point is a quad: the first
/// operand's four elements there quantized by its row's scale (every element along the
/// reduction: `anyshape_ir::i8_row_scale`), times the four bytes of the second
/// operand's word, summed exactly, times the scale; its magnitude bounds the kernel's
/// integer sums of each byte plus 128, and its correction, converted to `f32`.
fn contraction(w: &Workload, bound: &BoundWorkload, inputs: &[&[f32]]) -> (Vec<f64>, Vec<f64>) {
    let out_t = w.inputs.len();
    let len = bound.lens[out_t];
    let mut output = vec![0.0f64; len];
    let mut magnitude = vec![0.0f64; len];
    let spatial: Vec<usize> = (0..w.axes.len())
        .filter(|&a| w.axes[a].kind == AxisKind::Spatial)
        .collect();
    let reduction: Vec<usize> = (0..w.axes.len())
        .filter(|&a| w.axes[a].kind == AxisKind::Reduction)
        .collect();
    let terms: usize = reduction
        .iter()
        .map(|&a| bound.extents[a] as usize)
        .product();
    // The innermost reduction axis is walked with stride increments; the others by an
    // odometer over the iteration domain.
    let inner = reduction.last().copied();
    let outer_red = &reduction[..reduction.len().saturating_sub(1)];
    let n_in = w.class.operands();
    let bf16 = w.precision == Precision::Bf16;
    let i8 = w.precision == Precision::I8;
    let words = words(w);
    // A point's value and magnitude (the sum of its products' absolute values), given
    // (in i8) its row's scale and inverse.
    let product = |offs: &[i64], (scale, inverse): (f32, f32)| -> (f64, f64) {
        if i8 {
            let quad = i8_unquad(inputs[1][offs[1] as usize]);
            let (mut p, mut size) = (0i64, 0i64);
            for (e, w) in quad.into_iter().enumerate() {
                let q = i8_quantize(inputs[0][offs[0] as usize + e], inverse) as i64;
                p += q * w as i64;
                size += q.abs() * (w.abs() as i64 + 256);
            }
            (scale as f64 * p as f64, scale as f64 * size as f64)
        } else if bf16 {
            let rounded = |t: usize, o: i64| bf16_value(bf16_bits(inputs[t][o as usize]));
            let (lo, hi) = match words {
                true => bf16_unpair(inputs[1][offs[1] as usize]),
                false => (rounded(1, offs[1]), rounded(1, offs[1] + 1)),
            };
            let x = |o: i64| rounded(0, o) as f64;
            let (p, q) = (x(offs[0]) * lo as f64, x(offs[0] + 1) * hi as f64);
            (p + q, p.abs() + q.abs())
        } else {
            let p: f64 = (0..n_in)
                .map(|t| inputs[t][offs[t] as usize] as f64)
                .product();
            (p, p.abs())
        }
    };
    let terms = terms * w.precision.group() as usize;
    if terms > 0 && !spatial.iter().any(|&a| bound.extents[a] == 0) {
        let mut point = vec![0i64; w.axes.len()];
        loop {
            let o = bound.offset(out_t, &point) as usize;
            for &a in outer_red {
                point[a] = 0;
            }
            loop {
                let mut offs: Vec<i64> = (0..n_in).map(|t| bound.offset(t, &point)).collect();
                let (extent, strides) = match inner {
                    Some(r) => (
                        bound.extents[r],
                        (0..n_in)
                            .map(|t| bound.axis_strides[t][r])
                            .collect::<Vec<_>>(),
                    ),
                    None => (1, vec![0; n_in]),
                };
                // An i8 contraction's one reduction runs along its first operand's row.
                let row = match i8 {
                    true => i8_row_scale((0..extent).flat_map(|q| {
                        let at = offs[0] + q * strides[0];
                        (0..4).map(move |e| inputs[0][(at + e) as usize])
                    })),
                    false => (1.0, 1.0),
                };
                let (mut sum, mut mag) = (0.0f64, 0.0f64);
                for _ in 0..extent {
                    let (prod, size) = product(&offs, row);
                    sum += prod;
                    mag += size;
                    for t in 0..n_in {
                        offs[t] += strides[t];
                    }
                }
                output[o] += sum;
                magnitude[o] += mag;
                if !advance(&mut point, outer_red, &bound.extents) {
                    break;
                }
            }
            if !advance(&mut point, &spatial, &bound.extents) {
                break;
            }
        }
    }
    let eps = f32::EPSILON as f64;
    let tolerance = magnitude
        .iter()
        .map(|m| (terms as f64 + 2.0) * eps * m)
        .collect();
    (output, tolerance)
}

/// Each row of `x` along `axis` normalized by `kind`, with a bound on an f32 program's
/// error per element: its sums' rounding (at most `n` roundings each, worst case) and
/// the operations after them.
fn normalize(
    w: &Workload,
    bound: &BoundWorkload,
    x: &[f32],
    axis: usize,
    kind: Normalization,
) -> (Vec<f64>, Vec<f64>) {
    let out_t = w.inputs.len();
    let len = bound.lens[out_t];
    let (mut output, mut tolerance) = (vec![0.0f64; len], vec![0.0f64; len]);
    let n = bound.extents[axis];
    let rows: Vec<usize> = w.output_axes().into_iter().filter(|&a| a != axis).collect();
    if n == 0 || rows.iter().any(|&a| bound.extents[a] == 0) {
        return (output, tolerance);
    }
    let eps = f32::EPSILON as f64;
    let sums = (n as f64 + 8.0) * eps;
    let mut point = vec![0i64; w.axes.len()];
    loop {
        let at =
            |t: usize, j: i64| (bound.offset(t, &point) + j * bound.axis_strides[t][axis]) as usize;
        let row: Vec<f64> = (0..n).map(|j| x[at(0, j)] as f64).collect();
        let mean = |f: &dyn Fn(f64) -> f64| row.iter().map(|&v| f(v)).sum::<f64>() / n as f64;
        // Each element's value and its error bound.
        let element: Box<dyn Fn(f64) -> (f64, f64)> = match kind {
            Normalization::Softmax => {
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = row.iter().map(|&v| (v - max).exp()).sum();
                Box::new(move |v| {
                    let y = (v - max).exp() / sum;
                    (y, sums * y + eps * 1e-3)
                })
            }
            Normalization::LayerNorm { epsilon } => {
                let mu = mean(&|v| v);
                let r = 1.0 / (mean(&|v| (v - mu) * (v - mu)) + epsilon.0).sqrt();
                // The mean's own rounding shifts every element by up to n·ε·mean|x|.
                let shift = n as f64 * eps * mean(&f64::abs) * r;
                Box::new(move |v| {
                    let y = (v - mu) * r;
                    (y, sums * y.abs() + shift + eps * 1e-3)
                })
            }
            Normalization::RmsNorm { epsilon } => {
                let r = 1.0 / (mean(&|v| v * v) + epsilon.0).sqrt();
                Box::new(move |v| {
                    let y = v * r;
                    (y, sums * y.abs() + eps * 1e-3)
                })
            }
        };
        for (j, &v) in row.iter().enumerate() {
            let (y, tol) = element(v);
            output[at(out_t, j as i64)] = y;
            tolerance[at(out_t, j as i64)] = tol;
        }
        if !advance(&mut point, &rows, &bound.extents) {
            break;
        }
    }
    (output, tolerance)
}

/// A fused attention (see [`OpClass::Attention`]): for every (b, h, m), the scores
/// `scale · q·k + mask` over the keys, their softmax (NaN counted as 0 under
/// `nan_to_zero`) and its sum of the values. The tolerance of an output element: the
/// probabilities' relative error — twice the worst score's absolute error (its dot
/// product of `d` terms, `(d + 2)` ulps of `Σ|scale·q·k|`, and the mask's addition), the
/// sum's and the exponential's `n + 8` ulps — and the context's own `n + 2` roundings,
/// each times `Σ_n p_n · |v_n|` (in bf16 also the operands' rounding); an absolute floor
/// for results near zero.
fn attention(
    w: &Workload,
    bound: &BoundWorkload,
    inputs: &[&[f32]],
    spec: AttentionSpec,
) -> (Vec<f64>, Vec<f64>) {
    let out_t = w.inputs.len();
    let len = bound.lens[out_t];
    let (mut output, mut tolerance) = (vec![0.0f64; len], vec![0.0f64; len]);
    let axes = AttentionAxes::of(w).expect("an attention's axes");
    let (d, n) = (bound.extents[axes.d], bound.extents[axes.n]);
    let eps = f32::EPSILON as f64;
    // In bf16 the queries and keys are rounded (a product off by up to twice bfloat16's
    // unit roundoff), and so are the probabilities and values.
    let unit = match w.precision {
        Precision::Bf16 => 2f64.powi(-8),
        // No attention multiplies in i8.
        Precision::F32 | Precision::I8 => 0.0,
    };
    let paired = 2.0 * unit;
    let scale = spec.scale.0;
    // The point of (query row, head dim element, key): every other axis at `rows`'s.
    let at = |t: usize, rows: &[i64], e: i64, ni: i64| {
        let mut point = rows.to_vec();
        point[axes.d] = e;
        point[axes.n] = ni;
        bound.offset(t, &point) as usize
    };
    // Every (batch, head, [group,] query row): a point with d and n at 0.
    let mut rows = vec![0i64; bound.extents.len()];
    let outer: Vec<usize> = [Some(axes.b), Some(axes.h), axes.g, Some(axes.m)]
        .into_iter()
        .flatten()
        .collect();
    if bound.extents.iter().any(|&x| x <= 0) {
        return (output, tolerance);
    }
    loop {
        let (mut scores, mut slack) = (Vec::new(), 0.0f64);
        for ni in 0..n {
            let (mut s, mut abs) = (0.0f64, 0.0f64);
            for e in 0..d {
                let q = inputs[0][at(0, &rows, e, ni)] as f64;
                let k = inputs[1][at(1, &rows, e, ni)] as f64;
                s += scale * q * k;
                abs += (scale * q * k).abs();
            }
            if spec.masked {
                s += inputs[3][at(3, &rows, 0, ni)] as f64;
            }
            // A masked-out key (-inf) weighs exactly 0, whatever its product's rounding.
            if s.is_finite() {
                slack =
                    slack.max((d as f64 + 2.0) * eps * abs + 2.0 * eps * s.abs() + paired * abs);
            }
            scores.push(s);
        }
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = scores.iter().map(|&s| (s - max).exp()).sum();
        let p: Vec<f64> = scores
            .iter()
            .map(|&s| {
                let p = (s - max).exp() / sum;
                if spec.nan_to_zero && p.is_nan() {
                    0.0
                } else {
                    p
                }
            })
            .collect();
        let relative = 2.0 * slack + (n as f64 + 8.0) * eps + (n as f64 + 2.0) * eps + 2.0 * unit;
        for e in 0..d {
            let (mut y, mut abs) = (0.0f64, 0.0f64);
            for (ni, &p) in p.iter().enumerate() {
                let v = inputs[2][at(2, &rows, e, ni as i64)] as f64;
                y += p * v;
                abs += (p * v).abs();
            }
            let o = at(out_t, &rows, e, 0);
            output[o] = y;
            tolerance[o] = relative * abs + eps * 1e-3;
        }
        if !advance(&mut rows, &outer, &bound.extents) {
            break;
        }
    }
    (output, tolerance)
}

/// Step an odometer over `axes` (last fastest); false when it wraps around.
fn advance(point: &mut [i64], axes: &[usize], extents: &[i64]) -> bool {
    for &a in axes.iter().rev() {
        point[a] += 1;
        if point[a] < extents[a] {
            return true;
        }
        point[a] = 0;
    }
    false
}

/// The outcome of comparing a program's output with the reference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Whether every element is within its tolerance (and none is NaN).
    pub passed: bool,
    /// Largest absolute error; infinite where the output held NaN or an infinity (JSON
    /// writes it as `null`, which reads back as infinite).
    #[serde(deserialize_with = "null_is_infinite")]
    pub max_abs_error: f64,
    /// Elements outside their tolerance.
    pub mismatches: usize,
    /// The first mismatching element, if any.
    pub first_mismatch: Option<usize>,
}

/// An `f64` that JSON wrote as `null` (serde_json's form of a non-finite number) reads
/// back as infinite.
fn null_is_infinite<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// Compare `got` with the reference; each element may be off by its tolerance.
pub fn check_output(got: &[f32], reference: &Reference) -> CheckReport {
    let (mut max_abs_error, mut mismatches, mut first_mismatch) = (0.0f64, 0usize, None);
    for (i, (&g, (&r, &tol))) in got
        .iter()
        .zip(reference.output.iter().zip(&reference.tolerance))
        .enumerate()
    {
        let err = (g as f64 - r).abs();
        if err.is_nan() || err > tol {
            mismatches += 1;
            first_mismatch.get_or_insert(i);
        }
        if err.is_nan() || err > max_abs_error {
            max_abs_error = if err.is_nan() { f64::INFINITY } else { err };
        }
    }
    if got.len() != reference.output.len() {
        mismatches += 1;
    }
    CheckReport {
        passed: mismatches == 0,
        max_abs_error,
        mismatches,
        first_mismatch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_ir::Bindings;

    #[test]
    fn reference_matches_hand_computed_matmul() {
        let w = Workload::parse("batch_matmul_nn(B=2,M=2,N=3,K=T)").unwrap();
        let bound = w.bind(&Bindings::from_pairs([("T", 4)])).unwrap();
        let ins = random_inputs(&w, &bound, 7);
        let r = reference_output(&w, &bound, &[&ins[0], &ins[1]]);
        for b in 0..2 {
            for m in 0..2 {
                for n in 0..3 {
                    let want: f64 = (0..4)
                        .map(|k| {
                            ins[0][b * 8 + m * 4 + k] as f64 * ins[1][b * 12 + k * 3 + n] as f64
                        })
                        .sum();
                    assert!((r.output[b * 6 + m * 3 + n] - want).abs() < 1e-12);
                }
            }
        }
        let got: Vec<f32> = r.output.iter().map(|&x| x as f32).collect();
        assert!(check_output(&got, &r).passed);
        let mut bad = got.clone();
        bad[5] += 0.01;
        let report = check_output(&bad, &r);
        assert_eq!((report.passed, report.first_mismatch), (false, Some(5)));
        bad[5] = f32::NAN;
        assert!(!check_output(&bad, &r).passed);
    }

    #[test]
    fn softmax_rows_sum_to_one_and_epilogues_apply() {
        let w = Workload::parse("softmax(M=3,N=T)").unwrap();
        let bound = w.bind(&Bindings::from_pairs([("T", 7)])).unwrap();
        let ins = random_inputs(&w, &bound, 3);
        let r = reference_output(&w, &bound, &[&ins[0]]);
        for row in r.output.chunks(7) {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        let w = Workload::parse("dense(M=2,N=3,K=4)+bias+relu").unwrap();
        let bound = w.bind(&Bindings::default()).unwrap();
        let ins = random_inputs(&w, &bound, 5);
        let views: Vec<&[f32]> = ins.iter().map(|v| v.as_slice()).collect();
        let r = reference_output(&w, &bound, &views);
        for m in 0..2 {
            for n in 0..3 {
                let dot: f64 = (0..4)
                    .map(|k| ins[0][m * 4 + k] as f64 * ins[1][n * 4 + k] as f64)
                    .sum();
                let want = (dot + ins[2][n] as f64).max(0.0);
                assert!((r.output[m * 3 + n] - want).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn empty_reduction_gives_zeros() {
        let w = Workload::parse("dense(M=3,N=2,K=T)+relu").unwrap();
        let bound = w.bind(&Bindings::from_pairs([("T", 0)])).unwrap();
        let r = reference_output(&w, &bound, &[&[], &[]]);
        assert_eq!(r.output, vec![0.0; 6]);
    }
}
