//! Lowering: a [`Program`] (contraction sketch + micro-kernel + padding strategy + mode)
//! to a loop-IR [`Func`].
//!
//! Structure of every lowered contraction (see `sketch` for the parameters):
//! ```text
//! [global-pad: copy inputs into zero-padded buffers]
//! parallel for task in batch x tiles_n x tiles_m (M tiles fastest):
//!   if this thread does not hold the B panel of (batch, N tile) yet:
//!     fetch: pack the K x nc panel of B                                -- checks/zero-fill here
//!   for kt in tiles_k:
//!     fetch:   pack the A block (mc x kc)                              -- checks/zero-fill here
//!     compute: for each register tile: mr x nr accumulators over the packed panels
//!     write-back: store (kt == 0) or accumulate into the output        -- checks here
//!   [epilogue over the task's output tile]
//! [global-pad: copy the padded output back]
//! ```
use crate::loop_ir::{
    for_, if_, let_, shape_var_name, store, Cond, Func, LoopKind, Scope, Stmt, Value,
};
use crate::{CodegenError, CpuTarget, GemmView, KernelMode, PaddingStrategy, Program, Result};
use anyshape_ir::{Epilogue, Expr};

fn v(name: &str) -> Expr {
    Expr::var(name)
}

fn c(x: usize) -> Expr {
    Expr::Const(x as i64)
}

/// How the main loop nest addresses one operand: buffer, per-batch base offset and the
/// strides of its two GEMM axes (row = M or N, col = K or N).
struct Operand {
    buf: &'static str,
    base: Expr,
    s_row: Expr,
    s_col: Expr,
}

/// Everything the main loop nest needs to know.
struct Nest<'a> {
    p: &'a Program,
    lanes: usize,
}

