//! Workloads: an operator of some class over symbolic axes, its tensors with affine
//! index maps and a fused epilogue, their invariants and measures (flops, bytes);
//! binding one to an instance is `bound.rs`'s.
//!
//! Invariants of a [`Workload`] (checked by [`Workload::validate`]):
//! - every index term names an existing axis; every tensor's index map has one entry
//!   per dimension of its shape;
//! - the output is indexed by spatial axes only, each spatial axis exactly once, with
//!   coefficient 1 and offset 0;
//! - the class's operands come first among the inputs ([`OpClass::operands`]); every
//!   further input is an epilogue operand, read by exactly one epilogue op and indexed
//!   by spatial axes only, each at most once, with coefficient 1 and offset 0;
//! - a normalization normalizes along a spatial axis, the output's last, and its
//!   operand is indexed like the output;
//! - a `bf16` contraction ([`Precision::Bf16`]) has one reduction axis, over pairs: its
//!   first operand's last dimension, contiguous, twice the axis's constant extent and
//!   read at twice its index; its second operand in panels of words, or read in pairs
//!   as the first.
//! - an `i8` contraction ([`Precision::I8`]) likewise over quads (four times the
//!   extent, read at four times the index), its second operand in panels of words.
use crate::{BoundWorkload, DType, Epilogue, Expr, IrError, Precision, Result, Scalar};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Whether an axis indexes the output (spatial) or is summed over (reduction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AxisKind {
    /// Indexes the output.
    Spatial,
    /// Summed over.
    Reduction,
}

/// A loop axis of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Axis {
    /// Its name, e.g. `m`.
    pub name: String,
    /// Its extent, an expression over shape vars.
    pub extent: Expr,
    /// Spatial or reduction.
    pub kind: AxisKind,
}

/// One dimension's index: `sum(coeff * axis) + offset`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AffineIndex {
    /// `(axis position, coefficient)` pairs.
    pub terms: Vec<(usize, i64)>,
    /// Constant offset.
    pub offset: i64,
}

impl AffineIndex {
    /// The index `axis`.
    pub fn axis(axis: usize) -> AffineIndex {
        AffineIndex {
            terms: vec![(axis, 1)],
            offset: 0,
        }
    }

    /// The coefficient of `axis` (0 when absent).
    pub fn coeff(&self, axis: usize) -> i64 {
        self.terms.iter().filter(|t| t.0 == axis).map(|t| t.1).sum()
    }

    /// The axis, if this index is a plain axis (coefficient 1, offset 0).
    pub fn plain_axis(&self) -> Option<usize> {
        match self.terms.as_slice() {
            [(a, 1)] if self.offset == 0 => Some(*a),
            _ => None,
        }
    }
}

/// A tensor operand: its shape and how the axes index it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorRef {
    /// Its name, e.g. `X`.
    pub name: String,
    /// Its shape, row-major (last dimension contiguous).
    pub shape: Vec<Expr>,
    /// One affine index per dimension.
    pub index: Vec<AffineIndex>,
    /// Stored in panels (pre-packed weights): a 2-D tensor `[R, C]` whose rows are
    /// grouped by this many, each group stored column by column, so element `(r, c)`
    /// lies at `(r / w)·w·C + c·w + r % w` and the rows are padded to a multiple of `w`
    /// (the padding is zero); or a 3-D `[B, R, C]`, each of its `B` matrices so, one
    /// after another (`⌈R/w⌉·w·C` apart). `None`: row-major.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub panels: Option<i64>,
}

impl TensorRef {
    /// A tensor whose dimensions are the plain `axes` (with their extents).
    pub fn over(name: &str, axes: &[Axis], which: &[usize]) -> TensorRef {
        TensorRef {
            name: name.into(),
            shape: which.iter().map(|&a| axes[a].extent.clone()).collect(),
            index: which.iter().map(|&a| AffineIndex::axis(a)).collect(),
            panels: None,
        }
    }

