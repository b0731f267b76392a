//! Errors of the runtime.
use anyshape_ir::IrError;

/// Result alias for this crate.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Why a module cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A file of the module cannot be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The path is not a module (user input): what it is instead.
    #[error("{path} is not an anyshape module: {why}")]
    NotAModule {
        /// The module path.
        path: String,
        /// Why.
        why: String,
    },
    /// A file the module needs is gone (user input: the module was changed by hand).
    #[error("{path} is an incomplete module: its {file} is missing; compile (or tune) it again")]
    Missing {
        /// The module path.
        path: String,
        /// The missing file, relative to the module.
        file: String,
    },
    /// A file could not be read as anyshape reads files (not a regular file, too large,
    /// unreadable).
    #[error(transparent)]
    File(#[from] anyshape_files::FileError),
    /// A run would need more memory than the machine has (user input: the shape).
    #[error("{0}")]
    Memory(String),
    /// The manifest is not valid JSON of the module format.
    #[error("{path}: corrupted manifest: {reason}")]
    BadManifest {
        /// The manifest path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The manifest's content does not match its checksum.
    #[error("{path}: the manifest was modified after the module was written (checksum mismatch); rebuild the module")]
    Tampered {
        /// The manifest path.
        path: String,
    },
    /// A file does not match the checksum in the manifest.
    #[error("{path}: corrupted or truncated ({reason}); rebuild the module")]
    CorruptFile {
        /// The file.
        path: String,
        /// What differs.
        reason: String,
    },
    /// Written by another anyshape version or module format.
    #[error("the module was written by anyshape {built} (format {format}); this is anyshape {running} (format {expected}): rebuild the module with this version")]
    Version {
        /// The version that wrote it.
        built: String,
        /// Its format number.
        format: u32,
        /// This version.
        running: String,
        /// This version's format number.
        expected: u32,
    },
    /// This CPU lacks instructions the module's kernels may use.
    #[error("the module was built for a CPU with {missing}, which this CPU lacks (built on: {built_on}); rebuild it on this machine")]
    CpuFeatures {
        /// The missing features, comma-separated.
        missing: String,
        /// The CPU the module was built on.
        built_on: String,
    },
    /// The kernel library cannot be loaded or lacks a symbol.
    #[error("{path}: cannot load the kernels: {reason}")]
    Load {
        /// The library.
        path: String,
        /// Why.
        reason: String,
    },
    /// The shape-var values are invalid for the workload.
    #[error(transparent)]
    Shape(#[from] IrError),
    /// A shape var the workload does not have.
    #[error("`{name}` is not a shape var of {workload} (its shape vars: {vars})")]
    UnknownVar {
        /// The name given.
        name: String,
        /// The workload.
        workload: String,
        /// Its shape vars.
        vars: String,
    },
    /// Wrong number of buffers.
    #[error("expected {expected} {what} buffers, got {got}")]
    BufferCount {
        /// `input` or `output`.
        what: &'static str,
        /// How many the workload has.
        expected: usize,
        /// How many were passed.
        got: usize,
    },
    /// A buffer's length does not match the bound shape.
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
    /// The model could not be read or run (its error says what and where).
    #[error(transparent)]
    Model(anyshape_graph::GraphError),
}
