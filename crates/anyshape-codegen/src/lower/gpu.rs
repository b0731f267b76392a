//! The GPU contraction sketch's lowering (see `sketch/gpu.rs`), to the same loop IR as
//! the CPU's, with the same padding policy:
//! ```text
//! block (n tile, m tile, batch item) = blockIdx (x, y, z); thread = threadIdx.x
//! acc[tm x tn] = 0
//! load tile 0 into registers; stash it in shared buffer 0; barrier
//! for each bk-deep reduction tile kt (double-buffered):
//!   load:    the next tile's A and B slices into registers (global loads in flight...)
//!   compute: acc += a column of A x a row of B, bk times, from shared buffer kt % 2
//!   stash:   (...while this computes) the registers into the other shared buffer
//!   barrier
//! write-back: epilogue(acc) into the output
//! ```
//! A thread's tile rows (columns) come in groups of 4 contiguous ones where its tile is
//! a multiple of 4, read from shared memory as one `float4`; the groups, or single rows
//! otherwise, are strided across the block so that a warp's reads are contiguous.
//! The policy decides, as on the CPU, what each stage checks: local padding zero-fills
//! the fetch and leaves compute unchecked; boundary checks guard the fetch and check
//! the reduction index in the compute stage; loop partitioning runs blocks wholly inside
//! the output (and their whole reduction tiles) unchecked and the rest checked. Every
//! store checks the output's edge unless the block lies inside it.
use super::{c, renamed, shape_vars, v};
use crate::loop_ir::{for_, if_, let_, store, Cond, Func, GpuIndex, LoopKind, Scope, Stmt, Value};
use crate::padding::{Compute, Fetch, Policy};
use crate::{CodegenError, GemmView, GpuContractionKernel, GpuTarget, Program, Result, SHARED_PAD};
use anyshape_ir::{Expr, Workload};

/// Lower a contraction program for a GPU.
pub(crate) fn lower(p: &Program<GpuContractionKernel>, target: &GpuTarget) -> Result<Func> {
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
    mk: GpuContractionKernel,
    policy: Policy,
}

/// One operand's staging: A (`bm x bk`, shared `[k][m]`) or B (`bk x bn`, `[k][n]`).
struct Side {
    /// Input index.
    t: usize,
    /// The shared tile, the staging registers and the thread's compute registers.
    tile: &'static str,
    staged: &'static str,
    regs: &'static str,
    /// The slice's row and column axes (`m`, `n` or `k`) and sizes.
    axes: [&'static str; 2],
    dims: [u32; 2],
    /// Along the operand's non-reduction axis: the block tile, the thread tile, the
    /// thread coordinate, and the compute loop's variable.
    width: u32,
    per_thread: u32,
    coord: &'static str,
    var: &'static str,
}

impl Side {
    /// Threads along the non-reduction axis.
    fn threads(&self) -> u32 {
        self.width / self.per_thread
    }

    /// Floats of one shared buffer.
    fn buffer_len(&self, bk: u32) -> u32 {
        bk * (self.width + SHARED_PAD)
    }

    /// The origin variable of `axis` in the block, the reduction's being `k0`.
    fn origin<'a>(axis: &str, k0: &'a str) -> &'a str {
        match axis {
            "m" => "m0",
            "n" => "n0",
            _ => k0,
        }
    }
}

fn u(x: u32) -> Expr {
    c(x as usize)
}

/// Lanes of a thread's shared reads along an axis where its tile has `count` elements:
/// one `float4` where they come in groups of 4, else single floats.
fn lanes(count: u32) -> u32 {
    if count.is_multiple_of(4) {
        4
    } else {
        1
    }
}

/// The offset in the block tile of element `i` of a thread's tile along an axis, for the
/// thread at `coord` of `threads` along it: groups of `lanes` contiguous elements, the
/// groups `threads * lanes` apart (so a warp's threads read neighbouring groups).
fn spread(i: Expr, coord: &str, threads: u32, lanes: u32) -> Expr {
    if lanes == 1 {
        return v(coord) + i * u(threads);
    }
    (i.clone() / u(lanes)) * u(threads * lanes) + v(coord) * u(lanes) + i % u(lanes)
}

