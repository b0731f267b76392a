//! The renderer: loop IR to C-style source, in one of two dialects: C (GCC/Clang vector
//! extensions, OpenMP; the kernel ABI of `anyshape_abi`) or CUDA C (one `__global__`
//! function per kernel, its inputs and shape vars as parameters). Everything dialects
//! share is written once; what differs is in `Table` and the function's head.
//! `prelude.rs` holds the helpers every translation unit starts with.
mod prelude;

pub use prelude::prelude;

use crate::loop_ir::{
    shape_var_name, BinaryOp, Cond, Func, GpuIndex, LoopKind, Scope, Stmt, UnaryOp, Value,
};
use anyshape_abi::{KERNEL_SIGNATURE, STATUS_NO_MEMORY, STATUS_WRONG_SHAPE};
use anyshape_ir::Expr;
use std::fmt::Write;

/// The dialects of the renderer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// C for the CPU.
    C,
    /// CUDA C for NVIDIA GPUs (compiled by NVRTC).
    Cuda,
}

/// What differs between dialects, in one place.
pub(crate) struct Table {
    /// Qualifiers of the prelude's helper functions.
    pub helper: &'static str,
    /// The 64-bit integer type.
    pub int: &'static str,
    /// The `restrict` qualifier.
    pub restrict: &'static str,
    /// Whether a scalar `a * b + c` is written `fmaf(a, b, c)`.
    pub fmaf: bool,
    /// Whether unroll pragmas take the factor (`#pragma GCC unroll N`) or not
    /// (`#pragma unroll`).
    pub unroll_factor: bool,
    /// Attribute of a stack array.
    pub stack_align: &'static str,
}

impl Dialect {
    /// The dialect's table.
    pub(crate) fn table(self) -> Table {
        match self {
            Dialect::C => Table {
                helper: "static inline",
                int: "int64_t",
                restrict: "restrict",
                fmaf: false,
                unroll_factor: true,
                stack_align: " __attribute__((aligned(64)))",
            },
            Dialect::Cuda => Table {
                helper: "static __device__ __forceinline__",
                int: "as_i64",
                restrict: "__restrict__",
                fmaf: true,
                unroll_factor: false,
                stack_align: "",
            },
        }
    }
}

/// A float constant as a C literal that reads back the same `float`.
fn float_literal(x: f64) -> String {
    let f = x as f32;
    if f.is_infinite() {
        return if f > 0.0 { "INFINITY" } else { "(-INFINITY)" }.into();
    }
    if f.is_nan() {
        return "NAN".into();
    }
    // Rust's shortest round-trip form always has a `.` or an exponent, so C reads a
    // float, never an integer: `1.0f`, `0.1f`, `1e-7f`, `1e20f`.
    let text = format!("{f:?}f");
    if f < 0.0 {
        format!("({text})")
    } else {
        text
    }
}

/// An integer expression as C (the same in both dialects).
pub fn expr(e: &Expr) -> String {
    e.render(&mut |node, kids| match node {
        Expr::Const(c) if c.unsigned_abs() > i32::MAX as u64 => format!("INT64_C({c})"),
        Expr::Const(c) if *c < 0 => format!("({c})"),
        Expr::Const(c) => c.to_string(),
        Expr::Var(v) => v.clone(),
        Expr::Add(..) => format!("({} + {})", kids[0], kids[1]),
        Expr::Sub(..) => format!("({} - {})", kids[0], kids[1]),
        Expr::Mul(..) => format!("({} * {})", kids[0], kids[1]),
        Expr::FloorDiv(..) => format!("as_fdiv({}, {})", kids[0], kids[1]),
        Expr::CeilDiv(..) => format!("as_cdiv({}, {})", kids[0], kids[1]),
        Expr::Mod(..) => format!("as_fmod({}, {})", kids[0], kids[1]),
        Expr::Min(..) => format!("as_min({}, {})", kids[0], kids[1]),
        Expr::Max(..) => format!("as_max({}, {})", kids[0], kids[1]),
    })
}

fn cond(c: &Cond) -> String {
    match c {
        Cond::Lt(a, b) => format!("{} < {}", expr(a), expr(b)),
        Cond::Le(a, b) => format!("{} <= {}", expr(a), expr(b)),
        Cond::Eq(a, b) => format!("{} == {}", expr(a), expr(b)),
        Cond::And(a, b) => format!("({}) && ({})", cond(a), cond(b)),
        Cond::Claim { slot, key } => format!("as_claim({slot}, as_call, {})", expr(key)),
    }
}

