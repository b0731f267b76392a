//! Fused attention: scores, scaling, mask, softmax and context in one operator (see
//! [`OpClass::Attention`]), queries, keys, values and output in the projections'
//! `[batch, sequence, heads, dim]` layout.
use super::{axis, workload};
use crate::{
    AttentionSpec, AxisKind::Reduction, AxisKind::Spatial, Expr, OpClass, Scalar, TensorRef,
    Workload,
};

/// `op(B, H, M, N, D)`, its axes `b, h, m, d` (spatial) and `n` (the keys, summed
/// over), with the mask as a fourth operand where `masked`; scale 1 until
/// [`Workload::with_attention`] sets it.
fn attention_of(op: &str, a: &[Expr], masked: bool) -> Workload {
    let [b, h, m, n, d] = [&a[0], &a[1], &a[2], &a[3], &a[4]];
    let axes = vec![
        axis("b", b, Spatial),
        axis("h", h, Spatial),
        axis("m", m, Spatial),
        axis("d", d, Spatial),
        axis("n", n, Reduction),
    ];
    let mut inputs = vec![
        TensorRef::over("Q", &axes, &[0, 2, 1, 3]),
        TensorRef::over("K", &axes, &[0, 4, 1, 3]),
        TensorRef::over("V", &axes, &[0, 4, 1, 3]),
    ];
    if masked {
        inputs.push(TensorRef::over("mask", &axes, &[0, 2, 4]));
    }
    let y = TensorRef::over("Y", &axes, &[0, 2, 1, 3]);
    let class = OpClass::Attention(AttentionSpec {
        scale: Scalar(1.0),
        masked,
        nan_to_zero: false,
    });
    workload(op, &["B", "H", "M", "N", "D"], a, class, axes, inputs, y)
}

/// `attention(B, H, M, N, D)`: `Y[b,m,h,d] = Σ_n softmax_n(scale · Σ_e Q[b,m,h,e] ·
/// K[b,n,h,e]) · V[b,n,h,d]`.
pub fn attention(a: &[Expr]) -> Workload {
    attention_of("attention", a, false)
}

/// `masked_attention(B, H, M, N, D)`: [`attention`] with `mask[b,m,n]` added to the
/// scaled scores before the softmax.
pub fn masked_attention(a: &[Expr]) -> Workload {
    attention_of("masked_attention", a, true)
}

/// `attention_bf16(B, H, M, N, D)`: [`attention`] whose two products may multiply in
/// bfloat16 with `f32` sums (the queries, keys, probabilities and values rounded; see
/// [`Precision::Bf16`](crate::Precision)): on AMX tiles where the CPU has them and the
/// head dim is a whole number of 32-element tiles, in `f32` elsewhere.
pub fn attention_bf16(a: &[Expr]) -> Workload {
    let mut w = attention_of("attention_bf16", a, false);
    w.precision = crate::Precision::Bf16;
    w
}

/// `masked_attention_bf16(B, H, M, N, D)`: [`masked_attention`] as [`attention_bf16`].
pub fn masked_attention_bf16(a: &[Expr]) -> Workload {
    let mut w = attention_of("masked_attention_bf16", a, true);
    w.precision = crate::Precision::Bf16;
    w
}
