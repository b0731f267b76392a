//! Lowering a fused graph to a plan (`anyshape-plan`): every run-time value gets its
//! storage — a caller's input, a constant (weights read by kernels laid out in panels
//! here, once), shape plumbing kept as expressions, the arena for kernels' outputs, a
//! host step's own tensor, or a view of another value — kernel steps name their task,
//! every other run-time node becomes a host step, and the arena's slots are assigned.
//! The plan is verified before it is returned.
use crate::fusion::{Fusion, Layout, StepKind};
use crate::graph::Graph;
use crate::{fact, GraphError, Result};
use anyshape_ir::{bf16_pair, i8_quad, i8_quantize, i8_row_scale, Expr, Precision};
use anyshape_plan::{
    check_cache, Cache, ConstantLayout, MemoryPlan, Plan, PlanFile, Step, Storage, Task, Value,
};
use anyshape_tensor::{DType, Data, Fact, Node, Tensor, TensorSpec, ValueId};
use std::collections::HashMap;

/// The plan of `g`, whose facts are `facts` and whose steps are `fusion`'s.
pub fn lower(g: &Graph, facts: &[Option<Fact>], fusion: &Fusion) -> Result<PlanFile> {
    let tasks = fusion.tasks();
    let step_tasks = fusion.step_tasks(&tasks);
    let mut l = Lowering {
        g,
        facts,
        plan: Plan {
            inputs: Vec::new(),
            outputs: Vec::new(),
            values: Vec::new(),
            constants: Vec::new(),
            tasks: tasks
                .into_iter()
                .map(|t| Task {
                    workload: t.workload,
                    count: t.count,
                })
                .collect(),
            steps: Vec::new(),
            memory: MemoryPlan::default(),
            caches: Vec::new(),
        },
        // Room for every weight (once; the panels of one laid out both ways would grow
        // it): the data is written once, not copied as it grows.
        data: Vec::with_capacity(
            g.initializers
                .values()
                .map(|t| t.len() * 8 + 64)
                .sum::<usize>()
                .min(1 << 36),
        ),
        ids: HashMap::new(),
        panels: HashMap::new(),
    };
    for (i, input) in g.inputs.iter().enumerate() {
        let v = l.value(input.value)?;
        l.plan.values[v].storage = Storage::Input(i);
        let spec = TensorSpec {
            name: g.values[input.value].clone(),
            dtype: input.dtype,
            shape: input.dims.clone(),
        };
        l.plan.inputs.push((spec, v));
    }
    // Each host node's step.
    let mut host_steps = HashMap::new();
    for (k, step) in fusion.steps.iter().enumerate() {
        match &step.kind {
            StepKind::Kernel(_) => {
                let task = step_tasks[k].ok_or_else(|| internal("a kernel step without a task"))?;
                let inputs = step
                    .inputs
                    .iter()
                    .map(|&(v, layout)| match layout {
                        Layout::AsIs => l.value(v),
                        Layout::Panels {
                            width,
                            transposed,
                            precision,
                            batched,
                        } => l.panels(v, width, transposed, precision, batched),
                        Layout::I8Scales { transposed } => l.i8_scales(v, transposed),
                        Layout::Columns { conv } => l.columns(v, &g.nodes[conv]),
                    })
                    .collect::<Result<_>>()?;
                let y = step
                    .output
                    .ok_or_else(|| internal("a kernel step without an output"))?;
                let output = l.made(y, Storage::Arena(0))?;
                l.plan.steps.push(Step::Kernel {
                    task,
                    inputs,
                    output,
                });
            }
            StepKind::View => {
                let node = &g.nodes[step.nodes[0]];
                let src = node.input(0)?;
                let src = l.value(src)?;
                l.made(node.outputs[0], Storage::View(src))?;
            }
            _ => {
                for &n in &step.nodes {
                    host_steps.insert(n, l.plan.steps.len());
                    let node = &g.nodes[n];
                    let inputs = node
                        .inputs
                        .iter()
                        .map(|i| i.map(|v| l.value(v)).transpose())
                        .collect::<Result<_>>()?;
                    let outputs = node
                        .outputs
                        .iter()
                        .map(|&v| l.made(v, Storage::Owned))
                        .collect::<Result<_>>()?;
                    l.plan.steps.push(Step::Host(Node {
                        inputs,
                        outputs,
                        ..node.clone()
                    }));
                }
            }
        }
    }
    for &o in &g.outputs {
        let v = l.value(o)?;
        let f = fact(facts, o);
        let spec = TensorSpec {
            name: g.values[o].clone(),
            dtype: f.dtype,
            shape: f.shape.clone(),
        };
        l.plan.outputs.push((spec, v));
    }
    // A decoder's caches, where its kernels can read them with room to spare.
    for (present, &o) in g.outputs.iter().enumerate() {
        let Some((node, past, axis)) = g.cache_append(o) else {
            continue;
        };
        let Some(&step) = host_steps.get(&node) else {
            continue;
        };
        let cache = Cache {
            past,
            present,
            step,
            axis,
        };
        if check_cache(&l.plan, &cache).is_ok() {
            l.plan.caches.push(cache);
        }
    }
    MemoryPlan::assign(&mut l.plan);
    Ok(PlanFile::new(l.plan, l.data)?)
}

