//! The model module's manifest: a directory holding the compiled plan (`plan.bin`:
//! steps, memory plan, constants in their run-time layouts; `anyshape-plan`), one
//! module per task (`tasks/tNN/`, each a module of `manifest.rs`'s format), the tuning
//! log (`tuning.json`, where the model was tuned) and this manifest (`model.json`): the
//! source model it was compiled from (by checksum), the model's dims and their compiled
//! domains, each task's workload, how many steps run it and where its module is, and
//! every other file of the module with its checksum. The manifest is sealed by a
//! checksum of itself, so a module holds exactly what it lists, all of it verifiable.
//! The source ONNX is not part of the module: nothing is imported at load.
use crate::manifest::sealed_digest;
use crate::FileEntry;
use anyshape_ir::{Precision, ShapeVar};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Model module format number; bump when the layout or the manifest changes meaning,
/// or fusion makes other tasks of the same model (4: the compiled plan instead of the
/// source model; 3: every file listed with its checksum, the manifest sealed; 2:
/// attention's transposes, scales and mask folded into `attention_scores` and
/// `attention_context`, the softmax's NaN guard into `+nan_to_zero`).
pub const MODEL_FORMAT: u32 = 4;
/// The manifest's file name inside a model module.
pub const MODEL_FILE: &str = "model.json";
/// The compiled plan's file name inside a model module.
pub const MODEL_PLAN: &str = "plan.bin";

/// The source model a module was compiled from: where it was then and its checksum, so
/// a peer racing the module can be handed the same model (and a moved or changed one is
/// noticed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Its path when the module was compiled (absolute).
    pub path: String,
    /// Its checksum and size.
    pub file: FileEntry,
}

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
    /// The source model.
    pub source: Source,
    /// The model's dims with the domains they were compiled for.
    pub dims: Vec<ShapeVar>,
    /// What its dense layers over constant weights multiply in (`bf16`: weights stored
    /// as bfloat16 pairs; everything else runs in `f32`). Left out when `f32`, so the
    /// manifests (and checksums) of modules written before it stay as they were.
    #[serde(default, skip_serializing_if = "Precision::is_f32")]
    pub precision: Precision,
    /// The tasks.
    pub tasks: Vec<ModelTask>,
    /// Every file of the module but this manifest, by its path inside the module
    /// (`/`-separated): the plan, each task module's files, the tuning log. A module
    /// holds these and nothing else.
    pub files: BTreeMap<String, FileEntry>,
    /// SHA-256 of this manifest with this field empty.
    pub checksum: String,
}

impl ModelManifest {
    /// The checksum of the content (with `checksum` itself empty).
    pub fn digest(&self) -> String {
        sealed_digest(self, |m| &mut m.checksum)
    }

    /// Set the checksum over the current content.
    pub fn seal(&mut self) {
        self.checksum = self.digest();
    }

    /// As pretty JSON, the form of `model.json`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("manifests serialize")
    }
}