    /// Strides of each dimension, in elements: row-major, or for a tensor in panels
    /// those inside one panel (`1` along the rows, the panel width along the columns;
    /// a row's panel is [`TensorRef::panel_stride`] apart), a batch's matrices whole
    /// panels apart.
    pub fn strides(&self) -> Vec<Expr> {
        if let Some(w) = self.panels {
            let inside = [Expr::Const(1), Expr::Const(w)];
            return match self.shape.as_slice() {
                [_, rows, cols] => {
                    let matrix = Expr::round_up(rows.clone(), w) * cols.clone();
                    [vec![matrix], inside.to_vec()].concat()
                }
                _ => inside.to_vec(),
            };
        }
        let mut strides = vec![Expr::Const(1); self.shape.len()];
        for d in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[d] = &strides[d + 1] * &self.shape[d + 1];
        }
        strides
    }

    /// The dimensions it is stored in: its shape, or for a tensor in panels `[⌈R/w⌉, C,
    /// w]` (`[B, ⌈R/w⌉, C, w]` for a batch).
    pub fn stored_shape(&self) -> Vec<Expr> {
        match self.panels {
            Some(w) if self.shape.len() >= 2 => {
                let (batch, matrix) = self.shape.split_at(self.shape.len() - 2);
                let panels = Expr::ceil_div(matrix[0].clone(), Expr::Const(w));
                [batch, &[panels, matrix[1].clone(), Expr::Const(w)]].concat()
            }
            _ => self.shape.clone(),
        }
    }

    /// For a tensor in panels: the elements from one panel to the next (`w·C`).
    pub fn panel_stride(&self) -> Option<Expr> {
        let w = self.panels?;
        Some(self.shape.last()? * &Expr::Const(w))
    }

    /// How far one step along `axis` moves in memory, in elements (inside a panel for a
    /// tensor in panels).
    pub fn axis_stride(&self, axis: usize) -> Expr {
        self.strides()
            .into_iter()
            .zip(&self.index)
            .fold(Expr::Const(0), |acc, (s, ix)| acc + s * ix.coeff(axis))
    }

    /// The element offset of the point where every axis is 0.
    pub fn base_offset(&self) -> Expr {
        self.strides()
            .into_iter()
            .zip(&self.index)
            .fold(Expr::Const(0), |acc, (s, ix)| acc + s * ix.offset)
    }

    /// Whether the tensor is indexed by `axis`.
    pub fn uses_axis(&self, axis: usize) -> bool {
        self.index.iter().any(|ix| ix.coeff(axis) != 0)
    }

    /// The plain axes indexing each dimension, if every dimension is one.
    pub fn plain_axes(&self) -> Option<Vec<usize>> {
        self.index.iter().map(AffineIndex::plain_axis).collect()
    }
}

/// What a row-wise normalization computes along its axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalization {
    /// `y = exp(x - max) / Σ exp(x - max)` along the axis.
    Softmax,
    /// `y = (x - mean) / √(var + epsilon)` along the axis (the variance without
    /// Bessel's correction): ONNX's `LayerNormalization` before its scale and bias,
    /// which are epilogue inputs along the axis.
    LayerNorm {
        /// Added to the variance.
        epsilon: Scalar,
    },
    /// `y = x / √(mean(x²) + epsilon)` along the axis: RMSNorm (Llama's) before its
    /// scale, an epilogue input along the axis.
    RmsNorm {
        /// Added to the mean square.
        epsilon: Scalar,
    },
}

impl Normalization {
    /// The constant added under the square root, for the kinds that have one.
    pub fn epsilon(self) -> Option<f64> {
        match self {
            Normalization::Softmax => None,
            Normalization::LayerNorm { epsilon } | Normalization::RmsNorm { epsilon } => {
                Some(epsilon.0)
            }
        }
    }
}

/// The class of an operator: what its axes and tensors mean, which sketch serves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// `output[spatial] = epilogue(Σ over the reduction axes of input0 · input1)`: dense
    /// layers, batched matmuls (any number of batch axes, broadcast along any of them,
    /// transposes as strides), convolutions as implicit GEMM.
    Contraction,
    /// A function of each row of the operand along one spatial axis (the output's
    /// last), the same shape out as in: softmax, layer norm, RMSNorm.
    Normalization {
        /// What it computes.
        kind: Normalization,
        /// The axis it normalizes along.
        axis: usize,
    },
    /// Multi-head attention in one kernel: `Y[b,m,h,d] = Σ_n P[b,h,m,n] · V[b,n,h,d]`
    /// with `P` the softmax along `n` of `scale · Σ_d Q[b,m,h,d] · K[b,n,h,d]` (plus
    /// `mask[b,m,n]` where masked), queries, keys, values and output in the
    /// projections' `[batch, sequence, heads, dim]`; the scores never leave the
    /// kernel.
    Attention(AttentionSpec),
}

/// What a fused attention computes besides its two products (see
/// [`OpClass::Attention`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttentionSpec {
    /// The scores' constant factor.
    pub scale: Scalar,
    /// Whether an additive mask `[batch, sequence, sequence]` is the fourth operand.
    pub masked: bool,
    /// Whether probabilities that are not numbers count as 0 (a row whose scores are
    /// all -inf, or hold a NaN, gives zeros instead of NaN): a softmax followed by
    /// `nan_to_zero`, as the exporters write scaled dot-product attention.
    pub nan_to_zero: bool,
}

impl OpClass {
    /// How many leading inputs are the class's operands (the rest feed the epilogue).
    pub fn operands(self) -> usize {
        match self {
            OpClass::Contraction => 2,
            OpClass::Normalization { .. } => 1,
            OpClass::Attention(a) => 3 + usize::from(a.masked),
        }
    }

