//! The row-wise sketch's lowering (softmax; see `sketch/rows.rs`):
//! ```text
//! [global padding: copy X into rows padded to whole steps, filled with -inf]
//! parallel for task in ceil(rows / R):
//!   for each of its rows:
//!     max:   vector maxima over the row's whole steps; the tail by the policy
//!     exp:   y = exp(x - max) over the row, summed (vectors, then the tail)
//!     scale: y *= 1 / sum, then the epilogue        (checked stores for the tail)
//! [global padding: copy the padded Y back]
//! ```
//! The tail of a row (what is left after its whole `vectors x lanes` steps), by the
//! padding strategy's policy: local padding copies it into a step-sized buffer filled
//! with -inf (the identity of the maximum, whose exponential is the identity of the
//! sum) and runs it through the vector code, storing only its valid part; a guarded
//! fetch with partitioned compute runs it as a scalar loop; checked compute runs the
//! whole row element by element with a check on each.
use super::epilogue::chain_value;
use super::{c, renamed, shape_vars, v};
use crate::loop_ir::{
    for_, if_, let_, store, BinaryOp, Cond, Func, LoopKind, Scope, Stmt, UnaryOp, Value,
};
use crate::padding::{Compute, Fetch};
use crate::{CodegenError, CpuTarget, Program, Result, RowKernel};
use anyshape_ir::Expr;

