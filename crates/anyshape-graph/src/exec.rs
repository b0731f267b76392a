//! Executors. [`run`]: the reference, a graph run op by op on concrete tensors with the
//! operators' plain `eval`s (obviously correct, not fast). [`Plan::run`]: the fused
//! steps of [`crate::fuse`], kernel steps through a caller's kernel function (compiled
//! kernels, or a reference of the workload), the others with the operators' `eval`s.
//! Tests compare both with onnxruntime's recorded outputs.
use crate::graph::{Graph, Input, Node, ValueId};
use crate::ops::{op, unsupported};
use crate::{fact, Fact, Fusion, GraphError, Layout, Result, StepKind, Tensor};
use anyshape_ir::{Bindings, BoundWorkload, Expr, Workload};

/// Runs one kernel step: the step's index (in [`Fusion::steps`]), the workload, the
/// shape vars' values, its instance, its inputs (in the workload's order, contiguous)
/// and the output to fill.
pub type KernelFn<'a> = dyn FnMut(usize, &Workload, &Bindings, &BoundWorkload, &[&[f32]], &mut [f32]) -> Result<()>
    + 'a;

/// The given inputs, checked against the graph's (names, element types, ranks, and
/// dims that must agree), and the shape vars' values they imply.
fn bind_inputs(g: &Graph, inputs: &[(&str, Tensor)]) -> Result<(Vec<(usize, Tensor)>, Bindings)> {
    let mut b = Bindings::default();
    let mut given = Vec::new();
    for i in &g.inputs {
        let name = &g.values[i.value];
        let t = inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| GraphError::Shape(format!("input `{name}` is not given")))?;
        check_input(name, i, &t)?;
        for (d, &v) in i.dims.iter().zip(&t.shape) {
            if let Expr::Var(var) = d {
                match b.get(var) {
                    Some(prev) if prev != v as i64 => {
                        return Err(GraphError::Shape(format!(
                            "input `{name}`: dim `{var}` is {v}, another input gives it {prev}"
                        )))
                    }
                    _ => b.set(var.clone(), v as i64),
                }
            }
        }
        given.push((i.value, t));
    }
    for i in &g.inputs {
        let t = &given
            .iter()
            .find(|(v, _)| *v == i.value)
            .expect("given above")
            .1;
        for (d, &v) in i.dims.iter().zip(&t.shape) {
            if d.eval(&b).is_ok_and(|want| want != v as i64) {
                return Err(GraphError::Shape(format!(
                    "input `{}`: a dim is {v} where the model's {d} gives {}",
                    g.values[i.value],
                    d.eval(&b).unwrap_or(0)
                )));
            }
        }
    }
    Ok((given, b))
}

fn check_input(name: &str, i: &Input, t: &Tensor) -> Result<()> {
    if t.dtype() != i.dtype {
        return Err(GraphError::Type(format!(
            "input `{name}` is {}, the model takes {}",
            t.dtype(),
            i.dtype
        )));
    }
    if t.shape.len() != i.dims.len() {
        return Err(GraphError::Shape(format!(
            "input `{name}` has rank {}, the model takes {}",
            t.shape.len(),
            i.dims.len()
        )));
    }
    Ok(())
}

/// A 2-D weight laid out in panels of `width` rows of `W[n, k]` (`dense_packed`'s
/// layout, see `anyshape_ir::TensorRef::panels`): `transposed` when `t` is `[K, N]`.
/// The last panel's rows past `N` are zero.
fn panels(t: &Tensor, width: usize, transposed: bool) -> Result<Tensor> {
    let [r, c] = t.shape[..] else {
        return Err(GraphError::Shape(format!(
            "a weight of shape {:?} is not 2-D",
            t.shape
        )));
    };
    let (n, k) = if transposed { (c, r) } else { (r, c) };
    let v = t.as_f32()?;
    let tiles = n.div_ceil(width);
    let mut out = vec![0f32; tiles * k * width];
    let layout = anyshape_ir::BoundPanels {
        axis: 0,
        width: width as i64,
        stride: (k * width) as i64,
    };
    for row in 0..n {
        let at = layout.row_offset(row as i64) as usize;
        for col in 0..k {
            let x = if transposed {
                v[col * n + row]
            } else {
                v[row * k + col]
            };
            out[at + col * width] = x;
        }
    }
    Tensor::f32(vec![tiles, k, width], out)
}

