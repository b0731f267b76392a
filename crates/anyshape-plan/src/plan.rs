//! The plan's types. Invariants (checked by [`crate::verify`]):
//!
//! - every value a step, a view or an output names exists; every value is written
//!   before it is read: inputs, constants and shape plumbing before the first step, an
//!   arena or owned value by exactly one step, a view when its source is;
//! - a kernel step gives its task's workload as many inputs as it takes, each of 32-bit
//!   floats and of the workload tensor's size (symbolically: for every binding of the
//!   shape vars), and writes one arena value of the output's size;
//! - a host step is one registered ONNX op whose outputs are owned values;
//! - a view has as many elements as its source;
//! - arena values that share a slot are never alive at once, and a slot holds each;
//! - constants lie in the plan's data, each on a cache line, as large as their shape;
//! - a cache's present is made by a host `Concat` of its past (the one step to read
//!   the past) and read only by kernels that take `cache_reserve` rows to spare.
use crate::text;
use crate::MemoryPlan;
use anyshape_ir::{Bindings, Expr, Precision, Workload};
use anyshape_tensor::{DType, Node, TensorSpec, ValueId};
use serde::{Deserialize, Serialize};

/// Where a value lives while a plan runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Storage {
    /// The caller's input of this index (among [`Plan::inputs`]).
    Input(usize),
    /// The constant of this index (among [`Plan::constants`]).
    Constant(usize),
    /// Integers known as expressions over the shape vars (shape plumbing): evaluated at
    /// the instance's dims before the first step. A scalar when the value's shape is
    /// empty, else a vector.
    Plumbing(#[serde(with = "text::exprs")] Vec<Expr>),
    /// A slot of the arena (a kernel step's output).
    Arena(usize),
    /// A tensor a host step makes (its op's evaluation allocates it).
    Owned,
    /// The same elements as another value, under this value's shape.
    View(ValueId),
}

/// A value of the plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Value {
    /// Its name in the source model (for messages and profiles).
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape, as expressions over the shape vars.
    #[serde(with = "text::exprs")]
    pub shape: Vec<Expr>,
    /// Where it lives.
    pub storage: Storage,
}

/// How a constant's elements are laid out in the plan's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstantLayout {
    /// Row-major, as the model holds it.
    RowMajor,
    /// A 2-D weight `W[n, k]` in panels of `width` rows (`dense_packed`'s layout: stored
    /// `[⌈N/width⌉, K, width]`, the last panel's rows past `N` zero); in `bf16`,
    /// `dense_bf16`'s: each element a word of two bfloat16 along K (`[⌈N/width⌉, K/2,
    /// width]` words, see `anyshape_ir::Precision::Bf16`); a batch of f32 matrices `[B,
    /// N, K]` (Winograd's transformed filters) each so, one after another (`[B,
    /// ⌈N/width⌉, K, width]`).
    Panels {
        /// Rows per panel.
        width: usize,
        /// `f32` elements or words of two bfloat16.
        #[serde(default, skip_serializing_if = "Precision::is_f32")]
        precision: Precision,
    },
}

/// A constant the plan's steps read, stored in the plan's data in its run-time layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Constant {
    /// Its name in the source model.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// The shape of its stored elements (for panels: `[⌈N/width⌉, K, width]`, a batch's
    /// `[B, ⌈N/width⌉, K, width]`).
    pub shape: Vec<usize>,
    /// How its elements are laid out.
    pub layout: ConstantLayout,
    /// Where its elements start in the plan's data, in bytes (a multiple of 64).
    pub offset: u64,
    /// Its bytes.
    pub bytes: u64,
}

/// A kernel task: a workload compiled into a task module, and how many steps run it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// The workload (as its text form in the file).
    #[serde(with = "text::workload")]
    pub workload: Workload,
    /// How many steps run it.
    pub count: usize,
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// A compiled kernel: the task's module computes `output` from `inputs` (in the
    /// workload's order: operands, then the epilogue's inputs).
    Kernel {
        /// The task (an index into [`Plan::tasks`]).
        task: usize,
        /// The values it reads.
        inputs: Vec<ValueId>,
        /// The arena value it writes.
        output: ValueId,
    },
    /// One ONNX op evaluated on the host; the node's inputs and outputs are the plan's
    /// values.
    Host(Node),
}

/// A decoder's key/value cache: a `present` output that a host `Concat` makes of a
/// `past` input and the new rows, read only by kernels that take the rows the cache
/// holds past its end ([`anyshape_ir::CACHE_RESERVE`]). A plain run makes it as the
/// model says (no room to spare); a run that keeps the caches (a generation) holds each
/// in a buffer with room to grow and appends the new rows in place of the `Concat`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cache {
    /// The `past` input's index among [`Plan::inputs`].
    pub past: usize,
    /// The `present` output's index among [`Plan::outputs`].
    pub present: usize,
    /// The `Concat` step's index among [`Plan::steps`].
    pub step: usize,
    /// The axis that grows.
    pub axis: usize,
}

