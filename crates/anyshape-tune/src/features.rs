//! Program features for the cost model, read from a micro-kernel's lowered loop IR.
//!
//! In the spirit of Ansor's per-store features, but aggregated per buffer class so the
//! vector has a fixed length: arithmetic by kind, loop structure (extents of serial,
//! unrolled and parallel loops), branches, prefetch requests, and per buffer class the
//! bytes loaded and stored, unique bytes, reuse and contiguity. The walk is generic
//! over whatever the lowering produced; it never reads the sketch's parameters directly.
//!
//! Features describe the micro-kernel, not an instance: the program is lowered in
//! symbolic mode and walked over one full task (its sketch says what a task's extents
//! are), with tensor strides taken from a representative instance. GPU micro-kernels
//! are described by their tiles ([`Tunable`] for each sketch).
use anyshape_codegen::loop_ir::{shape_var_name, Cond, Func, LoopKind, Stmt, Value};
use anyshape_codegen::{
    lower, AttentionKernel, ContractionKernel, CpuTarget, GpuContractionKernel, GpuTarget,
    PaddingStrategy, Program, RowKernel, Sketch,
};
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
const TOTALS: [&str; 13] = [
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
    "prefetches_per_flop",
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
    prefetches: f64,
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
            Value::Zero { .. }
            | Value::Const { .. }
            | Value::Reg { .. }
            | Value::Lane(..)
            | Value::Count(..) => {}
            Value::Load {
                buf, index, lanes, ..
            } => self.access(buf, index, *lanes, false),
            Value::Binary(_, a, b) => {
                self.arith(lanes);
                self.value(a);
                self.value(b);
            }
            Value::Horizontal(_, x) => {
                self.arith(x.lanes() as f64);
                self.value(x);
            }
            // Two elements rounded to bfloat16 and packed: a few integer operations.
            Value::PairBf16 { buf, index } => {
                self.access(buf, index, 2, false);
                self.arith(2.0);
            }
            // Two products and two sums per lane.
            Value::DotBf16(a, b, c) => {
                self.arith(4.0 * lanes);
                self.value(a);
                self.value(b);
                self.value(c);
            }
            // Four products and four sums per lane.
            Value::DotI8(a, b, c) => {
                self.arith(8.0 * lanes);
                self.value(a);
                self.value(b);
                self.value(c);
            }
            Value::IntToFloat(x) => {
                self.arith(lanes);
                self.value(x);
            }
            Value::Fma(a, b, c) => {
                self.arith(2.0 * lanes);
                self.value(a);
                self.value(b);
                self.value(c);
            }
            Value::Unary(_, x) => {
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
            Stmt::Alloc { .. } | Stmt::Barrier => {}
            Stmt::Prefetch { .. } => self.prefetches += self.trip,
            // Counted as the vectors it loads and stores, one row at a time.
            Stmt::Transpose(t) => {
                let (rows, cols) = (self.eval(&t.rows).max(0), self.eval(&t.cols).max(0));
                let outs = self.eval(&t.outs).max(0) as usize;
                self.access(&t.src, &t.src_index, (rows * cols) as usize, false);
                self.access(&t.dst, &t.dst_index, outs * t.width, true);
            }
            // Counted as the floats it reads and the words it writes.
            Stmt::RoundPairs(r) => {
                let words = self.eval(&r.words).max(0) as usize;
                self.access(&r.src, &r.src_index, 2 * words, false);
                self.access(&r.dst, &r.dst_index, words, true);
            }
            // Counted as the floats it reads (twice: the maximum, then the values) and
            // the words it writes, and a few operations per float.
            Stmt::QuantizeRow(q) => {
                let words = self.eval(&q.words).max(0) as usize;
                self.access(&q.src, &q.src_index, 8 * words, false);
                self.access(&q.dst, &q.dst_index, words, true);
                self.arith(4.0 * 4.0 * words as f64);
            }
            // Counted as the words its tiles load and store, and its products (two
            // bfloat16 per word, a multiply and an add each).
            Stmt::TileProduct(t) => {
                let steps = self.eval(&t.steps).max(0) as usize;
                let tile = 16 * 16;
                for i in &t.a_index {
                    self.access(&t.a, i, tile * steps, false);
                }
                for j in &t.b_index {
                    self.access(&t.b, j, tile * steps, false);
                }
                let outputs = t.a_index.len() * t.b_index.len();
                self.access(&t.c, &t.c_index, outputs * tile, true);
                self.arith((outputs * tile * 16 * steps * 4) as f64);
            }
            Stmt::GpuIndex { var, .. } => self.env.set(var.clone(), 0),
            Stmt::Reg { init, .. } => self.value(init),
            Stmt::Assign { value, .. } => self.value(value),
            Stmt::Store {
                buf, index, value, ..
            } => {
                self.value(value);
                self.access(buf, index, value.lanes(), true);
            }
        }
    }
}