/// Lower a normalization program.
pub(crate) fn lower(p: &Program<RowKernel>, target: &CpuTarget) -> Result<Func> {
    p.micro_kernel.validate(target)?;
    let w = &p.workload;
    let (shape_vars, specialized) = shape_vars(p)?;
    let axes = w.output_axes();
    let (n_axis, row_axes) = axes.split_last().expect("a normalization has axes");
    let (x, y) = (&w.inputs[0], &w.output);
    let unit = |t: &anyshape_ir::TensorRef| renamed(&t.axis_stride(*n_axis)).as_const() == Some(1);
    if !unit(x) || !unit(y) || row_axes.len() != 1 {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: "the row-wise sketch needs one row axis and contiguous rows".into(),
        });
    }
    if w.epilogue.ops().iter().any(|op| op.input().is_some()) {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: "the row-wise sketch fuses epilogue ops without inputs only".into(),
        });
    }
    let m_axis = row_axes[0];
    let mk = p.micro_kernel;
    let lanes = target.lanes_f32();
    let step = mk.step(target);
    let policy = p.strategy.policy();
    let mut body = vec![
        let_("e_m", renamed(&w.axes[m_axis].extent)),
        let_("e_n", renamed(&w.axes[*n_axis].extent)),
        let_("sx_m", renamed(&x.axis_stride(m_axis))),
        let_("sy_m", renamed(&y.axis_stride(m_axis))),
        let_("bx0", renamed(&x.base_offset())),
        let_("by0", renamed(&y.base_offset())),
    ];
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
        let src = Value::Select(
            Cond::Lt(v("j"), v("e_n")),
            Box::new(Value::load("in0", v("bx0") + v("r") * v("sx_m") + v("j"))),
            Box::new(neg_inf(1)),
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
    let n = if policy.copy { v("p_n") } else { v("e_n") };
    body.push(let_("nfull", n / c(step)));
    body.push(let_("ntail", v("e_n") - v("nfull") * c(step)));
    let rows = Row {
        xb,
        yb,
        epilogue: w.epilogue.clone(),
        lanes,
        vectors: mk.vectors,
        step,
        tail: if policy.copy {
            Tail::None
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
    row.extend(rows.softmax());
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
        body.push(for_(
            "r",
            v("e_m"),
            LoopKind::Parallel,
            vec![for_(
                "j",
                v("e_n"),
                LoopKind::Serial,
                vec![store(
                    "out0",
                    v("by0") + v("r") * v("sy_m") + v("j"),
                    Value::load("Yg", v("r") * v("p_n") + v("j")),
                )],
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

/// One row's softmax, in the three passes.
struct Row {
    xb: &'static str,
    yb: &'static str,
    /// Applied to each probability as it is scaled (ops without inputs).
    epilogue: anyshape_ir::Epilogue,
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

    fn softmax(&self) -> Vec<Stmt> {
        let (lanes, step) = (self.lanes, self.step);
        let vectors = if self.tail == Tail::Checked {
            c(0)
        } else {
            v("nfull")
        };
        let mut s = Vec::new();
        // Pass 1: the maximum.
        for u in 0..self.vectors {
            s.push(Stmt::Reg {
                name: format!("mx_{u}"),
                lanes,
                init: neg_inf(lanes),
            });
        }
        s.push(Stmt::Reg {
            name: "mx_s".into(),
            lanes: 1,
            init: neg_inf(1),
        });
        let vmax = |u: usize, src: Value| Stmt::Assign {
            reg: format!("mx_{u}"),
            value: Value::binary(BinaryOp::Max, Value::reg(&format!("mx_{u}"), lanes), src),
        };
        s.push(self.steps(vectors.clone(), &|u| {
            vec![vmax(u, Value::vload(self.xb, self.x(self.at(u)), lanes))]
        }));
        let smax = |src: Value| Stmt::Assign {
            reg: "mx_s".into(),
            value: Value::binary(BinaryOp::Max, Value::reg("mx_s", 1), src),
        };
        match self.tail {
            Tail::None => {}
            Tail::Padded => {
                let j = v("nfull") * c(step) + v("e");
                s.push(Stmt::Alloc {
                    buf: "xt".into(),
                    len: c(step),
                    scope: Scope::Stack,
                });
                s.push(Stmt::Alloc {
                    buf: "yt".into(),
                    len: c(step),
                    scope: Scope::Stack,
                });
                // Nothing to do where the row is whole steps (BERT's 512: two exps of
                // 32 and a fill in every row).
                let mut tail = vec![for_(
                    "e",
                    c(step),
                    LoopKind::Serial,
                    vec![crate::lower::fetch::checked_copy(
                        Fetch::ZeroFill,
                        Cond::Lt(v("e"), v("ntail")),
                        "xt",
                        v("e"),
                        Value::load(self.xb, self.x(j)),
                        neg_inf(1),
                    )],
                )];
                for u in 0..self.vectors {
                    tail.push(vmax(u, Value::vload("xt", c(u * lanes), lanes)));
                }
                s.push(if_(Cond::Lt(c(0), v("ntail")), tail));
            }
            Tail::Scalar => {
                let j = v("nfull") * c(step) + v("e");
                s.push(for_(
                    "e",
                    v("ntail"),
                    LoopKind::Serial,
                    vec![smax(Value::load(self.xb, self.x(j)))],
                ));
            }
            Tail::Checked => {
                s.push(self.checked(vec![smax(Value::load(self.xb, self.x(v("j"))))]));
            }
        }
        s.push(Stmt::Reg {
            name: "mx".into(),
            lanes: 1,
            init: self.reduce("mx", BinaryOp::Max),
        });
        // Pass 2: y = exp(x - max), summed.
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
        s.push(self.steps(vectors.clone(), &|u| {
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
        let tail_j = v("nfull") * c(step) + v("e");
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
                sexp(
                    Value::load(self.xb, self.x(tail_j.clone())),
                    self.y(tail_j.clone()),
                ),
            )),
            Tail::Checked => {
                s.push(self.checked(sexp(Value::load(self.xb, self.x(v("j"))), self.y(v("j")))))
            }
        }
        s.push(Stmt::Reg {
            name: "inv".into(),
            lanes: 1,
            init: Value::binary(
                BinaryOp::Div,
                Value::Const {
                    value: 1.0,
                    lanes: 1,
                },
                self.reduce("sm", BinaryOp::Add),
            ),
        });
        // Pass 3: scale by 1 / sum, then the epilogue.
        let scaled = |buf: &str, at: Expr, lanes: usize| {
            let load = if lanes > 1 {
                Value::vload(buf, at, lanes)
            } else {
                Value::load(buf, at)
            };
            let p = Value::binary(BinaryOp::Mul, load, Value::reg("inv", 1));
            chain_value(&self.epilogue, p, &|_| c(0))
        };
        s.push(self.steps(vectors, &|u| {
            let at = self.y(self.at(u));
            vec![store(self.yb, at.clone(), scaled(self.yb, at, lanes))]
        }));
        match self.tail {
            Tail::None => {}
            Tail::Padded => s.push(for_(
                "e",
                v("ntail"),
                LoopKind::Serial,
                vec![store(
                    self.yb,
                    self.y(tail_j.clone()),
                    scaled("yt", v("e"), 1),
                )],
            )),
            Tail::Scalar => s.push(for_(
                "e",
                v("ntail"),
                LoopKind::Serial,
                vec![store(
                    self.yb,
                    self.y(tail_j.clone()),
                    scaled(self.yb, self.y(tail_j.clone()), 1),
                )],
            )),
            Tail::Checked => s.push(self.checked(vec![store(
                self.yb,
                self.y(v("j")),
                scaled(self.yb, self.y(v("j")), 1),
            )])),
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
