//! Fusion (TSCompiler §4.2–§4.3): a model's run-time nodes grouped into steps, and the
//! steps that are kernels into **tasks** — workloads over the model's shape vars,
//! identical ones counted once.
//!
//! - A contraction (`MatMul`, `Gemm`) is a backbone: `dense_packed` when one operand is
//!   a weight (a 2-D constant, laid out once in panels of [`PANEL_WIDTH`] rows of
//!   `W[n, k]` whether ONNX holds it as `[K, N]` or `[N, K]`: [`Layout`]),
//!   `batch_matmul_nn` when both are activations. The elementwise ops that follow it,
//!   through views (reshapes of contiguous data), become its epilogue while they fit: a
//!   bias along the last axis, a constant scale, GELU in its erf and tanh
//!   decompositions, tanh, relu, a residual input of the output's size, and an input
//!   broadcast along some output axes (a mask; the patterns: see [`epilogue`]).
//! - Multi-head attention's two contractions read the projections' `[batch, sequence,
//!   heads, dim]` tensors in place, their transposes and constant scales folded in
//!   (`attention_scores`, `attention_context`: see [`attention`]); where the scores'
//!   only use is their softmax and the probabilities' only use is the context, the
//!   three are one `attention` or `masked_attention` kernel (see [`fused_attention`]).
//! - Normalizations over the last axis are row-wise tasks (see [`normalization`]):
//!   `softmax` (with `+nan_to_zero` where `Where(IsNaN(p), 0, p)` follows it),
//!   `layer_norm` from `LayerNormalization`, `rms_norm` from `RMSNormalization` and
//!   from RMSNorm's decomposition (`Pow` … `Mul`), their scale and bias fused.
//! - Views cost nothing; everything else at run time (embedding gathers, other
//!   transposes, the masks' own values, other elementwise chains) is a movement or
//!   elementwise step.
//!
//! Nodes whose outputs are known at compile time (constants, shape plumbing) are no
//! step at all.
mod attention;
mod contraction;
mod epilogue;
mod fused_attention;
mod normalization;

use crate::fact;
use crate::graph::Graph;
use anyshape_ir::{Expr, Precision, Workload};
use anyshape_tensor::{DType, Fact, Node, ValueId};
use std::collections::BTreeMap;

/// What a step does.
#[derive(Clone, Debug, PartialEq, Eq)]
// A model has a few hundred steps, made once at compile time: boxing the kernel's
// workload would save nothing that counts.
#[allow(clippy::large_enum_variant)]
pub enum StepKind {
    /// A compiled kernel of a task (its workload).
    Kernel(Workload),
    /// Elementwise ops (their op types).
    Elementwise(String),
    /// Data movement (a copy, gather, concat, …).
    Movement(String),
    /// A view: the same buffer under another shape.
    View,
}

/// One step of a model: its kind and the nodes it covers.
#[derive(Clone, Debug)]
pub struct Step {
    /// What it does.
    pub kind: StepKind,
    /// The nodes (indices into [`Graph::nodes`]).
    pub nodes: Vec<usize>,
    /// A kernel's tensors in the order its workload takes them (operands, then the
    /// epilogue's inputs), each with how the kernel reads it; empty for other steps.
    pub inputs: Vec<(ValueId, Layout)>,
    /// The value a kernel step writes.
    pub output: Option<ValueId>,
}

/// Rows per panel of the weights of `dense_packed` kernels: two AVX2 vectors, one
/// AVX-512 vector, so the kernels read whole vectors of a panel in place.
pub const PANEL_WIDTH: usize = 16;

