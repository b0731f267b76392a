//! Errors of the runtime. Each variant (or the error it wraps) says whose fault it is.
use anyshape_ir::IrError;

/// Result alias for this crate.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Why a module cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The module cannot be read or checked (its error says why: not a module, missing
    /// or damaged files, another version or CPU).
    #[error(transparent)]
    Module(#[from] anyshape_abi::ModuleError),
    /// The kernel library cannot be loaded or lacks a symbol (a damaged module, or the
    /// system's loader refused it).
    #[error("{path}: cannot load the kernels: {reason}")]
    Load {
        /// The library.
        path: String,
        /// Why.
        reason: String,
    },
    /// The shape-var values are invalid for the workload (user input).
    #[error(transparent)]
    Shape(#[from] IrError),
    /// A shape var the workload does not have (user input).
    #[error("`{name}` is not a shape var of {workload} (its shape vars: {vars})")]
    UnknownVar {
        /// The name given.
        name: String,
        /// The workload.
        workload: String,
        /// Its shape vars.
        vars: String,
    },
    /// Wrong number of buffers (user input).
    #[error("expected {expected} {what} buffers, got {got}")]
    BufferCount {
        /// `input` or `output`.
        what: &'static str,
        /// How many the workload has.
        expected: usize,
        /// How many were passed.
        got: usize,
    },
    /// A buffer's length does not match the bound shape (user input).
    #[error("tensor {tensor} has {expected} elements at {bindings}, the buffer has {got}")]
    BufferLen {
        /// The tensor's name.
        tensor: String,
        /// The shape-var values.
        bindings: String,
        /// Elements the shape needs.
        expected: usize,
        /// Elements in the buffer.
        got: usize,
    },
    /// The kernel reported a failure.
    #[error("the kernel failed: {0}")]
    Kernel(String),
    /// The model's plan cannot be loaded or does not fit its task modules (its error
    /// says why).
    #[error(transparent)]
    Plan(#[from] anyshape_plan::PlanError),
    /// The inputs do not fit the model, or a host step failed on them (its error says
    /// which input or node).
    #[error(transparent)]
    Tensor(#[from] anyshape_tensor::TensorError),
    /// The model is not a decoder with a key/value cache, or one that breaks its
    /// convention (user input: the model; the message says what is missing or wrong).
    #[error("the model cannot generate: {0}")]
    Decoder(String),
    /// Options or a prompt that cannot be used (user input).
    #[error("{0}")]
    Options(String),
    /// A run would need more memory than the machine has (user input: the shape).
    #[error("{0}")]
    Memory(String),
}

/// A broken invariant of a plan or a run (a bug, not the caller's input).
pub(crate) fn internal(what: &str) -> RuntimeError {
    RuntimeError::Plan(anyshape_plan::PlanError::Invalid(what.to_string()))
}
