//! Errors of tuning.

/// Result alias for this crate.
pub type Result<T, E = TuneError> = std::result::Result<T, E>;

/// Errors raised while tuning.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// A workload, shape or domain problem (user input).
    #[error(transparent)]
    Ir(#[from] anyshape_ir::IrError),
    /// A code generation problem.
    #[error(transparent)]
    Codegen(#[from] anyshape_codegen::CodegenError),
    /// Building or measuring failed as a whole (environment problem).
    #[error(transparent)]
    Measure(#[from] anyshape_measure::MeasureError),
    /// The records file cannot be read or written.
    #[error("records file {path}: {message}")]
    Records {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The tuning database cannot be opened, read or written (not a tuning database:
    /// user input; locked or the disk full: environment).
    #[error("tuning database {path}: {message}")]
    Database {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The machine failed the run, not its input (the compiler killed, out of memory):
    /// the records are kept and the run can resume.
    #[error("{0}")]
    Environment(String),
    /// An output that would destroy what the user owns, or outputs that collide (user
    /// input): refused before any work.
    #[error("{0}")]
    Output(String),
    /// A file could not be read or written (environment: permissions, disk space).
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be read or written as anyshape reads and writes them (not a
    /// regular file, too large, read by the same command, or the system refused).
    #[error(transparent)]
    File(#[from] anyshape_files::FileError),
    /// A module could not be written or read back (its error says why).
    #[error(transparent)]
    Module(#[from] anyshape_abi::ModuleError),
    /// A model's plan could not be written (its error says why).
    #[error(transparent)]
    Plan(#[from] anyshape_plan::PlanError),
    /// Something anyshape does not do yet (user input asked for it).
    #[error("{0}")]
    Unsupported(String),
    /// Bad tuning options or domains (user input).
    #[error("{0}")]
    Options(String),
    /// The model could not be imported (its error says what and where; user input).
    #[error(transparent)]
    Model(anyshape_graph::GraphError),
    /// A bug in anyshape (a library it uses behaved unexpectedly): please report it.
    #[error("internal error (a bug in anyshape, please report it): {0}")]
    Internal(String),
}