/// A compiled model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The model's inputs as a caller gives them, and the value each is.
    pub inputs: Vec<(TensorSpec, ValueId)>,
    /// The model's outputs as a caller gets them (shapes as expressions), and the value
    /// each is.
    pub outputs: Vec<(TensorSpec, ValueId)>,
    /// Every value the steps read or write.
    pub values: Vec<Value>,
    /// The constants, their elements in the plan's data.
    pub constants: Vec<Constant>,
    /// The kernel tasks.
    pub tasks: Vec<Task>,
    /// The steps, in the order they run.
    pub steps: Vec<Step>,
    /// The arena the kernels' outputs share.
    pub memory: MemoryPlan,
    /// A decoder's key/value caches (none for other models).
    pub caches: Vec<Cache>,
}

impl Step {
    /// The values the step reads (a host op's left-out inputs skipped).
    pub fn reads(&self) -> Vec<ValueId> {
        match self {
            Step::Kernel { inputs, .. } => inputs.clone(),
            Step::Host(node) => node.inputs.iter().flatten().copied().collect(),
        }
    }

    /// The values the step writes.
    pub fn writes(&self) -> Vec<ValueId> {
        match self {
            Step::Kernel { output, .. } => vec![*output],
            Step::Host(node) => node.outputs.clone(),
        }
    }
}

impl Plan {
    /// The bytes of the constants kernel steps read (each counted once): what a run
    /// streams from memory where the activations are few (a decode step).
    pub fn kernel_constant_bytes(&self) -> u64 {
        let mut used = std::collections::BTreeSet::new();
        for step in &self.steps {
            if let Step::Kernel { inputs, .. } = step {
                for &v in inputs {
                    if let Storage::Constant(c) = self.values[self.root(v)].storage {
                        used.insert(c);
                    }
                }
            }
        }
        used.iter()
            .filter_map(|&c| self.constants.get(c))
            .map(|c| c.bytes)
            .sum()
    }

    /// The value whose storage holds `v`'s elements (`v` itself unless it is a view).
    pub fn root(&self, mut v: ValueId) -> ValueId {
        // Views form chains without cycles (verified); the bound guards a bad plan.
        for _ in 0..self.values.len() {
            match self.values[v].storage {
                Storage::View(src) => v = src,
                _ => return v,
            }
        }
        v
    }

    /// For each value, the last step that reads it or a view of it (`usize::MAX` for
    /// what the outputs read: alive to the end), by its root.
    pub fn last_uses(&self) -> Vec<usize> {
        let mut last = vec![0usize; self.values.len()];
        let mut read = vec![false; self.values.len()];
        for (k, s) in self.steps.iter().enumerate() {
            for v in s.reads() {
                let r = self.root(v);
                last[r] = k;
                read[r] = true;
            }
        }
        for &(_, o) in &self.outputs {
            let r = self.root(o);
            last[r] = usize::MAX;
            read[r] = true;
        }
        // A value nobody reads dies where it is made.
        for (k, s) in self.steps.iter().enumerate() {
            for v in s.writes() {
                if !read[v] {
                    last[v] = k;
                }
            }
        }
        last
    }

    /// The shape of value `v` at `bindings`.
    pub fn shape_at(&self, v: ValueId, bindings: &Bindings) -> crate::Result<Vec<usize>> {
        let mut shape = Vec::new();
        self.shape_into(v, bindings, &mut shape)?;
        Ok(shape)
    }

    /// [`Plan::shape_at`] into `shape` (its vector reused: nothing allocated where it
    /// has room).
    pub fn shape_into(
        &self,
        v: ValueId,
        bindings: &Bindings,
        shape: &mut Vec<usize>,
    ) -> crate::Result<()> {
        shape.clear();
        for e in &self.values[v].shape {
            let x = e.eval(bindings)?;
            shape.push(usize::try_from(x).map_err(|_| {
                crate::PlanError::Invalid(format!(
                    "`{}` has the dim {e} = {x} at {bindings}",
                    self.values[v].name
                ))
            })?);
        }
        Ok(())
    }

    /// The bytes of the constants' data the plan refers to.
    pub fn data_bytes(&self) -> u64 {
        self.constants
            .iter()
            .map(|c| c.offset + c.bytes)
            .max()
            .unwrap_or(0)
    }

    /// What step `k` computes, for profiles: its task's workload, or its op (host).
    pub fn step_label(&self, k: usize) -> String {
        match &self.steps[k] {
            Step::Kernel { task, .. } => self.tasks[*task].workload.to_string(),
            Step::Host(node) => format!("{} (host)", node.op),
        }
    }
}

/// The number of elements of a symbolic shape.
pub(crate) fn numel(shape: &[Expr]) -> Expr {
    shape
        .iter()
        .fold(Expr::Const(1), |acc, d| acc * d.clone())
        .simplify()
}
