//! A model's recorded case ([`Case`]): the arrays of a `.npz` file split, by name, into
//! the model's inputs and the outputs it records (onnxruntime's, for the models the
//! repository exports) — read strictly: an array that is neither is an error, since a
//! misspelt name would be an input left out. `anyshape run --module` and `anyshape
//! bench --model --compare --inputs` read their cases so.
use crate::{Model, Result, RuntimeError};
use anyshape_tensor::{Tensor, TensorRef};
use std::path::Path;

/// A model's inputs by name, and the outputs recorded with them.
#[derive(Clone, Debug)]
pub struct Case {
    /// Where its arrays came from, for messages (a file, `--input`).
    pub source: String,
    /// The model's inputs it holds (all of them once [`Case::given`] succeeds).
    pub inputs: Vec<(String, Tensor)>,
    /// The model's outputs it records.
    pub recorded: Vec<(String, Tensor)>,
}

impl Model {
    /// The case in the `.npz` file at `path` (see [`Model::case`]).
    pub fn read_case(&self, path: &Path) -> Result<Case> {
        let arrays = anyshape_tensor::npz::read(path)?;
        self.case(arrays, &path.display().to_string())
    }

    /// `arrays` (from `source`) split into this model's inputs and recorded outputs;
    /// an array of another name is an error (user input).
    pub fn case(&self, arrays: Vec<(String, Tensor)>, source: &str) -> Result<Case> {
        let inputs: Vec<&str> = self.inputs().iter().map(|s| s.name.as_str()).collect();
        let outputs: Vec<&str> = self.outputs().iter().map(|s| s.name.as_str()).collect();
        let unknown: Vec<&str> = arrays
            .iter()
            .map(|(n, _)| n.as_str())
            .filter(|n| !inputs.contains(n) && !outputs.contains(n))
            .collect();
        if !unknown.is_empty() {
            return Err(RuntimeError::Options(format!(
                "{source} holds arrays the model neither takes nor gives: {} (its inputs: {}; its outputs: {}); a misspelt name would be an input left out",
                unknown.join(", "),
                inputs.join(", "),
                outputs.join(", ")
            )));
        }
        let (inputs, recorded) = arrays
            .into_iter()
            .partition(|(n, _)| inputs.contains(&n.as_str()));
        Ok(Case {
            source: source.to_string(),
            inputs,
            recorded,
        })
    }
}

impl Case {
    /// Set input `name` to `tensor` (replacing the one of that name).
    pub fn set_input(&mut self, name: &str, tensor: Tensor) {
        self.inputs.retain(|(n, _)| n != name);
        self.inputs.push((name.to_string(), tensor));
    }

    /// Every input of `model`, in its order, as a run takes them; an input the case
    /// lacks is an error (user input).
    pub fn given(&self, model: &Model) -> Result<Vec<(&str, TensorRef<'_>)>> {
        model
            .inputs()
            .iter()
            .map(|spec| {
                self.inputs
                    .iter()
                    .find(|(n, _)| *n == spec.name)
                    .map(|(n, t)| (n.as_str(), t.view()))
                    .ok_or_else(|| {
                        RuntimeError::Options(format!(
                            "the model's input `{}` is not given ({} has no array of that name)",
                            spec.name, self.source
                        ))
                    })
            })
            .collect()
    }

    /// The recorded output `name`, where the case has it.
    pub fn recorded(&self, name: &str) -> Option<&Tensor> {
        self.recorded
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// The recorded outputs in `model`'s order, where the case records every one.
    pub fn recorded_outputs(&self, model: &Model) -> Option<Vec<Tensor>> {
        model
            .outputs()
            .iter()
            .map(|s| self.recorded(&s.name).cloned())
            .collect()
    }
}
