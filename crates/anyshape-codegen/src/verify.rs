//! The loop-IR verifier, run on every lowered function in debug builds and tests. The
//! invariants it checks:
//!
//! 1. every name an expression reads is in scope: a shape var (`sv_<name>`), a loop
//!    variable of an enclosing loop, or a `Let`/`GpuIndex` before it in an enclosing
//!    block;
//! 2. no name is bound twice in one scope, and no loop variable shadows a name in scope;
//! 3. every buffer read or written is a kernel argument (`in<i>` with `i` below the
//!    input count, `out0`) or allocated before in an enclosing block; nothing is stored
//!    into an input;
//! 4. every register is declared before it is read or assigned, with the lanes it is
//!    read with;
//! 5. the lanes of a store's value are 1 or the target's vector width, and a binary
//!    value's operands have equal lanes or one has 1 (a broadcast scalar);
//! 6. CPU functions (`threads` unset) use no GPU construct (thread or block index,
//!    barrier, shared memory); GPU functions use no parallel loop, no scratch buffer,
//!    no prefetch, no register transpose, no AMX tile product and no rounding of pairs;
//! 7. a scratch buffer's slot is below `SCRATCH_SLOTS`; a claim (`Cond::Claim`) names a
//!    scratch slot that is allocated;
//! 8. a load or store with a count (of the lanes it touches) is a vector access in a
//!    CPU function.
use crate::loop_ir::{Cond, Func, LoopKind, Scope, Stmt, UnaryOp, Value, SCRATCH_SLOTS};
use anyshape_ir::Expr;
use std::collections::{BTreeMap, BTreeSet};

/// A broken invariant: which, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError(pub String);

impl std::fmt::Display for VerifyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "loop IR: {}", self.0)
    }
}

#[derive(Clone, Default)]
struct Scope_ {
    names: BTreeSet<String>,
    buffers: BTreeSet<String>,
    regs: BTreeMap<String, usize>,
    slots: BTreeSet<u8>,
}

struct Verifier<'a> {
    f: &'a Func,
    gpu: bool,
    scopes: Vec<Scope_>,
}

/// Check `f` against the invariants of the module doc.
pub fn verify(f: &Func) -> Result<(), VerifyError> {
    let mut top = Scope_::default();
    for sv in &f.shape_vars {
        top.names.insert(crate::loop_ir::shape_var_name(sv));
    }
    for i in 0..f.inputs {
        top.buffers.insert(format!("in{i}"));
    }
    top.buffers.insert("out0".into());
    let mut v = Verifier {
        f,
        gpu: f.threads.is_some(),
        scopes: vec![top],
    };
    v.block(&f.body)
}

