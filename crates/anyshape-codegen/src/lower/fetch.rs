//! The fetch stage: copying blocks of the inputs into local buffers (packed panels on
//! CPU, shared memory on GPU), with the padding strategy's treatment of elements past
//! the tensor's edge: element by element ([`checked_copy`], for the GPU's shared
//! memory and the row sketches), or, for the CPU's packed panels, a whole edge block
//! zeroed and the rectangle of it inside the tensor copied (`Nest::pack`), or, where
//! the source's K axis is contiguous, tiles transposed in registers whose loads stop
//! at the edge and whose stores write the zeros (`Stmt::Transpose`). A bf16
//! contraction's A, and a B read in pairs, are packed as words of their pairs, rounded:
//! where the pairs are contiguous each row of the block is rounded into scratch `Rw`
//! (`Stmt::RoundPairs`) and transposed from there (`Packing::RoundedRows`), elsewhere
//! pair by pair as copied (`Value::PairBf16`).
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{for_, if_, let_, store, Cond, LoopKind, RoundPairs, Stmt, Transpose, Value};
use crate::padding::Fetch;
use anyshape_ir::{Expr, Precision};

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
        let panel = if which == 0 { c(0) } else { v("bofs") };
        let fetch = self.policy.fetch;
        // A padded fetch fills the block up to the unroll granularity.
        let kk_extent = if fetch.pads() { v("kp") } else { v("klen") };
        let block = Block {
            dst,
            rb,
            reg,
            origin,
            extent,
            panel: panel.clone(),
            kk_extent: kk_extent.clone(),
        };
        match self.packing(which, op) {
            Packing::Transposed => {
                let source = Source {
                    buf: op.buf,
                    at: v(&format!("base{which}")) + op.row(block.row(0)) + v("k0"),
                    stride: op.s_row.clone(),
                    rows_in: v(extent) - block.row(0),
                    ks_in: v("e_k") - v("k0"),
                };
                let tiles = self.transposed(&source, &block);
                return for_(rb, v(nblocks), LoopKind::Serial, tiles);
            }
            Packing::RoundedRows => {
                return for_(
                    rb,
                    v(nblocks),
                    LoopKind::Serial,
                    self.rounded_rows(op, which, &block),
                )
            }
            Packing::Elements => {}
        }
        let row = block.row(0) + v("rr");
        let src_idx =
            v(&format!("base{which}")) + op.row(row) + (v("k0") + v("kk")) * op.s_col.clone();
        let dst_idx = panel + v(rb) * c(mk.kc * reg) + v("kk") * c(reg) + v("rr");
        // In bf16, A's pairs rounded into words once here, not in every register tile
        // (and B's, where it is not in panels of words already: read in pairs).
        let rounded = self.w.precision == Precision::Bf16;
        let element = match rounded {
            true => Value::PairBf16 {
                buf: op.buf.into(),
                index: src_idx,
            },
            false => Value::load(op.buf, src_idx),
        };
        let copy = store(dst, dst_idx.clone(), element);
        // A copy writes the packed panel contiguously (register-tile rows innermost):
        // measured faster than walking a K-contiguous source, whose writes then stride
        // by `reg`. The rounding of bf16 pairs walks the source's rows instead, which
        // the compiler vectorizes: measured (Zen 5) 4.8x faster packing of BERT's A
        // blocks (11 x 384 pairs), a tenth of `dense_bf16`'s time at sequence 512.
        let nest = |rows: Expr, ks: Expr, copy: Stmt| match rounded {
            false => for_(
                "kk",
                ks,
                LoopKind::Serial,
                vec![for_("rr", rows, LoopKind::Serial, vec![copy])],
            ),
            true => for_(
                "rr",
                rows,
                LoopKind::Serial,
                vec![for_("kk", ks, LoopKind::Serial, vec![copy])],
            ),
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

    /// How operand `which` is packed: transposed in registers where its K axis is
    /// contiguous and each group of `lanes` rows fills more than half a vector —
    /// measured (Emerald Rapids class, batch_matmul_nt) 1.2-1.9x faster packing of
    /// 12-, 16-, 30- and 32-row blocks; slower than the element copy for 4 and 8 rows,
    /// which GCC vectorizes itself. In bf16 where its pairs are contiguous: each row's
    /// pairs rounded into words first (`Stmt::RoundPairs`), then transposed.
    pub(super) fn packing(&self, which: usize, op: &Operand) -> Packing {
        let (lanes, reg) = (self.lanes, [self.mk.mr, self.mk.nr][which]);
        if lanes == 1 || !(reg % lanes == 0 || 2 * (reg % lanes) > lanes) || op.panels.is_some() {
            return Packing::Elements;
        }
        let bf16 = self.w.precision == Precision::Bf16;
        match op.s_col.simplify().as_const() {
            Some(1) if !bf16 => Packing::Transposed,
            Some(2) if bf16 => Packing::RoundedRows,
            _ => Packing::Elements,
        }
    }

    /// The packing of register block `b.rb` in bf16 from a source whose pairs are
    /// contiguous: the block's rows inside the tensor rounded into the words of
    /// `Rw` (a row of `kc` words each; `Stmt::RoundPairs`: 16 words an instruction
    /// with AVX512_BF16), then transposed into the panel as [`Nest::transposed`]
    /// does, the rows and steps past the tensor's edge written as zeros. Measured
    /// (Zen 4, `dense_bf16(M=512,N=3072,K=768)`): the element-wise rounding stored
    /// word by word into the panel took 9 % of the kernel.
    fn rounded_rows(&self, op: &Operand, which: usize, b: &Block) -> Vec<Stmt> {
        let kc = self.mk.kc;
        let (rows, words) = match self.policy.fetch {
            Fetch::Unchecked => (c(b.reg), b.kk_extent.clone()),
            _ => (
                Expr::min(c(b.reg), v(b.extent) - b.row(0)),
                Expr::max(c(0), Expr::min(b.kk_extent.clone(), v("e_k") - v("k0"))),
            ),
        };
        let round = Stmt::RoundPairs(Box::new(RoundPairs {
            dst: ROUNDED_ROWS.into(),
            dst_index: v("rr") * c(kc),
            src: op.buf.into(),
            src_index: v(&format!("base{which}"))
                + op.row(b.row(0) + v("rr"))
                + v("k0") * op.s_col.clone(),
            words: v("pw"),
        }));
        let source = Source {
            buf: ROUNDED_ROWS,
            at: c(0),
            stride: c(kc),
            rows_in: v("pr"),
            ks_in: v("pw"),
        };
        let mut s = vec![
            let_("pr", rows),
            let_("pw", words),
            for_("rr", v("pr"), LoopKind::Serial, vec![round]),
        ];
        s.extend(self.transposed(&source, b));
        s
    }

    /// The packing of register block `b.rb` from a source whose K axis is contiguous:
    /// tiles of `lanes x lanes` transposed in registers (`Stmt::Transpose`), the
    /// block's rows in groups of `lanes` (the last may be narrower). Rows and
    /// reduction steps past the source's (`src.rows_in`, `src.ks_in`) are written as
    /// zeros where the policy checks (the transpose reads nothing past them);
    /// unchecked, the whole block is read.
    fn transposed(&self, src: &Source, b: &Block) -> Vec<Stmt> {
        let (mk, lanes) = (self.mk, self.lanes);
        let checked = self.policy.fetch != Fetch::Unchecked;
        let k = v("kq") * c(lanes);
        let steps = Expr::min(c(lanes), b.kk_extent.clone() - k.clone());
        let mut tiles = vec![];
        for g in 0..b.reg.div_ceil(lanes) {
            let width = (b.reg - g * lanes).min(lanes);
            let (rows, cols) = if checked {
                (
                    Expr::min(c(width), src.rows_in.clone() - c(g * lanes)),
                    Expr::min(steps.clone(), src.ks_in.clone() - k.clone()),
                )
            } else {
                (c(width), steps.clone())
            };
            tiles.push(Stmt::Transpose(Box::new(Transpose {
                dst: b.dst.into(),
                dst_index: b.panel.clone()
                    + v(b.rb) * c(mk.kc * b.reg)
                    + k.clone() * c(b.reg)
                    + c(g * lanes),
                dst_stride: c(b.reg),
                src: src.buf.into(),
                src_index: src.at.clone() + c(g * lanes) * src.stride.clone() + k.clone(),
                src_stride: src.stride.clone(),
                rows,
                cols,
                outs: steps.clone(),
                width,
            })));
        }
        let kqs = (b.kk_extent.clone() + c(lanes - 1)) / c(lanes);
        vec![for_("kq", kqs, LoopKind::Serial, tiles)]
    }
}

