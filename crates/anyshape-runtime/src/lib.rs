//! The anyshape runtime: loading a module (kernels in a shared library, a C header, a
//! JSON manifest; the format and its checks are `anyshape-abi`'s) with its integrity,
//! version and CPU checks, dispatching any instance to a kernel and calling it on
//! caller-owned buffers; and loading a model module ([`Model`]: its compiled plan,
//! mapped, and a module per task) and running the plan for any binding of the model's
//! dims — kernels' outputs in an arena planned at compile time, reused across runs —
//! on the inputs of a recorded case ([`Case`]) where the caller has one.
//!
//! It knows the kernel ABI, workloads, tensors and plans; it knows nothing of ONNX,
//! fusion, code generation, compiling, measuring or searching (modules are written by
//! `anyshape-tune`).
#![deny(missing_docs)]

mod arena;
mod cache;
mod case;
mod error;
mod exec;
mod generate;
mod kept;
mod model;
mod module;
mod sampling;

pub use cache::CacheState;
pub use case::Case;
pub use error::{Result, RuntimeError};
pub use exec::{Executor, TaskKernels};
pub use generate::{Decoder, GenerateOptions, Generation};
pub use kept::{KeptOutputs, Outputs};
pub use model::Model;
pub use module::{Dispatch, Module, Threads};
pub use sampling::Sampling;
