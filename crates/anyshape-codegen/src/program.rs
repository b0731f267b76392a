//! Programs: a micro-kernel applied to a workload with a padding strategy and a kernel
//! mode — `P(S, M)`, on whichever device the micro-kernel's sketch targets.
use crate::{Result, Sketch, Target};
use anyshape_ir::{Bindings, Workload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

pub use crate::padding::PaddingStrategy;

/// Whether the shape is baked into the kernel or passed at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelMode {
    /// The instance's shape vars are compile-time constants; the kernel rejects other values.
    Specialized,
    /// One kernel for every instance; shape vars are read at run time.
    Symbolic,
}

/// All kernel modes.
pub const KERNEL_MODES: [KernelMode; 2] = [KernelMode::Specialized, KernelMode::Symbolic];

impl KernelMode {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            KernelMode::Specialized => "specialized",
            KernelMode::Symbolic => "symbolic",
        }
    }
}

impl fmt::Display for KernelMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KernelMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        KERNEL_MODES
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown `{s}` (expected one of: {})",
                    KERNEL_MODES.map(|v| v.name()).join(", ")
                )
            })
    }
}

/// A micro-kernel applied to a workload: `P(S, M)`, ready to lower and render. `K` is
/// the micro-kernel, whose type names the sketch (and so the device).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program<K = crate::ContractionKernel> {
    /// The workload.
    pub workload: Workload,
    /// The micro-kernel.
    pub micro_kernel: K,
    /// How overhanging tiles are handled.
    pub strategy: PaddingStrategy,
    /// Specialized or symbolic.
    pub mode: KernelMode,
    /// The instance (required for specialized kernels; ignored by symbolic ones).
    pub bindings: Bindings,
}

impl<K: Sketch> Program<K> {
    /// A symbolic program: one kernel for every instance of `workload`.
    pub fn symbolic(workload: &Workload, micro_kernel: K, strategy: PaddingStrategy) -> Self {
        Program {
            workload: workload.clone(),
            micro_kernel,
            strategy,
            mode: KernelMode::Symbolic,
            bindings: Bindings::default(),
        }
    }

    /// A program specialized for the instance `bindings`.
    pub fn specialized(
        workload: &Workload,
        micro_kernel: K,
        strategy: PaddingStrategy,
        bindings: &Bindings,
    ) -> Self {
        Program {
            mode: KernelMode::Specialized,
            bindings: bindings.clone(),
            ..Self::symbolic(workload, micro_kernel, strategy)
        }
    }

    /// The exported symbol: a hash of the program and the target (the device's prefix:
    /// `as` on CPU, `asg` on CUDA). It names the kernel within one build of anyshape;
    /// compiled kernels are cached by their source, so a change of the generated code
    /// needs no new symbol.
    pub fn symbol(&self, target: &K::Target) -> String {
        let (prefix, tag) = match K::Target::DEVICE {
            crate::DeviceKind::Cpu => ("as", ""),
            crate::DeviceKind::Cuda => ("asg", "cuda|"),
        };
        let specialized = match self.mode {
            KernelMode::Specialized => self.bindings.to_string(),
            KernelMode::Symbolic => String::new(),
        };
        let key = format!(
            "{tag}{}|{}|{}|{}|{specialized}|{:?}",
            self.workload, self.micro_kernel, self.strategy, self.mode, target
        );
        let digest = Sha256::digest(key.as_bytes());
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        format!("{prefix}_{hex}")
    }

    /// The program's function: lowered by its sketch, rendered for the target (to
    /// follow the target's [`Target::prelude`]).
    pub fn source(&self, target: &K::Target) -> Result<String> {
        Ok(target.render(&crate::lower(self, target)?))
    }
}
