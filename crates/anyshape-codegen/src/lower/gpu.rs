//! The GPU contraction sketch's lowering (see `sketch/gpu.rs`), to the same loop IR as
//! the CPU's, with the same padding policy:
//! ```text
//! block (n tile, m tile, batch item) = blockIdx (x, y, z); thread = threadIdx.x
//! acc[tm x tn] = 0
//! for each bk-deep reduction tile:
//!   fetch:   stage the A and B slices in shared memory, threads striding over them
//!   barrier
//!   compute: acc += a column of A x a row of B, bk times (registers)
//!   barrier
//! write-back: epilogue(acc) into the output, thread tile strided over the block tile
//! ```
//! The policy decides, as on the CPU, what each stage checks: local padding zero-fills
//! the fetch and leaves compute unchecked; boundary checks guard the fetch and check
//! the reduction index in the compute stage; loop partitioning runs blocks wholly inside
//! the output (and their whole reduction tiles) unchecked and the rest checked. Every
//! store checks the output's edge unless the block lies inside it.
use super::{c, renamed, shape_vars, v};
use crate::loop_ir::{for_, if_, let_, store, Cond, Func, GpuIndex, LoopKind, Scope, Stmt, Value};
use crate::padding::{Compute, Fetch, Policy};
use crate::{CodegenError, GemmView, GpuMicroKernel, GpuTarget, Program, Result, SHARED_PAD};
use anyshape_ir::{Expr, Workload};

/// Lower a contraction program for a GPU.
pub(crate) fn lower(p: &Program<GpuMicroKernel>, target: &GpuTarget) -> Result<Func> {
    p.micro_kernel.validate(target)?;
    let w = &p.workload;
    let g = GemmView::of(w)?;
    let policy = p.strategy.policy();
    if policy.copy {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: "global padding is not built on GPU yet".into(),
        });
    }
    let (shape_vars, specialized) = shape_vars(p)?;
    let mk = p.micro_kernel;
    let block = Block { w, g, mk, policy };
    let mut body = block.prologue();
    body.extend(block.main());
    Ok(Func {
        name: p.symbol(target),
        shape_vars,
        specialized,
        inputs: w.inputs.len(),
        threads: Some(mk.threads()),
        body,
    })
}

/// What the stages of a block need to know.
struct Block<'a> {
    w: &'a Workload,
    g: GemmView,
    mk: GpuMicroKernel,
    policy: Policy,
}

fn u(x: u32) -> Expr {
    c(x as usize)
}

