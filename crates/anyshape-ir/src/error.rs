//! Errors of the IR layer. Every variant is a user-input error unless its doc says otherwise.
use std::fmt;

/// Result alias for this crate.
pub type Result<T, E = IrError> = std::result::Result<T, E>;

/// A syntax error in a textual form, with the position it was found at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The whole text that was parsed.
    pub text: String,
    /// Byte offset of the problem in `text`.
    pub pos: usize,
    /// What is wrong there.
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let col = self.text[..self.pos.min(self.text.len())].chars().count();
        write!(
            f,
            "{}\n  {}\n  {}^",
            self.message,
            self.text,
            " ".repeat(col)
        )
    }
}

impl std::error::Error for ParseError {}

/// Errors raised by the IR layer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IrError {
    /// Malformed text (expression, shape var, workload).
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// A shape var that an expression needs has no value.
    #[error("shape var `{0}` is not bound (give it a value, e.g. `--set {0}=16`)")]
    Unbound(String),
    /// A shape var was bound to a negative value.
    #[error("shape var `{name}` = {value} is negative; shape vars must be >= 0")]
    NegativeVar {
        /// The shape var.
        name: String,
        /// Its value.
        value: i64,
    },
    /// A shape var given two values.
    #[error("shape var `{name}` is given twice ({first} and {second}); give it once")]
    DuplicateVar {
        /// The shape var.
        name: String,
        /// The first value.
        first: i64,
        /// The second value.
        second: i64,
    },
    /// An extent evaluated to a negative number.
    #[error("{what} evaluates to {value}, which is negative")]
    NegativeExtent {
        /// What was evaluated.
        what: String,
        /// The value.
        value: i64,
    },
    /// Division or modulo by zero while evaluating an expression.
    #[error("division by zero in `{0}`")]
    DivByZero(String),
    /// Integer overflow while evaluating an expression.
    #[error("integer overflow while evaluating `{0}`")]
    Overflow(String),
    /// A workload name that is not built in.
    #[error("unknown workload `{name}`; built in: {known}")]
    UnknownWorkload {
        /// The name given.
        name: String,
        /// The built-in names.
        known: String,
    },
    /// Wrong arguments to a built-in workload.
    #[error("workload `{name}`: {message}")]
    BadArguments {
        /// The workload.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A workload definition that breaks an invariant (an internal or API-user bug).
    #[error("invalid workload: {0}")]
    InvalidWorkload(String),
    /// A tensor access that leaves the tensor for the bound shape.
    #[error("tensor `{tensor}` dim {dim}: index reaches {index} but the extent is {extent}")]
    OutOfBounds {
        /// The tensor.
        tensor: String,
        /// The dimension.
        dim: usize,
        /// The largest index reached.
        index: i64,
        /// The dimension's extent.
        extent: i64,
    },
    /// A tensor too large to address.
    #[error("tensor `{0}` is too large")]
    TooLarge(String),
}
