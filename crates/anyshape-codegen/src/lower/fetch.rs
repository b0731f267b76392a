//! The fetch stage: copying blocks of the inputs into local buffers (packed panels on
//! CPU, shared memory on GPU), with the padding strategy's treatment of elements past
//! the tensor's edge: element by element ([`checked_copy`], for the GPU's shared
//! memory and the row sketches), or, for the CPU's packed panels, a whole edge block
//! zeroed and the rectangle of it inside the tensor copied (`Nest::pack`).
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{for_, if_, let_, store, Cond, LoopKind, Stmt, Value};
use crate::padding::Fetch;
use anyshape_ir::Expr;

/// The copy of one element that may lie outside its tensor (`valid` says where it
/// lies), as the fetch policy does it: unchecked, filled with the identity of the
/// reduction that reads it (`fill`: zero for a sum; local padding), or guarded
/// (skipped outside).
pub(crate) fn checked_copy(
    fetch: Fetch,
    valid: Cond,
    dst: &str,
    index: Expr,
    load: Value,
    fill: Value,
) -> Stmt {
    match fetch {
        Fetch::Unchecked => store(dst, index, load),
        Fetch::ZeroFill => store(
            dst,
            index,
            Value::Select(valid, Box::new(load), Box::new(fill)),
        ),
        Fetch::Guard => if_(valid, vec![store(dst, index, load)]),
    }
}

impl Nest<'_> {
    /// Pack the current `kt` slice of operand `which` (0: the M side into `Ap`, 1: the
    /// N side into `Bp`). Layout: register block `rb` holds `kc x reg` elements,
    /// `kk`-major.
    pub(super) fn pack(&self, which: usize, op: &Operand) -> Stmt {
        let mk = self.mk;
        let (dst, rb, nblocks, reg, origin, extent) = match which {
            0 => ("Ap", "ib", "nmb", mk.mr, "m0", "e_m"),
            _ => ("Bp", "jb", "nnb", mk.nr, "n0", "e_n"),
        };
        let row = v(origin) + v(rb) * c(reg) + v("rr");
        let src_idx =
            v(&format!("base{which}")) + op.row(row) + (v("k0") + v("kk")) * op.s_col.clone();
        let panel = if which == 0 { c(0) } else { v("bofs") };
        let dst_idx = panel + v(rb) * c(mk.kc * reg) + v("kk") * c(reg) + v("rr");
        let copy = store(dst, dst_idx.clone(), Value::load(op.buf, src_idx));
        let fetch = self.policy.fetch;
        // A padded fetch fills the block up to the unroll granularity.
        let kk_extent = if fetch.pads() { v("kp") } else { v("klen") };
        // Write the packed panel contiguously (register-tile rows innermost): measured
        // faster than walking a K-contiguous source, whose writes then stride by `reg`.
        let nest = |rows: Expr, ks: Expr, copy: Stmt| {
            for_(
                "kk",
                ks,
                LoopKind::Serial,
                vec![for_("rr", rows, LoopKind::Serial, vec![copy])],
            )
        };
        // Blocks wholly inside the tensor are copied as they are (so the compiler can
        // vectorize the copy). An edge block copies the rectangle of it inside the
        // tensor likewise, unchecked, after filling the block with zeros where the
        // policy pads (measured: a check and a select per element took half the time
        // of batch_matmul_nt at T = 9).
        let body = if fetch == Fetch::Unchecked {
            nest(c(reg), kk_extent, copy)
        } else {
            let inside = Cond::and(
                Cond::Le(v(origin) + v(rb) * c(reg) + c(reg), v(extent)),
                Cond::Le(v("k0") + kk_extent.clone(), v("e_k")),
            );
            let (rows_in, ks_in) = (format!("pr{which}"), format!("pk{which}"));
            let mut edge = vec![
                let_(
                    &rows_in,
                    Expr::min(c(reg), v(extent) - v(origin) - v(rb) * c(reg)),
                ),
                let_(
                    &ks_in,
                    Expr::max(c(0), Expr::min(kk_extent.clone(), v("e_k") - v("k0"))),
                ),
            ];
            if fetch == Fetch::ZeroFill {
                let zero = store(dst, dst_idx, Value::Zero { lanes: 1 });
                edge.push(nest(c(reg), kk_extent.clone(), zero));
            }
            edge.push(nest(v(&rows_in), v(&ks_in), copy.clone()));
            Stmt::If {
                cond: inside,
                then: vec![nest(c(reg), kk_extent, copy)],
                otherwise: edge,
            }
        };
        for_(rb, v(nblocks), LoopKind::Serial, vec![body])
    }
}
