//! Errors of model import, shape propagation, fusion and the reference executor. Every
//! variant is the model's or the caller's fault (user input) unless its doc says
//! otherwise.

/// Result alias for this crate.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;

/// Why a model could not be read, understood or run.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// The bytes are not an ONNX model (truncated, another format, damaged).
    #[error("not a valid ONNX model: {0}")]
    Format(String),
    /// The model uses something anyshape does not support (named in the message).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A file could not be read (see its error).
    #[error(transparent)]
    File(#[from] anyshape_files::FileError),
    /// An op, a tensor or a shape of the model is wrong or cannot be handled (its error
    /// says which node and what).
    #[error(transparent)]
    Tensor(#[from] anyshape_tensor::TensorError),
    /// The plan the graph lowers to breaks an invariant (a bug in fusion or lowering).
    #[error(transparent)]
    Plan(#[from] anyshape_plan::PlanError),
    /// A symbolic expression could not be built or evaluated.
    #[error(transparent)]
    Ir(#[from] anyshape_ir::IrError),
}
