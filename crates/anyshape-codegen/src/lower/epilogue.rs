//! The fused epilogue: its chain as a loop-IR value (for every sketch and device), and
//! in the CPU contraction sketch each op of the workload's chain on
//! every output element, once its sum is complete (after the last reduction tile, over
//! the task's output tile; or while global padding copies the output back). Ops with an
//! input read it at the same output point through its own strides (broadcast where its
//! stride along an axis is 0).
use super::contraction::Nest;
use super::{renamed, v};
use crate::loop_ir::{for_, let_, store, BinaryOp, LoopKind, Stmt, UnaryOp, Value};
use anyshape_ir::{Epilogue, EpilogueOp, Expr};

/// The value of `epilogue` applied to `x` (every sketch on every device lowers its
/// chain so); `at(t)` is the element index of input `t` at the same output point.
pub(super) fn chain_value(epilogue: &Epilogue, x: Value, at: &dyn Fn(usize) -> Expr) -> Value {
    chain_with(epilogue, x, &|t| Value::load(&format!("in{t}"), at(t)))
}

/// The value of `epilogue` applied to `x`, where `input(t)` is the value of input `t`
/// at the same output point (or points: a vector of them).
pub(super) fn chain_with(epilogue: &Epilogue, x: Value, input: &dyn Fn(usize) -> Value) -> Value {
    epilogue.ops().iter().fold(x, |value, op| match *op {
        EpilogueOp::Unary(u) => Value::unary(UnaryOp::from(u), value),
        EpilogueOp::Scale(s) => Value::binary(
            BinaryOp::Mul,
            value,
            Value::Const {
                value: s.0,
                lanes: 1,
            },
        ),
        EpilogueOp::With { op, input: t } => Value::binary(BinaryOp::from(op), value, input(t)),
    })
}

impl Nest<'_> {
    /// The epilogue inputs (their indices among the workload's inputs).
    pub(super) fn epilogue_inputs(&self) -> impl Iterator<Item = usize> + '_ {
        self.w.class.operands()..self.w.inputs.len()
    }

    /// The stride of tensor `t` (an index among inputs then output) along `axis`: a name
    /// for an epilogue input, a constant where it is one.
    pub(super) fn tensor_stride(&self, t: usize, axis: usize) -> Expr {
        let tensor = self.w.tensors().nth(t).expect("a tensor of the workload");
        let e = renamed(&tensor.axis_stride(axis));
        if e.as_const().is_some() {
            e
        } else {
            let which = if axis == self.g.m { "m" } else { "n" };
            v(&format!("se{t}_{which}"))
        }
    }

    /// Let-statements naming the epilogue inputs' strides along M and N.
    pub(super) fn epilogue_strides(&self) -> Vec<Stmt> {
        let mut s = Vec::new();
        for t in self.epilogue_inputs() {
            for (which, axis) in [("m", self.g.m), ("n", self.g.n)] {
                let e = renamed(&self.w.inputs[t].axis_stride(axis));
                s.push(let_(&format!("se{t}_{which}"), e));
            }
        }
        s
    }

    /// Let-statements naming the epilogue inputs' base offsets, from every tensor's
    /// (as [`Nest::batch_bases`] gives them).
    pub(super) fn epilogue_bases(&self, bases: &[Expr]) -> Vec<Stmt> {
        self.epilogue_inputs()
            .map(|t| let_(&format!("ebase{t}"), bases[t].clone()))
            .collect()
    }

    /// The value of the epilogue chain on `x`; `at(t)` is the element index of input
    /// `t` at the same output point.
    pub(super) fn epilogue_value(&self, x: Value, at: &dyn Fn(usize) -> Expr) -> Value {
        chain_value(&self.w.epilogue, x, at)
    }

    /// The epilogue over the valid part of the task's output tile, the inner loop along
    /// the output's contiguous axis (N, or M in the transposed variant).
    pub(super) fn epilogue_tile(&self) -> Stmt {
        let (m, n) = (v("m0") + v("i"), v("n0") + v("j"));
        let idx = v("base2") + m.clone() * v("sc_m") + n.clone() * v("sc_n");
        let value = self.epilogue_value(Value::load("out0", idx.clone()), &|t| {
            v(&format!("ebase{t}"))
                + m.clone() * self.tensor_stride(t, self.g.m)
                + n.clone() * self.tensor_stride(t, self.g.n)
        });
        let m_contiguous = renamed(&self.w.output.axis_stride(self.g.m))
            .simplify()
            .as_const()
            == Some(1);
        let (outer, inner) = if m_contiguous {
            (("j", "nlen"), ("i", "mlen"))
        } else {
            (("i", "mlen"), ("j", "nlen"))
        };
        for_(
            outer.0,
            v(outer.1),
            LoopKind::Serial,
            vec![for_(
                inner.0,
                v(inner.1),
                LoopKind::Serial,
                vec![store("out0", idx, value)],
            )],
        )
    }
}
