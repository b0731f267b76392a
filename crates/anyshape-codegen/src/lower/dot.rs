//! The dot variant of the CPU contraction sketch (`dot=1`): a task's body when the
//! reduction is the vector axis.
//! ```text
//! for kt in tiles_k:
//!   pack the rows of an operand whose K axis is not contiguous (K-major)  (only those)
//!   for each register tile (mr rows x nr columns):
//!     row offsets, clamped to the last row (edge tiles read real rows, never past)
//!     mr x nr vector accumulators over K in vectors, then the K tail element by element
//!     each sum across its lanes, stored (kt == 0) or added; edge tiles checked
//! ```
//! Operands whose K axis is contiguous are read in place: nothing is packed for a dense
//! layer's weights, whose elements a small M uses once. Tiles that overhang the output
//! read clamped rows and store only what lies inside, so the padding strategies differ
//! here only in global padding's copies (whose padded buffers are contiguous along K).
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{for_, if_, let_, store, BinaryOp, Cond, LoopKind, Scope, Stmt, Value};
use anyshape_ir::Expr;

/// How the tile reads one operand: row `r` starts, at the current reduction tile, at
/// element `offset + r * stride` of `buf` (its K axis contiguous).
struct Rows {
    buf: &'static str,
    offset: Expr,
    stride: Expr,
}

impl Rows {
    fn start(&self, r: Expr) -> Expr {
        self.offset.clone() + r * self.stride.clone()
    }
}

