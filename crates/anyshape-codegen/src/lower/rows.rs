//! The row-wise sketch's lowering (softmax, layer norm, RMSNorm; see `sketch/rows.rs`):
//! ```text
//! [global padding: copy X into rows padded to whole steps]
//! parallel for task in ceil(rows / R):
//!   for each of its rows:
//!     softmax:    max over the row; y = exp(x - max), summed; y *= 1 / sum
//!     layer norm: mean; variance of x - mean; y = (x - mean) / √(var + ε)
//!     RMSNorm:    mean square; y = x / √(ms + ε)
//!     then the epilogue (its inputs read along the row: a scale, a bias)
//! [global padding: copy the padded Y back, the epilogue applied on the way]
//! ```
//! Each pass sweeps the row's whole `vectors x lanes` steps, then its tail by the
//! padding strategy's policy: local padding copies the tail into a step-sized buffer
//! filled with the identity of the pass (-inf for the maximum, 0 for a sum, the mean
//! for the centered squares) and runs it through the vector code, storing only its
//! valid part; a guarded fetch with partitioned compute runs it as a scalar loop;
//! checked compute runs the whole row element by element with a check on each. Under
//! global padding a softmax sweeps the padded row (filled with -inf); the sums of a
//! layer norm or RMSNorm stop at the row's end, its tail scalar.
use super::epilogue::chain_with;
use super::{c, renamed, shape_vars, v};
use crate::loop_ir::{
    for_, if_, let_, store, BinaryOp, Cond, Func, LoopKind, Scope, Stmt, UnaryOp, Value,
};
use crate::padding::{Compute, Fetch};
use crate::{CodegenError, CpuTarget, Program, Result, RowKernel};
use anyshape_ir::{Epilogue, Expr, Normalization, OpClass};

