//! Program features for the cost model, read from a micro-kernel's lowered loop IR.
//!
//! In the spirit of Ansor's per-store features, but aggregated per buffer class so the
//! vector has a fixed length: arithmetic by kind, loop structure (extents of serial,
//! unrolled and parallel loops), branches, and per buffer class the bytes loaded and
//! stored, unique bytes, reuse and contiguity. The walk is generic over whatever the
//! lowering produced; it never reads the sketch's parameters directly.
//!
//! Features describe the micro-kernel, not an instance: the program is lowered in
//! symbolic mode and walked over one full task (one cache tile of every axis, batch 1),
//! with tensor strides taken from a representative instance.
use anyshape_codegen::loop_ir::{shape_var_name, Cond, LoopKind, Stmt, Value};
use anyshape_codegen::{lower, CpuTarget, MicroKernel, PaddingStrategy, Program};
use anyshape_ir::{Bindings, Expr, Workload};

/// Buffer classes features are aggregated over.
const CLASSES: [&str; 4] = ["global_in", "global_out", "scratch", "stack"];
const PER_CLASS: [&str; 6] = [
    "load_bytes",
    "store_bytes",
    "unique_bytes",
    "reuse",
    "contiguous_frac",
    "accesses",
];
const TOTALS: [&str; 12] = [
    "flops",
    "vector_flop_frac",
    "lanes",
    "branches",
    "branches_per_flop",
    "intensity_scratch",
    "intensity_global",
    "loops",
    "max_depth",
    "unrolled_body",
    "parallel_extent",
    "inner_flops_per_iter",
];

/// Names of the features, in vector order.
pub fn feature_names() -> Vec<String> {
    let mut names: Vec<String> = TOTALS.iter().map(|s| s.to_string()).collect();
    for c in CLASSES {
        for f in PER_CLASS {
            names.push(format!("{c}.{f}"));
        }
    }
    names
}

#[derive(Default, Clone, Copy)]
struct Access {
    load_bytes: f64,
    store_bytes: f64,
    unique_bytes: f64,
    accesses: f64,
    contiguous: f64,
}

struct Loop {
    var: String,
    extent: i64,
    kind: LoopKind,
}

#[derive(Default)]
struct Walk {
    env: Bindings,
    fixed: Vec<&'static str>,
    loops: Vec<Loop>,
    trip: f64,
    flops: f64,
    vector_flops: f64,
    lanes: f64,
    branches: f64,
    n_loops: f64,
    max_depth: usize,
    unrolled_body: f64,
    parallel_extent: f64,
    inner_flops: f64,
    classes: [Access; 4],
}

fn class_of(buf: &str) -> usize {
    if buf.starts_with("in") {
        0
    } else if buf.starts_with("out") {
        1
    } else if buf == "acc" {
        3
    } else {
        2
    }
}

impl Walk {
    fn eval(&self, e: &Expr) -> i64 {
        e.eval(&self.env).unwrap_or(0)
    }

    /// Record an access of `lanes` elements at `index` under the current loop nest.
    fn access(&mut self, buf: &str, index: &Expr, lanes: usize, store: bool) {
        let bytes = self.trip * lanes as f64 * 4.0;
        // Span of the index over the loop box (affine, non-negative strides assumed).
        let mut env = self.env.clone();
        let lo = index.eval(&env).unwrap_or(0);
        for l in &self.loops {
            env.set(l.var.clone(), (l.extent - 1).max(0));
        }
        let hi = index.eval(&env).unwrap_or(lo);
        let span = ((hi - lo).unsigned_abs() as f64 + lanes as f64) * 4.0;
        let inner_stride = self.loops.last().map(|l| {
            let mut e = self.env.clone();
            e.set(l.var.clone(), 1);
            index.eval(&e).unwrap_or(lo) - lo
        });
        let c = &mut self.classes[class_of(buf)];
        if store {
            c.store_bytes += bytes;
        } else {
            c.load_bytes += bytes;
        }
        c.unique_bytes += span.min(bytes);
        c.accesses += self.trip;
        if matches!(inner_stride, Some(0 | 1) | None) || lanes > 1 {
            c.contiguous += self.trip;
        }
    }

    fn value(&mut self, v: &Value) {
        let lanes = v.lanes() as f64;
        match v {
            Value::Zero { .. } | Value::Reg { .. } | Value::Lane(..) => {}
            Value::Load { buf, index, lanes } => self.access(buf, index, *lanes, false),
            Value::Add(a, b) => {
                self.arith(lanes);
                self.value(a);
                self.value(b);
            }
            Value::Fma(a, b, c) => {
                self.arith(2.0 * lanes);
                self.value(a);
                self.value(b);
                self.value(c);
            }
            Value::Relu(x) => {
                self.arith(lanes);
                self.value(x);
            }
            Value::Select(c, a, b) => {
                self.branches += self.trip;
                if self.holds(c).unwrap_or(true) {
                    self.value(a)
                } else {
                    self.value(b)
                }
            }
        }
    }

    fn arith(&mut self, n: f64) {
        self.flops += n * self.trip;
        if n > 2.0 {
            self.vector_flops += n * self.trip;
            self.lanes = self.lanes.max(n / 2.0);
        }
        if self
            .loops
            .last()
            .is_some_and(|l| matches!(l.kind, LoopKind::Unrolled(_)))
        {
            self.inner_flops += n;
        }
    }

