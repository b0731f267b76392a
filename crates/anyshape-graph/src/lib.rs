//! Whole models for anyshape: reading ONNX files ([`onnx`]) into a graph IR
//! ([`Graph`]), symbolic shape propagation ([`infer`]: every value's shape as
//! expressions over the model's shape vars, shape plumbing folded), the operators'
//! semantics ([`ops`]), a reference executor ([`exec::run`]) and fusion into steps
//! and tasks ([`fuse`]); tensors in NumPy files ([`npz`]) and compared with a
//! reference ([`compare`]).
//!
//! It builds on `anyshape-ir` (expressions, shape vars); it knows nothing of code
//! generation, measuring or tuning.
#![deny(missing_docs)]

mod compare;
mod error;
pub mod exec;
mod fact;
mod fusion;
mod graph;
mod infer;
pub mod npz;
pub mod onnx;
pub mod ops;
mod tensor;

pub use compare::{compare, Comparison, Element};
pub use error::{GraphError, Result};
pub use fact::{broadcast, equal, exact_quotient, positive, shape_text, Fact, FOLD_LIMIT};
pub use fusion::{fuse, Fusion, Layout, Step, StepKind, Task, PANEL_WIDTH};
pub use graph::{Attr, Graph, Input, Node, ValueId};
pub use infer::{fact, infer};
pub use tensor::{numel, strides, DType, Data, Tensor};