/// Lower a normalization program.
pub(crate) fn lower(p: &Program<RowKernel>, target: &CpuTarget) -> Result<Func> {
    p.micro_kernel.validate(target)?;
    let w = &p.workload;
    let OpClass::Normalization { kind, .. } = w.class else {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: "the row-wise sketch serves normalizations".into(),
        });
    };
    let (shape_vars, specialized) = shape_vars(p)?;
    let axes = w.output_axes();
    let (n_axis, row_axes) = axes.split_last().expect("a normalization has axes");
    let (x, y) = (&w.inputs[0], &w.output);
    let stride = |t: &anyshape_ir::TensorRef, axis: usize| renamed(&t.axis_stride(axis)).simplify();
    let unit = |t: &anyshape_ir::TensorRef| stride(t, *n_axis).as_const() == Some(1);
    if !unit(x) || !unit(y) || row_axes.len() != 1 {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: "the row-wise sketch needs one row axis and contiguous rows".into(),
        });
    }
    let m_axis = row_axes[0];
    // Epilogue inputs: along the row (contiguous, a scale or bias) or one per row.
    let mut inputs = Vec::new();
    let mut body = Vec::new();
    for t in 1..w.inputs.len() {
        let along = match stride(&w.inputs[t], *n_axis).as_const() {
            Some(1) => true,
            Some(0) => false,
            _ => {
                return Err(CodegenError::SketchNotApplicable {
                    workload: w.to_string(),
                    reason: "the row-wise sketch reads epilogue inputs contiguous along the row or one per row".into(),
                })
            }
        };
        body.push(let_(&format!("se{t}_m"), stride(&w.inputs[t], m_axis)));
        body.push(let_(&format!("eb{t}"), renamed(&w.inputs[t].base_offset())));
        inputs.push((t, along));
    }
    let mk = p.micro_kernel;
    let lanes = target.lanes_f32();
    let step = mk.step(target);
    let policy = p.strategy.policy();
    let softmax = kind == Normalization::Softmax;
    body.extend([
        let_("e_m", renamed(&w.axes[m_axis].extent)),
        let_("e_n", renamed(&w.axes[*n_axis].extent)),
        let_("sx_m", renamed(&x.axis_stride(m_axis))),
        let_("sy_m", renamed(&y.axis_stride(m_axis))),
        let_("bx0", renamed(&x.base_offset())),
        let_("by0", renamed(&y.base_offset())),
    ]);
    // Where the rows are read and written: the tensors, or their padded copies.
    let (xb, yb, xs, ys, bx, by) = if policy.copy {
        body.push(let_("p_n", Expr::round_up(v("e_n"), step as i64)));
        for (buf, slot) in [("Xg", 2), ("Yg", 3)] {
            body.push(Stmt::Alloc {
                buf: buf.into(),
                len: v("e_m") * v("p_n"),
                scope: Scope::Scratch(slot),
            });
        }
        let fill = if softmax {
            neg_inf(1)
        } else {
            Value::Zero { lanes: 1 }
        };
        let src = Value::Select(
            Cond::Lt(v("j"), v("e_n")),
            Box::new(Value::load("in0", v("bx0") + v("r") * v("sx_m") + v("j"))),
            Box::new(fill),
        );
        body.push(for_(
            "r",
            v("e_m"),
            LoopKind::Parallel,
            vec![for_(
                "j",
                v("p_n"),
                LoopKind::Serial,
                vec![store("Xg", v("r") * v("p_n") + v("j"), src)],
            )],
        ));
        ("Xg", "Yg", v("p_n"), v("p_n"), c(0), c(0))
    } else {
        ("in0", "out0", v("sx_m"), v("sy_m"), v("bx0"), v("by0"))
    };
    // Whole vector steps of a row and what is left.
    let n = if policy.copy && softmax {
        v("p_n")
    } else {
        v("e_n")
    };
    body.push(let_("nfull", n / c(step)));
    body.push(let_("ntail", v("e_n") - v("nfull") * c(step)));
    let rows = Row {
        xb,
        yb,
        kind,
        // Under global padding the epilogue runs as Y is copied back, on valid
        // elements only.
        epilogue: if policy.copy {
            Epilogue::none()
        } else {
            w.epilogue.clone()
        },
        inputs: inputs.clone(),
        lanes,
        vectors: mk.vectors,
        step,
        tail: if policy.copy && softmax {
            Tail::None
        } else if policy.copy {
            Tail::Scalar
        } else if policy.compute == Compute::Checked {
            Tail::Checked
        } else if policy.fetch == Fetch::ZeroFill {
            Tail::Padded
        } else {
            Tail::Scalar
        },
    };
    let mut row = vec![
        let_("row", v("t") * c(mk.rows) + v("r")),
        let_("bx", bx + v("row") * xs),
        let_("by", by + v("row") * ys),
    ];
    row.extend(rows.normalize());
    body.push(for_(
        "t",
        Expr::ceil_div(v("e_m"), c(mk.rows)),
        LoopKind::Parallel,
        vec![for_(
            "r",
            Expr::min(c(mk.rows), v("e_m") - v("t") * c(mk.rows)),
            LoopKind::Serial,
            row,
        )],
    ));
    if policy.copy {
        let value = chain_with(
            &w.epilogue,
            Value::load("Yg", v("r") * v("p_n") + v("j")),
            &|t| input_value(&inputs, t, v("r"), v("j"), 1),
        );
        body.push(for_(
            "r",
            v("e_m"),
            LoopKind::Parallel,
            vec![for_(
                "j",
                v("e_n"),
                LoopKind::Serial,
                vec![store("out0", v("by0") + v("r") * v("sy_m") + v("j"), value)],
            )],
        ));
    }
    Ok(Func {
        name: p.symbol(target),
        shape_vars,
        specialized,
        inputs: w.inputs.len(),
        threads: None,
        body,
    })
}

/// The value of epilogue input `t` at row `row`, element `j` (`lanes` of them from `j`
/// where it runs along the row; one broadcast where it is one per row).
fn input_value(inputs: &[(usize, bool)], t: usize, row: Expr, j: Expr, lanes: usize) -> Value {
    let along = inputs.iter().any(|&(u, along)| u == t && along);
    let base = v(&format!("eb{t}")) + row * v(&format!("se{t}_m"));
    let buf = format!("in{t}");
    match (along, lanes) {
        (true, 1) => Value::load(&buf, base + j),
        (true, _) => Value::vload(&buf, base + j, lanes),
        (false, _) => Value::load(&buf, base),
    }
}

/// -inf in `lanes` lanes: the identity of the maximum.
fn neg_inf(lanes: usize) -> Value {
    Value::Const {
        value: f64::NEG_INFINITY,
        lanes,
    }
}