fn internal(what: &str) -> GraphError {
    GraphError::Format(format!("{what} (a bug in fusion)"))
}

struct Lowering<'a> {
    g: &'a Graph,
    facts: &'a [Option<Fact>],
    plan: Plan,
    data: Vec<u8>,
    /// The plan's value of each graph value lowered so far.
    ids: HashMap<ValueId, usize>,
    /// The plan's value of each weight laid out in panels: (graph value, width,
    /// transposed, precision, batched).
    panels: HashMap<(ValueId, usize, bool, Precision, bool), usize>,
}

impl Lowering<'_> {
    fn push(&mut self, value: Value) -> usize {
        self.plan.values.push(value);
        self.plan.values.len() - 1
    }

    /// The plan's value of graph value `v` as steps read it: a constant, shape
    /// plumbing, or (until its writer says otherwise) a run-time value.
    fn value(&mut self, v: ValueId) -> Result<usize> {
        if let Some(&id) = self.ids.get(&v) {
            return Ok(id);
        }
        let f = fact(self.facts, v);
        let name = self.g.values[v].clone();
        let storage = match (&f.value, &f.sym) {
            (Some(t), _) => Storage::Constant(self.constant(&name, t)),
            (None, Some(sym)) if f.dtype == DType::I64 && f.rank() <= 1 => {
                Storage::Plumbing(sym.clone())
            }
            _ => Storage::Owned,
        };
        let id = self.push(Value {
            name,
            dtype: f.dtype,
            shape: f.shape.clone(),
            storage,
        });
        self.ids.insert(v, id);
        Ok(id)
    }

    /// The plan's value of graph value `v`, which a step writes, stored as `storage`.
    fn made(&mut self, v: ValueId, storage: Storage) -> Result<usize> {
        let id = self.value(v)?;
        self.plan.values[id].storage = storage;
        Ok(id)
    }

    /// Add tensor `t` to the constants, row-major.
    fn constant(&mut self, name: &str, t: &Tensor) -> usize {
        let width = t.dtype().size_bytes();
        PlanFile::add_constant(
            &mut self.plan,
            &mut self.data,
            name,
            t.dtype(),
            t.shape.clone(),
            ConstantLayout::RowMajor,
            t.len() * width,
            |out| match &t.data {
                Data::F32(v) => {
                    for (o, x) in out.chunks_exact_mut(4).zip(v) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                }
                Data::I64(v) => {
                    for (o, x) in out.chunks_exact_mut(8).zip(v) {
                        o.copy_from_slice(&x.to_le_bytes());
                    }
                }
                Data::Bool(v) => {
                    for (o, &x) in out.iter_mut().zip(v) {
                        *o = x as u8;
                    }
                }
            },
        )
    }

    /// The plan's value of the columns of image tensor `x` for the convolution `conv`
    /// (`[n, ci·kh·kw, oh·ow]`), laid out by a host step ([`anyshape_tensor::ops::IM2COL`])
    /// pushed here, before the kernel that reads them.
    fn columns(&mut self, x: ValueId, conv: &Node) -> Result<usize> {
        let kernel = fact(self.facts, conv.input(1)?)
            .const_shape()
            .filter(|s| s.len() == 4)
            .ok_or_else(|| internal("a convolution's filters are not constant"))?;
        let mut attrs = conv.attrs.clone();
        attrs.insert(
            "kernel_shape".into(),
            anyshape_tensor::Attr::Ints(vec![kernel[2] as i64, kernel[3] as i64]),
        );
        let spec = anyshape_tensor::ops::op(anyshape_tensor::ops::IM2COL)
            .ok_or_else(|| internal("no im2col op"))?;
        let mut node = Node {
            name: format!("{} (columns)", conv.name),
            op: spec.name.into(),
            inputs: vec![Some(x)],
            outputs: vec![],
            attrs,
        };
        let out = (spec.infer)(&node, &[Some(fact(self.facts, x))])?.remove(0);
        let input = self.value(x)?;
        let id = self.push(Value {
            name: format!("{} (columns)", self.g.values[x]),
            dtype: out.dtype,
            shape: out.shape,
            storage: Storage::Owned,
        });
        node.inputs = vec![Some(input)];
        node.outputs = vec![id];
        self.plan.steps.push(Step::Host(node));
        Ok(id)
    }

    /// The plan's value of the scales of the constant 2-D weight `v`'s output channels
    /// (`transposed`: the graph holds it as `[K, N]`) quantized to 8 bits, as its `i8`
    /// panels are: `[N]`, row-major.
    fn i8_scales(&mut self, v: ValueId, transposed: bool) -> Result<usize> {
        let name = self.g.values[v].clone();
        let t = fact(self.facts, v).value.as_ref().ok_or_else(|| {
            GraphError::Format(format!("`{name}` is quantized but not a constant"))
        })?;
        let [r, c] = t.shape[..] else {
            return Err(internal(&format!(
                "`{name}`: an i8 weight of shape {:?} is not 2-D",
                t.shape
            )));
        };
        let (n, k) = if transposed { (c, r) } else { (r, c) };
        let w = t.as_f32()?;
        let at = |row: usize, col: usize| match transposed {
            true => w[col * n + row],
            false => w[row * k + col],
        };
        let scales = i8_channels(at, n, k).into_iter().map(|(s, _)| s).collect();
        let tensor = Tensor::f32(vec![n], scales)?;
        let label = format!("{name} (i8 channel scales)");
        let c = self.constant(&label, &tensor);
        Ok(self.push(Value {
            name: label,
            dtype: DType::F32,
            shape: vec![Expr::Const(n as i64)],
            storage: Storage::Constant(c),
        }))
    }

    /// The plan's value of the constant weight `v` laid out in panels of `width` rows
    /// of `W[n, k]` (`transposed`: the graph holds it as `[K, N]`; in `bf16` as words of
    /// two bfloat16 along K; a convolution's filters `[co, ci, kh, kw]` as `[co,
    /// ci·kh·kw]`; `batched`: a batch `[B, N, K]` of such matrices, one after another),
    /// made once: written straight into the plan's data, rows past `N` zero.
    fn panels(
        &mut self,
        v: ValueId,
        width: usize,
        transposed: bool,
        precision: Precision,
        batched: bool,
    ) -> Result<usize> {
        let key = (v, width, transposed, precision, batched);
        if let Some(&id) = self.panels.get(&key) {
            return Ok(id);
        }
        let name = self.g.values[v].clone();
        let t = fact(self.facts, v).value.as_ref().ok_or_else(|| {
            GraphError::Format(format!("`{name}` is laid out in panels but not a constant"))
        })?;
        // Matrices, rows, and the rest of the dims as the columns (a convolution's
        // filters).
        let (items, r, c) = match t.shape[..] {
            [b, r, c] if batched && !transposed && precision == Precision::F32 => (b, r, c),
            _ if batched => {
                return Err(internal(&format!(
                    "`{name}`: a batch of f32 matrices [B, N, K] in panels, not {:?}",
                    t.shape
                )))
            }
            [r, c] => (1, r, c),
            [r, _, ..] if !transposed => (1, r, t.shape[1..].iter().product()),
            _ => {
                return Err(GraphError::Format(format!(
                    "`{name}`: a weight of shape {:?} is not 2-D",
                    t.shape
                )))
            }
        };
        let (n, k) = if transposed { (c, r) } else { (r, c) };
        let w = t.as_f32()?;
        // The columns stored: elements, or words of a pair each.
        let cols = match precision {
            Precision::F32 => k,
            Precision::Bf16 if k % 2 == 0 => k / 2,
            Precision::I8 if k % 4 == 0 => k / 4,
            Precision::Bf16 | Precision::I8 => {
                return Err(internal(&format!(
                    "`{name}`: {precision} groups of {} along a reduction of {k}",
                    precision.group()
                )))
            }
        };
        let matrix = [n.div_ceil(width), cols, width];
        let shape = match batched {
            true => [&[items][..], &matrix].concat(),
            false => matrix.to_vec(),
        };
        let c = PlanFile::add_constant(
            &mut self.plan,
            &mut self.data,
            &name,
            DType::F32,
            shape.clone(),
            ConstantLayout::Panels { width, precision },
            shape.iter().product::<usize>() * 4,
            |out| {
                let bytes = matrix.iter().product::<usize>() * 4;
                if bytes == 0 {
                    return; // no rows or columns: nothing to lay out
                }
                for (item, out) in out.chunks_exact_mut(bytes).enumerate() {
                    let w = &w[item * n * k..];
                    let at = |row: usize, col: usize| match transposed {
                        true => w[col * n + row],
                        false => w[row * k + col],
                    };
                    match precision {
                        Precision::F32 => panels(at, n, cols, width, out),
                        Precision::Bf16 => panels(
                            |row, col| bf16_pair(at(row, 2 * col), at(row, 2 * col + 1)),
                            n,
                            cols,
                            width,
                            out,
                        ),
                        Precision::I8 => {
                            // Each output channel quantized by its own scale.
                            let scales = i8_channels(at, n, k);
                            panels(
                                |row, col| {
                                    i8_quad(std::array::from_fn(|e| {
                                        i8_quantize(at(row, 4 * col + e), scales[row].1)
                                    }))
                                },
                                n,
                                cols,
                                width,
                                out,
                            )
                        }
                    }
                }
            },
        );
        let suffix = match precision {
            Precision::F32 => "in panels",
            Precision::Bf16 => "in panels of bf16 pairs",
            Precision::I8 => "in panels of 8-bit quads",
        };
        let id = self.push(Value {
            name: format!("{name} ({suffix})"),
            dtype: DType::F32,
            shape: shape.iter().map(|&d| Expr::Const(d as i64)).collect(),
            storage: Storage::Constant(c),
        });
        self.panels.insert(key, id);
        Ok(id)
    }
}