/// A model's fused steps, ready to run any number of times: the graph, its facts and
/// steps ([`crate::fuse`]), each kernel step's parsed workload and the weights its
/// kernels read laid out in panels — all made once.
pub struct Plan {
    graph: Graph,
    facts: Vec<Option<Fact>>,
    fusion: Fusion,
    workloads: Vec<Option<Workload>>,
    laid_out: std::collections::HashMap<usize, Tensor>,
    /// The last step that reads each value (values are freed after it).
    last_use: Vec<usize>,
}

impl Plan {
    /// Propagate shapes, fuse, and prepare the kernel steps of `graph`.
    pub fn new(graph: Graph) -> Result<Plan> {
        let facts = crate::infer(&graph)?;
        let fusion = crate::fuse(&graph, &facts);
        let mut workloads = Vec::new();
        let mut laid_out = std::collections::HashMap::new();
        let mut last_use = vec![usize::MAX; graph.values.len()];
        for (k, step) in fusion.steps.iter().enumerate() {
            workloads.push(match &step.kind {
                StepKind::Kernel(text) => Some(Workload::parse(text)?),
                _ => None,
            });
            for &(v, layout) in &step.inputs {
                if let Layout::Panels { width, transposed } = layout {
                    if let std::collections::hash_map::Entry::Vacant(slot) = laid_out.entry(v) {
                        let w = fact(&facts, v).value.as_ref().ok_or_else(|| {
                            GraphError::Shape(format!(
                                "`{}` is laid out in panels but not a constant",
                                graph.values[v]
                            ))
                        })?;
                        slot.insert(panels(w, width, transposed)?);
                    }
                }
                last_use[v] = k;
            }
            for &n in &step.nodes {
                for v in graph.nodes[n].inputs.iter().flatten() {
                    last_use[*v] = k;
                }
            }
        }
        for &o in &graph.outputs {
            last_use[o] = usize::MAX;
        }
        Ok(Plan {
            graph,
            facts,
            fusion,
            workloads,
            laid_out,
            last_use,
        })
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The facts of the graph's values.
    pub fn facts(&self) -> &[Option<Fact>] {
        &self.facts
    }

    /// The steps.
    pub fn fusion(&self) -> &Fusion {
        &self.fusion
    }

    /// Run on `inputs` (by input name); `kernel` runs kernel steps. Returns the
    /// outputs in the graph's order.
    pub fn run(&self, inputs: &[(&str, Tensor)], kernel: &mut KernelFn) -> Result<Vec<Tensor>> {
        self.execute(inputs, kernel, None)
    }

    /// [`Plan::run`], adding each step's wall time (seconds) to `seconds[step]`
    /// (`seconds` has one entry per step).
    pub fn run_profiled(
        &self,
        inputs: &[(&str, Tensor)],
        kernel: &mut KernelFn,
        seconds: &mut [f64],
    ) -> Result<Vec<Tensor>> {
        if seconds.len() != self.fusion.steps.len() {
            return Err(GraphError::Shape(format!(
                "{} step times for {} steps",
                seconds.len(),
                self.fusion.steps.len()
            )));
        }
        self.execute(inputs, kernel, Some(seconds))
    }

    /// The bytes a run on `inputs` allocates at its peak, from the inputs' dims alone
    /// (nothing is allocated): the tensors live at once as steps make and free them,
    /// and a host step's working space (twice its outputs: the index walks of
    /// broadcasts and gathers). The inputs themselves are the caller's, not counted.
    pub fn run_bytes(&self, inputs: &[(&str, Tensor)]) -> Result<u128> {
        let (_, b) = bind_inputs(&self.graph, inputs)?;
        let size = |v: ValueId| -> Result<u128> {
            let f = fact(&self.facts, v);
            let n = f
                .shape_at(&b)?
                .iter()
                .try_fold(1u128, |n, &d| n.checked_mul(d as u128))
                .unwrap_or(u128::MAX);
            let width = match f.dtype {
                crate::DType::F32 => 4,
                crate::DType::I64 => 8,
                crate::DType::Bool => 1,
            };
            Ok(n.saturating_mul(width))
        };
        let (mut live, mut peak) = (0u128, 0u128);
        for (k, step) in self.fusion.steps.iter().enumerate() {
            let made: Vec<ValueId> = match step.output {
                Some(out) => vec![out],
                None => step
                    .nodes
                    .iter()
                    .flat_map(|&n| self.graph.nodes[n].outputs.iter().copied())
                    .collect(),
            };
            let mut bytes = 0u128;
            for v in made {
                bytes = bytes.saturating_add(size(v)?);
            }
            let work = if step.output.is_some() { 0 } else { 2 * bytes };
            live = live.saturating_add(bytes);
            peak = peak.max(live.saturating_add(work));
            let read = step
                .inputs
                .iter()
                .map(|&(v, _)| v)
                .chain(
                    step.nodes
                        .iter()
                        .flat_map(|&n| self.graph.nodes[n].inputs.iter().flatten().copied()),
                )
                .filter(|&v| {
                    self.last_use[v] == k
                        && fact(&self.facts, v).value.is_none()
                        && !self.graph.inputs.iter().any(|i| i.value == v)
                });
            let mut freed: Vec<ValueId> = read.collect();
            freed.sort_unstable();
            freed.dedup();
            for v in freed {
                live = live.saturating_sub(size(v)?);
            }
        }
        Ok(peak)
    }

    /// What step `k` computes, for profiles: its task's workload, `layer_norm`,
    /// `softmax`, or its ops.
    pub fn step_label(&self, k: usize) -> String {
        match &self.fusion.steps[k].kind {
            StepKind::Kernel(w) => w.clone(),
            StepKind::LayerNorm(rows) => format!("layer_norm{rows} (host)"),
            StepKind::Elementwise(ops) => format!("{ops} (host)"),
            StepKind::Movement(op) => format!("{op} (host)"),
            StepKind::View => "view".into(),
        }
    }

    /// A view step whose input no later step reads: the buffer moves to the output
    /// under its new shape instead of being copied. `false` where that does not apply.
    fn view_in_place(&self, k: usize, values: &mut [Option<Tensor>], b: &Bindings) -> Result<bool> {
        let step = &self.fusion.steps[k];
        let (StepKind::View, [n]) = (&step.kind, &step.nodes[..]) else {
            return Ok(false);
        };
        let node = &self.graph.nodes[*n];
        let (Some(&Some(x)), [y]) = (node.inputs.first(), &node.outputs[..]) else {
            return Ok(false);
        };
        if self.last_use[x] != k || values[x].is_none() {
            return Ok(false);
        }
        let shape = fact(&self.facts, *y).shape_at(b)?;
        let t = values[x].take().expect("checked");
        values[*y] = Some(Tensor::new(shape, t.data)?);
        Ok(true)
    }

    fn execute(
        &self,
        inputs: &[(&str, Tensor)],
        kernel: &mut KernelFn,
        mut seconds: Option<&mut [f64]>,
    ) -> Result<Vec<Tensor>> {
        let g = &self.graph;
        let (given, b) = bind_inputs(g, inputs)?;
        // Run-time values; constants are read from the facts.
        let mut values: Vec<Option<Tensor>> = vec![None; g.values.len()];
        for (v, f) in self.facts.iter().enumerate() {
            let Some(f) = f else { continue };
            if let (None, Some(sym)) = (&f.value, &f.sym) {
                // Shape plumbing, evaluated at this instance.
                let x: Vec<i64> = sym.iter().map(|e| e.eval(&b)).collect::<Result<_, _>>()?;
                let shape = if f.rank() == 0 { vec![] } else { vec![x.len()] };
                values[v] = Some(Tensor::i64(shape, x)?);
            }
        }
        for (v, t) in given {
            values[v] = Some(t);
        }
        let facts = &self.facts;
        /// A value: computed in this run, or a constant.
        fn get<'a>(
            values: &'a [Option<Tensor>],
            facts: &'a [Option<Fact>],
            v: usize,
        ) -> Option<&'a Tensor> {
            values[v]
                .as_ref()
                .or_else(|| facts[v].as_ref().and_then(|f| f.value.as_ref()))
        }
        for (k, step) in self.fusion.steps.iter().enumerate() {
            let started = seconds.is_some().then(std::time::Instant::now);
            match (&self.workloads[k], step.output) {
                (Some(w), Some(out)) => {
                    let bound = w.bind(&b)?;
                    let mut ins: Vec<&[f32]> = Vec::with_capacity(step.inputs.len());
                    for &(v, layout) in &step.inputs {
                        let t: &Tensor = if layout != Layout::AsIs {
                            &self.laid_out[&v]
                        } else {
                            get(&values, facts, v).ok_or_else(|| {
                                GraphError::Shape(format!(
                                    "`{}` has no value for a kernel",
                                    g.values[v]
                                ))
                            })?
                        };
                        ins.push(t.as_f32()?);
                    }
                    if ins.len() != w.inputs.len() {
                        return Err(GraphError::Shape(format!(
                            "{w}: {} tensors for a kernel that takes {} (a fusion bug)",
                            ins.len(),
                            w.inputs.len()
                        )));
                    }
                    for (i, x) in ins.iter().enumerate() {
                        if x.len() != bound.lens[i] {
                            return Err(GraphError::Shape(format!(
                                "{w}: tensor {i} has {} elements, the kernel reads {}",
                                x.len(),
                                bound.lens[i]
                            )));
                        }
                    }
                    let mut y = vec![0f32; bound.lens[ins.len()]];
                    kernel(k, w, &b, &bound, &ins, &mut y)?;
                    drop(ins);
                    let shape = fact(facts, out).shape_at(&b)?;
                    values[out] = Some(Tensor::f32(shape, y)?);
                }
                _ if self.view_in_place(k, &mut values, &b)? => {}
                _ => {
                    for &n in &step.nodes {
                        let node = &g.nodes[n];
                        let outs = eval_node(node, |id| get(&values, facts, id))?;
                        for (&id, t) in node.outputs.iter().zip(outs) {
                            values[id] = Some(t);
                        }
                    }
                }
            }
            if let (Some(t), Some(s)) = (started, seconds.as_deref_mut()) {
                s[k] += t.elapsed().as_secs_f64();
            }
            // Free what no later step reads.
            for &(v, _) in &step.inputs {
                if self.last_use[v] == k {
                    values[v] = None;
                }
            }
            for &n in &step.nodes {
                for v in g.nodes[n].inputs.iter().flatten() {
                    if self.last_use[*v] == k {
                        values[*v] = None;
                    }
                }
            }
        }
        g.outputs
            .iter()
            .map(|&o| {
                values[o]
                    .take()
                    .or_else(|| facts[o].as_ref().and_then(|f| f.value.clone()))
                    .ok_or_else(|| {
                        GraphError::Format(format!("output `{}` has no value", g.values[o]))
                    })
            })
            .collect()
    }
}