/// How the tail of a row is handled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tail {
    /// There is none (the rows are padded to whole steps).
    None,
    /// Through the vector code from a -inf-filled step buffer; stores checked.
    Padded,
    /// A scalar loop over exactly the tail.
    Scalar,
    /// The whole row element by element, each checked.
    Checked,
}

/// One row's normalization, in passes.
struct Row {
    xb: &'static str,
    yb: &'static str,
    kind: Normalization,
    /// Applied to each result as it is stored.
    epilogue: Epilogue,
    /// The epilogue's inputs: their indices, and whether each runs along the row.
    inputs: Vec<(usize, bool)>,
    lanes: usize,
    vectors: usize,
    step: usize,
    tail: Tail,
}

impl Row {
    fn x(&self, j: Expr) -> Expr {
        v("bx") + j
    }

    fn y(&self, j: Expr) -> Expr {
        v("by") + j
    }

    /// The offset of vector `u` of step `q` in the row.
    fn at(&self, u: usize) -> Expr {
        v("q") * c(self.step) + c(u * self.lanes)
    }

    /// The offset in the row of tail element `e`.
    fn tail_j(&self) -> Expr {
        v("nfull") * c(self.step) + v("e")
    }

    /// The whole steps the vector code sweeps (none where every element is checked).
    fn whole_steps(&self) -> Expr {
        if self.tail == Tail::Checked {
            c(0)
        } else {
            v("nfull")
        }
    }

    /// `for q in steps { for u (unrolled) { body(u) } }`.
    fn steps(&self, extent: Expr, body: &dyn Fn(usize) -> Vec<Stmt>) -> Stmt {
        let inner: Vec<Stmt> = (0..self.vectors).flat_map(body).collect();
        for_("q", extent, LoopKind::Serial, inner)
    }

    /// Reduce the vector accumulators `name_u` (and the scalar `name_s`) with `op`: the
    /// vectors lane by lane first, then one horizontal reduction of what they come to.
    fn reduce(&self, name: &str, op: BinaryOp) -> Value {
        let vector = (0..self.vectors)
            .map(|u| Value::reg(&format!("{name}_{u}"), self.lanes))
            .reduce(|a, b| Value::binary(op, a, b))
            .expect("at least one vector");
        Value::binary(
            op,
            Value::Horizontal(op, Box::new(vector)),
            Value::reg(&format!("{name}_s"), 1),
        )
    }

    fn normalize(&self) -> Vec<Stmt> {
        let mut s = Vec::new();
        if self.tail == Tail::Padded {
            for buf in ["xt", "yt"] {
                s.push(Stmt::Alloc {
                    buf: buf.into(),
                    len: c(self.step),
                    scope: Scope::Stack,
                });
            }
        }
        let zero = Value::Zero { lanes: 1 };
        let scalar = |name: &str, init: Value| Stmt::Reg {
            name: name.into(),
            lanes: 1,
            init,
        };
        let div = |a: Value, b: Value| Value::binary(BinaryOp::Div, a, b);
        let one = Value::Const {
            value: 1.0,
            lanes: 1,
        };
        // 1 / √(sum / n + ε).
        let inverse_root = |sum: &str, epsilon: f64| {
            let mean = div(Value::reg(sum, 1), Value::Count(v("e_n")));
            let eps = Value::Const {
                value: epsilon,
                lanes: 1,
            };
            div(
                one.clone(),
                Value::unary(UnaryOp::Sqrt, Value::sum(mean, eps)),
            )
        };
        let times = |a: Value, b: &str| Value::binary(BinaryOp::Mul, a, Value::reg(b, 1));
        match self.kind {
            Normalization::Softmax => {
                s.extend(self.reduce_pass("mx", BinaryOp::Max, neg_inf(1), &|x| x));
                s.extend(self.exp_pass());
                s.push(scalar(
                    "inv",
                    div(one.clone(), self.reduce("sm", BinaryOp::Add)),
                ));
                s.extend(self.map_pass(false, &|y| times(y, "inv")));
            }
            Normalization::LayerNorm { epsilon } => {
                s.extend(self.reduce_pass("sm", BinaryOp::Add, zero, &|x| x));
                s.push(scalar(
                    "mean",
                    div(Value::reg("sm", 1), Value::Count(v("e_n"))),
                ));
                let centered = |x: Value| Value::binary(BinaryOp::Sub, x, Value::reg("mean", 1));
                // The tail's padding is the mean: its centered square is 0.
                s.extend(
                    self.reduce_pass("sq", BinaryOp::Add, Value::reg("mean", 1), &|x| {
                        Value::binary(BinaryOp::Mul, centered(x.clone()), centered(x))
                    }),
                );
                s.push(scalar("rs", inverse_root("sq", epsilon.0)));
                s.extend(self.map_pass(true, &|x| times(centered(x), "rs")));
            }
            Normalization::RmsNorm { epsilon } => {
                s.extend(self.reduce_pass("sq", BinaryOp::Add, zero, &|x| {
                    Value::binary(BinaryOp::Mul, x.clone(), x)
                }));
                s.push(scalar("rs", inverse_root("sq", epsilon.0)));
                s.extend(self.map_pass(true, &|x| times(x, "rs")));
            }
        }
        s
    }

