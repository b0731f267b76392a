//! Row-wise normalizations: each row of the operand along the output's last axis maps
//! to a row of the output.
use super::{axis, workload};
use crate::{AxisKind::Spatial, Expr, Normalization, OpClass, TensorRef, Workload};

/// `softmax(M, N)`: `Y[m,n] = exp(X[m,n] - max_n X[m,:]) / Σ_n exp(X[m,n] - max_n X[m,:])`.
pub fn softmax(a: &[Expr]) -> Workload {
    let [m, n] = [&a[0], &a[1]];
    let axes = vec![axis("m", m, Spatial), axis("n", n, Spatial)];
    let x = TensorRef::over("X", &axes, &[0, 1]);
    let y = TensorRef::over("Y", &axes, &[0, 1]);
    let class = OpClass::Normalization {
        kind: Normalization::Softmax,
        axis: 1,
    };
    workload("softmax", &["M", "N"], a, class, axes, vec![x], y)
}