/// One node evaluated by its op's reference `eval`, its inputs read through `value`.
fn eval_node<'a>(
    node: &Node,
    value: impl Fn(ValueId) -> Option<&'a Tensor>,
) -> Result<Vec<Tensor>> {
    let spec = op(&node.op).ok_or_else(|| unsupported(node))?;
    let ins: Vec<Option<&Tensor>> = node.inputs.iter().map(|i| i.and_then(&value)).collect();
    if node
        .inputs
        .iter()
        .zip(&ins)
        .any(|(i, t)| i.is_some() && t.is_none())
    {
        return Err(node.error("an input has no value"));
    }
    (spec.eval)(node, &ins)
}

/// Run `g` on `inputs` (by input name); returns the outputs in the graph's order.
pub fn run(g: &Graph, inputs: &[(&str, Tensor)]) -> Result<Vec<Tensor>> {
    let (given, _) = bind_inputs(g, inputs)?;
    let mut values: Vec<Option<Tensor>> = vec![None; g.values.len()];
    for (&id, t) in &g.initializers {
        values[id] = Some(t.clone());
    }
    for (v, t) in given {
        values[v] = Some(t);
    }
    // Free each value after its last use.
    let mut last = vec![usize::MAX; g.values.len()];
    for (k, n) in g.nodes.iter().enumerate() {
        for id in n.inputs.iter().flatten() {
            last[*id] = k;
        }
    }
    for &o in &g.outputs {
        last[o] = usize::MAX;
    }
    for (k, node) in g.nodes.iter().enumerate() {
        let outs = eval_node(node, |id| values[id].as_ref())?;
        for (&id, t) in node.outputs.iter().zip(outs) {
            values[id] = Some(t);
        }
        for id in node.inputs.iter().flatten() {
            if last[*id] == k && !g.initializers.contains_key(id) {
                values[*id] = None;
            }
        }
    }
    g.outputs
        .iter()
        .map(|&o| {
            values[o]
                .take()
                .ok_or_else(|| GraphError::Format(format!("output `{}` has no value", g.values[o])))
        })
        .collect()
}
