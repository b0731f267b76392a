//! Row-wise normalizations: each row of the operand along the output's last axis maps
//! to a row of the output.
use super::{axis, workload};
use crate::{AxisKind::Spatial, Expr, Normalization, OpClass, Scalar, TensorRef, Workload};

/// The epsilon of a layer norm or RMSNorm built from text without one: ONNX's default.
pub const DEFAULT_EPSILON: f64 = 1e-5;

/// A normalization `op(M, N)` of `kind` along `N`.
fn rows(op: &str, a: &[Expr], kind: Normalization) -> Workload {
    let [m, n] = [&a[0], &a[1]];
    let axes = vec![axis("m", m, Spatial), axis("n", n, Spatial)];
    let x = TensorRef::over("X", &axes, &[0, 1]);
    let y = TensorRef::over("Y", &axes, &[0, 1]);
    let class = OpClass::Normalization { kind, axis: 1 };
    workload(op, &["M", "N"], a, class, axes, vec![x], y)
}

/// `softmax(M, N)`: `Y[m,n] = exp(X[m,n] - max_n X[m,:]) / Σ_n exp(X[m,n] - max_n X[m,:])`.
pub fn softmax(a: &[Expr]) -> Workload {
    rows("softmax", a, Normalization::Softmax)
}

/// `layer_norm(M, N)`: `Y[m,n] = (X[m,n] - mean) / √(var + ε)` over row `m`, with
/// [`DEFAULT_EPSILON`] until [`Workload::with_epsilon`] sets it.
pub fn layer_norm(a: &[Expr]) -> Workload {
    let epsilon = Scalar(DEFAULT_EPSILON);
    rows("layer_norm", a, Normalization::LayerNorm { epsilon })
}

/// `rms_norm(M, N)`: `Y[m,n] = X[m,n] / √(mean_n X[m,:]² + ε)`, with
/// [`DEFAULT_EPSILON`] until [`Workload::with_epsilon`] sets it.
pub fn rms_norm(a: &[Expr]) -> Workload {
    let epsilon = Scalar(DEFAULT_EPSILON);
    rows("rms_norm", a, Normalization::RmsNorm { epsilon })
}
