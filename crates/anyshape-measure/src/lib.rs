//! Measuring programs on any device: the builder (C sources to one shared library with
//! the system compiler, CUDA to PTX with NVRTC; in parallel, cached by source hash and
//! checked), the reference implementation every result is checked against, and the
//! runner (times programs in a separate worker process with a time limit, so that a
//! crashing or hanging candidate fails alone) with its worker, which runs CPU kernels,
//! GPU kernels (launches timed by CUDA events; CUDA loaded at run time, absent without
//! it) and the builtin kernels of the worker executable.
//!
//! It knows programs, their sources and symbols; it knows nothing of search or dispatch.
#![deny(missing_docs)]

mod builder;
pub mod cache;
mod error;
mod gpu;
mod nvrtc;
mod progress;
pub mod queue;
mod reference;
mod runner;
mod threads;
pub mod worker;

pub use builder::{render_programs, Builder, BuiltLibrary, KernelSource};
pub use error::{MeasureError, Result};
pub use gpu::{GpuBuffers, GpuBuiltin, GpuCall, GpuDevice};
pub use progress::{Progress, Silent};
pub use reference::{
    buffer_bytes, check_output, random_inputs, reference_output, CheckReport, Reference,
};
pub use runner::{
    Candidate, Kernels, MeasureOptions, Measurement, Outcome, Runner, WorkerCommand,
    MAX_TIMEOUT_SECONDS,
};
pub use threads::each_on_threads;
pub use worker::{Builtin, Builtins, PreparedKernel};

/// The measurer: a builder that compiles programs and a runner that times them — or
/// a work queue whose workers, on other machines, do both.
#[derive(Clone, Debug)]
pub struct Measurer {
    /// Compiles kernels.
    pub builder: Builder,
    /// Times them in isolated workers.
    pub runner: Runner,
    /// Where set, tuning rounds are built and measured by the queue's workers instead
    /// (with the runner's timing options).
    pub queue: Option<queue::Queue>,
}
