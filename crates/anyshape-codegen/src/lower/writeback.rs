//! The write-back stage of the CPU contraction sketch: a register tile stored into the
//! output (the first reduction tile) or added to it (the others), or stored once where
//! it ran over the whole reduction (`Nest::whole_k`); whole vectors with
//! vector stores where the output is contiguous, a vector that overhangs the output's
//! edge with a partial (masked) store of the columns inside, as the padding strategy's
//! policy says; element by element where the output is strided.
use super::compute::acc;
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{for_, if_, store, store_first, Cond, LoopKind, Stmt, Value};
use crate::padding::Compute;
use anyshape_ir::Expr;

impl Nest<'_> {
    /// Store a vector register tile of `rows` rows of `nv` vectors: checked where it
    /// may overhang the output (a policy with checked stores whose compute does not
    /// stay inside the output). A tile at the edge stores each row inside the output,
    /// each of its vectors inside the output whole, the others by their columns inside
    /// (a masked store; lane by lane into a strided output).
    pub(super) fn vector_store(&self, out: &Operand, rows: usize, nv: usize) -> Vec<Stmt> {
        let lanes = self.lanes;
        let out_idx = |i: usize, col: Expr| {
            v("base2") + (v("mi") + c(i)) * out.s_row.clone() + (v("nj") + col) * out.s_col.clone()
        };
        let contiguous = out.s_col.simplify().as_const() == Some(1);
        let vector_store = |i: usize, j: usize, accumulate: bool| -> Stmt {
            let reg = Value::reg(&acc(i, j), lanes);
            if contiguous {
                let idx = out_idx(i, c(j * lanes));
                let value = if accumulate {
                    Value::sum(Value::vload(out.buf, idx.clone(), lanes), reg)
                } else {
                    reg
                };
                store(out.buf, idx, value)
            } else {
                lane_store(
                    out,
                    out_idx(i, c(j * lanes) + v("l")),
                    &acc(i, j),
                    accumulate,
                    lanes,
                    None,
                )
            }
        };
        let full_store = |accumulate: bool| -> Vec<Stmt> {
            (0..rows)
                .flat_map(|i| (0..nv).map(move |j| (i, j)))
                .map(|(i, j)| vector_store(i, j, accumulate))
                .collect()
        };
        // A tile over the whole reduction is stored once.
        let by_kt = |f: &dyn Fn(bool) -> Vec<Stmt>| match self.whole_k {
            true => f(false),
            false => vec![Stmt::If {
                cond: Cond::Eq(v("kt"), c(0)),
                then: f(false),
                otherwise: f(true),
            }],
        };
        let full = by_kt(&full_store);
        let checked = self.policy.checked_store && self.policy.compute == Compute::Unchecked;
        if !checked {
            return full;
        }
        // The columns of vector `j` inside the output (clamped by the store).
        let inside = |j: usize| v("e_n") - v("nj") - c(j * lanes);
        let partial_store = |accumulate: bool| -> Vec<Stmt> {
            let mut st = Vec::new();
            for i in 0..rows {
                let mut row = Vec::new();
                for j in 0..nv {
                    let otherwise = if contiguous {
                        let idx = out_idx(i, c(j * lanes));
                        let reg = Value::reg(&acc(i, j), lanes);
                        let value = if accumulate {
                            let old = Value::vload_first(out.buf, idx.clone(), lanes, inside(j));
                            Value::sum(old, reg)
                        } else {
                            reg
                        };
                        store_first(out.buf, idx, value, inside(j))
                    } else {
                        let col_ok = Cond::Lt(v("nj") + c(j * lanes) + v("l"), v("e_n"));
                        lane_store(
                            out,
                            out_idx(i, c(j * lanes) + v("l")),
                            &acc(i, j),
                            accumulate,
                            lanes,
                            Some(col_ok),
                        )
                    };
                    row.push(Stmt::If {
                        cond: Cond::Le(v("nj") + c((j + 1) * lanes), v("e_n")),
                        then: vec![vector_store(i, j, accumulate)],
                        otherwise: vec![otherwise],
                    });
                }
                st.push(if_(Cond::Lt(v("mi") + c(i), v("e_m")), row));
            }
            st
        };
        vec![Stmt::If {
            cond: self.full_tile(nv * lanes),
            then: full,
            otherwise: by_kt(&partial_store),
        }]
    }

    /// Store the scalar accumulator array of a checked tile, element by element where
    /// it lies in the output.
    pub(super) fn checked_store(&self, out: &Operand) -> Stmt {
        let acc_idx = v("i") * c(self.mk.nr) + v("j");
        let out_idx = v("base2")
            + (v("mi") + v("i")) * out.s_row.clone()
            + (v("nj") + v("j")) * out.s_col.clone();
        let mut acc = Value::load("acc", acc_idx);
        if self.w.precision == anyshape_ir::Precision::I8 {
            acc = self.converted_element(acc);
        }
        let write = Value::Select(
            Cond::Eq(v("kt"), c(0)),
            Box::new(acc.clone()),
            Box::new(Value::sum(Value::load(out.buf, out_idx.clone()), acc)),
        );
        self.tile_loop(vec![if_(
            self.element_inside(),
            vec![store(out.buf, out_idx, write)],
        )])
    }
}

/// Store each lane of a vector register at `idx` (which uses loop var `l`), optionally
/// checked.
fn lane_store(
    out: &Operand,
    idx: Expr,
    reg: &str,
    accumulate: bool,
    lanes: usize,
    check: Option<Cond>,
) -> Stmt {
    let lane = Value::Lane(reg.into(), v("l"));
    let value = if accumulate {
        Value::sum(Value::load(out.buf, idx.clone()), lane)
    } else {
        lane
    };
    let st = store(out.buf, idx, value);
    let body = match check {
        Some(cond) => vec![if_(cond, vec![st])],
        None => vec![st],
    };
    for_("l", c(lanes), LoopKind::Serial, body)
}
