//! Symbolic shapes and tensor operator definitions: the lowest layer of anyshape.
//!
//! This crate owns integer expressions over shape vars ([`Expr`]), their textual
//! form and parser ([`parse_expr`]), shape vars with domains ([`ShapeVar`]),
//! bindings of shape vars to values ([`Bindings`]), the operator registry
//! ([`OPERATORS`]: each operator defined once, with its class and shape rule), and
//! workloads: an operator's axes and tensors with affine index maps, its class
//! ([`OpClass`]) and a fused elementwise epilogue ([`Epilogue`]), with their text form.
//!
//! It knows nothing of schedules, targets or code generation: those live in
//! `anyshape-codegen`, which depends on this crate and never the other way round.
#![deny(missing_docs)]

mod bound;
mod build;
mod dtype;
mod epilogue;
mod error;
mod expr;
mod ops;
mod parse;
mod shape;
mod text;
mod workload;

pub use bound::{BoundPanels, BoundWorkload};
pub use dtype::{
    bf16_bits, bf16_pair, bf16_unpair, bf16_value, i8_quad, i8_quantize, i8_row_scale, i8_unquad,
    DType, Precision,
};
pub use epilogue::{Binary, Epilogue, EpilogueOp, Scalar, Unary};
pub use error::{IrError, ParseError, Result};
pub use expr::{is_runtime_dim, Expr, RUNTIME_DIM};
pub use ops::{operator, AttentionAxes, OpDef, CACHE_RESERVE, OPERATORS};
pub use parse::{parse_expr, split_top_level, MAX_EXPR_LEN, MAX_NESTING};
pub use shape::{Bindings, Domain, ShapeVar};
pub use workload::{
    AffineIndex, AttentionSpec, Axis, AxisKind, Normalization, OpClass, TensorRef, Workload,
};
