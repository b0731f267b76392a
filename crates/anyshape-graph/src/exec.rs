//! The reference executor: a graph run op by op on concrete tensors with the operators'
//! plain `eval`s (obviously correct, not fast). Tests compare compiled models with it
//! and with onnxruntime's recorded outputs.
use crate::graph::Graph;
use crate::ops::{op, unsupported};
use crate::{GraphError, Result, Tensor};

/// Run `g` on `inputs` (by input name); returns the outputs in the graph's order.
pub fn run(g: &Graph, inputs: &[(&str, Tensor)]) -> Result<Vec<Tensor>> {
    let mut values: Vec<Option<Tensor>> = vec![None; g.values.len()];
    for (&id, t) in &g.initializers {
        values[id] = Some(t.clone());
    }
    for i in &g.inputs {
        let name = &g.values[i.value];
        let t = inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| GraphError::Shape(format!("input `{name}` is not given")))?;
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
        values[i.value] = Some(t);
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
