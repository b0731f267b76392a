//! The model module's manifest: a directory holding the source model (`model.onnx`),
//! one module per task (`tasks/tNN/`, each a module of `manifest.rs`'s format) and this
//! manifest (`model.json`): the model's dims and their tuned domains, and each task's
//! workload, how many steps run it and where its module is.
use crate::FileEntry;
use anyshape_ir::ShapeVar;
use serde::{Deserialize, Serialize};

/// Model module format number; bump when the layout or the manifest changes meaning,
/// or fusion makes other tasks of the same model (2: attention's transposes, scales and
/// mask folded into `attention_scores` and `attention_context`, the softmax's NaN guard
/// into `+nan_to_zero`).
pub const MODEL_FORMAT: u32 = 2;
/// The manifest's file name inside a model module.
pub const MODEL_FILE: &str = "model.json";
/// The source model's file name inside a model module.
pub const MODEL_SOURCE: &str = "model.onnx";

/// One task of a model module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelTask {
    /// The workload's text form.
    pub workload: String,
    /// How many steps of the model run it.
    pub count: usize,
    /// Its module's directory, relative to the model module.
    pub module: String,
    /// Trials its tuning measured (0: its sketch's default micro-kernel).
    pub trials: usize,
}

/// What a model module holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelManifest {
    /// [`MODEL_FORMAT`] of the writer.
    pub format: u32,
    /// The anyshape version that wrote it.
    pub anyshape: String,
    /// The source model's checksum.
    pub source: FileEntry,
    /// The model's dims with the domains they were compiled for.
    pub dims: Vec<ShapeVar>,
    /// The tasks.
    pub tasks: Vec<ModelTask>,
}
