//! The fetch stage: copying blocks of the inputs into local buffers (packed panels on
//! CPU, shared memory on GPU), with the padding strategy's treatment of elements past
//! the tensor's edge ([`checked_copy`], shared by every device).
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{for_, if_, store, Cond, LoopKind, Stmt, Value};
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
        let src_idx = v(&format!("base{which}"))
            + op.row(row.clone())
            + (v("k0") + v("kk")) * op.s_col.clone();
        let panel = if which == 0 { c(0) } else { v("bofs") };
        let dst_idx = panel + v(rb) * c(mk.kc * reg) + v("kk") * c(reg) + v("rr");
        let load = Value::load(op.buf, src_idx);
        let valid = Cond::and(
            Cond::Lt(row, v(extent)),
            Cond::Lt(v("k0") + v("kk"), v("e_k")),
        );
        let fetch = self.policy.fetch;
        // A padded fetch fills the block up to the unroll granularity.
        let kk_extent = if fetch.pads() { v("kp") } else { v("klen") };
        let zero = Value::Zero { lanes: 1 };
        let unchecked = checked_copy(
            Fetch::Unchecked,
            valid.clone(),
            dst,
            dst_idx.clone(),
            load.clone(),
            zero.clone(),
        );
        let checked = checked_copy(fetch, valid, dst, dst_idx, load, zero);
        // Write the packed panel contiguously (register-tile rows innermost): measured
        // faster than walking a K-contiguous source, whose writes then stride by `reg`.
        let nest = |copy: Stmt| {
            for_(
                "kk",
                kk_extent.clone(),
                LoopKind::Serial,
                vec![for_("rr", c(reg), LoopKind::Serial, vec![copy])],
            )
        };
        // Blocks wholly inside the tensor are copied without checks (so the compiler can
        // vectorize the copy); only edge blocks check each element.
        let body = if fetch == Fetch::Unchecked {
            nest(unchecked)
        } else {
            let inside = Cond::and(
                Cond::Le(v(origin) + v(rb) * c(reg) + c(reg), v(extent)),
                Cond::Le(v("k0") + kk_extent.clone(), v("e_k")),
            );
            Stmt::If {
                cond: inside,
                then: vec![nest(unchecked)],
                otherwise: vec![nest(checked)],
            }
        };
        for_(rb, v(nblocks), LoopKind::Serial, vec![body])
    }
}