/// The scratch buffer (slot [`ROUNDED_ROWS_SLOT`]) of a register block's rows rounded
/// into words before they are transposed into the panel ([`Packing::RoundedRows`]).
pub(super) const ROUNDED_ROWS: &str = "Rw";
/// [`ROUNDED_ROWS`]'s scratch slot (the contraction's panels take 0 and 1, global
/// padding 2 to 4).
pub(super) const ROUNDED_ROWS_SLOT: u8 = 5;

/// How one operand's blocks are packed ([`Nest::packing`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Packing {
    /// Element by element (bf16: each pair rounded as it is copied).
    Elements,
    /// Tiles transposed in registers from the operand.
    Transposed,
    /// bf16: rows of pairs rounded into words, then transposed in registers.
    RoundedRows,
}

/// What a register block is transposed from: `buf[at + r * stride + k]` for the block's
/// row `r` and step `k` of the slice, of which `rows_in` rows and `ks_in` steps lie
/// inside the source.
struct Source {
    buf: &'static str,
    at: Expr,
    stride: Expr,
    rows_in: Expr,
    ks_in: Expr,
}

/// Where one register block of a packed panel goes, and the extents it is cut by.
struct Block {
    dst: &'static str,
    rb: &'static str,
    reg: usize,
    origin: &'static str,
    extent: &'static str,
    panel: Expr,
    kk_extent: Expr,
}

impl Block {
    /// The tensor row of the block's row `r`.
    fn row(&self, r: usize) -> Expr {
        v(self.origin) + v(self.rb) * c(self.reg) + c(r)
    }
}
