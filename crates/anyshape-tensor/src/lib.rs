//! Tensors and the ONNX ops anyshape computes on them — what a model's host steps need
//! at run time as much as what the compiler needs to understand a model:
//!
//! - [`Tensor`]s of the three element types models use (f32, i64, bool), owned, and
//!   borrowed views of them ([`TensorRef`]) over any memory (an arena, a mapped file);
//! - [`Node`]: one op applied to values, with its attributes;
//! - [`Fact`]: what is known of a value before it runs (shape as expressions over the
//!   shape vars, elements where known) and symbolic broadcasting and division;
//! - [`ops`]: the registry of ONNX ops — each op's shape rule (`infer`, over facts) and
//!   reference evaluation (`eval`, over tensors), and the op versions it implements;
//! - [`bind`]ing the tensors a caller gives to the inputs a model declares
//!   ([`TensorSpec`]), which sets the shape vars;
//! - the [`Workers`] a host op may split its work over;
//! - NumPy files of named tensors ([`npz`]) and comparing tensors with a reference
//!   ([`compare`]).
//!
//! It knows expressions and shape vars (`anyshape-ir`); it knows nothing of ONNX files,
//! fusion, plans, code generation or tuning.
#![deny(missing_docs)]

mod bind;
mod compare;
mod error;
mod fact;
mod node;
pub mod npz;
pub mod ops;
mod tensor;
mod workers;

pub use bind::{bind, Binder, TensorSpec};
pub use compare::{compare, Comparison, Element};
pub use error::{Result, TensorError};
pub use fact::{broadcast, equal, exact_quotient, positive, shape_text, Fact, FOLD_LIMIT};
pub use node::{Attr, Branch, Node, ValueId};
pub use tensor::{numel, strides, DType, Data, DataRef, Tensor, TensorRef};
pub use workers::{Split, Workers};
