//! Errors of the measurer.

/// Result alias for this crate.
pub type Result<T, E = MeasureError> = std::result::Result<T, E>;

/// Errors raised while building or running programs.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The C compiler could not be run at all (environment problem).
    #[error("cannot run the C compiler `{cc}`: {source} (install gcc, or set CC)")]
    NoCompiler {
        /// The compiler command.
        cc: String,
        /// Why.
        source: std::io::Error,
    },
    /// The C compiler rejected a source (internal bug in code generation).
    #[error("the C compiler failed on {what}:\n{stderr}")]
    Compile {
        /// Which program or file.
        what: String,
        /// The compiler's messages.
        stderr: String,
    },
    /// The environment stopped a build (the compiler killed, out of memory, no disk
    /// space): nobody's fault in the code; try again once the machine has room.
    #[error("the machine could not finish a build: {0}")]
    Environment(String),
    /// Measuring options that make no sense (user input): a time limit that is not a
    /// positive number, say.
    #[error("bad measuring options: {0}")]
    Options(String),
    /// The worker process could not be started (environment problem).
    #[error("cannot start the measuring worker `{cmd}`: {source}")]
    Worker {
        /// The command.
        cmd: String,
        /// Why.
        source: std::io::Error,
    },
    /// File system trouble in the build cache.
    #[error("build cache {path}: {source}")]
    Io {
        /// The path involved.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A work queue's address that is not one (user input).
    #[error("bad --queue URL {0}")]
    QueueUrl(String),
    /// The work queue failed: its server unreachable, or no worker of the target to
    /// measure (environment).
    #[error("{0}")]
    Queue(String),
    /// No GPU to run on here (missing driver, NVRTC or device): GPU work is skipped.
    #[error("no GPU: {0}")]
    NoGpu(String),
    /// A CUDA driver call failed.
    #[error("GPU: {0}")]
    Gpu(String),
}
