//! The anyshape runtime: loading a module (kernels in a shared library, a C header, a
//! JSON manifest; the format is `anyshape-abi`'s) with its integrity, version and CPU
//! checks, dispatching any instance to a kernel and calling it on caller-owned buffers;
//! and loading a model module ([`Model`]: the source ONNX model, fused as the compiler
//! fused it, with a module per task) and running it for any binding of its dims.
//!
//! It knows the kernel ABI, workloads and graphs (`anyshape-graph`); it knows nothing of
//! code generation, compiling, measuring or searching (modules are written by
//! `anyshape-tune`).
#![deny(missing_docs)]

mod error;
mod manifest;
mod model;
mod module;

pub use error::{Result, RuntimeError};
pub use manifest::{
    check_cpu, check_files, listed_files, read_manifest, read_model_manifest, write_manifest,
    ModuleKind, MANIFEST_LIMIT, MODULE_FILE_LIMIT,
};
pub use model::Model;
pub use module::{Dispatch, Module};
