//! The plan: what `anyshape compile` produces and the runtime runs — a model fused,
//! with every decision made:
//!
//! - [`Plan`]: the model's inputs and outputs, its values (each with its element type,
//!   shape as expressions over the shape vars, and where it lives: an input, a constant,
//!   shape plumbing, the arena, a host step's own tensor, or a view of another value),
//!   its kernel tasks (typed workloads), and its steps in order — kernel steps calling a
//!   task's module, host steps evaluating one ONNX op;
//! - [`MemoryPlan`]: the arena slots the kernels' outputs share (sizes as expressions,
//!   offsets from the instance's dims, the peak as an expression);
//! - [`verify`]: the plan's invariants, checked after lowering and after loading;
//! - the file ([`PlanFile`]): a versioned header and the constants in their run-time
//!   layouts (weights already in panels), mapped rather than read.
//!
//! It knows workloads (`anyshape-ir`) and tensors and ops (`anyshape-tensor`); it knows
//! nothing of ONNX files, fusion, code generation, tuning or kernels' libraries.
#![deny(missing_docs)]

mod error;
mod file;
mod memory;
mod plan;
mod text;
mod verify;

pub use error::{PlanError, Result};
pub use file::{PlanFile, PLAN_FORMAT};
pub use memory::{ArenaLayout, MemoryPlan};
pub use plan::{Cache, Constant, ConstantLayout, Plan, Step, Storage, Task, Value};
pub use verify::{check_cache, check_instance, verify};
