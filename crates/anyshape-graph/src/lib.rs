//! Whole models for anyshape: reading ONNX files ([`onnx`]) into a graph IR
//! ([`Graph`]; control flow inlined, repeated computations merged), symbolic shape
//! propagation ([`infer`]: every value's shape as
//! expressions over the model's shape vars, shape plumbing folded), a reference
//! executor ([`exec::run`]), rotary embeddings' seven exported nodes rewritten into one
//! pass ([`rotate_half`]), 3 x 3 convolutions rewritten by Winograd's F(2x2, 3x3)
//! or F(4x4, 3x3) ([`winograd`]), fusion into steps and tasks ([`fuse`]) and lowering the
//! fused graph to a plan ([`lower`], `anyshape-plan`), what `anyshape compile` saves.
//!
//! It builds on `anyshape-ir` (expressions, shape vars) and `anyshape-tensor` (tensors,
//! the ONNX ops' semantics); it knows nothing of code generation, measuring, tuning or
//! running plans.
#![deny(missing_docs)]

mod branches;
mod cse;
mod error;
pub mod exec;
mod fusion;
mod graph;
mod infer;
mod lower;
pub mod onnx;
mod rotary;
mod winograd;

pub use error::{GraphError, Result};
pub use fusion::{fuse, fuse_with_attention, Fusion, Layout, Step, StepKind, Task, PANEL_WIDTH};
pub use graph::{Graph, Input};
pub use infer::{fact, infer};
pub use lower::lower;
pub use rotary::rotate_half;
pub use winograd::winograd;
