//! The AMX variant of the CPU contraction sketch (`amx=1`): a task's body when its
//! products run on AMX-BF16 tiles (`Stmt::TileProduct`).
//! ```text
//! once per thread and M tile: A's rows rounded into words of pairs, row-major
//!   (K / 2 words a row; `Stmt::RoundPairs`), the rows up to whole register tiles zero
//! [B read in pairs (attention's keys), once per thread and N tile: its columns
//!   rounded into words of pairs in groups of 16, each group laid out as a weight
//!   panel is, the columns past N zero]
//! for each register tile (mr/16 x nr/16 output tiles of 16 x 16):
//!   the tiles summed over the whole reduction, A's tiles from the packed rows, B's
//!   from the weight's panels in place (a panel of 16 columns is a B tile per step)
//!   or from the packed groups
//!   inside the output: stored into it; at its edge: stored into a stack tile, and
//!   the part inside copied
//! ```
//! The fused epilogue then runs over the task's output tile as in the usual variant.
//! Tasks run N tiles fastest, so a thread's consecutive tasks share the M tile it has
//! packed. Only a contraction that `amx_runs` lowers so: B in panels of 16 words or read
//! in pairs, A's pairs contiguous, the output contiguous along N, the reduction whole
//! tiles.
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{
    for_, if_, let_, store, Cond, LoopKind, RoundPairs, Scope, Stmt, TileProduct, Value,
};
use crate::sketch::AMX_EDGE;
use anyshape_ir::Expr;

/// `for var in 0..count: for kk in 0..e_k: dst[at(var)] = value`: `count` rows (A's) or
/// columns (B's) of the reduction's pairs, each rounded into a word as it is copied (or
/// zero).
fn pairs_of(var: &str, count: Expr, dst: &str, at: impl Fn(Expr) -> Expr, value: Value) -> Stmt {
    for_(
        var,
        count,
        LoopKind::Serial,
        vec![for_(
            "kk",
            v("e_k"),
            LoopKind::Serial,
            vec![store(dst, at(v(var)), value)],
        )],
    )
}