struct Printer {
    out: String,
    indent: usize,
    dialect: Dialect,
    table: Table,
    /// f32 lanes of a vector (1: scalar code).
    lanes: usize,
    /// Cores a parallel loop spreads over (CPU).
    cores: usize,
    in_parallel: bool,
}

impl Printer {
    fn line(&mut self, text: &str) {
        let _ = writeln!(self.out, "{}{}", "  ".repeat(self.indent), text);
    }

    fn value(&self, val: &Value) -> String {
        match val {
            Value::Zero { lanes } if *lanes > 1 => "(as_vf){0}".into(),
            Value::Zero { .. } => "0.0f".into(),
            Value::Load {
                buf,
                index,
                lanes,
                count: Some(n),
            } if *lanes > 1 => {
                format!("as_vload_first(&{buf}[{}], {})", expr(index), expr(n))
            }
            Value::Load {
                buf, index, lanes, ..
            } if *lanes > 1 => {
                format!("as_vload(&{buf}[{}])", expr(index))
            }
            Value::Load { buf, index, .. } => format!("{buf}[{}]", expr(index)),
            Value::Reg { name, .. } => name.clone(),
            Value::Lane(r, l) if self.dialect == Dialect::Cuda => {
                format!("as_lane({r}, {})", expr(l))
            }
            Value::Lane(r, _) if self.lanes == 1 => r.clone(),
            Value::Lane(r, l) => format!("{r}[{}]", expr(l)),
            Value::Count(e) => format!("((float)({}))", expr(e)),
            Value::Const { value, lanes } => {
                let c = float_literal(*value);
                if *lanes > 1 {
                    format!("((as_vf){{0}} + {c})")
                } else {
                    c
                }
            }
            Value::Binary(op, a, b) => {
                let (x, y) = (self.value(a), self.value(b));
                match op {
                    BinaryOp::Add => format!("({x} + {y})"),
                    BinaryOp::Sub => format!("({x} - {y})"),
                    BinaryOp::Mul => format!("({x} * {y})"),
                    BinaryOp::Div => format!("({x} / {y})"),
                    BinaryOp::Max if val.lanes() > 1 => format!("as_vmax({x}, {y})"),
                    BinaryOp::Max => format!("as_max_f({x}, {y})"),
                }
            }
            Value::Horizontal(op, x) => {
                let f = if *op == BinaryOp::Max {
                    "as_hmax"
                } else {
                    "as_hsum"
                };
                format!("{f}({})", self.value(x))
            }
            Value::Fma(a, b, c) if self.table.fmaf && val.lanes() == 1 => format!(
                "fmaf({}, {}, {})",
                self.value(a),
                self.value(b),
                self.value(c)
            ),
            Value::Fma(a, b, c) => format!(
                "({} * {} + {})",
                self.value(a),
                self.value(b),
                self.value(c)
            ),
            Value::PairBf16 { buf, index } => format!("as_pair_bf16(&{buf}[{}])", expr(index)),
            Value::DotBf16(a, b, c) => format!(
                "{}({}, {}, {})",
                if val.lanes() > 1 {
                    "as_vdot_bf16"
                } else {
                    "as_dot_bf16"
                },
                self.value(c),
                self.value(a),
                self.value(b)
            ),
            Value::DotI8(a, b, c) => format!(
                "{}({}, {}, {})",
                if val.lanes() > 1 {
                    "as_vdot_i8"
                } else {
                    "as_dot_i8"
                },
                self.value(c),
                self.value(a),
                self.value(b)
            ),
            Value::IntToFloat(x) if x.lanes() > 1 => format!("as_vint_float({})", self.value(x)),
            Value::IntToFloat(x) => format!("as_int_float({})", self.value(x)),
            Value::Unary(op, x) => {
                let vector = x.lanes() > 1;
                let f = match op {
                    UnaryOp::Relu if vector => "as_vrelu",
                    UnaryOp::Relu => "as_relu",
                    UnaryOp::Tanh => "as_tanh",
                    UnaryOp::Gelu => "as_gelu",
                    UnaryOp::GeluTanh => "as_gelu_tanh",
                    UnaryOp::Silu => "as_silu",
                    UnaryOp::Exp if vector => "as_vexp",
                    UnaryOp::Exp => "expf",
                    UnaryOp::Sqrt => "sqrtf",
                    UnaryOp::NanToZero if vector => "as_vnan0",
                    UnaryOp::NanToZero => "as_nan0",
                };
                format!("{f}({})", self.value(x))
            }
            Value::Select(c, a, b) => {
                format!("(({}) ? {} : {})", cond(c), self.value(a), self.value(b))
            }
        }
    }