    /// The scalar register `name`: `op` over `f` of the row's elements, the tail
    /// padded with `fill` where local padding runs it through the vector code (`f` of
    /// `fill` must be the identity of `op`).
    fn reduce_pass(
        &self,
        name: &str,
        op: BinaryOp,
        fill: Value,
        f: &dyn Fn(Value) -> Value,
    ) -> Vec<Stmt> {
        let lanes = self.lanes;
        let identity = |lanes: usize| match op {
            BinaryOp::Max => neg_inf(lanes),
            _ => Value::Zero { lanes },
        };
        let mut s: Vec<Stmt> = (0..self.vectors)
            .map(|u| Stmt::Reg {
                name: format!("{name}_{u}"),
                lanes,
                init: identity(lanes),
            })
            .collect();
        s.push(Stmt::Reg {
            name: format!("{name}_s"),
            lanes: 1,
            init: identity(1),
        });
        let vector = |u: usize, src: Value| Stmt::Assign {
            reg: format!("{name}_{u}"),
            value: Value::binary(op, Value::reg(&format!("{name}_{u}"), lanes), f(src)),
        };
        let scalar = |src: Value| Stmt::Assign {
            reg: format!("{name}_s"),
            value: Value::binary(op, Value::reg(&format!("{name}_s"), 1), f(src)),
        };
        s.push(self.steps(self.whole_steps(), &|u| {
            vec![vector(u, Value::vload(self.xb, self.x(self.at(u)), lanes))]
        }));
        match self.tail {
            Tail::None => {}
            Tail::Padded => {
                // Nothing to do where the row is whole steps (BERT's 768: no tail).
                let mut tail = vec![for_(
                    "e",
                    c(self.step),
                    LoopKind::Serial,
                    vec![crate::lower::fetch::checked_copy(
                        Fetch::ZeroFill,
                        Cond::Lt(v("e"), v("ntail")),
                        "xt",
                        v("e"),
                        Value::load(self.xb, self.x(self.tail_j())),
                        fill,
                    )],
                )];
                for u in 0..self.vectors {
                    tail.push(vector(u, Value::vload("xt", c(u * lanes), lanes)));
                }
                s.push(if_(Cond::Lt(c(0), v("ntail")), tail));
            }
            Tail::Scalar => s.push(for_(
                "e",
                v("ntail"),
                LoopKind::Serial,
                vec![scalar(Value::load(self.xb, self.x(self.tail_j())))],
            )),
            Tail::Checked => {
                s.push(self.checked(vec![scalar(Value::load(self.xb, self.x(v("j"))))]))
            }
        }
        s.push(Stmt::Reg {
            name: name.into(),
            lanes: 1,
            init: self.reduce(name, op),
        });
        s
    }

