//! Programs: a micro-kernel applied to a workload with a padding strategy and a kernel mode.
use crate::{c, lower, CpuTarget, MicroKernel, Result};
use anyshape_ir::{Bindings, Workload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// How a program handles tiles that overhang the tensors (DietCode Fig. 6).
///
/// Every strategy computes the same result; they differ in where the checks are:
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PaddingStrategy {
    /// Checks inside the compute stage, on every element of every register tile:
    /// always legal, slowest (scalar, branchy compute).
    BoundaryCheck,
    /// Copy inputs into zero-padded buffers (each axis rounded up to the register tile),
    /// compute without any check, copy the output back: costs extra memory and two copies.
    GlobalPad,
    /// Full register tiles run the unchecked vectorized kernel; edge tiles run the checked
    /// one: fast when tiles are small against the shape, no gain on small shapes.
    LoopPartition,
    /// Zero-fill while packing (fetch stage), unchecked vectorized compute, checked
    /// write-back: no extra memory, and works for small and large shapes alike.
    LocalPad,
}

/// All padding strategies, in the order of the paper's figure.
pub const PADDING_STRATEGIES: [PaddingStrategy; 4] = [
    PaddingStrategy::BoundaryCheck,
    PaddingStrategy::GlobalPad,
    PaddingStrategy::LoopPartition,
    PaddingStrategy::LocalPad,
];

impl PaddingStrategy {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            PaddingStrategy::BoundaryCheck => "boundary-check",
            PaddingStrategy::GlobalPad => "global-pad",
            PaddingStrategy::LoopPartition => "loop-partition",
            PaddingStrategy::LocalPad => "local-pad",
        }
    }
}

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

macro_rules! named_enum {
    ($ty:ty, $all:expr) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
        impl FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                $all.into_iter().find(|v| v.name() == s).ok_or_else(|| {
                    format!(
                        "unknown `{s}` (expected one of: {})",
                        $all.map(|v| v.name()).join(", ")
                    )
                })
            }
        }
    };
}
named_enum!(PaddingStrategy, PADDING_STRATEGIES);
named_enum!(KernelMode, KERNEL_MODES);

/// A micro-kernel applied to a workload: `P(S, M)`, ready to lower and print.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program {
    /// The workload.
    pub workload: Workload,
    /// The micro-kernel.
    pub micro_kernel: MicroKernel,
    /// How overhanging tiles are handled.
    pub strategy: PaddingStrategy,
    /// Specialized or symbolic.
    pub mode: KernelMode,
    /// The instance (required for specialized kernels; ignored by symbolic ones).
    pub bindings: Bindings,
}

/// Bump when generated code changes, so cached builds and symbols change with it.
pub const CODEGEN_VERSION: u32 = 1;

impl Program {
    /// A symbolic program: one kernel for every instance of `workload`.
    pub fn symbolic(
        workload: &Workload,
        micro_kernel: MicroKernel,
        strategy: PaddingStrategy,
    ) -> Program {
        Program {
            workload: workload.clone(),
            micro_kernel,
            strategy,
            mode: KernelMode::Symbolic,
            bindings: Bindings::default(),
        }
    }

    /// The exported symbol: a hash of everything that shapes the generated code.
    pub fn symbol(&self, target: &CpuTarget) -> String {
        let key = format!(
            "{CODEGEN_VERSION}|{}|{}|{}|{}|{}|{:?}",
            self.workload,
            self.micro_kernel,
            self.strategy,
            self.mode,
            specialized_key(self.mode, &self.bindings),
            target
        );
        hashed_symbol("as", &key)
    }

    /// Lower to loop IR and print as C (one function; see [`c::header`] for the shared prelude).
    pub fn c_source(&self, target: &CpuTarget) -> Result<String> {
        let func = lower::lower(self, target)?;
        Ok(c::print_func(&func, target))
    }
}

/// The instance a kernel is specialized for, as it enters a symbol's key (empty for a
/// symbolic kernel).
pub(crate) fn specialized_key(mode: KernelMode, bindings: &Bindings) -> String {
    match mode {
        KernelMode::Specialized => bindings.to_string(),
        KernelMode::Symbolic => String::new(),
    }
}

/// A kernel name: `prefix` and the first 8 bytes of the SHA-256 of `key` (everything
/// that shapes the kernel's code), in hex.
pub(crate) fn hashed_symbol(prefix: &str, key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{prefix}_{hex}")
}