/// A sketch the search tunes: the input of `f_MK` for its micro-kernels, and what a
/// generated kernel's launch needs (GPU).
pub trait Tunable: Sketch {
    /// The shape-generic feature vector of `self` on `workload` with `strategy`;
    /// `representative` is an instance whose tensor strides stand in for all.
    fn features(
        &self,
        workload: &Workload,
        strategy: PaddingStrategy,
        target: &Self::Target,
        representative: &Bindings,
    ) -> Vec<f64>;

    /// The micro-kernel a GPU launch needs, for a generated GPU kernel.
    fn launch(&self) -> Option<GpuContractionKernel> {
        None
    }
}

/// The features of a lowered function walked over one full task: the lets named in
/// `task` fixed to the task's extents, tensor strides from `representative` (see
/// [`feature_names`]).
pub fn extract(func: &Func, task: &[(&'static str, i64)], representative: &Bindings) -> Vec<f64> {
    let mut walk = Walk {
        trip: 1.0,
        fixed: task.iter().map(|t| t.0).collect(),
        ..Default::default()
    };
    for (name, value) in representative.iter() {
        walk.env.set(shape_var_name(name), value);
    }
    for &(name, value) in task {
        walk.env.set(name, value);
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
        walk.prefetches / walk.flops.max(1.0),
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

/// The features of a CPU sketch's symbolic program over one task.
fn cpu_features<K: Sketch<Target = CpuTarget>>(
    mk: &K,
    workload: &Workload,
    strategy: PaddingStrategy,
    target: &CpuTarget,
    representative: &Bindings,
    task: &[(&'static str, i64)],
) -> Vec<f64> {
    let program = Program::symbolic(workload, *mk, strategy);
    match lower(&program, target) {
        Ok(func) => extract(&func, task, representative),
        Err(_) => vec![0.0; feature_names().len()],
    }
}

impl Tunable for ContractionKernel {
    /// One cache tile of every axis, batch 1.
    fn features(
        &self,
        workload: &Workload,
        strategy: PaddingStrategy,
        target: &CpuTarget,
        representative: &Bindings,
    ) -> Vec<f64> {
        let task = [
            ("e_b", 1),
            ("e_m", self.mc as i64),
            ("e_n", self.nc as i64),
            ("e_k", self.kc as i64),
        ];
        cpu_features(self, workload, strategy, target, representative, &task)
    }
}

impl Tunable for RowKernel {
    /// One task of `rows` rows, each 16 steps long.
    fn features(
        &self,
        workload: &Workload,
        strategy: PaddingStrategy,
        target: &CpuTarget,
        representative: &Bindings,
    ) -> Vec<f64> {
        let task = [
            ("e_m", self.rows as i64),
            ("e_n", 16 * self.step(target) as i64),
        ];
        cpu_features(self, workload, strategy, target, representative, &task)
    }
}

impl Tunable for AttentionKernel {
    /// One task (a batch item's head) of four blocks of queries against eight tile rows
    /// of keys.
    fn features(
        &self,
        workload: &Workload,
        strategy: PaddingStrategy,
        target: &CpuTarget,
        representative: &Bindings,
    ) -> Vec<f64> {
        let task = [
            ("e_b", 1),
            ("e_h", 1),
            ("e_m", 4 * self.rows as i64),
            ("e_n", 8 * self.width(target) as i64),
        ];
        cpu_features(self, workload, strategy, target, representative, &task)
    }
}

impl Tunable for GpuContractionKernel {
    /// From the tiles alone (the sketch's structure is fixed): tile sizes, threads,
    /// shared memory, registers, resident blocks and warps, arithmetic per shared load,
    /// global loads per multiply-add, fetch work per thread.
    fn features(
        &self,
        _workload: &Workload,
        _strategy: PaddingStrategy,
        t: &GpuTarget,
        _representative: &Bindings,
    ) -> Vec<f64> {
        let f = |x: u32| f64::from(x);
        let mk = self;
        let threads = f(mk.threads());
        let blocks = f(t.blocks_per_sm(mk));
        vec![
            f(mk.bm).ln(),
            f(mk.bn).ln(),
            f(mk.bk).ln(),
            f(mk.tm),
            f(mk.tn),
            threads.ln(),
            f(mk.shared_bytes()) / 1024.0,
            f(mk.registers_per_thread()),
            blocks,
            blocks * threads / f(t.max_threads_per_sm).max(1.0),
            2.0 * f(mk.tm * mk.tn) / f(mk.tm + mk.tn),
            (f(mk.bm) + f(mk.bn)) / (f(mk.bm) * f(mk.bn)),
            f(mk.bk) * (f(mk.bm) + f(mk.bn)) / threads,
        ]
    }

    fn launch(&self) -> Option<GpuContractionKernel> {
        Some(*self)
    }
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
        let a = ContractionKernel::default_for(&target);
        let small = ContractionKernel {
            mr: 2,
            nr: lanes,
            mc: 4,
            nc: 2 * lanes,
            kc: 8,
            uk: 2,
            dot: false,
            pf: false,
            ia: false,
            ib: false,
            vm: false,
            amx: false,
        };
        let fa = a.features(&w, PaddingStrategy::LocalPad, &target, &b);
        let fs = small.features(&w, PaddingStrategy::LocalPad, &target, &b);
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