    fn block(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        let int = self.table.int;
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                let was_parallel = self.in_parallel;
                match kind {
                    LoopKind::Serial => {}
                    LoopKind::Unrolled(n) if self.table.unroll_factor => {
                        self.line(&format!("#pragma GCC unroll {n}"))
                    }
                    LoopKind::Unrolled(_) => self.line("#pragma unroll"),
                    LoopKind::Parallel => {
                        self.line(&format!(
                            "#pragma omp parallel for schedule(static) num_threads({}) if({} > 1)",
                            self.cores,
                            expr(extent)
                        ));
                        self.in_parallel = true;
                    }
                }
                self.line(&format!(
                    "for ({int} {var} = 0; {var} < {}; {var}++) {{",
                    expr(extent)
                ));
                self.indent += 1;
                self.block(body);
                self.indent -= 1;
                self.line("}");
                self.in_parallel = was_parallel;
            }
            Stmt::If {
                cond: c,
                then,
                otherwise,
            } => {
                self.line(&format!("if ({}) {{", cond(c)));
                self.indent += 1;
                self.block(then);
                self.indent -= 1;
                if !otherwise.is_empty() {
                    self.line("} else {");
                    self.indent += 1;
                    self.block(otherwise);
                    self.indent -= 1;
                }
                self.line("}");
            }
            Stmt::Let { var, value } => self.line(&format!("const {int} {var} = {};", expr(value))),
            Stmt::GpuIndex { var, index } => {
                let what = match index {
                    GpuIndex::Thread => "threadIdx.x".to_string(),
                    GpuIndex::Block(d) => format!("blockIdx.{}", ["x", "y", "z"][*d as usize % 3]),
                };
                self.line(&format!("const {int} {var} = ({int}){what};"))
            }
            Stmt::Barrier => self.line("__syncthreads();"),
            // Integer arithmetic: the address may lie past the buffer, which a pointer
            // may not.
            Stmt::Prefetch {
                buf,
                index,
                l2,
                write,
            } => self.line(&format!(
                "__builtin_prefetch((const void *)((uintptr_t){buf} + (uintptr_t)({}) * sizeof(float)), {}, {});",
                expr(index),
                u8::from(*write),
                if *l2 { 2 } else { 3 }
            )),
            Stmt::Transpose(t) => self.line(&format!(
                "as_transpose(&{}[{}], {}, &{}[{}], {}, {}, {}, {}, {});",
                t.dst,
                expr(&t.dst_index),
                expr(&t.dst_stride),
                t.src,
                expr(&t.src_index),
                expr(&t.src_stride),
                expr(&t.rows),
                expr(&t.cols),
                expr(&t.outs),
                t.width
            )),
            Stmt::RoundPairs(r) => self.line(&format!(
                "as_round_pairs(&{}[{}], &{}[{}], {});",
                r.dst,
                expr(&r.dst_index),
                r.src,
                expr(&r.src_index),
                expr(&r.words)
            )),
            Stmt::QuantizeRow(q) => self.line(&format!(
                "as_quantize_row(&{}[{}], &{}[{}], {}, &{}[{}]);",
                q.dst,
                expr(&q.dst_index),
                q.src,
                expr(&q.src_index),
                expr(&q.words),
                q.scale,
                expr(&q.scale_index)
            )),
            Stmt::TileProduct(t) => {
                let ptr = |buf: &str, i: &Expr| format!("&{buf}[{}]", expr(i));
                let args: Vec<String> = t
                    .a_index
                    .iter()
                    .map(|i| ptr(&t.a, i))
                    .chain([expr(&t.a_stride)])
                    .chain(t.b_index.iter().map(|j| ptr(&t.b, j)))
                    .chain([expr(&t.steps), ptr(&t.c, &t.c_index), expr(&t.c_stride)])
                    .collect();
                self.line(&format!(
                    "{{ int32_t as_st = as_amx_{}x{}(as_call, {}); if (as_st) __atomic_store_n(&as_status, as_st, __ATOMIC_RELAXED); }}",
                    t.a_index.len(),
                    t.b_index.len(),
                    args.join(", ")
                ));
            }
            Stmt::Alloc {
                buf,
                len,
                scope: Scope::Stack,
            } => {
                let align = self.table.stack_align;
                self.line(&format!("float {buf}[{}]{align};", expr(len)));
            }
            Stmt::Alloc {
                buf,
                len,
                scope: Scope::Shared,
            } => self.line(&format!(
                "__shared__ __align__(16) float {buf}[{}];",
                expr(len)
            )),
            Stmt::Alloc {
                buf,
                len,
                scope: Scope::Scratch(slot),
            } => {
                self.line(&format!(
                    "float *restrict {buf} = (float *)as_scratch({slot}, {});",
                    expr(len)
                ));
                let fail = if self.in_parallel {
                    format!("{{ __atomic_store_n(&as_status, {STATUS_NO_MEMORY}, __ATOMIC_RELAXED); continue; }}")
                } else {
                    format!("return {STATUS_NO_MEMORY};")
                };
                self.line(&format!("if (!{buf}) {fail}"));
            }
            Stmt::Reg { name, lanes, init } => {
                let ty = if *lanes > 1 { "as_vf" } else { "float" };
                self.line(&format!("{ty} {name} = {};", self.value(init)));
            }
            Stmt::Assign { reg, value } => self.line(&format!("{reg} = {};", self.value(value))),
            Stmt::Store {
                buf,
                index,
                value,
                count: Some(n),
            } => self.line(&format!(
                "as_vstore_first(&{buf}[{}], {}, {});",
                expr(index),
                self.value(value),
                expr(n)
            )),
            Stmt::Store {
                buf, index, value, ..
            } => {
                if value.lanes() > 1 {
                    self.line(&format!(
                        "as_vstore(&{buf}[{}], {});",
                        expr(index),
                        self.value(value)
                    ));
                } else {
                    self.line(&format!("{buf}[{}] = {};", expr(index), self.value(value)));
                }
            }
        }
    }

    /// The function's head: its signature, its buffers and shape vars by name.
    fn head(&mut self, f: &Func) {
        match self.dialect {
            Dialect::C => {
                let _ = writeln!(self.out, "int32_t {}{KERNEL_SIGNATURE} {{", f.name);
                self.line("int32_t as_status = 0;");
                self.line(
                    "const int64_t as_call = __atomic_add_fetch(&as_calls, 1, __ATOMIC_RELAXED);",
                );
                self.line("(void)as_call;");
                self.line("(void)vars;");
                for i in 0..f.inputs {
                    self.line(&format!("const float *restrict in{i} = ins[{i}];"));
                }
                self.line("float *restrict out0 = outs[0];");
                for (i, sv) in f.shape_vars.iter().enumerate() {
                    match &f.specialized {
                        Some(values) => {
                            self.line(&format!(
                                "if (vars[{i}] != {}) return {STATUS_WRONG_SHAPE};",
                                values[i]
                            ));
                            self.line(&format!(
                                "const int64_t {} = {};",
                                shape_var_name(sv),
                                values[i]
                            ));
                        }
                        None => self.line(&format!(
                            "const int64_t {} = vars[{i}];",
                            shape_var_name(sv)
                        )),
                    }
                }
            }
            Dialect::Cuda => {
                let r = self.table.restrict;
                let mut params: Vec<String> = (0..f.inputs)
                    .map(|i| format!("const float *{r} in{i}"))
                    .collect();
                params.push(format!("float *{r} out0"));
                params.extend(f.shape_vars.iter().map(|sv| format!("as_i64 as_arg_{sv}")));
                let bounds = f
                    .threads
                    .map_or(String::new(), |t| format!("__launch_bounds__({t}) "));
                let _ = writeln!(
                    self.out,
                    "extern \"C\" __global__ void {bounds}{}({}) {{",
                    f.name,
                    params.join(", ")
                );
                for (i, sv) in f.shape_vars.iter().enumerate() {
                    // A specialized kernel's shape is a constant; the launch passes the
                    // instance's anyway.
                    let value = match &f.specialized {
                        Some(values) => format!("{}; (void)as_arg_{sv}", values[i]),
                        None => format!("as_arg_{sv}"),
                    };
                    self.line(&format!("const as_i64 {} = {value};", shape_var_name(sv)));
                }
            }
        }
    }
}

/// One lowered function in `dialect`, to follow [`prelude`] in a translation unit;
/// `lanes` are the f32 lanes of a vector, `cores` what a parallel loop spreads over.
pub fn render(f: &Func, dialect: Dialect, lanes: usize, cores: usize) -> String {
    let mut p = Printer {
        out: String::new(),
        indent: 1,
        dialect,
        table: dialect.table(),
        lanes,
        cores,
        in_parallel: false,
    };
    p.head(f);
    p.block(&f.body);
    if dialect == Dialect::C {
        p.line("return as_status;");
    }
    p.out.push_str("}\n");
    p.out
}