    /// Evaluate a condition at the first iteration of every enclosing loop (the main path
    /// of a full tile); `None` for a claim (taken once per panel, counted as taken).
    fn holds(&self, c: &Cond) -> Option<bool> {
        match c {
            Cond::Lt(a, b) => Some(self.eval(a) < self.eval(b)),
            Cond::Le(a, b) => Some(self.eval(a) <= self.eval(b)),
            Cond::Eq(a, b) => Some(self.eval(a) == self.eval(b)),
            Cond::And(a, b) => Some(self.holds(a)? && self.holds(b)?),
            Cond::Claim { .. } => None,
        }
    }

    fn stmts(&mut self, body: &[Stmt]) {
        for s in body {
            self.stmt(s);
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                let n = self.eval(extent).max(0);
                self.n_loops += 1.0;
                if *kind == LoopKind::Parallel {
                    self.parallel_extent = self.parallel_extent.max(n as f64);
                }
                if let LoopKind::Unrolled(_) = kind {
                    self.unrolled_body = self.unrolled_body.max(n as f64 * body.len() as f64);
                }
                let saved = self.trip;
                self.trip *= n as f64;
                self.env.set(var.clone(), 0);
                self.loops.push(Loop {
                    var: var.clone(),
                    extent: n,
                    kind: *kind,
                });
                self.max_depth = self.max_depth.max(self.loops.len());
                self.stmts(body);
                self.loops.pop();
                self.trip = saved;
            }
            Stmt::If {
                cond,
                then,
                otherwise,
            } => {
                self.branches += self.trip;
                match self.holds(cond) {
                    Some(false) => self.stmts(otherwise),
                    _ => self.stmts(then),
                }
            }
            Stmt::Let { var, value } => {
                if !self.fixed.contains(&var.as_str()) {
                    let v = self.eval(value);
                    self.env.set(var.clone(), v);
                }
            }
            Stmt::Alloc { .. } => {}
            Stmt::Reg { init, .. } => self.value(init),
            Stmt::Assign { value, .. } => self.value(value),
            Stmt::Store { buf, index, value } => {
                self.value(value);
                self.access(buf, index, value.lanes(), true);
            }
        }
    }
}

/// The feature vector of `mk` on `workload` (see [`feature_names`]); `representative` is
/// an instance whose tensor strides stand in for all.
pub fn extract(
    workload: &Workload,
    mk: &MicroKernel,
    strategy: PaddingStrategy,
    target: &CpuTarget,
    representative: &Bindings,
) -> Vec<f64> {
    let program = Program::symbolic(workload, *mk, strategy);
    let Ok(func) = lower(&program, target) else {
        return vec![0.0; feature_names().len()];
    };
    let mut walk = Walk {
        trip: 1.0,
        fixed: vec!["e_b", "e_m", "e_n", "e_k"],
        ..Default::default()
    };
    for (name, value) in representative.iter() {
        walk.env.set(shape_var_name(name), value);
    }
    for (name, value) in [("e_b", 1), ("e_m", mk.mc), ("e_n", mk.nc), ("e_k", mk.kc)] {
        walk.env.set(name, value as i64);
    }
    walk.stmts(&func.body);
    let l = |x: f64| x.max(0.0).ln_1p();
    let scratch_bytes = walk.classes[2].load_bytes + walk.classes[3].load_bytes;
    let global_bytes = walk.classes[0].load_bytes + walk.classes[1].store_bytes;
    let mut f = vec![
        l(walk.flops),
        walk.vector_flops / walk.flops.max(1.0),
        walk.lanes,
        l(walk.branches),
        walk.branches / walk.flops.max(1.0),
        walk.flops / scratch_bytes.max(1.0),
        walk.flops / global_bytes.max(1.0),
        walk.n_loops,
        walk.max_depth as f64,
        walk.unrolled_body,
        walk.parallel_extent,
        walk.inner_flops,
    ];
    for c in walk.classes {
        f.extend([
            l(c.load_bytes),
            l(c.store_bytes),
            l(c.unique_bytes),
            (c.load_bytes + c.store_bytes) / c.unique_bytes.max(1.0),
            c.contiguous / c.accesses.max(1.0),
            l(c.accesses),
        ]);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_are_finite_and_tell_micro_kernels_apart() {
        let target = CpuTarget::detect();
        let lanes = target.lanes_f32();
        let w = Workload::parse("dense(M=16*T,N=2304,K=768)").unwrap();
        let b = Bindings::from_pairs([("T", 64)]);
        let a = MicroKernel::default_for(&target);
        let small = MicroKernel {
            mr: 2,
            nr: lanes,
            mc: 4,
            nc: 2 * lanes,
            kc: 8,
            uk: 2,
        };
        let fa = extract(&w, &a, PaddingStrategy::LocalPad, &target, &b);
        let fs = extract(&w, &small, PaddingStrategy::LocalPad, &target, &b);
        assert_eq!(fa.len(), feature_names().len());
        assert!(fa.iter().chain(&fs).all(|x| x.is_finite()));
        assert_ne!(fa, fs);
        // A full tile does mc * nc * kc multiply-adds.
        let flops = 2.0 * (a.mc * a.nc * a.kc) as f64;
        assert!(
            (fa[0] - flops.ln_1p()).abs() < 0.05,
            "{} vs {}",
            fa[0].exp_m1(),
            flops
        );
    }
}