impl Nest<'_> {
    /// The task body of the dot variant (after the task's tile lets).
    pub(super) fn dot_task_body(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let mk = self.mk;
        let mut body = Vec::new();
        let mut kt_body = vec![
            let_("k0", v("kt") * c(mk.kc)),
            let_(
                "klen",
                Expr::max(Expr::Const(0), Expr::min(c(mk.kc), v("p_k") - v("k0"))),
            ),
        ];
        let mut rows = Vec::new();
        for (which, op) in ops[..2].iter().enumerate() {
            let (origin, len, tile) = match which {
                0 => ("m0", "mlen", mk.mc),
                _ => ("n0", "nlen", mk.nc),
            };
            if op.s_col.simplify().as_const() == Some(1) {
                rows.push(Rows {
                    buf: op.buf,
                    offset: v(&format!("base{which}")) + v("k0"),
                    stride: op.s_row.clone(),
                });
            } else {
                let dst = ["Ap", "Bp"][which];
                body.push(Stmt::Alloc {
                    buf: dst.into(),
                    len: c(tile * mk.kc),
                    scope: Scope::Scratch(which as u8),
                });
                kt_body.push(self.pack_k_major(which, dst, op, origin, len));
                rows.push(Rows {
                    buf: dst,
                    offset: v(origin) * Expr::Const(-(mk.kc as i64)),
                    stride: c(mk.kc),
                });
            }
        }
        let tile = self.dot_tile(&rows, &ops[2]);
        kt_body.push(self.register_tiles(tile));
        body.push(for_("kt", v("tiles_k"), LoopKind::Serial, kt_body));
        body
    }

    /// Copy the task's `len` rows of operand `which` (`op`, from `origin`) at the
    /// current reduction tile into `dst`, each row's `klen` elements contiguous (rows
    /// `kc` apart); the loop order follows whichever of the source's axes is contiguous.
    fn pack_k_major(&self, which: usize, dst: &str, op: &Operand, origin: &str, len: &str) -> Stmt {
        let src = v(&format!("base{which}"))
            + op.row(v(origin) + v("r"))
            + (v("k0") + v("kk")) * op.s_col.clone();
        let copy = store(
            dst,
            v("r") * c(self.mk.kc) + v("kk"),
            Value::load(op.buf, src),
        );
        let (outer, inner) = if op.s_row.simplify().as_const() == Some(1) {
            (("kk", v("klen")), ("r", v(len)))
        } else {
            (("r", v(len)), ("kk", v("klen")))
        };
        for_(
            outer.0,
            outer.1,
            LoopKind::Serial,
            vec![for_(inner.0, inner.1, LoopKind::Serial, vec![copy])],
        )
    }

    /// One `mr x nr` register tile at (`mi`, `nj`) over the current reduction tile.
    fn dot_tile(&self, rows: &[Rows], out: &Operand) -> Vec<Stmt> {
        let mk = self.mk;
        let lanes = self.lanes;
        let (a, b) = (&rows[0], &rows[1]);
        let mut s = vec![
            let_("mi", v("m0") + v("ib") * c(mk.mr)),
            let_("nj", v("n0") + v("jb") * c(mk.nr)),
        ];
        for i in 0..mk.mr {
            let row = Expr::min(v("mi") + c(i), v("p_m") - c(1));
            s.push(let_(&format!("pa{i}"), a.start(row)));
        }
        for j in 0..mk.nr {
            let row = Expr::min(v("nj") + c(j), v("p_n") - c(1));
            s.push(let_(&format!("pb{j}"), b.start(row)));
        }
        let acc = |i: usize, j: usize| format!("dacc_{i}_{j}");
        let tail = |i: usize, j: usize| format!("dtail_{i}_{j}");
        for i in 0..mk.mr {
            for j in 0..mk.nr {
                s.push(Stmt::Reg {
                    name: acc(i, j),
                    lanes,
                    init: Value::Zero { lanes },
                });
                s.push(Stmt::Reg {
                    name: tail(i, j),
                    lanes: 1,
                    init: Value::Zero { lanes: 1 },
                });
            }
        }
        // Whole vectors of the reduction tile, then its tail element by element.
        let mut step = Vec::new();
        let at = |p: String, k: Expr| v(&p) + k;
        for j in 0..mk.nr {
            step.push(Stmt::Reg {
                name: format!("db_{j}"),
                lanes,
                init: Value::vload(b.buf, at(format!("pb{j}"), v("kv") * c(lanes)), lanes),
            });
        }
        for i in 0..mk.mr {
            step.push(Stmt::Reg {
                name: format!("da_{i}"),
                lanes,
                init: Value::vload(a.buf, at(format!("pa{i}"), v("kv") * c(lanes)), lanes),
            });
            for j in 0..mk.nr {
                step.push(Stmt::Assign {
                    reg: acc(i, j),
                    value: Value::Fma(
                        Box::new(Value::reg(&format!("da_{i}"), lanes)),
                        Box::new(Value::reg(&format!("db_{j}"), lanes)),
                        Box::new(Value::reg(&acc(i, j), lanes)),
                    ),
                });
            }
        }
        s.push(for_(
            "kv",
            v("klen") / c(lanes),
            LoopKind::Unrolled(mk.uk),
            step,
        ));
        let mut rest = vec![let_("kk", v("klen") / c(lanes) * c(lanes) + v("kr"))];
        for i in 0..mk.mr {
            for j in 0..mk.nr {
                rest.push(Stmt::Assign {
                    reg: tail(i, j),
                    value: Value::Fma(
                        Box::new(Value::load(a.buf, at(format!("pa{i}"), v("kk")))),
                        Box::new(Value::load(b.buf, at(format!("pb{j}"), v("kk")))),
                        Box::new(Value::reg(&tail(i, j), 1)),
                    ),
                });
            }
        }
        s.push(for_("kr", v("klen") % c(lanes), LoopKind::Serial, rest));

        // Each sum across its lanes, stored or added; an edge tile stores what is inside.
        let store_all = |checked: bool| -> Vec<Stmt> {
            let mut st = Vec::new();
            for i in 0..mk.mr {
                for j in 0..mk.nr {
                    let idx = v("base2")
                        + (v("mi") + c(i)) * out.s_row.clone()
                        + (v("nj") + c(j)) * out.s_col.clone();
                    let sum = Value::binary(
                        BinaryOp::Add,
                        Value::Horizontal(BinaryOp::Add, Box::new(Value::reg(&acc(i, j), lanes))),
                        Value::reg(&tail(i, j), 1),
                    );
                    let write = Value::Select(
                        Cond::Eq(v("kt"), c(0)),
                        Box::new(sum.clone()),
                        Box::new(Value::sum(Value::load(out.buf, idx.clone()), sum)),
                    );
                    let put = store(out.buf, idx, write);
                    st.push(if checked {
                        let inside = Cond::and(
                            Cond::Lt(v("mi") + c(i), v("p_m")),
                            Cond::Lt(v("nj") + c(j), v("p_n")),
                        );
                        if_(inside, vec![put])
                    } else {
                        put
                    });
                }
            }
            st
        };
        let whole = Cond::and(
            Cond::Le(v("mi") + c(mk.mr), v("p_m")),
            Cond::Le(v("nj") + c(mk.nr), v("p_n")),
        );
        s.push(Stmt::If {
            cond: whole,
            then: store_all(false),
            otherwise: store_all(true),
        });
        s
    }
}