/// How a kernel reads one of its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// As the graph holds it.
    AsIs,
    /// A constant weight laid out once, before any run, in panels of `width` rows of
    /// `W[n, k]` (what `dense_packed` reads; in `bf16`, words of two bfloat16 along K,
    /// what `dense_bf16` reads; a convolution's filters `[co, ci, kh, kw]` as `[co,
    /// ci·kh·kw]`, what `conv_packed` reads); `transposed`: the graph holds it as ONNX's
    /// `[K, N]`.
    Panels {
        /// Rows per panel.
        width: usize,
        /// Whether the graph holds the weight as `[K, N]`.
        transposed: bool,
        /// `f32` elements, or words of two `bf16` or of four 8-bit values.
        precision: Precision,
        /// Whether it is a batch of matrices `[B, N, K]`, each in panels (what
        /// `batch_matmul_packed` reads: Winograd's transformed filters), one after
        /// another.
        batched: bool,
    },
    /// The scales of a constant weight's output channels as an `i8` contraction's
    /// epilogue multiplies by them (`[N]`, each the largest magnitude of the channel's
    /// weights over 127: `anyshape_ir::i8_row_scale`), the weight being laid out in
    /// [`Layout::Panels`] of 8-bit quads; `transposed`: the graph holds it as `[K, N]`.
    I8Scales {
        /// Whether the graph holds the weight as `[K, N]`.
        transposed: bool,
    },
    /// An NCHW image tensor's patches as the columns of a matrix per image
    /// (`[n, ci·kh·kw, oh·ow]`), laid out at run time by a host step before the kernel:
    /// the input of the convolution `conv`, the node whose window attributes say how.
    Columns {
        /// The `Conv` node.
        conv: usize,
    },
}

impl Layout {
    /// The weight of a `dense_packed` (`dense_bf16`, `conv_packed`) kernel, held by the
    /// graph as `[K, N]` or not.
    fn panels(transposed: bool, precision: Precision) -> Layout {
        Layout::Panels {
            width: PANEL_WIDTH,
            transposed,
            precision,
            batched: false,
        }
    }

    /// The constant batch of matrices `[B, M, K]` of a `batch_matmul_packed` kernel.
    fn batch_panels() -> Layout {
        Layout::Panels {
            width: PANEL_WIDTH,
            transposed: false,
            precision: Precision::F32,
            batched: true,
        }
    }
}

/// A kernel task and how often the model runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    /// The workload.
    pub workload: Workload,
    /// How many steps run it.
    pub count: usize,
}

/// The steps of a model, in order.
pub struct Fusion {
    /// Every run-time step.
    pub steps: Vec<Step>,
}

impl Fusion {
    /// The kernel tasks, deduplicated, most frequent first.
    pub fn tasks(&self) -> Vec<Task> {
        let mut tasks: Vec<Task> = Vec::new();
        for s in &self.steps {
            if let StepKind::Kernel(w) = &s.kind {
                match tasks.iter_mut().find(|t| &t.workload == w) {
                    Some(t) => t.count += 1,
                    None => tasks.push(Task {
                        workload: w.clone(),
                        count: 1,
                    }),
                }
            }
        }
        // Most frequent first; ties in the order of the workloads' text form.
        tasks.sort_by_cached_key(|t| (std::cmp::Reverse(t.count), t.workload.to_string()));
        tasks
    }

    /// The index in [`Fusion::tasks`] of the task each kernel step runs (`None` for
    /// other steps).
    pub fn step_tasks(&self, tasks: &[Task]) -> Vec<Option<usize>> {
        self.steps
            .iter()
            .map(|s| match &s.kind {
                StepKind::Kernel(w) => tasks.iter().position(|t| &t.workload == w),
                _ => None,
            })
            .collect()
    }

    /// How many steps of each kind other than kernels, by a short name.
    pub fn other_steps(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for s in &self.steps {
            let key = match &s.kind {
                StepKind::Kernel(_) => continue,
                StepKind::Elementwise(ops) => format!("elementwise {ops}"),
                StepKind::Movement(op) => format!("movement {op}"),
                StepKind::View => "view".to_string(),
            };
            *m.entry(key).or_default() += 1;
        }
        m
    }
}

/// Ops that only reinterpret a contiguous buffer.
const VIEWS: [&str; 5] = ["Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"];

