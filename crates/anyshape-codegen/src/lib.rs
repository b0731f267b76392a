//! Code generation for anyshape: targets (CPU, CUDA GPU), the sketch of each class of
//! operators on each device and its micro-kernels, lowering of programs to a small loop
//! IR with a padding strategy (decided once per strategy, for every device), the
//! loop-IR verifier, one C-style renderer with a C and a CUDA dialect, and the
//! dispatcher's C form.
//!
//! It knows workloads (from `anyshape-ir`) and the kernel ABI (`anyshape-abi`), but
//! nothing of compiling, measuring, searching or loading: those crates build on this one.
#![deny(missing_docs)]

mod dispatch;
mod error;
pub mod loop_ir;
mod lower;
mod padding;
mod program;
pub mod render;
mod sketch;
mod target;
pub mod verify;

pub use dispatch::{dispatcher_c, DispatcherSpec};
pub use error::{CodegenError, Result};
pub use lower::lower;
pub use padding::{Compute, Fetch, PaddingStrategy, Policy, PADDING_STRATEGIES};
pub use program::{KernelMode, Program, KERNEL_MODES};
pub use sketch::{
    launch_config, Adaptation, AttentionKernel, ContractionKernel, Factors, GemmOperand, GemmView,
    GpuContractionKernel, LaunchConfig, RowKernel, Sketch, StridedGemm, SHARED_PAD,
};
pub use target::{CpuTarget, DeviceKind, GpuTarget, Simd, Target};

/// The generation of the kernels this code generator writes. Trials are recorded, and a
/// tuning database keys its runs, under [`kernels_version`], so that measurements of
/// kernels written differently are never reused as this code's: bump it with every
/// change to generated code that moves its speed (2: bf16 kernels broadcast A's words
/// as one load and pack A walking K; 3: contraction tiles balanced over the threads;
/// 4: a softmax row's accumulators reduced lane by lane before one horizontal
/// reduction, the maximum's as a tree, and no padded tail where a row is whole steps;
/// 5: a fused attention's tasks split into pieces where its heads do not divide among
/// the threads, and a contraction's N tiles rounded up to the threads where M's
/// cannot be).
pub const KERNELS_GENERATION: u32 = 5;

/// The version trials are measured under: anyshape's and the kernels' generation
/// (`0.1.0+k5`).
pub fn kernels_version() -> String {
    format!("{}+k{KERNELS_GENERATION}", env!("CARGO_PKG_VERSION"))
}