/// The `(scale, inverse)` of each of the `n` output channels of a weight quantized to
/// 8 bits (`anyshape_ir::i8_row_scale` over its `k` elements `at(row, col)`).
fn i8_channels(at: impl Fn(usize, usize) -> f32, n: usize, k: usize) -> Vec<(f32, f32)> {
    (0..n)
        .map(|row| i8_row_scale((0..k).map(|col| at(row, col))))
        .collect()
}

/// The `n x cols` matrix of 32-bit elements `element(row, col)` laid out in panels of
/// `width` rows (`anyshape_ir::TensorRef::panels`: `dense_packed`'s weights, or
/// `dense_bf16`'s words of two bfloat16) as little-endian bytes into `out`, zeroed: a
/// panel at a time, each column of it `width` rows.
fn panels(
    element: impl Fn(usize, usize) -> f32,
    n: usize,
    cols: usize,
    width: usize,
    out: &mut [u8],
) {
    for (p, panel) in out.chunks_exact_mut(cols * width * 4).enumerate() {
        let rows = (p * width)..((p + 1) * width).min(n);
        for col in 0..cols {
            let start = col * width * 4;
            for (i, row) in rows.clone().enumerate() {
                let x = element(row, col);
                panel[start + i * 4..start + i * 4 + 4].copy_from_slice(&x.to_le_bytes());
            }
        }
    }
}