struct Fuser<'a> {
    g: &'a Graph,
    facts: &'a [Option<Fact>],
    /// Run-time consumers of each value.
    consumers: Vec<Vec<usize>>,
    /// The run-time node that computes each value.
    producer: Vec<Option<usize>>,
    taken: Vec<bool>,
    /// Values that are a 2-D `Transpose` of a constant read only as a `MatMul`'s right
    /// operand: the constant and the `Transpose` node (its kernel reads the constant
    /// in place instead, e.g. GPT-2's tied LM head `MatMul(x, Transpose(wte))`).
    transposed: std::collections::HashMap<ValueId, (ValueId, usize)>,
    /// The attention contractions, by their `MatMul` node.
    attention: std::collections::HashMap<usize, attention::Attention>,
    /// What dense layers over constant weights multiply in.
    precision: Precision,
    /// What attention's products multiply in (`f32` or `bf16`).
    attention_precision: Precision,
}

/// Whether value `v` is known at compile time (a constant, or shape plumbing).
fn is_static(f: &Fact) -> bool {
    f.value.is_some() || (f.sym.is_some() && f.dtype == DType::I64 && f.rank() <= 1)
}

/// Group the run-time nodes of `g` (with the facts of [`crate::infer`]) into steps; dense
/// layers over constant weights multiply in `precision` (`bf16`: `dense_bf16`, its
/// weights in panels of bfloat16 pairs, where the reduction is an even constant; `i8`:
/// `dense_i8`, its weights in panels of 8-bit quads times its channels' scales, where
/// the reduction is a constant multiple of 4; the others, and every other kernel, in
/// `f32`), attention's products as the dense layers in `bf16`, else in `f32`
/// ([`fuse_with_attention`] chooses).
pub fn fuse(g: &Graph, facts: &[Option<Fact>], precision: Precision) -> Fusion {
    let attention = match precision {
        Precision::Bf16 => Precision::Bf16,
        Precision::F32 | Precision::I8 => Precision::F32,
    };
    fuse_with_attention(g, facts, precision, attention)
}

