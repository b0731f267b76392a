//! Global padding's copies: every input copied into a zero-filled buffer with each axis
//! rounded up to the register tile, before the loop nest; the padded output copied back
//! (with the epilogue applied) after it.
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{for_, let_, store, Cond, LoopKind, Scope, Stmt, Value};
use anyshape_ir::Expr;

impl Nest<'_> {
    /// The padded extents and the copies of both operands into their padded buffers.
    pub(super) fn copy_in(&self) -> Vec<Stmt> {
        let mk = self.mk;
        let mut body = vec![
            let_("p_m", Expr::round_up(v("e_m"), mk.mr as i64)),
            let_("p_n", Expr::round_up(v("e_n"), mk.nr as i64)),
            let_(
                "p_k",
                Expr::round_up(v("e_k"), mk.k_granule(self.lanes) as i64),
            ),
        ];
        for (buf, slot, rows) in [("Ag", 2, "p_m"), ("Bg", 3, "p_n")] {
            body.push(Stmt::Alloc {
                buf: buf.into(),
                len: v("e_b") * v(rows) * v("p_k"),
                scope: Scope::Scratch(slot),
            });
        }
        body.push(Stmt::Alloc {
            buf: "Cg".into(),
            len: v("e_b") * v("p_m") * v("p_n"),
            scope: Scope::Scratch(4),
        });
        for (buf, rows, ext, s_row, s_col, which) in [
            ("Ag", "p_m", "e_m", "sa_m", "sa_k", self.roles[0]),
            ("Bg", "p_n", "e_n", "sb_n", "sb_k", self.roles[1]),
        ] {
            let mut task = vec![let_("bt", v("t") / v(rows)), let_("r", v("t") % v(rows))];
            let bases = self.batch_bases("bt", &mut task);
            let valid = Cond::and(Cond::Lt(v("r"), v(ext)), Cond::Lt(v("kk"), v("e_k")));
            let op = Operand {
                buf: super::contraction::OPERAND_BUFS[which],
                base: bases[which].clone(),
                s_row: v(s_row),
                s_col: v(s_col),
                panels: self.w.inputs[which].panels,
            };
            let src_idx = op.base.clone() + op.row(v("r")) + v("kk") * op.s_col.clone();
            let value = Value::Select(
                valid,
                Box::new(Value::load(op.buf, src_idx)),
                Box::new(Value::Zero { lanes: 1 }),
            );
            task.push(for_(
                "kk",
                v("p_k"),
                LoopKind::Serial,
                vec![store(buf, v("t") * v("p_k") + v("kk"), value)],
            ));
            body.push(for_("t", v("e_b") * v(rows), LoopKind::Parallel, task));
        }
        body
    }

    /// The operands as the loop nest reads them from the padded buffers.
    pub(super) fn padded_operands(&self) -> [Operand; 3] {
        [
            Operand {
                buf: "Ag",
                base: v("bt") * v("p_m") * v("p_k"),
                s_row: v("p_k"),
                s_col: c(1),
                panels: None,
            },
            Operand {
                buf: "Bg",
                base: v("bt") * v("p_n") * v("p_k"),
                s_row: v("p_k"),
                s_col: c(1),
                panels: None,
            },
            Operand {
                buf: "Cg",
                base: v("bt") * v("p_m") * v("p_n"),
                s_row: v("p_n"),
                s_col: c(1),
                panels: None,
            },
        ]
    }

    /// Slice the padded output back, applying the epilogue on the way.
    pub(super) fn copy_out(&self) -> Stmt {
        let mut task = vec![let_("bt", v("t") / v("e_m")), let_("r", v("t") % v("e_m"))];
        let bases = self.batch_bases("bt", &mut task);
        let out = self.w.inputs.len();
        let src = Value::load("Cg", (v("bt") * v("p_m") + v("r")) * v("p_n") + v("j"));
        let value = self.epilogue_value(src, &|t| {
            bases[t].clone()
                + v("r") * self.tensor_stride(t, self.g.m)
                + v("j") * self.tensor_stride(t, self.g.n)
        });
        let dst = bases[out].clone() + v("r") * v("sc_m") + v("j") * v("sc_n");
        task.push(for_(
            "j",
            v("e_n"),
            LoopKind::Serial,
            vec![store("out0", dst, value)],
        ));
        for_("t", v("e_b") * v("e_m"), LoopKind::Parallel, task)
    }
}
