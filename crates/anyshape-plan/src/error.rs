//! Errors of plans: a plan that breaks an invariant, a plan file that cannot be read.

/// Result alias for this crate.
pub type Result<T, E = PlanError> = std::result::Result<T, E>;

/// Why a plan is not one the runtime can run.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The plan breaks one of its invariants: after lowering an internal bug, after
    /// loading a damaged or tampered module (the message says which and where).
    #[error("the plan is invalid: {0}")]
    Invalid(String),
    /// The plan file is not one this anyshape reads (another format, damaged,
    /// truncated): the message says which.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// The plan file could not be read or written (see its error).
    #[error(transparent)]
    Files(#[from] anyshape_files::FileError),
    /// An expression could not be evaluated at the given dims (user input).
    #[error(transparent)]
    Ir(#[from] anyshape_ir::IrError),
}