/// [`fuse`], attention's products in `attention` (`f32` or `bf16`: the fused attention's
/// `_bf16` forms, and a decoder's scores in bf16 where their reduction is an even
/// constant; an 8-bit attention does not exist, so `i8` is `f32`) whatever the dense
/// layers multiply in.
pub fn fuse_with_attention(
    g: &Graph,
    facts: &[Option<Fact>],
    precision: Precision,
    attention: Precision,
) -> Fusion {
    let runtime: Vec<bool> = g
        .nodes
        .iter()
        .map(|n| n.outputs.iter().any(|&o| !is_static(fact(facts, o))))
        .collect();
    let mut consumers = vec![Vec::new(); g.values.len()];
    let mut producer = vec![None; g.values.len()];
    for (k, n) in g.nodes.iter().enumerate() {
        if runtime[k] {
            for v in n.inputs.iter().flatten() {
                consumers[*v].push(k);
            }
            for &v in &n.outputs {
                producer[v] = Some(k);
            }
        }
    }
    let mut f = Fuser {
        g,
        facts,
        consumers,
        producer,
        taken: runtime.iter().map(|r| !r).collect(),
        transposed: Default::default(),
        attention: Default::default(),
        precision,
        attention_precision: attention,
    };
    // A node that reads or makes a value with run-time dims runs alone on the host:
    // no kernel's task, view or fused chain is over dims the compile cannot know.
    let mut steps = Vec::new();
    for (k, n) in g.nodes.iter().enumerate() {
        let late = |v: &ValueId| fact(facts, *v).shape.iter().any(Expr::has_runtime_dims);
        if runtime[k] && n.inputs.iter().flatten().chain(&n.outputs).any(late) {
            f.taken[k] = true;
            steps.push(Step {
                kind: StepKind::Movement(n.op.clone()),
                nodes: vec![k],
                inputs: vec![],
                output: None,
            });
        }
    }
    for (k, n) in g.nodes.iter().enumerate() {
        let (Some(&Some(src)), Some(&out)) = (n.inputs.first(), n.outputs.first()) else {
            continue;
        };
        let plain_2d = match n.ints("perm") {
            Ok(None) => true,
            Ok(Some(p)) => p == [1, 0],
            Err(_) => false,
        };
        if n.op == "Transpose"
            && runtime[k]
            && plain_2d
            && f.constant(src).is_some_and(|t| t.shape.len() == 2)
            && matches!(f.consumers[out].as_slice(),
                [c] if g.nodes[*c].op == "MatMul" && g.nodes[*c].inputs.get(1) == Some(&Some(out)))
            && !g.outputs.contains(&out)
        {
            f.taken[k] = true;
            f.transposed.insert(out, (src, k));
        }
    }
    for k in 0..g.nodes.len() {
        if f.taken[k] {
            continue;
        }
        if let Some(a) = f.attention(k) {
            for &n in &a.nodes {
                f.taken[n] = true;
            }
            f.attention.insert(k, a);
        }
    }
    for k in 0..g.nodes.len() {
        if f.taken[k] {
            continue;
        }
        let node = &g.nodes[k];
        let step = match node.op.as_str() {
            "MatMul" | "Gemm" | "Conv" => f.contraction(k),
            "Softmax" => f.softmax(k),
            "LayerNormalization" | "RMSNormalization" => f.layer_norm(k),
            "Pow" => f.rms_norm(k),
            // A `Concat` of one input is that input (PyTorch's cache of one tensor), and
            // a `Cast` to the type it has already is it too (PyTorch's `.float()`).
            op if VIEWS.contains(&op)
                || (op == "Concat" && node.inputs.len() == 1)
                || (op == "Cast" && f.same_type(k)) =>
            {
                Some(Step {
                    kind: StepKind::View,
                    nodes: vec![k],
                    inputs: vec![],
                    output: None,
                })
            }
            _ => None,
        };
        let mut step = step.unwrap_or_else(|| f.loose(k));
        // An attention MatMul that did not become a kernel runs the nodes it took.
        if let Some(a) = f.attention.get(&k) {
            for &n in &a.nodes {
                if !step.nodes.contains(&n) {
                    step.nodes.push(n);
                }
            }
            step.nodes.sort_unstable();
        }
        // A MatMul that did not become a kernel computes the transpose it reads.
        if let Some(&(_, t)) = node.input(1).ok().and_then(|b| f.transposed.get(&b)) {
            if !step.nodes.contains(&t) {
                step.nodes.insert(0, t);
            }
        }
        for &n in &step.nodes {
            f.taken[n] = true;
        }
        steps.push(step);
    }
    // A step runs where its last node would: its epilogue's inputs are ready by then.
    steps.sort_by_key(|s| s.nodes.iter().max().copied());
    Fusion {
        steps: f.fuse_attention(steps),
    }
}

