//! One ONNX op applied to values: its op type, attributes, inputs and outputs. What
//! the importer reads from a model, what the ops' shape rules and evaluations take, and
//! what a plan's host steps hold.
use crate::{Result, Tensor, TensorError};
use std::collections::BTreeMap;

/// A value (a tensor edge of a graph or a plan), by index.
pub type ValueId = usize;

/// A node attribute.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// Strings (a recurrent layer's activations).
    Strs(Vec<String>),
    /// A tensor.
    Tensor(Tensor),
    /// A branch of an `If` or the body of a `Scan` (its nodes over the model's values,
    /// the values it takes and gives), which the importer inlines.
    Branch(Box<Branch>),
    /// A kind anyshape's operators never read (other graphs, sparse tensors, type
    /// protos).
    Unsupported,
}

/// A subgraph of an `If` or a `Scan`: nodes whose values are numbered with the model's
/// (reading the model's values it names, its own values new ones), the values it takes
/// (a `Scan` body's; none for an `If` branch) and the values it gives.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Branch {
    /// The values it takes, in order.
    pub inputs: Vec<ValueId>,
    /// Its nodes, in order.
    pub nodes: Vec<Node>,
    /// The values it gives, in order.
    pub outputs: Vec<ValueId>,
}

/// One operation.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
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

impl Node {
    /// A problem with this node, for errors.
    pub fn error(&self, message: impl std::fmt::Display) -> TensorError {
        TensorError::Node {
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
        Ok(self.int_list(name)?.map(<[i64]>::to_vec))
    }

    /// An integer-list attribute, if present, borrowed (a run's host step reads it
    /// without allocating).
    pub fn int_list(&self, name: &str) -> Result<Option<&[i64]>> {
        match self.attrs.get(name) {
            None => Ok(None),
            Some(Attr::Ints(v)) => Ok(Some(v)),
            Some(Attr::Int(v)) => Ok(Some(std::slice::from_ref(v))),
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