    /// The class's name, as sketches are named.
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Contraction => "contraction",
            OpClass::Normalization { .. } => "normalization",
            OpClass::Attention(_) => "attention",
        }
    }
}

/// A tensor operator over shape vars: its class, axes and tensors, and the epilogue
/// applied to each output element.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Workload {
    /// Operator name in the registry, e.g. `dense`.
    pub op: String,
    /// Named arguments it was built from, for display (`M=16*T`).
    pub args: Vec<(String, Expr)>,
    /// Element type.
    pub dtype: DType,
    /// What a contraction multiplies in (`f32` unless the operator says otherwise).
    #[serde(default, skip_serializing_if = "Precision::is_f32")]
    pub precision: Precision,
    /// What the operator computes.
    pub class: OpClass,
    /// The loop axes.
    pub axes: Vec<Axis>,
    /// Input tensors: the class's operands, then the epilogue's.
    pub inputs: Vec<TensorRef>,
    /// The output tensor.
    pub output: TensorRef,
    /// Elementwise ops on each output element.
    pub epilogue: Epilogue,
}

impl Workload {
    /// The class's operands (the leading inputs).
    pub fn operands(&self) -> &[TensorRef] {
        &self.inputs[..self.class.operands().min(self.inputs.len())]
    }

    /// The spatial axes in the order they index the output.
    pub fn output_axes(&self) -> Vec<usize> {
        self.output
            .index
            .iter()
            .filter_map(AffineIndex::plain_axis)
            .collect()
    }

