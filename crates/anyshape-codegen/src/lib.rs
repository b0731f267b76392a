//! Code generation for anyshape: CPU targets, the contraction sketch and its
//! micro-kernels, lowering of programs to a small loop IR with a padding strategy, and
//! the C printer, the dispatcher's C form, and the global-padding wrapper of the
//! bucketing baseline; and for GPUs the target, micro-kernel, launch configuration and
//! the CUDA C printer.
//!
//! It knows workloads (from `anyshape-ir`) but nothing of measuring, searching or
//! loading: those crates build on this one.
#![deny(missing_docs)]

mod bucket;
pub mod c;
mod cuda;
mod dispatch;
mod error;
mod gpu;
pub mod loop_ir;
mod lower;
mod program;
mod sketch;
mod target;

pub use bucket::bucket_c;
pub use cuda::{GpuProgram, CUDA_PRELUDE};
pub use dispatch::{dispatcher_c, DispatcherSpec};
pub use error::{CodegenError, Result};
pub use gpu::{launch_config, GpuMicroKernel, GpuTarget, LaunchConfig, SHARED_PAD};
pub use lower::lower;
pub use program::{
    KernelMode, PaddingStrategy, Program, CODEGEN_VERSION, KERNEL_MODES, PADDING_STRATEGIES,
};
pub use sketch::{GemmOperand, GemmView, MicroKernel, StridedGemm};
pub use target::{CpuTarget, Simd};
