//! Errors of code generation.

/// Result alias for this crate.
pub type Result<T, E = CodegenError> = std::result::Result<T, E>;

/// Errors raised while building sketches, checking micro-kernels and lowering programs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodegenError {
    /// A shape or workload problem (user input).
    #[error(transparent)]
    Ir(#[from] anyshape_ir::IrError),
    /// The micro-kernel breaks a limit of the target (user input or search bug).
    #[error("micro-kernel {micro_kernel} does not fit the target: {reason}")]
    InvalidMicroKernel {
        /// The micro-kernel in its text form.
        micro_kernel: String,
        /// Which limit it breaks.
        reason: String,
    },
    /// Malformed micro-kernel text (user input).
    #[error("cannot read micro-kernel `{text}`: {reason}")]
    BadMicroKernelText {
        /// The text.
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// The contraction sketch does not apply to this workload.
    #[error("the contraction sketch does not apply to `{workload}`: {reason}")]
    SketchNotApplicable {
        /// The workload.
        workload: String,
        /// Why.
        reason: String,
    },
    /// A specialized program without a value for some shape var (user input).
    #[error("a specialized kernel needs every shape var bound: {0}")]
    Unspecialized(String),
    /// A bug in the code generator: lowered code breaks an invariant of the loop IR.
    #[error("internal error in the code generator (please report it): {0}")]
    Internal(String),
    /// A target description that cannot be read (user input).
    #[error("bad target description: {0}")]
    BadTarget(String),
}
