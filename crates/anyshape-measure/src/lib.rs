//! Measuring programs: the builder (C sources to one shared library, in parallel, cached
//! by source hash), the reference implementation every result is checked against, and
//! the runner (times programs in a separate worker process with a time limit, so that a
//! crashing or hanging candidate fails alone), and the GPU device (NVRTC, launches,
//! CUDA events; loaded at run time, absent without CUDA).
//!
//! It knows programs as C source and symbols; it knows nothing of search or dispatch.
#![deny(missing_docs)]

mod builder;
pub mod cache;
mod error;
mod gpu;
mod reference;
mod runner;
pub mod worker;

pub use builder::{Builder, BuiltLibrary, KernelSource};
pub use error::{MeasureError, Result};
pub use gpu::{GpuDevice, CUBLAS_LIBRARY, CUBLAS_SYMBOL};
pub use reference::{
    buffer_bytes, check_fits, check_output, random_inputs, reference_output, CheckReport, Reference,
};
pub use runner::{
    Candidate, MeasureOptions, Measurement, Outcome, Runner, WorkerCommand, MAX_TIMEOUT_SECONDS,
};
pub use worker::{Builtin, PreparedKernel, BUILTIN_LIBRARY};

/// The measurer: a builder that compiles programs and a runner that times them.
#[derive(Clone, Debug)]
pub struct Measurer {
    /// Compiles kernels.
    pub builder: Builder,
    /// Times them in isolated workers.
    pub runner: Runner,
}
