//! A contraction seen as a (batched) GEMM: which axes play batch, M, N and K
//! ([`GemmView`]), and a bound instance as a strided batched GEMM ([`StridedGemm`], what
//! BLAS-style libraries take). Every contraction sketch and GEMM baseline reads these.
use crate::{CodegenError, Result};
use anyshape_ir::{AxisKind, BoundWorkload, OpClass, Workload};

/// The contraction seen as a batched GEMM: which axes play the roles of batch, M, N, K.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmView {
    /// The other spatial axes, in output order (shared or broadcast).
    pub batch: Vec<usize>,
    /// The output axis read by operand 0 only (the second-to-last, unless the output
    /// is written in another layout).
    pub m: usize,
    /// The output's last axis, read by operand 1 only.
    pub n: usize,
    /// The reduction axis.
    pub k: usize,
}

impl GemmView {
    /// Whether input `operand` is contiguous along this view's N, so that its vectors
    /// along N can be loaded from the tensor itself (`ib=1`) rather than packed: the
    /// second operand (B) of a view from [`GemmView::of`], the first (A) of its
    /// [`GemmView::transposed`].
    pub fn n_contiguous(&self, w: &Workload, operand: usize) -> bool {
        contiguous(w, operand, self.n)
    }

    /// Whether input `operand` is contiguous along K (dense's `[N, K]` weights).
    pub fn k_contiguous(&self, w: &Workload, operand: usize) -> bool {
        contiguous(w, operand, self.k)
    }

    /// The view of the transposed problem `Cᵀ = B · Aᵀ`: M and N swapped (the
    /// transposed variant's, `vm=1`).
    pub fn transposed(&self) -> GemmView {
        GemmView {
            m: self.n,
            n: self.m,
            ..self.clone()
        }
    }

    /// Classify the axes of a contraction: `n` is the output's last axis (read by the
    /// second operand only), `m` the output axis read by the first operand only (the
    /// one before `n`, or further out where the output is written in another layout,
    /// as `attention_context` does), `k` the reduction axis, every other spatial axis a
    /// batch axis (read by both operands, or broadcast: read by one). Errors say why
    /// the sketch does not apply.
    pub fn of(w: &Workload) -> Result<GemmView> {
        let fail = |reason: &str| CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: reason.into(),
        };
        if w.class != OpClass::Contraction {
            return Err(fail("it is not a contraction"));
        }
        let [a, b] = w.operands() else {
            return Err(fail("it needs exactly two operands"));
        };
        let out = w.output_axes();
        let [rest @ .., n] = out.as_slice() else {
            return Err(fail("its output needs at least two axes (M and N)"));
        };
        if !b.uses_axis(*n) || a.uses_axis(*n) {
            return Err(fail(
                "the output's last axis (N) must index the second operand only",
            ));
        }
        let reads_a_only = |x: usize| a.uses_axis(x) && !b.uses_axis(x);
        let ms: Vec<usize> = match rest.last() {
            Some(&x) if reads_a_only(x) => vec![x],
            _ => rest.iter().copied().filter(|&x| reads_a_only(x)).collect(),
        };
        let [m] = ms.as_slice() else {
            return Err(fail(
                "the output's second-to-last axis (M), or else exactly one output axis, must index the first operand only",
            ));
        };
        let ks: Vec<usize> = (0..w.axes.len())
            .filter(|&i| w.axes[i].kind == AxisKind::Reduction)
            .collect();
        let [k] = ks.as_slice() else {
            return Err(fail("it needs exactly one reduction axis"));
        };
        if !(a.uses_axis(*k) && b.uses_axis(*k)) {
            return Err(fail("the reduction axis must index both operands"));
        }
        Ok(GemmView {
            batch: rest.iter().copied().filter(|x| x != m).collect(),
            m: *m,
            n: *n,
            k: *k,
        })
    }
}

/// Whether input `operand` of `w` has stride 1 along `axis`.
fn contiguous(w: &Workload, operand: usize, axis: usize) -> bool {
    w.inputs
        .get(operand)
        .is_some_and(|t| t.axis_stride(axis).simplify().as_const() == Some(1))
}

/// One matrix of a strided batched GEMM: offset, batch, row and column strides, in
/// elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmOperand {
    /// Element offset of the first batch item's origin.
    pub offset: i64,
    /// Stride between batch items.
    pub batch: i64,
    /// Stride between rows.
    pub row: i64,
    /// Stride between columns.
    pub col: i64,
}

/// An instance of a contraction as a strided batched GEMM `c[i] = a[i] · b[i]` (what
/// BLAS-style libraries take): A is `m × k`, B `k × n`, C `m × n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StridedGemm {
    /// Batch items.
    pub batch: usize,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// The reduction.
    pub k: usize,
    /// Input 0.
    pub a: GemmOperand,
    /// Input 1.
    pub b: GemmOperand,
    /// The output.
    pub c: GemmOperand,
}

impl StridedGemm {
    /// The bound instance of `w` as a strided batched GEMM; an error for more than one
    /// batch axis (the epilogue and its inputs are the caller's to refuse or apply).
    pub fn of(w: &Workload, bound: &BoundWorkload) -> Result<StridedGemm> {
        let g = GemmView::of(w)?;
        if w.tensors().any(|t| t.panels.is_some()) {
            return Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: "a strided GEMM reads no tensor in panels (pre-packed weights)".into(),
            });
        }
        if g.batch.len() > 1 {
            return Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: "a strided batched GEMM has at most one batch axis".into(),
            });
        }
        let operand = |t: usize, [r, c]: [usize; 2]| GemmOperand {
            offset: bound.offsets[t],
            batch: g.batch.first().map_or(0, |&x| bound.axis_strides[t][x]),
            row: bound.axis_strides[t][r],
            col: bound.axis_strides[t][c],
        };
        let extent = |a: usize| bound.extents[a].max(0) as usize;
        Ok(StridedGemm {
            batch: g.batch.first().map_or(1, |&x| extent(x)),
            m: extent(g.m),
            n: extent(g.n),
            k: extent(g.k),
            a: operand(0, [g.m, g.k]),
            b: operand(1, [g.k, g.n]),
            c: operand(bound.shapes.len() - 1, [g.m, g.n]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_builtin_contractions() {
        let w = Workload::parse("batch_matmul_nn(B=2,M=T,N=64,K=T)").unwrap();
        assert_eq!(
            GemmView::of(&w).unwrap(),
            GemmView {
                batch: vec![0],
                m: 1,
                n: 2,
                k: 3
            }
        );
        // The output in another layout than `[.., M, N]`: M found further out.
        let w = Workload::parse("attention_context(B=1,H=12,M=T,N=64,K=T)").unwrap();
        assert_eq!(
            GemmView::of(&w).unwrap(),
            GemmView {
                batch: vec![0, 1],
                m: 2,
                n: 3,
                k: 4
            }
        );
        let w = Workload::parse("dense(M=T,N=64,K=T)").unwrap();
        assert_eq!(
            GemmView::of(&w).unwrap(),
            GemmView {
                batch: vec![],
                m: 0,
                n: 1,
                k: 2
            }
        );
    }
}