impl Nest<'_> {
    /// The task body of the AMX variant (after the task's tile lets).
    pub(super) fn amx_task_body(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let mk = self.mk;
        let (a, b) = (&ops[0], &ops[1]);
        let edge = c(AMX_EDGE);
        let pair = Value::PairBf16 {
            buf: a.buf.into(),
            index: v("base0") + a.row(v("m0") + v("r")) + v("kk") * a.s_col.clone(),
        };
        let rows = |count: Expr, first: Expr, value: Value| {
            pairs_of(
                "r",
                count,
                "Ap",
                |r| (first.clone() + r) * v("e_k") + v("kk"),
                value,
            )
        };
        // A's rows: a run of pairs each where they are contiguous (as `amx_runs` asks).
        let a_rows = match a.s_col.simplify().as_const() {
            Some(2) => for_(
                "r",
                v("mlen"),
                LoopKind::Serial,
                vec![Stmt::RoundPairs(Box::new(RoundPairs {
                    dst: "Ap".into(),
                    dst_index: v("r") * v("e_k"),
                    src: a.buf.into(),
                    src_index: v("base0") + a.row(v("m0") + v("r")),
                    words: v("e_k"),
                }))],
            ),
            _ => rows(v("mlen"), c(0), pair),
        };
        let pack = vec![
            a_rows,
            rows(
                v("nmb") * c(mk.mr) - v("mlen"),
                v("mlen"),
                Value::Zero { lanes: 1 },
            ),
        ];
        // B's tiles: the weight's panels, or the groups packed here (a tile past the
        // last panel or group, at the edge, reads the last: its columns lie outside
        // the output and are not copied).
        let in_panels = b.panels.is_some();
        let b_buf = if in_panels { "in1" } else { "Bq" };
        // Tile `j` of the register tile: the weight's panel of its columns, or the
        // group of the task's columns packed.
        let b_tile = |j: usize| {
            if in_panels {
                let last = v("e_np") / c(AMX_EDGE) - c(1);
                let panel = v("nj") / c(AMX_EDGE) + c(j);
                v("base1") + Expr::min(panel, last) * v("sb_p")
            } else {
                let last = Expr::ceil_div(v("nlen"), c(AMX_EDGE)) - c(1);
                let group = v("jb") * c(mk.nr / AMX_EDGE) + c(j);
                Expr::min(group, last) * v("e_k") * c(AMX_EDGE)
            }
        };
        let product = |out: &str, index: Expr, stride: Expr| {
            Stmt::TileProduct(Box::new(TileProduct {
                a: "Ap".into(),
                a_index: (0..mk.mr / AMX_EDGE)
                    .map(|i| (v("ib") * c(mk.mr) + c(i * AMX_EDGE)) * v("e_k"))
                    .collect(),
                a_stride: v("e_k"),
                b: b_buf.into(),
                b_index: (0..mk.nr / AMX_EDGE).map(b_tile).collect(),
                steps: v("e_k") / edge.clone(),
                c: out.into(),
                c_index: index,
                c_stride: stride,
            }))
        };
        let at = |r: Expr, j: Expr| v("base2") + (v("mi") + r) * v("sc_m") + v("nj") + j;
        let inside = Cond::and(
            Cond::Le(v("mi") + c(mk.mr), v("p_m")),
            Cond::Le(v("nj") + c(mk.nr), v("p_n")),
        );
        let copy = for_(
            "r",
            Expr::min(c(mk.mr), v("p_m") - v("mi")),
            LoopKind::Serial,
            vec![for_(
                "j",
                Expr::min(c(mk.nr), v("p_n") - v("nj")),
                LoopKind::Serial,
                vec![store(
                    "out0",
                    at(v("r"), v("j")),
                    Value::load("Cs", v("r") * c(mk.nr) + v("j")),
                )],
            )],
        );
        let tile = vec![
            let_("mi", v("m0") + v("ib") * c(mk.mr)),
            let_("nj", v("n0") + v("jb") * c(mk.nr)),
            Stmt::If {
                cond: inside,
                then: vec![product("out0", at(c(0), c(0)), v("sc_m"))],
                otherwise: vec![
                    Stmt::Alloc {
                        buf: "Cs".into(),
                        len: c(mk.mr * mk.nr),
                        scope: Scope::Stack,
                    },
                    product("Cs", c(0), c(mk.nr)),
                    copy,
                ],
            },
        ];
        let mut body = vec![
            Stmt::Alloc {
                buf: "Ap".into(),
                len: c(mk.mc) * v("e_k"),
                scope: Scope::Scratch(0),
            },
            if_(
                Cond::Claim {
                    slot: 0,
                    key: v("bt") * v("tiles_m") + v("it"),
                },
                pack,
            ),
        ];
        if b.panels.is_none() {
            body.extend(self.amx_pack_b(b));
        }
        body.push(for_(
            "ib",
            v("nmb"),
            LoopKind::Serial,
            vec![for_("jb", v("nnb"), LoopKind::Serial, tile)],
        ));
        body
    }

    /// The packing of a B read in pairs (once per thread and N tile, into `Bq`): the
    /// task's columns in groups of 16, group `g` as a weight panel lays them out (row
    /// `k` of the group its 16 columns' words of pair `k`), the columns past N zero.
    fn amx_pack_b(&self, b: &Operand) -> Vec<Stmt> {
        let edge = c(AMX_EDGE);
        let column = |count: Expr, first: Expr, value: Value| {
            let at = |cc: Expr| (v("g") * v("e_k") + v("kk")) * c(AMX_EDGE) + first.clone() + cc;
            pairs_of("cc", count, "Bq", at, value)
        };
        let pair = Value::PairBf16 {
            buf: b.buf.into(),
            index: v("base1")
                + b.row(v("n0") + v("g") * edge.clone() + v("cc"))
                + v("kk") * b.s_col.clone(),
        };
        let group = vec![
            let_(
                "cols",
                Expr::min(edge.clone(), v("nlen") - v("g") * edge.clone()),
            ),
            column(v("cols"), c(0), pair),
            column(
                edge.clone() - v("cols"),
                v("cols"),
                Value::Zero { lanes: 1 },
            ),
        ];
        vec![
            Stmt::Alloc {
                buf: "Bq".into(),
                len: c(self.mk.nc) * v("e_k"),
                scope: Scope::Scratch(1),
            },
            if_(
                Cond::Claim {
                    slot: 1,
                    key: v("bt") * v("tiles_n") + v("jt"),
                },
                vec![for_(
                    "g",
                    Expr::ceil_div(v("nlen"), edge),
                    LoopKind::Serial,
                    group,
                )],
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use crate::{ContractionKernel, CpuTarget, KernelMode, PaddingStrategy, Program, Target};
    use anyshape_ir::{Bindings, Workload};

    /// An AMX kernel lowers (verified) and renders to calls of its tile shape's helper,
    /// which only a target with AMX has in its prelude; a workload the tiles cannot
    /// run is refused with why, and so is a target without them.
    #[test]
    fn lowers_to_tile_products_where_tiles_run() {
        let target = CpuTarget {
            amx: true,
            ..CpuTarget::avx512_for_tests()
        };
        let program = |w: &str, mk: &str| Program {
            workload: Workload::parse(w).unwrap(),
            micro_kernel: ContractionKernel::parse(mk).unwrap(),
            strategy: PaddingStrategy::LocalPad,
            mode: KernelMode::Symbolic,
            bindings: Bindings::default(),
        };
        let mk = "mr=32,nr=32,mc=64,nc=64,kc=16,uk=1,amx=1";
        let source = program("dense_bf16(M=T,N=80,K=64,P=16)+bias+gelu", mk)
            .source(&target)
            .unwrap();
        // The whole tile into the output, the edge tile into the stack.
        assert_eq!(
            source.matches("as_amx_2x2(as_call, ").count(),
            2,
            "{source}"
        );
        assert!(target
            .prelude()
            .contains("static inline int32_t as_amx_2x2("));
        assert!(!CpuTarget {
            amx: false,
            ..target.clone()
        }
        .prelude()
        .contains("as_amx_"));
        let odd = program("dense_bf16(M=T,N=80,K=42,P=16)", mk).source(&target);
        let err = odd.unwrap_err().to_string();
        assert!(err.contains("AMX tiles run"), "{err}");
        let none = CpuTarget {
            amx: false,
            ..target
        };
        let err = program("dense_bf16(M=T,N=80,K=64,P=16)", mk)
            .source(&none)
            .unwrap_err()
            .to_string();
        assert!(err.contains("AMX-BF16"), "{err}");
    }
}