impl Fuser<'_> {
    fn shape(&self, v: ValueId) -> &[Expr] {
        &fact(self.facts, v).shape
    }

    fn constant(&self, v: ValueId) -> Option<&anyshape_tensor::Tensor> {
        fact(self.facts, v).value.as_ref()
    }

    /// The one run-time consumer of `v`, not yet taken, if `v` is no graph output.
    fn sole_use(&self, v: ValueId) -> Option<usize> {
        match self.consumers[v].as_slice() {
            [c] if !self.taken[*c] && !self.g.outputs.contains(&v) => Some(*c),
            _ => None,
        }
    }

    /// `v` followed through views that are its sole use: the last view's output and
    /// the views passed.
    fn through_views(&self, v: ValueId) -> (ValueId, Vec<usize>) {
        let mut views = Vec::new();
        let mut v = v;
        while let Some(c) = self.sole_use(v) {
            let n = &self.g.nodes[c];
            if !(VIEWS.contains(&n.op.as_str()) && n.inputs.first() == Some(&Some(v))) {
                break;
            }
            views.push(c);
            v = n.outputs[0];
        }
        (v, views)
    }

    /// Whether node `k`'s one output has its first input's element type (a `Cast` that
    /// changes nothing).
    fn same_type(&self, k: usize) -> bool {
        let node = &self.g.nodes[k];
        match (node.input(0), node.outputs.as_slice()) {
            (Ok(x), [y]) => fact(self.facts, x).dtype == fact(self.facts, *y).dtype,
            _ => false,
        }
    }

    /// The other operand of a binary node that reads `v`.
    fn operand(&self, node: &Node, v: ValueId) -> Option<ValueId> {
        match node.inputs.as_slice() {
            [Some(a), Some(b)] if *a == v => Some(*b),
            [Some(a), Some(b)] if *b == v => Some(*a),
            _ => None,
        }
    }

    /// A constant scalar operand's value.
    fn scalar(&self, v: ValueId) -> Option<f32> {
        let t = self.constant(v)?;
        (t.len() == 1)
            .then(|| t.as_f32().ok().map(|x| x[0]))
            .flatten()
    }

    /// The consumers of `v` (run-time, untaken), by op type.
    fn uses(&self, v: ValueId) -> Vec<(usize, &str)> {
        self.consumers[v]
            .iter()
            .filter(|&&c| !self.taken[c])
            .map(|&c| (c, self.g.nodes[c].op.as_str()))
            .collect()
    }

    /// The one consumer of `v`, if it has op type `op`.
    fn single(&self, v: ValueId, op: &str) -> Option<usize> {
        match self.uses(v).as_slice() {
            [(c, o)] if *o == op => Some(*c),
            _ => None,
        }
    }

    /// Any other run-time node: elementwise chains grouped, others alone.
    fn loose(&self, k: usize) -> Step {
        let node = &self.g.nodes[k];
        if !is_elementwise(&node.op) {
            return Step {
                kind: StepKind::Movement(node.op.clone()),
                nodes: vec![k],
                inputs: vec![],
                output: None,
            };
        }
        let mut nodes = vec![k];
        let mut ops = vec![node.op.clone()];
        let mut v = node.outputs[0];
        while let Some(c) = self.sole_use(v) {
            let n = &self.g.nodes[c];
            if !is_elementwise(&n.op) {
                break;
            }
            nodes.push(c);
            ops.push(n.op.clone());
            v = n.outputs[0];
        }
        Step {
            kind: StepKind::Elementwise(ops.join("→")),
            nodes,
            inputs: vec![],
            output: None,
        }
    }
}

/// The number of elements of a symbolic shape.
fn numel(s: &[Expr]) -> Expr {
    s.iter()
        .fold(Expr::Const(1), |acc, d| acc * d.clone())
        .simplify()
}

/// Ops that map elements to elements (with broadcasting).
fn is_elementwise(op: &str) -> bool {
    matches!(
        op,
        "Add"
            | "Sub"
            | "Mul"
            | "Div"
            | "Pow"
            | "Max"
            | "Min"
            | "Equal"
            | "Greater"
            | "GreaterOrEqual"
            | "Less"
            | "LessOrEqual"
            | "And"
            | "Or"
            | "Xor"
            | "Not"
            | "Where"
            | "Sqrt"
            | "Exp"
            | "Log"
            | "Erf"
            | "Tanh"
            | "Relu"
            | "Sigmoid"
            | "Gelu"
            | "Neg"
            | "Abs"
            | "Reciprocal"
            | "Sin"
            | "Cos"
            | "Tan"
            | "Asin"
            | "Acos"
            | "Atan"
            | "Sinh"
            | "Cosh"
            | "Asinh"
            | "Acosh"
            | "Atanh"
            | "Softplus"
            | "Softsign"
            | "HardSigmoid"
            | "HardSwish"
            | "Sign"
            | "Floor"
            | "Ceil"
            | "Round"
            | "Clip"
            | "IsNaN"
            | "IsInf"
            | "Cast"
    )
}