impl Verifier<'_> {
    fn fail<T>(&self, what: String) -> Result<T, VerifyError> {
        Err(VerifyError(format!("{}: {what}", self.f.name)))
    }

    fn has_name(&self, n: &str) -> bool {
        self.scopes.iter().any(|s| s.names.contains(n))
    }

    fn bind(&mut self, n: &str) -> Result<(), VerifyError> {
        if self.has_name(n) {
            return self.fail(format!("`{n}` is bound twice"));
        }
        self.scopes
            .last_mut()
            .expect("a scope")
            .names
            .insert(n.to_string());
        Ok(())
    }

    fn expr(&self, e: &Expr) -> Result<(), VerifyError> {
        for name in e.vars() {
            if !self.has_name(&name) {
                return self.fail(format!("`{name}` is read but not in scope (in `{e}`)"));
            }
        }
        Ok(())
    }

    fn cond(&self, c: &Cond) -> Result<(), VerifyError> {
        match c {
            Cond::Lt(a, b) | Cond::Le(a, b) | Cond::Eq(a, b) => {
                self.expr(a)?;
                self.expr(b)
            }
            Cond::And(a, b) => {
                self.cond(a)?;
                self.cond(b)
            }
            Cond::Claim { slot, key } => {
                if !self.scopes.iter().any(|s| s.slots.contains(slot)) {
                    return self.fail(format!("a claim of scratch slot {slot}, never allocated"));
                }
                self.expr(key)
            }
        }
    }

    fn buffer(&self, b: &str) -> Result<(), VerifyError> {
        if self.scopes.iter().any(|s| s.buffers.contains(b)) {
            Ok(())
        } else {
            self.fail(format!(
                "buffer `{b}` is used but neither an argument nor allocated"
            ))
        }
    }

    /// A buffer written by `what` (a store, a transpose): in scope and not an input.
    fn written(&self, b: &str, what: &str) -> Result<(), VerifyError> {
        if b.starts_with("in") {
            return self.fail(format!("a {what} into input `{b}`"));
        }
        self.buffer(b)
    }

    fn reg(&self, r: &str) -> Result<usize, VerifyError> {
        match self.scopes.iter().rev().find_map(|s| s.regs.get(r)) {
            Some(&lanes) => Ok(lanes),
            None => self.fail(format!("register `{r}` is used before its declaration")),
        }
    }

    /// The count of a partial vector access (invariant 8).
    fn count(&self, count: Option<&Expr>, lanes: usize) -> Result<(), VerifyError> {
        let Some(n) = count else { return Ok(()) };
        if lanes < 2 || self.gpu {
            return self.fail(format!(
                "a partial access of {lanes} lanes{}",
                if self.gpu { " in a GPU function" } else { "" }
            ));
        }
        self.expr(n)
    }

    fn value(&self, val: &Value) -> Result<(), VerifyError> {
        match val {
            Value::Zero { .. } | Value::Const { .. } => Ok(()),
            Value::Load {
                buf,
                index,
                lanes,
                count,
            } => {
                self.buffer(buf)?;
                self.expr(index)?;
                self.count(count.as_ref(), *lanes)
            }
            Value::Reg { name, lanes } => {
                let declared = self.reg(name)?;
                if declared != *lanes {
                    return self.fail(format!(
                        "register `{name}` has {declared} lanes, read with {lanes}"
                    ));
                }
                Ok(())
            }
            Value::Lane(r, l) => {
                self.reg(r)?;
                self.expr(l)
            }
            Value::Count(e) => self.expr(e),
            Value::Unary(UnaryOp::Sqrt, x) if x.lanes() > 1 => {
                self.fail("the square root of a vector (only scalars have one)".into())
            }
            Value::Unary(_, x) | Value::Horizontal(_, x) => self.value(x),
            Value::PairBf16 { .. } | Value::DotBf16(..) if self.gpu => {
                self.fail("bfloat16 in a GPU function".into())
            }
            Value::DotI8(..) | Value::IntToFloat(..) if self.gpu => {
                self.fail("8-bit integer products in a GPU function".into())
            }
            Value::PairBf16 { buf, index } => {
                self.buffer(buf)?;
                self.expr(index)
            }
            Value::IntToFloat(x) => self.value(x),
            Value::Binary(_, a, b)
            | Value::Fma(a, _, b)
            | Value::DotBf16(a, _, b)
            | Value::DotI8(a, _, b) => {
                let (la, lb) = (a.lanes(), b.lanes());
                if la != lb && la != 1 && lb != 1 {
                    return self.fail(format!("operands of {la} and {lb} lanes"));
                }
                if let Value::Fma(_, m, _) | Value::DotBf16(_, m, _) | Value::DotI8(_, m, _) = val {
                    if m.lanes() != 1 && m.lanes() != val.lanes() {
                        return self.fail(format!(
                            "a multiplier of {} lanes in a product of {}",
                            m.lanes(),
                            val.lanes()
                        ));
                    }
                    self.value(m)?;
                }
                self.value(a)?;
                self.value(b)
            }
            Value::Select(c, a, b) => {
                self.cond(c)?;
                self.value(a)?;
                self.value(b)
            }
        }
    }

    fn block(&mut self, stmts: &[Stmt]) -> Result<(), VerifyError> {
        self.scopes.push(Scope_::default());
        let out = stmts.iter().try_for_each(|s| self.stmt(s));
        self.scopes.pop();
        out
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), VerifyError> {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                self.expr(extent)?;
                if self.gpu && *kind == LoopKind::Parallel {
                    return self.fail("a parallel loop in a GPU kernel".into());
                }
                self.scopes.push(Scope_::default());
                self.bind(var)?;
                let out = self.block(body);
                self.scopes.pop();
                out
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.cond(cond)?;
                self.block(then)?;
                self.block(otherwise)
            }
            Stmt::Let { var, value } => {
                self.expr(value)?;
                self.bind(var)
            }
            Stmt::GpuIndex { var, .. } => {
                if !self.gpu {
                    return self.fail("a GPU thread index in a CPU function".into());
                }
                self.bind(var)
            }
            Stmt::Barrier if !self.gpu => self.fail("a barrier in a CPU function".into()),
            Stmt::Barrier => Ok(()),
            Stmt::Prefetch { .. } if self.gpu => self.fail("a prefetch in a GPU kernel".into()),
            Stmt::Prefetch { buf, index, .. } => {
                self.buffer(buf)?;
                self.expr(index)
            }
            Stmt::Transpose(_) if self.gpu => self.fail("a transpose in a GPU kernel".into()),
            Stmt::Transpose(t) => {
                self.written(&t.dst, "transpose")?;
                self.buffer(&t.src)?;
                [
                    &t.dst_index,
                    &t.dst_stride,
                    &t.src_index,
                    &t.src_stride,
                    &t.rows,
                    &t.cols,
                    &t.outs,
                ]
                .into_iter()
                .try_for_each(|e| self.expr(e))
            }
            Stmt::RoundPairs(_) if self.gpu => {
                self.fail("a rounding of pairs in a GPU kernel".into())
            }
            Stmt::RoundPairs(r) => {
                self.written(&r.dst, "rounding of pairs")?;
                self.buffer(&r.src)?;
                [&r.dst_index, &r.src_index, &r.words]
                    .into_iter()
                    .try_for_each(|e| self.expr(e))
            }
            Stmt::QuantizeRow(_) if self.gpu => {
                self.fail("a quantization to 8 bits in a GPU kernel".into())
            }
            Stmt::QuantizeRow(q) => {
                self.written(&q.dst, "quantization of a row")?;
                self.written(&q.scale, "quantization of a row")?;
                self.buffer(&q.src)?;
                [&q.dst_index, &q.src_index, &q.words, &q.scale_index]
                    .into_iter()
                    .try_for_each(|e| self.expr(e))
            }
            Stmt::TileProduct(_) if self.gpu => {
                self.fail("an AMX tile product in a GPU kernel".into())
            }
            Stmt::TileProduct(t) => {
                if t.a_index.is_empty()
                    || t.b_index.is_empty()
                    || t.a_index.len() * t.b_index.len() + t.a_index.len() + t.b_index.len() > 8
                {
                    return self.fail(format!(
                        "an AMX tile product of {} x {} output tiles: they, an A tile per row \
                         and a B tile per column must fit eight tile registers",
                        t.a_index.len(),
                        t.b_index.len()
                    ));
                }
                self.written(&t.c, "tile product")?;
                self.buffer(&t.a)?;
                self.buffer(&t.b)?;
                t.a_index
                    .iter()
                    .chain(&t.b_index)
                    .chain([&t.a_stride, &t.steps, &t.c_index, &t.c_stride])
                    .try_for_each(|e| self.expr(e))
            }
            Stmt::Alloc { buf, len, scope } => {
                self.expr(len)?;
                match (scope, self.gpu) {
                    (Scope::Shared, false) => {
                        return self.fail(format!("shared memory `{buf}` in a CPU function"))
                    }
                    (Scope::Scratch(_), true) => {
                        return self.fail(format!("scratch buffer `{buf}` in a GPU kernel"))
                    }
                    (Scope::Scratch(slot), false) if *slot >= SCRATCH_SLOTS => {
                        return self.fail(format!(
                            "scratch buffer `{buf}` in slot {slot}; there are {SCRATCH_SLOTS}"
                        ))
                    }
                    _ => {}
                }
                let top = self.scopes.last_mut().expect("a scope");
                top.buffers.insert(buf.clone());
                if let Scope::Scratch(slot) = scope {
                    top.slots.insert(*slot);
                }
                Ok(())
            }
            Stmt::Reg { name, lanes, init } => {
                self.value(init)?;
                self.scopes
                    .last_mut()
                    .expect("a scope")
                    .regs
                    .insert(name.clone(), *lanes);
                Ok(())
            }
            Stmt::Assign { reg, value } => {
                self.reg(reg)?;
                self.value(value)
            }
            Stmt::Store {
                buf,
                index,
                value,
                count,
            } => {
                self.written(buf, "store")?;
                self.expr(index)?;
                self.count(count.as_ref(), value.lanes())?;
                self.value(value)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loop_ir::{for_, let_, store, store_first, RoundPairs, Transpose};

    fn func(body: Vec<Stmt>) -> Func {
        Func {
            name: "k".into(),
            shape_vars: vec!["T".into()],
            specialized: None,
            inputs: 1,
            threads: None,
            body,
        }
    }

    #[test]
    fn catches_each_kind_of_mistake() {
        let x = Expr::var;
        let ok = func(vec![for_(
            "i",
            x("sv_T"),
            LoopKind::Parallel,
            vec![store("out0", x("i"), Value::load("in0", x("i")))],
        )]);
        assert_eq!(verify(&ok), Ok(()));
        for (bad, why) in [
            (
                func(vec![store("out0", x("i"), Value::Zero { lanes: 1 })]),
                "not in scope",
            ),
            (
                func(vec![store("in0", Expr::Const(0), Value::Zero { lanes: 1 })]),
                "into input",
            ),
            (
                func(vec![store("tmp", Expr::Const(0), Value::Zero { lanes: 1 })]),
                "allocated",
            ),
            (
                func(vec![let_("a", Expr::Const(1)), let_("a", Expr::Const(2))]),
                "twice",
            ),
            (func(vec![Stmt::Barrier]), "barrier"),
            (
                func(vec![Stmt::Prefetch {
                    buf: "Bp".into(),
                    index: Expr::Const(0),
                    l2: false,
                    write: false,
                }]),
                "allocated",
            ),
            (
                func(vec![Stmt::Assign {
                    reg: "r".into(),
                    value: Value::Zero { lanes: 1 },
                }]),
                "before its declaration",
            ),
            (
                func(vec![store_first(
                    "out0",
                    Expr::Const(0),
                    Value::Zero { lanes: 1 },
                    Expr::Const(1),
                )]),
                "partial access of 1 lanes",
            ),
            (func(vec![transpose("in0", x("i"))]), "into input `in0`"),
            (
                func(vec![transpose("out0", x("i"))]),
                "`i` is read but not in scope",
            ),
            (
                Func {
                    threads: Some(32),
                    ..func(vec![transpose("out0", Expr::Const(0))])
                },
                "transpose in a GPU kernel",
            ),
            (
                func(vec![Stmt::Alloc {
                    buf: "S".into(),
                    len: Expr::Const(1),
                    scope: Scope::Scratch(SCRATCH_SLOTS),
                }]),
                "in slot 16; there are 16",
            ),
            (
                func(vec![round_pairs("in0")]),
                "rounding of pairs into input `in0`",
            ),
            (
                Func {
                    threads: Some(32),
                    ..func(vec![round_pairs("out0")])
                },
                "rounding of pairs in a GPU kernel",
            ),
        ] {
            let e = verify(&bad).unwrap_err();
            assert!(e.0.contains(why), "{e}");
        }
        assert_eq!(verify(&func(vec![transpose("out0", x("sv_T"))])), Ok(()));
        assert_eq!(verify(&func(vec![round_pairs("out0")])), Ok(()));
    }

    /// A run of `in0`'s pairs rounded into `dst`.
    fn round_pairs(dst: &str) -> Stmt {
        Stmt::RoundPairs(Box::new(RoundPairs {
            dst: dst.into(),
            dst_index: Expr::Const(0),
            src: "in0".into(),
            src_index: Expr::Const(0),
            words: Expr::var("sv_T"),
        }))
    }

    /// A transpose of `in0` into `dst`, its destination at `at`.
    fn transpose(dst: &str, at: Expr) -> Stmt {
        let one = || Expr::Const(1);
        Stmt::Transpose(Box::new(Transpose {
            dst: dst.into(),
            dst_index: at,
            dst_stride: one(),
            src: "in0".into(),
            src_index: Expr::Const(0),
            src_stride: one(),
            rows: one(),
            cols: one(),
            outs: one(),
            width: 1,
        }))
    }
}
