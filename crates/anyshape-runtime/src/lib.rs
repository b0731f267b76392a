//! The anyshape runtime: loading a module (kernels in a shared library, a C header, a
//! JSON manifest; the format is `anyshape-abi`'s) with its integrity, version and CPU
//! checks, dispatching any instance to a kernel and calling it on caller-owned buffers.
//!
//! It knows the kernel ABI and workloads; it knows nothing of code generation,
//! compiling, measuring or searching (a module is written by `anyshape-tune`).
#![deny(missing_docs)]

mod error;
mod manifest;
mod module;

pub use error::{Result, RuntimeError};
pub use manifest::{check_cpu, check_files, listed_files, read_manifest, write_manifest};
pub use module::{Dispatch, Module};
