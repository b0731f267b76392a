//! Symbolic shapes and tensor operator definitions: the lowest layer of anyshape.
//!
//! This crate owns integer expressions over shape vars ([`Expr`]), their textual
//! form and parser ([`parse_expr`]), shape vars with domains ([`ShapeVar`]),
//! bindings of shape vars to values ([`Bindings`]), and workloads: contractions
//! with affine index maps and an optional elementwise epilogue ([`Workload`]).
//!
//! It knows nothing of schedules, targets or code generation: those live in
//! `anyshape-codegen`, which depends on this crate and never the other way round.
#![deny(missing_docs)]

mod error;
mod expr;
mod parse;
mod shape;
mod workload;

pub use error::{IrError, ParseError, Result};
pub use expr::Expr;
pub use parse::{parse_expr, split_top_level};
pub use shape::{Bindings, Domain, ShapeVar};
pub use workload::{
    AffineIndex, Axis, AxisKind, BoundWorkload, DType, Epilogue, TensorRef, Workload,
    BUILTIN_WORKLOADS,
};