/// Lower a program for a target.
pub fn lower(p: &Program, target: &CpuTarget) -> Result<Func> {
    p.micro_kernel.validate(target)?;
    p.workload.validate()?;
    let w = &p.workload;
    let g = GemmView::of(w)?;
    let shape_vars = w.shape_vars();
    let specialized = match p.mode {
        KernelMode::Symbolic => None,
        KernelMode::Specialized => {
            w.bind(&p.bindings)?;
            let values = shape_vars.iter().map(|s| {
                p.bindings
                    .get(s)
                    .ok_or_else(|| CodegenError::Unspecialized(format!("`{s}` has no value")))
            });
            Some(values.collect::<Result<Vec<_>>>()?)
        }
    };
    let rename = |e: &Expr| e.map_vars(&mut |name| v(&shape_var_name(name)));
    let mk = p.micro_kernel;
    let mut body = Vec::new();

    // Extents and strides, named once.
    let batch_ext: Vec<Expr> = g.batch.iter().map(|&a| rename(&w.axes[a].extent)).collect();
    let e_b = batch_ext
        .iter()
        .fold(Expr::Const(1), |acc, e| acc * e.clone());
    for (name, e) in [
        ("e_b", e_b),
        ("e_m", rename(&w.axes[g.m].extent)),
        ("e_n", rename(&w.axes[g.n].extent)),
        ("e_k", rename(&w.axes[g.k].extent)),
    ] {
        body.push(let_(name, e));
    }
    let (a, b, out) = (&w.inputs[0], &w.inputs[1], &w.output);
    let mut strides = std::collections::HashMap::new();
    for (name, t, axis) in [
        ("sa_m", a, g.m),
        ("sa_k", a, g.k),
        ("sb_n", b, g.n),
        ("sb_k", b, g.k),
        ("sc_m", out, g.m),
        ("sc_n", out, g.n),
    ] {
        let e = rename(&t.axis_stride(axis));
        // Constant strides stay visible to the code below (contiguity decides vector
        // stores and the packing loop order); others are read through their name.
        strides.insert(
            name,
            if e.as_const().is_some() {
                e.clone()
            } else {
                v(name)
            },
        );
        body.push(let_(name, e));
    }
    // Base offset of each tensor for the flat batch index held in `bt_var`.
    let batch_bases = |bt_var: &str, prefix: &str, stmts: &mut Vec<Stmt>| -> [Expr; 3] {
        let mut inner = Expr::Const(1);
        let mut idx = Vec::new();
        for (j, e) in batch_ext.iter().enumerate().rev() {
            let name = format!("{prefix}bi{j}");
            stmts.push(let_(&name, v(bt_var) / inner.clone() % e.clone()));
            inner = inner * e.clone();
            idx.push((g.batch[j], name));
        }
        [a, b, out].map(|t| {
            idx.iter()
                .fold(rename(&t.base_offset()), |acc, (axis, name)| {
                    acc + v(name) * rename(&t.axis_stride(*axis))
                })
        })
    };

    let nest = Nest {
        p,
        lanes: target.lanes_f32(),
    };
    let global = p.strategy == PaddingStrategy::GlobalPad;
    if global {
        // Padded extents: every axis rounded up to its register-tile granularity.
        body.push(let_("p_m", Expr::round_up(v("e_m"), mk.mr as i64)));
        body.push(let_("p_n", Expr::round_up(v("e_n"), mk.nr as i64)));
        body.push(let_("p_k", Expr::round_up(v("e_k"), mk.uk as i64)));
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
        for (buf, src, rows, ext, s_row, s_col, which) in [
            ("Ag", "in0", "p_m", "e_m", "sa_m", "sa_k", 0),
            ("Bg", "in1", "p_n", "e_n", "sb_n", "sb_k", 1),
        ] {
            let mut task = vec![let_("bt", v("t") / v(rows)), let_("r", v("t") % v(rows))];
            let bases = batch_bases("bt", "", &mut task);
            let valid = Cond::and(Cond::Lt(v("r"), v(ext)), Cond::Lt(v("kk"), v("e_k")));
            let src_idx = bases[which].clone() + v("r") * v(s_row) + v("kk") * v(s_col);
            let value = Value::Select(
                valid,
                Box::new(Value::load(src, src_idx)),
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
    } else {
        for (p_name, e_name) in [("p_m", "e_m"), ("p_n", "e_n"), ("p_k", "e_k")] {
            body.push(let_(p_name, v(e_name)));
        }
    }

    body.push(let_("tiles_m", Expr::ceil_div(v("p_m"), c(mk.mc))));
    body.push(let_("tiles_n", Expr::ceil_div(v("p_n"), c(mk.nc))));
    body.push(let_(
        "tiles_k",
        Expr::max(Expr::Const(1), Expr::ceil_div(v("p_k"), c(mk.kc))),
    ));
    let mut task = vec![
        // M tiles vary fastest, so consecutive tasks of a thread share the packed B panel.
        let_("it", v("t") % v("tiles_m")),
        let_("jt", v("t") / v("tiles_m") % v("tiles_n")),
        let_("bt", v("t") / (v("tiles_n") * v("tiles_m"))),
    ];
    let operands = if global {
        [
            Operand {
                buf: "Ag",
                base: v("bt") * v("p_m") * v("p_k"),
                s_row: v("p_k"),
                s_col: c(1),
            },
            Operand {
                buf: "Bg",
                base: v("bt") * v("p_n") * v("p_k"),
                s_row: v("p_k"),
                s_col: c(1),
            },
            Operand {
                buf: "Cg",
                base: v("bt") * v("p_m") * v("p_n"),
                s_row: v("p_n"),
                s_col: c(1),
            },
        ]
    } else {
        let [ba, bb, bc] = batch_bases("bt", "", &mut task);
        [
            Operand {
                buf: "in0",
                base: ba,
                s_row: strides["sa_m"].clone(),
                s_col: strides["sa_k"].clone(),
            },
            Operand {
                buf: "in1",
                base: bb,
                s_row: strides["sb_n"].clone(),
                s_col: strides["sb_k"].clone(),
            },
            Operand {
                buf: "out0",
                base: bc,
                s_row: strides["sc_m"].clone(),
                s_col: strides["sc_n"].clone(),
            },
        ]
    };
    for (i, op) in operands.iter().enumerate() {
        task.push(let_(&format!("base{i}"), op.base.clone()));
    }
    task.extend(nest.task_body(&operands));
    if !global && w.epilogue != Epilogue::None {
        task.push(epilogue_tile(w.epilogue));
    }
    body.push(for_(
        "t",
        v("e_b") * v("tiles_m") * v("tiles_n"),
        LoopKind::Parallel,
        task,
    ));

    if global {
        // Slice the padded output back, applying the epilogue on the way.
        let mut task = vec![let_("bt", v("t") / v("e_m")), let_("r", v("t") % v("e_m"))];
        let bases = batch_bases("bt", "", &mut task);
        let src = Value::load("Cg", (v("bt") * v("p_m") + v("r")) * v("p_n") + v("j"));
        let value = if w.epilogue == Epilogue::Relu {
            Value::Relu(Box::new(src))
        } else {
            src
        };
        let dst = bases[2].clone() + v("r") * v("sc_m") + v("j") * v("sc_n");
        task.push(for_(
            "j",
            v("e_n"),
            LoopKind::Serial,
            vec![store("out0", dst, value)],
        ));
        body.push(for_("t", v("e_b") * v("e_m"), LoopKind::Parallel, task));
    }

    Ok(Func {
        name: p.symbol(target),
        shape_vars,
        specialized,
        inputs: w.inputs.len(),
        body,
    })
}

/// Apply the epilogue to the valid part of the task's output tile.
fn epilogue_tile(epilogue: Epilogue) -> Stmt {
    let idx = v("base2") + (v("m0") + v("i")) * v("sc_m") + (v("n0") + v("j")) * v("sc_n");
    let value = match epilogue {
        Epilogue::Relu => Value::Relu(Box::new(Value::load("out0", idx.clone()))),
        Epilogue::None => Value::load("out0", idx.clone()),
    };
    for_(
        "i",
        v("mlen"),
        LoopKind::Serial,
        vec![for_(
            "j",
            v("nlen"),
            LoopKind::Serial,
            vec![store("out0", idx, value)],
        )],
    )
}

impl Nest<'_> {
    fn mk(&self) -> crate::MicroKernel {
        self.p.micro_kernel
    }

    /// Whether the compute stage may assume full register tiles everywhere.
    fn padded(&self) -> bool {
        matches!(
            self.p.strategy,
            PaddingStrategy::LocalPad | PaddingStrategy::GlobalPad
        )
    }

    fn task_body(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let mk = self.mk();
        let mut s = vec![
            let_("m0", v("it") * c(mk.mc)),
            let_("n0", v("jt") * c(mk.nc)),
            let_("mlen", Expr::min(c(mk.mc), v("p_m") - v("m0"))),
            let_("nlen", Expr::min(c(mk.nc), v("p_n") - v("n0"))),
            let_("nmb", Expr::ceil_div(v("mlen"), c(mk.mr))),
            let_("nnb", Expr::ceil_div(v("nlen"), c(mk.nr))),
            Stmt::Alloc {
                buf: "Ap".into(),
                len: c(mk.mc * mk.kc),
                scope: Scope::Scratch(0),
            },
            Stmt::Alloc {
                buf: "Bp".into(),
                len: v("tiles_k") * c(mk.kc * mk.nc),
                scope: Scope::Scratch(1),
            },
        ];
        let klen = Expr::max(Expr::Const(0), Expr::min(c(mk.kc), v("p_k") - v("k0")));
        let kp = match self.p.strategy {
            PaddingStrategy::LocalPad => Expr::round_up(v("klen"), mk.uk as i64),
            _ => v("klen"),
        };
        let kt_lets = vec![
            let_("k0", v("kt") * c(mk.kc)),
            let_("klen", klen),
            let_("kp", kp),
            let_("bofs", v("kt") * c(mk.kc * mk.nc)),
        ];
        // The whole K x nc panel of B is packed once per thread and (batch, N tile).
        let pack_b = [kt_lets.clone(), vec![self.pack(1, &ops[1])]].concat();
        let claim = Cond::Claim {
            slot: 1,
            key: v("bt") * v("tiles_n") + v("jt"),
        };
        s.push(if_(
            claim,
            vec![for_("kt", v("tiles_k"), LoopKind::Serial, pack_b)],
        ));
        let mut kt_body = kt_lets;
        kt_body.push(self.pack(0, &ops[0]));
        let tile = vec![
            let_("mi", v("m0") + v("ib") * c(mk.mr)),
            let_("nj", v("n0") + v("jb") * c(mk.nr)),
        ];
        let tile_body: Vec<Stmt> = match self.p.strategy {
            PaddingStrategy::GlobalPad => [tile, self.fast_tile(&ops[2], false)].concat(),
            PaddingStrategy::LocalPad => [tile, self.fast_tile(&ops[2], true)].concat(),
            PaddingStrategy::BoundaryCheck => [tile, self.checked_tile(&ops[2])].concat(),
            PaddingStrategy::LoopPartition => {
                let mut t = tile;
                t.push(Stmt::If {
                    cond: self.full_tile(),
                    then: self.fast_tile(&ops[2], false),
                    otherwise: self.checked_tile(&ops[2]),
                });
                t
            }
        };
        kt_body.push(for_(
            "jb",
            v("nnb"),
            LoopKind::Serial,
            vec![for_("ib", v("nmb"), LoopKind::Serial, tile_body)],
        ));
        s.push(for_("kt", v("tiles_k"), LoopKind::Serial, kt_body));
        s
    }

    /// Fetch stage: pack the current `kt` slice of operand `which` (0: the M side into
    /// `Ap`, 1: the N side into `Bp`). Layout: register block `rb` holds `kc x reg`
    /// elements, `kk`-major.
    fn pack(&self, which: usize, op: &Operand) -> Stmt {
        let mk = self.mk();
        let (dst, rb, nblocks, reg, origin, extent) = match which {
            0 => ("Ap", "ib", "nmb", mk.mr, "m0", "e_m"),
            _ => ("Bp", "jb", "nnb", mk.nr, "n0", "e_n"),
        };
        let kc = self.mk().kc;
        let row = v(origin) + v(rb) * c(reg) + v("rr");
        let src_idx = v(&format!("base{which}"))
            + row.clone() * op.s_row.clone()
            + (v("k0") + v("kk")) * op.s_col.clone();
        let panel = if which == 0 { c(0) } else { v("bofs") };
        let dst_idx = panel + v(rb) * c(kc * reg) + v("kk") * c(reg) + v("rr");
        let load = Value::load(op.buf, src_idx);
        let valid = Cond::and(
            Cond::Lt(row, v(extent)),
            Cond::Lt(v("k0") + v("kk"), v("e_k")),
        );
        let kk_extent = match self.p.strategy {
            PaddingStrategy::GlobalPad | PaddingStrategy::LocalPad => v("kp"),
            _ => v("klen"),
        };
        let unchecked = store(dst, dst_idx.clone(), load.clone());
        let checked = match self.p.strategy {
            PaddingStrategy::LocalPad => store(
                dst,
                dst_idx,
                Value::Select(valid, Box::new(load), Box::new(Value::Zero { lanes: 1 })),
            ),
            _ => if_(valid, vec![store(dst, dst_idx, load)]),
        };
        // Write the packed panel contiguously (register-tile rows innermost): measured
        // faster than walking a K-contiguous source, whose writes then stride by `reg`.
        let (outer, inner) = (("kk", kk_extent.clone()), ("rr", c(reg)));
        let nest = |copy: Stmt| {
            for_(
                outer.0,
                outer.1.clone(),
                LoopKind::Serial,
                vec![for_(inner.0, inner.1.clone(), LoopKind::Serial, vec![copy])],
            )
        };
        // Blocks wholly inside the tensor are copied without checks (so the compiler can
        // vectorize the copy); only edge blocks check each element.
        let body = match self.p.strategy {
            PaddingStrategy::GlobalPad => nest(unchecked),
            _ => {
                let inside = Cond::and(
                    Cond::Le(v(origin) + v(rb) * c(reg) + c(reg), v(extent)),
                    Cond::Le(v("k0") + kk_extent, v("e_k")),
                );
                Stmt::If {
                    cond: inside,
                    then: vec![nest(unchecked)],
                    otherwise: vec![nest(checked)],
                }
            }
        };
        for_(rb, v(nblocks), LoopKind::Serial, vec![body])
    }

    /// Whether the register tile at (`mi`, `nj`) lies wholly inside the output.
    fn full_tile(&self) -> Cond {
        let mk = self.mk();
        Cond::and(
            Cond::Le(v("mi") + c(mk.mr), v("e_m")),
            Cond::Le(v("nj") + c(mk.nr), v("e_n")),
        )
    }

    fn acc(i: usize, j: usize) -> String {
        format!("acc_{i}_{j}")
    }

    /// Unchecked vectorized register tile; `checked_writeback` stores partial tiles
    /// element by element.
    fn fast_tile(&self, out: &Operand, checked_writeback: bool) -> Vec<Stmt> {
        let mk = self.mk();
        let (lanes, nv) = (self.lanes, mk.nr / self.lanes);
        let mut s = Vec::new();
        for i in 0..mk.mr {
            for j in 0..nv {
                s.push(Stmt::Reg {
                    name: Self::acc(i, j),
                    lanes,
                    init: Value::Zero { lanes },
                });
            }
        }
        let mut step = vec![];
        for j in 0..nv {
            let idx = v("bofs") + v("jb") * c(mk.kc * mk.nr) + v("kk") * c(mk.nr) + c(j * lanes);
            step.push(Stmt::Reg {
                name: format!("b_{j}"),
                lanes,
                init: Value::vload("Bp", idx, lanes),
            });
        }
        for i in 0..mk.mr {
            let a = Value::load("Ap", v("ib") * c(mk.kc * mk.mr) + v("kk") * c(mk.mr) + c(i));
            for j in 0..nv {
                let value = Value::Fma(
                    Box::new(Value::reg(&format!("b_{j}"), lanes)),
                    Box::new(a.clone()),
                    Box::new(Value::reg(&Self::acc(i, j), lanes)),
                );
                step.push(Stmt::Assign {
                    reg: Self::acc(i, j),
                    value,
                });
            }
        }
        if self.padded() {
            // kp is a multiple of uk: an outer loop and a fully unrolled inner one.
            let mut inner = vec![let_("kk", v("kq") * c(mk.uk) + v("u"))];
            inner.extend(step);
            s.push(for_(
                "kq",
                v("kp") / c(mk.uk),
                LoopKind::Serial,
                vec![for_("u", c(mk.uk), LoopKind::Unrolled(mk.uk), inner)],
            ));
        } else {
            s.push(for_("kk", v("klen"), LoopKind::Unrolled(mk.uk), step));
        }
        let out_idx = |i: usize, col: Expr| {
            v("base2") + (v("mi") + c(i)) * out.s_row.clone() + (v("nj") + col) * out.s_col.clone()
        };
        let contiguous = out.s_col.simplify().as_const() == Some(1);
        let full_store = |accumulate: bool| -> Vec<Stmt> {
            let mut st = Vec::new();
            for i in 0..mk.mr {
                for j in 0..nv {
                    let reg = Value::reg(&Self::acc(i, j), lanes);
                    if contiguous {
                        let idx = out_idx(i, c(j * lanes));
                        let value = if accumulate {
                            Value::sum(Value::vload(out.buf, idx.clone(), lanes), reg)
                        } else {
                            reg
                        };
                        st.push(store(out.buf, idx, value));
                    } else {
                        st.push(Self::lane_store(
                            out,
                            out_idx(i, c(j * lanes) + v("l")),
                            &Self::acc(i, j),
                            accumulate,
                            lanes,
                            None,
                        ));
                    }
                }
            }
            st
        };
        let by_kt = |f: &dyn Fn(bool) -> Vec<Stmt>| Stmt::If {
            cond: Cond::Eq(v("kt"), c(0)),
            then: f(false),
            otherwise: f(true),
        };
        let full = by_kt(&full_store);
        if !checked_writeback {
            s.push(full);
            return s;
        }
        let partial_store = |accumulate: bool| -> Vec<Stmt> {
            let mut st = Vec::new();
            for i in 0..mk.mr {
                let mut row = Vec::new();
                for j in 0..nv {
                    let col_ok = Cond::Lt(v("nj") + c(j * lanes) + v("l"), v("e_n"));
                    row.push(Self::lane_store(
                        out,
                        out_idx(i, c(j * lanes) + v("l")),
                        &Self::acc(i, j),
                        accumulate,
                        lanes,
                        Some(col_ok),
                    ));
                }
                st.push(if_(Cond::Lt(v("mi") + c(i), v("e_m")), row));
            }
            st
        };
        s.push(Stmt::If {
            cond: self.full_tile(),
            then: vec![full],
            otherwise: vec![by_kt(&partial_store)],
        });
        s
    }

    /// Store each lane of a vector register at `idx` (which uses loop var `l`), optionally checked.
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

    /// Register tile with a boundary check on every element in the compute stage.
    fn checked_tile(&self, out: &Operand) -> Vec<Stmt> {
        let mk = self.mk();
        let valid = || {
            Cond::and(
                Cond::Lt(v("mi") + v("i"), v("e_m")),
                Cond::Lt(v("nj") + v("j"), v("e_n")),
            )
        };
        let acc_idx = v("i") * c(mk.nr) + v("j");
        let a = Value::load(
            "Ap",
            v("ib") * c(mk.kc * mk.mr) + v("kk") * c(mk.mr) + v("i"),
        );
        let b = Value::load(
            "Bp",
            v("bofs") + v("jb") * c(mk.kc * mk.nr) + v("kk") * c(mk.nr) + v("j"),
        );
        let fma = Value::Fma(
            Box::new(b),
            Box::new(a),
            Box::new(Value::load("acc", acc_idx.clone())),
        );
        let out_idx = v("base2")
            + (v("mi") + v("i")) * out.s_row.clone()
            + (v("nj") + v("j")) * out.s_col.clone();
        let acc = Value::load("acc", acc_idx.clone());
        let write = Value::Select(
            Cond::Eq(v("kt"), c(0)),
            Box::new(acc.clone()),
            Box::new(Value::sum(Value::load(out.buf, out_idx.clone()), acc)),
        );
        let ij = |body: Vec<Stmt>| {
            for_(
                "i",
                c(mk.mr),
                LoopKind::Unrolled(mk.mr),
                vec![for_("j", c(mk.nr), LoopKind::Serial, body)],
            )
        };
        vec![
            Stmt::Alloc {
                buf: "acc".into(),
                len: c(mk.mr * mk.nr),
                scope: Scope::Stack,
            },
            ij(vec![store(
                "acc",
                acc_idx.clone(),
                Value::Zero { lanes: 1 },
            )]),
            for_(
                "kk",
                v("klen"),
                LoopKind::Serial,
                vec![ij(vec![if_(valid(), vec![store("acc", acc_idx, fma)])])],
            ),
            ij(vec![if_(valid(), vec![store(out.buf, out_idx, write)])]),
        ]
    }
}