impl Block<'_> {
    /// A's and B's staging.
    fn sides(&self) -> [Side; 2] {
        let mk = self.mk;
        [
            Side {
                t: 0,
                tile: "As",
                staged: "pa",
                regs: "a",
                axes: ["m", "k"],
                dims: [mk.bm, mk.bk],
                width: mk.bm,
                per_thread: mk.tm,
                coord: "ty",
                var: "i",
            },
            Side {
                t: 1,
                tile: "Bs",
                staged: "pb",
                regs: "b",
                axes: ["k", "n"],
                dims: [mk.bk, mk.bn],
                width: mk.bn,
                per_thread: mk.tn,
                coord: "tx",
                var: "j",
            },
        ]
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
            let_("tx", v("tid") % u(self.sides()[1].threads())),
            let_("ty", v("tid") / u(self.sides()[1].threads())),
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
        // Two buffers per operand (double buffering).
        for side in self.sides() {
            s.push(Stmt::Alloc {
                buf: side.tile.into(),
                len: u(2 * side.buffer_len(mk.bk)),
                scope: Scope::Shared,
            });
        }
        let [na, nb] = mk.staged_per_thread();
        for (buf, len) in [
            ("acc", mk.tm * mk.tn),
            ("a", mk.tm),
            ("b", mk.tn),
            ("pa", na),
            ("pb", nb),
        ] {
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
        // The staging registers start at zero: a guarded fetch leaves some unwritten.
        for (buf, len) in [("pa", na), ("pb", nb)] {
            s.push(for_(
                "z",
                u(len),
                LoopKind::Unrolled(len as usize),
                vec![store(buf, v("z"), Value::Zero { lanes: 1 })],
            ));
        }
        s
    }

    /// The reduction loop and the write-back, as the policy splits blocks.
    fn main(&self) -> Vec<Stmt> {
        let mk = self.mk;
        let checked = self.pipeline(
            Expr::ceil_div(v("e_k"), u(mk.bk)),
            self.policy.fetch,
            self.policy.compute != Compute::Unchecked,
        );
        if self.policy.compute != Compute::Partitioned {
            return [checked, vec![self.write_back(self.policy.checked_store)]].concat();
        }
        // A block inside the output runs its whole reduction tiles unchecked, the last
        // partial one (if any) checked; other blocks run checked throughout.
        let inside = Cond::and(
            Cond::Le(v("m0") + u(mk.bm), v("e_m")),
            Cond::Le(v("n0") + u(mk.bn), v("e_n")),
        );
        let whole = v("e_k") / u(mk.bk);
        let tail = [
            vec![let_("k0", whole.clone() * u(mk.bk))],
            self.load(self.policy.fetch, "k0"),
            self.stash(c(0)),
            vec![Stmt::Barrier, self.compute(true, c(0))],
        ]
        .concat();
        let fast = [
            self.pipeline(whole.clone(), Fetch::Unchecked, false),
            vec![
                if_(Cond::Lt(whole * u(mk.bk), v("e_k")), tail),
                self.write_back(false),
            ],
        ]
        .concat();
        vec![Stmt::If {
            cond: inside,
            then: fast,
            otherwise: [checked, vec![self.write_back(true)]].concat(),
        }]
    }

    /// `tiles` reduction tiles from the first, double-buffered: the next tile's global
    /// loads are issued before the current tile's compute and stashed after it, so one
    /// barrier per tile suffices. Ends on a barrier (the shared buffers are free).
    fn pipeline(&self, tiles: Expr, fetch: Fetch, check_k: bool) -> Vec<Stmt> {
        let mk = self.mk;
        let next = Cond::Lt(v("kt") + c(1), v("nt"));
        let body = vec![
            let_("k0", v("kt") * u(mk.bk)),
            let_("cur", v("kt") % c(2)),
            let_("kn", v("k0") + u(mk.bk)),
            if_(next.clone(), self.load(fetch, "kn")),
            self.compute(check_k, v("cur")),
            if_(next, self.stash(c(1) - v("cur"))),
            Stmt::Barrier,
        ];
        vec![
            let_("nt", tiles),
            if_(
                Cond::Lt(c(0), v("nt")),
                [
                    vec![let_("kz", c(0))],
                    self.load(fetch, "kz"),
                    self.stash(c(0)),
                ]
                .concat(),
            ),
            Stmt::Barrier,
            for_("kt", v("nt"), LoopKind::Serial, body),
        ]
    }

    /// The thread's share of a side's slice (`it`-th element: `e = it * threads + tid`,
    /// at row `r`, column `q`), `body` run on each. Where the rows are the tensor's
    /// unit-stride axis a warp walks them, else the columns: its loads are contiguous.
    fn each_element(&self, side: &Side, body: Stmt) -> Stmt {
        let threads = self.mk.threads();
        let [nrows, ncols] = side.dims;
        let n = nrows * ncols;
        let (r, q) = if self.unit(side.t, side.axes[0]) && !self.unit(side.t, side.axes[1]) {
            (v("e") % u(nrows), v("e") / u(nrows))
        } else {
            (v("e") / u(ncols), v("e") % u(ncols))
        };
        let element = vec![let_("r", r), let_("q", q), body];
        let element = if n.is_multiple_of(threads) {
            element
        } else {
            vec![if_(Cond::Lt(v("e"), u(n)), element)]
        };
        for_(
            "it",
            u(n.div_ceil(threads)),
            LoopKind::Unrolled(n.div_ceil(threads) as usize),
            [vec![let_("e", v("it") * u(threads) + v("tid"))], element].concat(),
        )
    }

    /// Load the slices at reduction origin `k0` (a variable's name) into the staging
    /// registers, as the fetch policy checks them.
    fn load(&self, fetch: Fetch, k0: &str) -> Vec<Stmt> {
        self.sides()
            .iter()
            .map(|side| {
                let t = side.t;
                let [row, col] = side.axes;
                let (r0, q0) = (Side::origin(row, k0), Side::origin(col, k0));
                let load = Value::load(
                    &format!("in{t}"),
                    v(&format!("base{t}"))
                        + (v(r0) + v("r")) * v(&format!("s{t}_{row}"))
                        + (v(q0) + v("q")) * v(&format!("s{t}_{col}")),
                );
                let valid = Cond::and(
                    Cond::Lt(v(r0) + v("r"), v(&format!("e_{row}"))),
                    Cond::Lt(v(q0) + v("q"), v(&format!("e_{col}"))),
                );
                let copy = super::fetch::checked_copy(
                    fetch,
                    valid,
                    side.staged,
                    v("it"),
                    load,
                    Value::Zero { lanes: 1 },
                );
                self.each_element(side, copy)
            })
            .collect()
    }

    /// Store the staging registers into shared buffer `buf` (0 or 1), `[k][m]` for A
    /// (transposed) and `[k][n]` for B.
    fn stash(&self, buf: Expr) -> Vec<Stmt> {
        self.sides()
            .iter()
            .map(|side| {
                let (k, other) = if side.axes[0] == "k" {
                    (v("r"), v("q"))
                } else {
                    (v("q"), v("r"))
                };
                let at = buf.clone() * u(side.buffer_len(self.mk.bk))
                    + k * u(side.width + SHARED_PAD)
                    + other;
                self.each_element(
                    side,
                    store(side.tile, at, Value::load(side.staged, v("it"))),
                )
            })
            .collect()
    }

    /// Whether input `t`'s `axis` (`m`, `n` or `k`) is unit-stride.
    fn unit(&self, t: usize, axis: &str) -> bool {
        let a = match axis {
            "m" => self.g.m,
            "n" => self.g.n,
            _ => self.g.k,
        };
        self.w.inputs[t].axis_stride(a).simplify() == Expr::Const(1)
    }

    /// `acc[i][j] += A[kk][row i] * B[kk][column j]` over the tile's `bk` steps from
    /// shared buffer `buf`, each step checked against the reduction's extent with
    /// `check_k`. A thread's rows (columns) are read 4 at a time where they come in
    /// groups of 4 ([`spread`]).
    fn compute(&self, check_k: bool, buf: Expr) -> Stmt {
        let mk = self.mk;
        let read = |side: &Side| {
            let (var, count) = (side.var, side.per_thread);
            let row =
                buf.clone() * u(side.buffer_len(mk.bk)) + v("kk") * u(side.width + SHARED_PAD);
            if lanes(count) == 1 {
                return for_(
                    var,
                    u(count),
                    LoopKind::Unrolled(count as usize),
                    vec![store(
                        side.regs,
                        v(var),
                        Value::load(
                            side.tile,
                            row + spread(v(var), side.coord, side.threads(), 1),
                        ),
                    )],
                );
            }
            let group = format!("{var}g");
            let reg = format!("{}4", side.tile);
            for_(
                &group,
                u(count / 4),
                LoopKind::Unrolled(count as usize / 4),
                vec![
                    Stmt::Reg {
                        name: reg.clone(),
                        lanes: 4,
                        init: Value::vload(
                            side.tile,
                            row + spread(v(&group) * c(4), side.coord, side.threads(), 4),
                            4,
                        ),
                    },
                    for_(
                        "l",
                        c(4),
                        LoopKind::Unrolled(4),
                        vec![store(
                            side.regs,
                            v(&group) * c(4) + v("l"),
                            Value::Lane(reg, v("l")),
                        )],
                    ),
                ],
            )
        };
        let mut step: Vec<Stmt> = self.sides().iter().map(read).collect();
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
        let [a, b] = self.sides();
        let at_thread = |side: &Side| {
            spread(
                v(side.var),
                side.coord,
                side.threads(),
                lanes(side.per_thread),
            )
        };
        let mut st = vec![
            let_("m", v("m0") + at_thread(&a)),
            let_("n", v("n0") + at_thread(&b)),
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
