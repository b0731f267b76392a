//! The anyshape runtime: the module format (kernels in a shared library, a C header, a
//! JSON manifest), loading a module with its integrity, version and CPU checks,
//! dispatching any instance to a kernel and calling it on caller-owned buffers.
//!
//! It knows how to load and call compiled kernels; it knows nothing of compiling,
//! measuring or searching (a module is written by `anyshape-tune`).
#![deny(missing_docs)]

mod error;
mod kernel;
mod manifest;
mod module;

pub use error::{Result, RuntimeError};
pub use kernel::{load_library, status_message, KernelFn, SelectFn};
pub use manifest::{
    sha256_hex, FileEntry, Manifest, SpecializedKernel, TuningInfo, Vote, FORMAT_VERSION,
    HEADER_FILE, MANIFEST_FILE,
};
pub use module::{Dispatch, Module};
