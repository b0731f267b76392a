//! Targets: what the code generator may assume about a device, and how programs for it
//! are written out. Every device implements [`Target`]: its kind, its name, the prelude
//! of a translation unit, and the rendering of a lowered function in its dialect.
//!
//! - `cpu.rs`: CPU targets (cores, SIMD, registers, caches), detected or from JSON;
//! - `gpu.rs`: GPU targets (SMs, threads, shared memory, registers).
mod cpu;
mod gpu;

pub use cpu::{CpuTarget, Simd};
pub use gpu::GpuTarget;

use crate::loop_ir::Func;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::hash::Hash;

/// The kinds of device anyshape generates code for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// A CPU: C with vector extensions and OpenMP, built by the system C compiler.
    Cpu,
    /// An NVIDIA GPU: CUDA C, built by NVRTC.
    Cuda,
}

impl DeviceKind {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

/// A device the code generator writes programs for.
pub trait Target:
    Clone + PartialEq + Eq + Hash + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// Its kind.
    const DEVICE: DeviceKind;
    /// Its model name.
    fn name(&self) -> &str;
    /// Its name with what matters for speed, for reports: `AMD EPYC 7B13 (2 cores, Avx2)`.
    fn describe(&self) -> String;
    /// What every translation unit of kernels starts with, once.
    fn prelude(&self) -> String;
    /// A lowered function in the device's dialect (after [`Target::prelude`]).
    fn render(&self, f: &Func) -> String;
    /// Flags the device's compiler takes for this target (beyond the builder's own).
    fn compile_flags(&self) -> Vec<String> {
        Vec::new()
    }
}
