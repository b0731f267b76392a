//! The reference executor: a graph run op by op on concrete tensors with the ops' plain
//! `eval`s — obviously correct, not fast. Tests compare it, and compiled plans, with
//! onnxruntime's recorded outputs.
use crate::graph::Graph;
use crate::{GraphError, Result};
use anyshape_tensor::ops::{op, unsupported};
use anyshape_tensor::{bind, Node, Tensor, TensorRef, ValueId};

/// One node evaluated by its op's reference `eval`, its inputs read through `value`.
pub fn eval_node<'a>(
    node: &Node,
    value: impl Fn(ValueId) -> Option<TensorRef<'a>>,
) -> Result<Vec<Tensor>> {
    let spec = op(&node.op).ok_or_else(|| unsupported(node))?;
    let ins: Vec<Option<TensorRef>> = node.inputs.iter().map(|i| i.and_then(&value)).collect();
    if node
        .inputs
        .iter()
        .zip(&ins)
        .any(|(i, t)| i.is_some() && t.is_none())
    {
        return Err(node.error("an input has no value").into());
    }
    Ok((spec.eval)(node, &ins)?)
}

/// Run `g` on `inputs` (by input name); returns the outputs in the graph's order.
pub fn run(g: &Graph, inputs: &[(&str, Tensor)]) -> Result<Vec<Tensor>> {
    let views: Vec<(&str, TensorRef)> = inputs.iter().map(|(n, t)| (*n, t.view())).collect();
    let (given, _) = bind(&g.input_specs(), &views)?;
    let mut values: Vec<Option<Tensor>> = vec![None; g.values.len()];
    for (&id, t) in &g.initializers {
        values[id] = Some(t.clone());
    }
    for (i, t) in g.inputs.iter().zip(given) {
        values[i.value] = Some(t.to_tensor());
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
        let outs = eval_node(node, |id| values[id].as_ref().map(Tensor::view))?;
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
