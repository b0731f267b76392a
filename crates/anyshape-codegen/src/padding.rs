//! Padding strategies (DietCode Fig. 6): how a program handles tiles that overhang its
//! tensors. Every strategy computes the same result; they differ in where the checks
//! are. What each strategy does in each stage of a kernel is decided here, once, as a
//! [`Policy`]; the lowering of every sketch on every device reads the policy and never
//! matches on the strategy itself.
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// How a program handles tiles that overhang the tensors.
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

/// How the fetch stage copies a block of an input that may overhang the tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Without checks: the data are padded already (global padding).
    Unchecked,
    /// Elements past the edge become the reduction's identity (zero for a sum): local
    /// padding. The copy is padded up to the compute stage's granularity.
    ZeroFill,
    /// Elements past the edge are skipped; the compute stage must not read them.
    Guard,
}

/// How the compute stage runs register tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compute {
    /// Every tile vectorized and unchecked.
    Unchecked,
    /// Every tile checked element by element.
    Checked,
    /// Tiles wholly inside the output unchecked, edge tiles checked.
    Partitioned,
}

/// What a strategy does in each stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Inputs are copied into zero-padded buffers first and the output is copied back
    /// last (global padding).
    pub copy: bool,
    /// The fetch stage.
    pub fetch: Fetch,
    /// The compute stage.
    pub compute: Compute,
    /// The write-back stage checks tiles that overhang the output (unchecked only where
    /// the output itself is padded).
    pub checked_store: bool,
}

impl Fetch {
    /// Whether the fetched block is padded to the compute granularity (so the compute
    /// stage needs no tail).
    pub fn pads(self) -> bool {
        self != Fetch::Guard
    }
}

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

    /// What the strategy does in each stage: the one place strategies are told apart.
    pub fn policy(self) -> Policy {
        match self {
            PaddingStrategy::BoundaryCheck => Policy {
                copy: false,
                fetch: Fetch::Guard,
                compute: Compute::Checked,
                checked_store: true,
            },
            PaddingStrategy::GlobalPad => Policy {
                copy: true,
                fetch: Fetch::Unchecked,
                compute: Compute::Unchecked,
                checked_store: false,
            },
            PaddingStrategy::LoopPartition => Policy {
                copy: false,
                fetch: Fetch::Guard,
                compute: Compute::Partitioned,
                checked_store: true,
            },
            PaddingStrategy::LocalPad => Policy {
                copy: false,
                fetch: Fetch::ZeroFill,
                compute: Compute::Unchecked,
                checked_store: true,
            },
        }
    }
}

impl fmt::Display for PaddingStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PaddingStrategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PADDING_STRATEGIES
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown `{s}` (expected one of: {})",
                    PADDING_STRATEGIES.map(|v| v.name()).join(", ")
                )
            })
    }
}
