//! Executors. [`run`]: the reference, a graph run op by op on concrete tensors with the
//! operators' plain `eval`s (obviously correct, not fast). [`run_fused`]: the fused
//! steps of [`crate::fuse`], kernel steps through a caller's kernel function (compiled
//! kernels, or a reference of the workload), the others with the operators' `eval`s.
//! Tests compare both with onnxruntime's recorded outputs.
use crate::graph::{Graph, Input};
use crate::ops::{op, unsupported};
use crate::{fact, Fact, Fusion, GraphError, Result, StepKind, Tensor};
use anyshape_ir::{Bindings, BoundWorkload, Expr, Workload};

/// Runs one kernel step: the workload, the shape vars' values, its instance, its inputs
/// (in the workload's order, contiguous) and the output to fill.
pub type KernelFn<'a> =
    dyn FnMut(&Workload, &Bindings, &BoundWorkload, &[&[f32]], &mut [f32]) -> Result<()> + 'a;

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

/// A 2-D tensor transposed.
fn transpose_2d(t: &Tensor) -> Result<Tensor> {
    let [r, c] = t.shape[..] else {
        return Err(GraphError::Shape(format!(
            "a weight of shape {:?} is not 2-D",
            t.shape
        )));
    };
    let v = t.as_f32()?;
    let mut out = vec![0f32; v.len()];
    for i in 0..r {
        for j in 0..c {
            out[j * r + i] = v[i * c + j];
        }
    }
    Tensor::f32(vec![c, r], out)
}

/// Run the fused steps of `g` on `inputs`; `kernel` runs kernel steps.
pub fn run_fused(
    g: &Graph,
    facts: &[Option<Fact>],
    fusion: &Fusion,
    inputs: &[(&str, Tensor)],
    kernel: &mut KernelFn,
) -> Result<Vec<Tensor>> {
    let (given, b) = bind_inputs(g, inputs)?;
    let mut values: Vec<Option<Tensor>> = vec![None; g.values.len()];
    // Constants, and the shape plumbing's expressions evaluated at this instance.
    for (v, f) in facts.iter().enumerate() {
        let Some(f) = f else { continue };
        if let Some(t) = &f.value {
            values[v] = Some(t.clone());
        } else if let Some(sym) = &f.sym {
            let x: Vec<i64> = sym.iter().map(|e| e.eval(&b)).collect::<Result<_, _>>()?;
            let shape = if f.rank() == 0 { vec![] } else { vec![x.len()] };
            values[v] = Some(Tensor::i64(shape, x)?);
        }
    }
    for (v, t) in given {
        values[v] = Some(t);
    }
    for step in &fusion.steps {
        match (&step.kind, step.output) {
            (StepKind::Kernel(text), Some(out)) => {
                let w = Workload::parse(text)?;
                let bound = w.bind(&b)?;
                let mut owned = Vec::new();
                for &(v, transpose) in &step.inputs {
                    let t = values[v].as_ref().ok_or_else(|| {
                        GraphError::Shape(format!("`{}` has no value for a kernel", g.values[v]))
                    })?;
                    owned.push(if transpose {
                        transpose_2d(t)?
                    } else {
                        t.clone()
                    });
                }
                let ins: Vec<&[f32]> = owned.iter().map(|t| t.as_f32()).collect::<Result<_>>()?;
                if ins.len() != w.inputs.len() {
                    return Err(GraphError::Shape(format!(
                        "{text}: {} tensors for a kernel that takes {} (a fusion bug)",
                        ins.len(),
                        w.inputs.len()
                    )));
                }
                for (k, x) in ins.iter().enumerate() {
                    if x.len() != bound.lens[k] {
                        return Err(GraphError::Shape(format!(
                            "{text}: tensor {k} has {} elements, the kernel reads {}",
                            x.len(),
                            bound.lens[k]
                        )));
                    }
                }
                let mut y = vec![0f32; bound.lens[ins.len()]];
                kernel(&w, &b, &bound, &ins, &mut y)?;
                let shape = fact(facts, out).shape_at(&b)?;
                values[out] = Some(Tensor::f32(shape, y)?);
            }
            _ => {
                for &k in &step.nodes {
                    let node = &g.nodes[k];
                    let spec = op(&node.op).ok_or_else(|| unsupported(node))?;
                    let ins: Vec<Option<&Tensor>> = node
                        .inputs
                        .iter()
                        .map(|i| i.and_then(|id| values[id].as_ref()))
                        .collect();
                    if node
                        .inputs
                        .iter()
                        .zip(&ins)
                        .any(|(i, t)| i.is_some() && t.is_none())
                    {
                        return Err(node.error("an input has no value"));
                    }
                    let outs = (spec.eval)(node, &ins)?;
                    for (&id, t) in node.outputs.iter().zip(outs) {
                        values[id] = Some(t);
                    }
                }
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
        let spec = op(&node.op).ok_or_else(|| unsupported(node))?;
        let ins: Vec<Option<&Tensor>> = node
            .inputs
            .iter()
            .map(|i| i.and_then(|id| values[id].as_ref()))
            .collect();
        if node
            .inputs
            .iter()
            .zip(&ins)
            .any(|(i, t)| i.is_some() && t.is_none())
        {
            return Err(node.error("an input has no value"));
        }
        let outs = (spec.eval)(node, &ins)?;
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
