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
    /// Bad tuning options or domains (user input).
    #[error("{0}")]
    Options(String),
}