    /// Check the invariants listed in the module doc.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(IrError::InvalidWorkload(m));
        if self.dtype != DType::F32 {
            return bad(format!(
                "its tensors are {}: the kernels anyshape generates compute in f32",
                self.dtype
            ));
        }
        for t in self.inputs.iter().chain([&self.output]) {
            if t.index.len() != t.shape.len() {
                return bad(format!(
                    "tensor {} has {} dims but {} indices",
                    t.name,
                    t.shape.len(),
                    t.index.len()
                ));
            }
            if t.index
                .iter()
                .flat_map(|ix| &ix.terms)
                .any(|&(a, _)| a >= self.axes.len())
            {
                return bad(format!(
                    "tensor {} names an axis that does not exist",
                    t.name
                ));
            }
        }
        for t in self.inputs.iter().chain([&self.output]) {
            if let Some(w) = t.panels {
                let rank = t.shape.len();
                if w < 1 || !(2..=3).contains(&rank) || t.index[rank - 2].plain_axis().is_none() {
                    return bad(format!(
                        "tensor {} in panels of {w} rows must be 2-D (or a batch of 2-D), its rows a plain axis, the width at least 1",
                        t.name
                    ));
                }
            }
        }
        let spatial = |a: usize| self.axes[a].kind == AxisKind::Spatial;
        let mut seen = BTreeSet::new();
        for ix in &self.output.index {
            match ix.plain_axis() {
                Some(a) if spatial(a) && seen.insert(a) => {}
                _ => return bad("output indices must be distinct spatial axes".into()),
            }
        }
        if seen.len() != (0..self.axes.len()).filter(|&a| spatial(a)).count() {
            return bad("every spatial axis must index the output".into());
        }
        let operands = self.class.operands();
        if self.inputs.len() < operands {
            return bad(format!("a {} takes {operands} operands", self.class.name()));
        }
        for (i, t) in self.inputs.iter().enumerate().skip(operands) {
            let readers = self
                .epilogue
                .ops()
                .iter()
                .filter(|op| op.input() == Some(i))
                .count();
            let axes = t.plain_axes().unwrap_or_default();
            let distinct: BTreeSet<usize> = axes.iter().copied().collect();
            if readers != 1
                || axes.len() != t.index.len()
                || distinct.len() != axes.len()
                || !axes.iter().all(|&a| spatial(a))
            {
                return bad(format!(
                    "input {} must be read by one epilogue op and indexed by distinct output axes",
                    t.name
                ));
            }
        }
        if let Some(op) = self.epilogue.ops().iter().find(|op| {
            op.input()
                .is_some_and(|i| i < operands || i >= self.inputs.len())
        }) {
            return bad(format!("epilogue op {op:?} reads no epilogue input"));
        }
        // A bf16 attention rounds its operands as its sketch multiplies them: no
        // layout invariant.
        if !self.precision.is_f32() && !matches!(self.class, OpClass::Attention(_)) {
            self.validate_groups()?;
        }
        if let OpClass::Attention(a) = self.class {
            if !self.epilogue.ops().is_empty() || self.inputs.len() != self.class.operands() {
                return bad("an attention takes no epilogue".into());
            }
            if !a.scale.0.is_finite() {
                return bad(format!("scale={}: the scale must be finite", a.scale.0));
            }
        }
        if let OpClass::Normalization { axis, .. } = self.class {
            let last = self.output_axes().last().copied();
            if last != Some(axis) || self.inputs[0].index != self.output.index {
                return bad(
                    "a normalization runs along the output's last axis, its operand indexed like the output"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// The invariant of a `bf16` or `i8` contraction (see the module doc): its
    /// reduction over groups of [`Precision::group`] elements.
    fn validate_groups(&self) -> Result<()> {
        let bad = |m: String| Err(IrError::InvalidWorkload(m));
        let (p, g) = (self.precision, self.precision.group());
        let reductions: Vec<usize> = (0..self.axes.len())
            .filter(|&a| self.axes[a].kind == AxisKind::Reduction)
            .collect();
        let (x, w) = (&self.inputs[0], &self.inputs[1]);
        let [k] = reductions[..] else {
            return bad(format!("a {p} contraction has exactly one reduction axis"));
        };
        let groups = self.axes[k].extent.as_const();
        // Read in groups: the last dimension `g` times the reduction's constant extent,
        // indexed by the reduction alone at `g` times its index.
        let in_groups = |t: &TensorRef| {
            let last = t.index.len().saturating_sub(1);
            t.panels.is_none()
                && t.index.last().map(|ix| ix.terms.as_slice()) == Some(&[(k, g)][..])
                && t.index.iter().take(last).all(|ix| ix.coeff(k) == 0)
                && groups.is_some_and(|n| t.shape.last() == Some(&Expr::Const(g * n)))
        };
        // Only bf16 rounds a second operand as it reads it; i8 weights are quantized
        // once, by the model.
        let ok = self.class == OpClass::Contraction
            && in_groups(x)
            && (w.panels.is_some() || (p == Precision::Bf16 && in_groups(w)));
        if !ok {
            let (what, how) = match p {
                Precision::I8 => ("quads", "a multiple of 4"),
                _ => ("pairs", "an even constant"),
            };
            return bad(format!(
                "a {p} contraction multiplies {what}: {}'s last dimension must be {how}, \
                 {g} times the reduction's extent, and {} in panels of words{}",
                x.name,
                w.name,
                match p {
                    Precision::Bf16 => " or read in pairs likewise",
                    _ => "",
                }
            ));
        }
        Ok(())
    }

    /// The shape vars this workload mentions, sorted by name (the order kernels take them in).
    pub fn shape_vars(&self) -> Vec<String> {
        let exprs = self.axes.iter().map(|a| &a.extent).chain(
            self.inputs
                .iter()
                .chain([&self.output])
                .flat_map(|t| &t.shape),
        );
        exprs
            .flat_map(Expr::vars)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// All tensors: inputs, then the output.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorRef> {
        self.inputs.iter().chain([&self.output])
    }

    /// Useful floating-point operations of an instance: a multiply and an add per point
    /// of a contraction; five per element of a softmax (max, subtract, exp, sum,
    /// divide), six of a layer norm (sum; subtract, square, sum; subtract, multiply),
    /// three of an RMSNorm (square, sum, multiply); an attention's two products (a
    /// multiply and an add per point each) and a softmax over its scores; one per
    /// epilogue op and output element.
    pub fn flops(&self, bound: &BoundWorkload) -> f64 {
        let points: f64 = bound.extents.iter().map(|&e| e as f64).product();
        let out = *bound.lens.last().unwrap_or(&0) as f64;
        let core = match self.class {
            // A bf16 (i8) contraction's reduction counts pairs (quads).
            OpClass::Contraction => 2.0 * self.precision.group() as f64 * points,
            OpClass::Normalization { kind, .. } => {
                points
                    * match kind {
                        Normalization::Softmax => 5.0,
                        Normalization::LayerNorm { .. } => 6.0,
                        Normalization::RmsNorm { .. } => 3.0,
                    }
            }
            OpClass::Attention(_) => {
                // The points are (b, h, [g,] m, d, n); the scores the same but d.
                let dim = crate::AttentionAxes::of(self)
                    .and_then(|a| bound.extents.get(a.d).copied())
                    .unwrap_or(1)
                    .max(1) as f64;
                4.0 * points + 5.0 * points / dim
            }
        };
        core + self.epilogue.ops().len() as f64 * out
    }

    /// Bytes every instance must move at least: each tensor read or written once.
    pub fn bytes(&self, bound: &BoundWorkload) -> f64 {
        bound.lens.iter().map(|&n| n as f64).sum::<f64>() * self.dtype.size_bytes() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epilogue_inputs_are_checked() {
        let mut w = Workload::parse("dense(M=T,N=8,K=4)+bias").unwrap();
        assert_eq!(w.inputs.len(), 3);
        w.validate().unwrap();
        w.epilogue.0.clear();
        assert!(w.validate().is_err(), "an input no op reads");
    }
}