impl Block<'_> {
    fn rows(&self) -> u32 {
        self.mk.bm / self.mk.tm
    }

    fn cols(&self) -> u32 {
        self.mk.bn / self.mk.tn
    }

    /// Extents, strides, the thread's coordinates, the block's origin and bases, the
    /// shared tiles and the accumulators.
    fn prologue(&self) -> Vec<Stmt> {
        let (w, g, mk) = (self.w, &self.g, self.mk);
        let mut s = vec![
            let_("e_m", renamed(&w.axes[g.m].extent)),
            let_("e_n", renamed(&w.axes[g.n].extent)),
            let_("e_k", renamed(&w.axes[g.k].extent)),
            Stmt::GpuIndex {
                var: "tid".into(),
                index: GpuIndex::Thread,
            },
            let_("tx", v("tid") % u(self.cols())),
            let_("ty", v("tid") / u(self.cols())),
            Stmt::GpuIndex {
                var: "bx".into(),
                index: GpuIndex::Block(0),
            },
            Stmt::GpuIndex {
                var: "by".into(),
                index: GpuIndex::Block(1),
            },
            Stmt::GpuIndex {
                var: "bz".into(),
                index: GpuIndex::Block(2),
            },
            let_("m0", v("by") * u(mk.bm)),
            let_("n0", v("bx") * u(mk.bn)),
        ];
        // Per tensor: its base for the block's batch item and its strides along M, N, K.
        for (t, tensor) in w.tensors().enumerate() {
            let batch = g
                .batch
                .first()
                .map_or(Expr::Const(0), |&b| renamed(&tensor.axis_stride(b)));
            s.push(let_(
                &format!("base{t}"),
                renamed(&tensor.base_offset()) + v("bz") * batch,
            ));
            for (axis, name) in [(g.m, "m"), (g.n, "n"), (g.k, "k")] {
                s.push(let_(
                    &format!("s{t}_{name}"),
                    renamed(&tensor.axis_stride(axis)),
                ));
            }
        }
        s.push(Stmt::Alloc {
            buf: "As".into(),
            len: u(mk.bk * (mk.bm + SHARED_PAD)),
            scope: Scope::Shared,
        });
        s.push(Stmt::Alloc {
            buf: "Bs".into(),
            len: u(mk.bk * (mk.bn + SHARED_PAD)),
            scope: Scope::Shared,
        });
        for (buf, len) in [("acc", mk.tm * mk.tn), ("a", mk.tm), ("b", mk.tn)] {
            s.push(Stmt::Alloc {
                buf: buf.into(),
                len: u(len),
                scope: Scope::Stack,
            });
        }
        s.push(self.each_acc(vec![store(
            "acc",
            self.acc_index(),
            Value::Zero { lanes: 1 },
        )]));
        s
    }

    /// The reduction loop and the write-back, as the policy splits blocks.
    fn main(&self) -> Vec<Stmt> {
        let checked = self.reduction(
            Expr::ceil_div(v("e_k"), u(self.mk.bk)),
            self.policy.fetch,
            self.policy.compute != Compute::Unchecked,
        );
        if self.policy.compute != Compute::Partitioned {
            return vec![checked, self.write_back(self.policy.checked_store)];
        }
        // A block inside the output runs its whole reduction tiles unchecked, the last
        // partial one (if any) checked; other blocks run checked throughout.
        let inside = Cond::and(
            Cond::Le(v("m0") + u(self.mk.bm), v("e_m")),
            Cond::Le(v("n0") + u(self.mk.bn), v("e_n")),
        );
        let whole = v("e_k") / u(self.mk.bk);
        let fast = vec![
            self.reduction(whole.clone(), Fetch::Unchecked, false),
            if_(
                Cond::Lt(whole * u(self.mk.bk), v("e_k")),
                [
                    vec![let_("kt0", v("e_k") / u(self.mk.bk))],
                    self.reduction_tile(v("kt0"), self.policy.fetch, true),
                ]
                .concat(),
            ),
            self.write_back(false),
        ];
        vec![Stmt::If {
            cond: inside,
            then: fast,
            otherwise: vec![checked, self.write_back(true)],
        }]
    }

    /// `tiles` reduction tiles from the first.
    fn reduction(&self, tiles: Expr, fetch: Fetch, check_k: bool) -> Stmt {
        for_(
            "kt",
            tiles,
            LoopKind::Serial,
            self.reduction_tile(v("kt"), fetch, check_k),
        )
    }

    /// One reduction tile (number `kt`): fetch, barrier, compute, barrier.
    fn reduction_tile(&self, kt: Expr, fetch: Fetch, check_k: bool) -> Vec<Stmt> {
        let mut s = vec![let_("k0", kt * u(self.mk.bk))];
        s.extend(self.fetch(fetch));
        s.push(Stmt::Barrier);
        s.push(self.compute(check_k));
        s.push(Stmt::Barrier);
        s
    }

    /// Stage the A (`bm x bk`) and B (`bk x bn`) slices in shared memory. A warp's loads
    /// follow the unit-stride axis, so they are contiguous.
    fn fetch(&self, fetch: Fetch) -> Vec<Stmt> {
        let mk = self.mk;
        let threads = mk.threads();
        let mut out = Vec::new();
        // (tile, operand, rows, cols, row origin, col origin, row extent, col extent,
        //  row stride, col stride, slot(r, q))
        let a_unit = self.unit(0, "m");
        let b_unit = self.unit(1, "k");
        for (tile, t, nrows, ncols, r0, q0, rext, qext, rs, qs, rows_fast) in [
            (
                "As",
                0,
                mk.bm,
                mk.bk,
                "m0",
                "k0",
                "e_m",
                "e_k",
                "s0_m",
                "s0_k",
                a_unit.0 && !a_unit.1,
            ),
            (
                "Bs",
                1,
                mk.bk,
                mk.bn,
                "k0",
                "n0",
                "e_k",
                "e_n",
                "s1_k",
                "s1_n",
                b_unit.0 && !b_unit.1,
            ),
        ] {
            let n = nrows * ncols;
            let (r, q) = if rows_fast {
                (v("e") % u(nrows), v("e") / u(nrows))
            } else {
                (v("e") / u(ncols), v("e") % u(ncols))
            };
            // As is stored [k][m] (transposed), Bs [k][n].
            let slot = if tile == "As" {
                v("q") * u(mk.bm + SHARED_PAD) + v("r")
            } else {
                v("r") * u(mk.bn + SHARED_PAD) + v("q")
            };
            let load = Value::load(
                &format!("in{t}"),
                v(&format!("base{t}")) + (v(r0) + v("r")) * v(rs) + (v(q0) + v("q")) * v(qs),
            );
            let valid = Cond::and(
                Cond::Lt(v(r0) + v("r"), v(rext)),
                Cond::Lt(v(q0) + v("q"), v(qext)),
            );
            let copy = super::fetch::checked_copy(
                fetch,
                valid,
                tile,
                slot,
                load,
                Value::Zero { lanes: 1 },
            );
            let mut element = vec![
                let_("e", v("it") * u(threads) + v("tid")),
                let_("r", r),
                let_("q", q),
            ];
            element.push(copy);
            let element = if n.is_multiple_of(threads) {
                element
            } else {
                let (lets, rest) = element.split_at(1);
                [
                    lets.to_vec(),
                    vec![if_(Cond::Lt(v("e"), u(n)), rest.to_vec())],
                ]
                .concat()
            };
            out.push(for_(
                "it",
                u(n.div_ceil(threads)),
                LoopKind::Unrolled(n.div_ceil(threads) as usize),
                element,
            ));
        }
        out
    }

    /// Whether tensor `t`'s rows (M or K) and columns (K or N) are its unit-stride axes.
    fn unit(&self, t: usize, row: &str) -> (bool, bool) {
        let tensor = &self.w.inputs[t];
        let (ra, ca) = if row == "m" {
            (self.g.m, self.g.k)
        } else {
            (self.g.k, self.g.n)
        };
        let one = |a: usize| tensor.axis_stride(a).simplify() == Expr::Const(1);
        (one(ra), one(ca))
    }

    /// `acc[i][j] += A[kk][ty + i rows] * B[kk][tx + j cols]` over the tile's `bk` steps,
    /// each step checked against the reduction's extent with `check_k`.
    fn compute(&self, check_k: bool) -> Stmt {
        let mk = self.mk;
        let (rows, cols) = (self.rows(), self.cols());
        let mut step = vec![
            for_(
                "i",
                u(mk.tm),
                LoopKind::Unrolled(mk.tm as usize),
                vec![store(
                    "a",
                    v("i"),
                    Value::load(
                        "As",
                        v("kk") * u(mk.bm + SHARED_PAD) + v("ty") + v("i") * u(rows),
                    ),
                )],
            ),
            for_(
                "j",
                u(mk.tn),
                LoopKind::Unrolled(mk.tn as usize),
                vec![store(
                    "b",
                    v("j"),
                    Value::load(
                        "Bs",
                        v("kk") * u(mk.bn + SHARED_PAD) + v("tx") + v("j") * u(cols),
                    ),
                )],
            ),
        ];
        step.push(self.each_acc(vec![store(
            "acc",
            self.acc_index(),
            Value::Fma(
                Box::new(Value::load("a", v("i"))),
                Box::new(Value::load("b", v("j"))),
                Box::new(Value::load("acc", self.acc_index())),
            ),
        )]));
        let step = if check_k {
            vec![if_(Cond::Lt(v("k0") + v("kk"), v("e_k")), step)]
        } else {
            step
        };
        for_("kk", u(mk.bk), LoopKind::Unrolled(mk.bk as usize), step)
    }

    fn acc_index(&self) -> Expr {
        v("i") * u(self.mk.tn) + v("j")
    }

    /// `for i < tm { for j < tn { body } }`, both unrolled.
    fn each_acc(&self, body: Vec<Stmt>) -> Stmt {
        let mk = self.mk;
        for_(
            "i",
            u(mk.tm),
            LoopKind::Unrolled(mk.tm as usize),
            vec![for_(
                "j",
                u(mk.tn),
                LoopKind::Unrolled(mk.tn as usize),
                body,
            )],
        )
    }

    /// The epilogue on the accumulators, stored into the output (checked with `checked`).
    fn write_back(&self, checked: bool) -> Stmt {
        let out = self.w.inputs.len();
        let mut st = vec![
            let_("m", v("m0") + v("ty") + v("i") * u(self.rows())),
            let_("n", v("n0") + v("tx") + v("j") * u(self.cols())),
        ];
        let at = |t: usize| {
            v(&format!("base{t}")) + v("m") * v(&format!("s{t}_m")) + v("n") * v(&format!("s{t}_n"))
        };
        let value = super::epilogue::chain_value(
            &self.w.epilogue,
            Value::load("acc", self.acc_index()),
            &at,
        );
        let write = store("out0", at(out), value);
        st.push(if checked {
            if_(
                Cond::and(Cond::Lt(v("m"), v("e_m")), Cond::Lt(v("n"), v("e_n"))),
                vec![write],
            )
        } else {
            write
        });
        self.each_acc(st)
    }
}
