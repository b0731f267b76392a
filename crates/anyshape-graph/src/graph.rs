//! The graph IR: values by index, nodes in topological order with their ONNX op type and
//! attributes, the graph's inputs (element type and symbolic dims), outputs and
//! initializers. It is what the ONNX reader produces and what shape propagation, the
//! reference executor and (later) fusion read; it knows nothing of protobuf.
use anyshape_ir::Expr;
use anyshape_tensor::{DType, Node, Tensor, TensorSpec, ValueId};
use std::collections::BTreeMap;

/// A graph input: its value, element type and dims (constants or expressions over the
/// model's dim names).
#[derive(Clone, Debug)]
pub struct Input {
    /// The value.
    pub value: ValueId,
    /// The element type.
    pub dtype: DType,
    /// The dims.
    pub dims: Vec<Expr>,
}

/// A model's graph.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    /// Value names, by id.
    pub values: Vec<String>,
    /// Nodes, each after the nodes its inputs come from.
    pub nodes: Vec<Node>,
    /// The inputs a caller gives.
    pub inputs: Vec<Input>,
    /// The outputs a caller gets.
    pub outputs: Vec<ValueId>,
    /// Weights and other constant tensors.
    pub initializers: BTreeMap<ValueId, Tensor>,
    /// The default-domain opset the model was exported with.
    pub opset: i64,
    /// The `ai.onnx.ml` opset it imports, if any (its ops are named `ai.onnx.ml.…`).
    pub ml_opset: Option<i64>,
    /// The external data files its tensors were read from, relative to the model's
    /// directory (a compiled model module carries copies of them).
    pub external: std::collections::BTreeSet<String>,
}

impl Graph {
    /// The id of the value named `name`.
    pub fn value(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v == name)
    }

    /// The inputs as the model declares them (name, element type, dims).
    pub fn input_specs(&self) -> Vec<TensorSpec> {
        self.inputs
            .iter()
            .map(|i| TensorSpec {
                name: self.values[i.value].clone(),
                dtype: i.dtype,
                shape: i.dims.clone(),
            })
            .collect()
    }

    /// The names of the dims the inputs use (the model's shape vars), sorted.
    pub fn dim_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .inputs
            .iter()
            .flat_map(|i| i.dims.iter().flat_map(|d| d.vars()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Where `v` is a decoder's key/value cache — a graph output `Concat(past, new)`
    /// along the sequence axis (2) of `[batch, heads, sequence, dim]`, `past` a graph
    /// input (or a view of one) whose length there is a dim of its own — that concat's
    /// node, the input's
    /// index among the inputs, and the axis: what the runtime may keep across runs and
    /// append `new` to in place.
    pub fn cache_append(&self, v: ValueId) -> Option<(usize, usize, usize)> {
        if !self.outputs.contains(&v) {
            return None;
        }
        let k = self.nodes.iter().position(|n| n.outputs.contains(&v))?;
        let node = &self.nodes[k];
        let [Some(mut past), Some(_)] = node.inputs.as_slice() else {
            return None;
        };
        // Through `Concat`s of one input (views of it).
        while let Some(n) = self.nodes.iter().find(|n| n.outputs.contains(&past)) {
            match n.inputs.as_slice() {
                [Some(x)] if n.op == "Concat" || n.op == "Identity" => past = *x,
                _ => break,
            }
        }
        let i = self.inputs.iter().position(|i| i.value == past)?;
        let dims = &self.inputs[i].dims;
        let axis = node.int("axis", 0).ok()?;
        let axis = if axis < 0 {
            axis + dims.len() as i64
        } else {
            axis
        };
        (node.op == "Concat" && dims.len() == 4 && axis == 2 && matches!(dims[2], Expr::Var(_)))
            .then_some((k, i, 2))
    }
}