    /// A softmax's second pass: `y = exp(x - mx)` stored (the padded tail into `yt`)
    /// and summed into `sm`.
    fn exp_pass(&self) -> Vec<Stmt> {
        let lanes = self.lanes;
        let mut s = Vec::new();
        for u in 0..self.vectors {
            s.push(Stmt::Reg {
                name: format!("sm_{u}"),
                lanes,
                init: Value::Zero { lanes },
            });
        }
        s.push(Stmt::Reg {
            name: "sm_s".into(),
            lanes: 1,
            init: Value::Zero { lanes: 1 },
        });
        let exp = |src: Value| {
            Value::unary(
                UnaryOp::Exp,
                Value::binary(BinaryOp::Sub, src, Value::reg("mx", 1)),
            )
        };
        let vexp = |u: usize, src: Value, dst: &str, at: Expr| {
            vec![
                Stmt::Reg {
                    name: format!("ev_{u}"),
                    lanes,
                    init: exp(src),
                },
                store(dst, at, Value::reg(&format!("ev_{u}"), lanes)),
                Stmt::Assign {
                    reg: format!("sm_{u}"),
                    value: Value::sum(
                        Value::reg(&format!("sm_{u}"), lanes),
                        Value::reg(&format!("ev_{u}"), lanes),
                    ),
                },
            ]
        };
        s.push(self.steps(self.whole_steps(), &|u| {
            vexp(
                u,
                Value::vload(self.xb, self.x(self.at(u)), lanes),
                self.yb,
                self.y(self.at(u)),
            )
        }));
        let sexp = |src: Value, at: Expr| {
            vec![
                Stmt::Reg {
                    name: "es".into(),
                    lanes: 1,
                    init: exp(src),
                },
                store(self.yb, at, Value::reg("es", 1)),
                Stmt::Assign {
                    reg: "sm_s".into(),
                    value: Value::sum(Value::reg("sm_s", 1), Value::reg("es", 1)),
                },
            ]
        };
        let tail_j = self.tail_j();
        match self.tail {
            Tail::None => {}
            Tail::Padded => {
                let tail = (0..self.vectors).flat_map(|u| {
                    vexp(
                        u,
                        Value::vload("xt", c(u * lanes), lanes),
                        "yt",
                        c(u * lanes),
                    )
                });
                s.push(if_(Cond::Lt(c(0), v("ntail")), tail.collect()));
            }
            Tail::Scalar => s.push(for_(
                "e",
                v("ntail"),
                LoopKind::Serial,
                sexp(Value::load(self.xb, self.x(tail_j.clone())), self.y(tail_j)),
            )),
            Tail::Checked => {
                s.push(self.checked(sexp(Value::load(self.xb, self.x(v("j"))), self.y(v("j")))))
            }
        }
        s
    }

    /// The last pass: `y = epilogue(f(value))` stored, the value read from X
    /// (`from_x`; the padded tail from `xt`) or from what an earlier pass stored in Y
    /// (the padded tail from `yt`).
    fn map_pass(&self, from_x: bool, f: &dyn Fn(Value) -> Value) -> Vec<Stmt> {
        let (src, tail_buf) = if from_x {
            (self.xb, "xt")
        } else {
            (self.yb, "yt")
        };
        let at = |j: Expr| if from_x { self.x(j) } else { self.y(j) };
        let value = |load: Value, j: Expr, lanes: usize| {
            chain_with(&self.epilogue, f(load), &|t| {
                input_value(&self.inputs, t, v("row"), j.clone(), lanes)
            })
        };
        let lanes = self.lanes;
        let mut s = vec![self.steps(self.whole_steps(), &|u| {
            let j = self.at(u);
            let load = Value::vload(src, at(j.clone()), lanes);
            vec![store(self.yb, self.y(j.clone()), value(load, j, lanes))]
        })];
        let tail_j = self.tail_j();
        let scalar_store =
            |load: Value, j: Expr| store(self.yb, self.y(j.clone()), value(load, j, 1));
        match self.tail {
            Tail::None => {}
            Tail::Padded => s.push(for_(
                "e",
                v("ntail"),
                LoopKind::Serial,
                vec![scalar_store(Value::load(tail_buf, v("e")), tail_j)],
            )),
            Tail::Scalar => s.push(for_(
                "e",
                v("ntail"),
                LoopKind::Serial,
                vec![scalar_store(Value::load(src, at(tail_j.clone())), tail_j)],
            )),
            Tail::Checked => {
                s.push(self.checked(vec![scalar_store(Value::load(src, at(v("j"))), v("j"))]))
            }
        }
        s
    }

    /// The row as whole steps, element by element, `body` where `j` is in the row.
    fn checked(&self, body: Vec<Stmt>) -> Stmt {
        for_(
            "q",
            Expr::ceil_div(v("e_n"), c(self.step)),
            LoopKind::Serial,
            vec![for_(
                "e",
                c(self.step),
                LoopKind::Serial,
                vec![
                    let_("j", v("q") * c(self.step) + v("e")),
                    if_(Cond::Lt(v("j"), v("e_n")), body),
                ],
            )],
        )
    }
}
