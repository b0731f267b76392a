//! Errors of tensors and ops. Every variant is the model's or the caller's fault (user
//! input) unless its doc says otherwise.

/// Result alias for this crate.
pub type Result<T, E = TensorError> = std::result::Result<T, E>;

/// Why a tensor could not be read or an op could not be inferred or evaluated.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    /// A file could not be read: missing, unreadable (environment), not a regular file
    /// or too large (user input).
    #[error(transparent)]
    File(#[from] anyshape_files::FileError),
    /// A `.npz` file is damaged or holds what anyshape cannot read (user input).
    #[error("{0}")]
    Npz(String),
    /// The model uses something anyshape does not support (named in the message).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A node is wrong or cannot be handled: which node, which op, what.
    #[error("node `{node}` ({op}): {message}")]
    Node {
        /// The node's name.
        node: String,
        /// Its op type.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// A shape problem outside any node (inputs, sizes).
    #[error("{0}")]
    Shape(String),
    /// An element-type problem outside any node.
    #[error("{0}")]
    Type(String),
    /// A symbolic expression could not be built or evaluated.
    #[error(transparent)]
    Ir(#[from] anyshape_ir::IrError),
}
