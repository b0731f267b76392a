//! Fused epilogues: a chain of elementwise ops applied to every output element of a
//! backbone (a contraction's sum, a softmax's probability) before it is written:
//! activations, a NaN guard, a scale, and — for contractions — operations with extra
//! inputs indexed by the output's axes (a bias broadcast along the last axis, a
//! residual shaped like the output, a mask).
//!
//! Each op is defined once here: its reference semantics ([`EpilogueOp::apply`], in
//! f64), its error bound ([`EpilogueOp::propagate`]) and its text form.
use serde::{Deserialize, Serialize};
use std::fmt;

/// A floating-point constant of an op, compared and hashed by its bits.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Scalar(pub f64);

impl PartialEq for Scalar {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Scalar {}
impl std::hash::Hash for Scalar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}

/// An elementwise function of one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unary {
    /// `max(x, 0)`.
    Relu,
    /// `tanh(x)`.
    Tanh,
    /// GELU, erf form: `x/2 · (1 + erf(x/√2))`.
    Gelu,
    /// GELU, tanh form: `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))`.
    GeluTanh,
    /// `0` where `x` is NaN, else `x` (what exporters write after a softmax whose rows
    /// may be fully masked: `Where(IsNaN(p), 0, p)`).
    NanToZero,
    /// SiLU (swish): `x · sigmoid(x)` = `x/2 · (1 + tanh(x/2))` (Llama's gated MLP).
    Silu,
}

/// An elementwise function of the value and an input's element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Binary {
    /// `x + y`.
    Add,
    /// `x · y`.
    Mul,
}

/// One op of an epilogue chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpilogueOp {
    /// A function of the value.
    Unary(Unary),
    /// The value times a constant.
    Scale(Scalar),
    /// The value combined with the element of workload input `input` at the same output
    /// point (the input's index map names some of the output's axes: broadcast along
    /// the others).
    With {
        /// The function.
        op: Binary,
        /// Index of the input among the workload's inputs.
        input: usize,
    },
}

impl Unary {
    /// The reference semantics.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Unary::Relu => x.max(0.0),
            Unary::Tanh => x.tanh(),
            Unary::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            Unary::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
            }
            Unary::NanToZero if x.is_nan() => 0.0,
            Unary::NanToZero => x,
            Unary::Silu => x / (1.0 + (-x).exp()),
        }
    }

    /// The largest slope of the function (how much an error in `x` can grow).
    fn lipschitz(self) -> f64 {
        match self {
            Unary::Relu | Unary::Tanh | Unary::NanToZero => 1.0,
            Unary::Gelu | Unary::GeluTanh => 1.13,
            Unary::Silu => 1.1,
        }
    }

    /// The absolute error of the generated code's evaluation beyond f32 rounding: erf
    /// and tanh are rational approximations there (`as_erf` < 5e-7, `as_tanh` < 4e-7),
    /// which GELU scales by `0.5·|x|` with `|x| ≤ 4` where it matters, and SiLU by
    /// `0.5·|x|` with `|x| ≤ 16` (past that tanh is ±1 in f32).
    fn approximation(self) -> f64 {
        match self {
            Unary::Relu | Unary::NanToZero => 0.0,
            Unary::Tanh => 4e-7,
            Unary::Gelu | Unary::GeluTanh => 1e-6,
            Unary::Silu => 4e-6,
        }
    }

    /// Its name in the text form.
    pub fn name(self) -> &'static str {
        match self {
            Unary::Relu => "relu",
            Unary::Tanh => "tanh",
            Unary::Gelu => "gelu",
            Unary::GeluTanh => "gelu_tanh",
            Unary::NanToZero => "nan_to_zero",
            Unary::Silu => "silu",
        }
    }

    /// Every unary op.
    pub const ALL: [Unary; 6] = [
        Unary::Relu,
        Unary::Tanh,
        Unary::Gelu,
        Unary::GeluTanh,
        Unary::NanToZero,
        Unary::Silu,
    ];
}

impl Binary {
    /// The reference semantics.
    pub fn apply(self, x: f64, y: f64) -> f64 {
        match self {
            Binary::Add => x + y,
            Binary::Mul => x * y,
        }
    }

    /// Its name in the text form.
    pub fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Mul => "mul",
        }
    }
}

impl EpilogueOp {
    /// The reference semantics on value `x`; `operand` is the element of the op's input
    /// at the same output point (unused by ops without an input).
    pub fn apply(self, x: f64, operand: f64) -> f64 {
        match self {
            EpilogueOp::Unary(u) => u.apply(x),
            EpilogueOp::Scale(s) => x * s.0,
            EpilogueOp::With { op, .. } => op.apply(x, operand),
        }
    }

    /// The error bound after the op, from the bound `before` on its argument, the
    /// result `y` and the operand: the argument's error through the op's slope, plus a
    /// few rounding errors of f32 evaluation.
    pub fn propagate(self, before: f64, y: f64, operand: f64) -> f64 {
        let eps = f32::EPSILON as f64;
        let rounding = 4.0 * eps * y.abs();
        match self {
            EpilogueOp::Unary(u) => {
                u.lipschitz() * before + rounding + eps * 1e-6 + u.approximation()
            }
            EpilogueOp::Scale(s) => s.0.abs() * before + rounding,
            EpilogueOp::With {
                op: Binary::Add, ..
            } => before + rounding,
            EpilogueOp::With {
                op: Binary::Mul, ..
            } => operand.abs() * before + rounding,
        }
    }

    /// The input this op reads, if any.
    pub fn input(self) -> Option<usize> {
        match self {
            EpilogueOp::With { input, .. } => Some(input),
            _ => None,
        }
    }
}

/// A chain of elementwise ops applied, in order, to each output element.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Epilogue(pub Vec<EpilogueOp>);

impl Epilogue {
    /// No epilogue: the output is the backbone's value.
    pub fn none() -> Epilogue {
        Epilogue(Vec::new())
    }

    /// Whether the chain is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The ops, in order.
    pub fn ops(&self) -> &[EpilogueOp] {
        &self.0
    }

    /// Apply the chain to `x` (reference semantics); `operand(input)` is the element of
    /// that input at the output point.
    pub fn apply(&self, x: f64, operand: &dyn Fn(usize) -> f64) -> f64 {
        self.0
            .iter()
            .fold(x, |v, op| op.apply(v, op.input().map_or(0.0, operand)))
    }

    /// The value and the error bound after the chain, from the backbone's value `x` and
    /// its bound.
    pub fn apply_with_bound(
        &self,
        x: f64,
        bound: f64,
        operand: &dyn Fn(usize) -> f64,
    ) -> (f64, f64) {
        self.0.iter().fold((x, bound), |(v, b), op| {
            let o = op.input().map_or(0.0, operand);
            let y = op.apply(v, o);
            (y, op.propagate(b, y, o))
        })
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_apply_in_order() {
        let e = Epilogue(vec![
            EpilogueOp::With {
                op: Binary::Add,
                input: 2,
            },
            EpilogueOp::Unary(Unary::Relu),
            EpilogueOp::Scale(Scalar(0.5)),
        ]);
        assert_eq!(e.apply(-3.0, &|i| if i == 2 { 1.0 } else { 0.0 }), 0.0);
        assert_eq!(e.apply(3.0, &|_| 1.0), 2.0);
        assert!((Unary::Gelu.apply(1.0) - 0.8413447460685429).abs() < 1e-14);
        assert!((Unary::GeluTanh.apply(1.0) - 0.8411919906082768).abs() < 1e-12);
    }
}
