//! The graph IR: values by index, nodes in topological order with their ONNX op type and
//! attributes, the graph's inputs (element type and symbolic dims), outputs and
//! initializers. It is what the ONNX reader produces and what shape propagation, the
//! reference executor and (later) fusion read; it knows nothing of protobuf.
use crate::{DType, GraphError, Result, Tensor};
use anyshape_ir::Expr;
use std::collections::BTreeMap;

/// A value (a tensor edge of the graph), by index into [`Graph::values`].
pub type ValueId = usize;

/// A node attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f32),
    /// Integers.
    Ints(Vec<i64>),
    /// Floats.
    Floats(Vec<f32>),
    /// A string.
    Str(String),
    /// A tensor.
    Tensor(Tensor),
    /// A kind anyshape's operators never read (graphs, sparse tensors, type protos).
    Unsupported,
}

/// One operation.
#[derive(Clone, Debug)]
pub struct Node {
    /// Its name in the model (or `#index` where the model gave none).
    pub name: String,
    /// The ONNX op type, e.g. `MatMul`.
    pub op: String,
    /// Inputs; `None` for an optional input left out.
    pub inputs: Vec<Option<ValueId>>,
    /// Outputs.
    pub outputs: Vec<ValueId>,
    /// Attributes by name.
    pub attrs: BTreeMap<String, Attr>,
}

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
    /// The external data files its tensors were read from, relative to the model's
    /// directory (a compiled model module carries copies of them).
    pub external: std::collections::BTreeSet<String>,
}

impl Graph {
    /// The id of the value named `name`.
    pub fn value(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v == name)
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
}

impl Node {
    /// A problem with this node, for errors.
    pub fn error(&self, message: impl std::fmt::Display) -> GraphError {
        GraphError::Node {
            node: self.name.clone(),
            op: self.op.clone(),
            message: message.to_string(),
        }
    }

    /// The `i`-th input, which the op requires.
    pub fn input(&self, i: usize) -> Result<ValueId> {
        self.inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| self.error(format!("input {i} is missing")))
    }

    /// The `i`-th input, if given.
    pub fn optional_input(&self, i: usize) -> Option<ValueId> {
        self.inputs.get(i).copied().flatten()
    }

    /// An integer attribute, or `default`.
    pub fn int(&self, name: &str, default: i64) -> Result<i64> {
        match self.attrs.get(name) {
            None => Ok(default),
            Some(Attr::Int(v)) => Ok(*v),
            Some(other) => {
                Err(self.error(format!("attribute `{name}` is {other:?}, not an integer")))
            }
        }
    }

    /// A float attribute, or `default`.
    pub fn float(&self, name: &str, default: f32) -> Result<f32> {
        match self.attrs.get(name) {
            None => Ok(default),
            Some(Attr::Float(v)) => Ok(*v),
            Some(Attr::Int(v)) => Ok(*v as f32),
            Some(other) => Err(self.error(format!("attribute `{name}` is {other:?}, not a float"))),
        }
    }

    /// An integer-list attribute, if present.
    pub fn ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v.clone())),
            Some(Attr::Int(v)) => Ok(Some(vec![*v])),
            Some(other) => {
                Err(self.error(format!("attribute `{name}` is {other:?}, not integers")))
            }
        }
    }

    /// A string attribute, or `default`.
    pub fn string(&self, name: &str, default: &str) -> Result<String> {
        match self.attrs.get(name) {
            None => Ok(default.to_string()),
            Some(Attr::Str(v)) => Ok(v.clone()),
            Some(other) => {
                Err(self.error(format!("attribute `{name}` is {other:?}, not a string")))
            }
        }
    }
}
