//! Sketches: for each class of operators and each device, the structure of a schedule
//! (tiling levels, staging, vectorized, parallel and unrolled axes, the fused epilogue)
//! whose parameters make a micro-kernel. Every sketch implements [`Sketch`]: what it
//! serves, its micro-kernel's limits on a target (never on a shape), the space of its
//! micro-kernels, how a program lowers, and how an instance maps onto a micro-kernel.
//!
//! - `contraction.rs`: contractions on the CPU ([`ContractionKernel`], BLIS-like; its text
//!   form in `contraction_text.rs`, its defaults and seeds in `contraction_seeds.rs`,
//!   its AMX variant's shapes and workloads in `contraction_amx.rs`);
//! - `rows.rs`: normalizations on the CPU ([`RowKernel`]);
//! - `attention.rs`: fused attention on the CPU ([`AttentionKernel`]);
//! - `gpu.rs`: contractions on CUDA GPUs ([`GpuContractionKernel`]).
//!
//! A new class needs its sketch file here, its lowering in `lower/`, and the renderer's
//! table where it uses something new.
mod attention;
mod contraction;
mod contraction_amx;
mod contraction_seeds;
mod contraction_space;
#[cfg(test)]
mod contraction_tests;
mod contraction_text;
mod gemm;
mod gpu;
mod rows;

pub use attention::AttentionKernel;
pub(crate) use attention::{attention_pieces, packs_pairs};
pub use contraction::ContractionKernel;
pub use contraction_amx::{amx_runs, AMX_EDGE, AMX_TILES};
pub use gemm::{GemmOperand, GemmView, StridedGemm};
pub use gpu::{launch_config, GpuContractionKernel, LaunchConfig, SHARED_PAD};
pub use rows::RowKernel;

use crate::loop_ir::Func;
use crate::{Program, Result, Target};
use anyshape_ir::{BoundWorkload, Workload};
use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::{Debug, Display};
use std::hash::Hash;

/// The compact text form of a micro-kernel, `NAME=VALUE,…`: the whole-number value of
/// each of `names`, in their order (`None` where not given). Unknown or repeated names
/// and values that are not whole numbers are errors: the reason, for the caller's error
/// that names the text.
pub(crate) fn parse_fields<T: std::str::FromStr>(
    text: &str,
    names: &[&str],
) -> std::result::Result<Vec<Option<T>>, String> {
    let mut values: Vec<Option<T>> = names.iter().map(|_| None).collect();
    for part in text.split(',') {
        let (k, val) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not `NAME=VALUE`"))?;
        let k = k.trim();
        let slot = names
            .iter()
            .position(|n| *n == k)
            .ok_or_else(|| format!("unknown parameter `{k}` (known: {})", names.join(", ")))?;
        let val = val
            .trim()
            .parse()
            .map_err(|_| format!("`{}` is not a whole number", val.trim()))?;
        if values[slot].replace(val).is_some() {
            return Err(format!("`{k}` is given twice"));
        }
    }
    Ok(values)
}

/// How an instance maps onto a micro-kernel: what `f_occ` and `f_pad` of the cost
/// model take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptation {
    /// Micro-kernel instances the program runs (CPU: batch × cache tiles of M and N;
    /// GPU: blocks).
    pub tasks: f64,
    /// How many tasks run at once (CPU: cores; GPU: SMs × resident blocks per SM).
    pub slots: f64,
    /// Useful / padded work.
    pub pad: f64,
}

/// The extents of one instance along the sketch's tiled axes, for the per-shape
/// (Ansor-style) space whose tiles divide them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Factors(pub Vec<usize>);

/// A sketch and its micro-kernel: the type is the micro-kernel (every parameter of the
/// sketch fixed); the trait is the sketch.
pub trait Sketch:
    Copy + Ord + Hash + Debug + Display + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The device it runs on.
    type Target: Target;
    /// Its name in records and messages.
    const NAME: &'static str;

    /// Whether it serves `w`; the error says why not.
    fn applies(w: &Workload) -> Result<()>;
    /// A reasonable micro-kernel for `target` (what runs before anything is tuned).
    fn default_for(target: &Self::Target) -> Self;
    /// The micro-kernels a search of `w` measures before any other: the default first,
    /// then the defaults of the sketch's other variants that suit `w`.
    fn seeds(target: &Self::Target, _w: &Workload) -> Vec<Self> {
        vec![Self::default_for(target)]
    }
    /// `self` as it runs `w`: the parameters `w` fixes set (a bf16 contraction runs
    /// only the usual variant, B in its panels or packed, or AMX tiles where `w` and
    /// the target allow them); the search space of `w` holds only micro-kernels it
    /// leaves unchanged. Validity is the caller's to check.
    fn fit(self, _target: &Self::Target, _w: &Workload) -> Self {
        self
    }
    /// The default as it runs `w`: the first of `w`'s seeds, fitted.
    fn default_for_workload(target: &Self::Target, w: &Workload) -> Self {
        let first = Self::seeds(target, w).into_iter().next();
        first
            .unwrap_or_else(|| Self::default_for(target))
            .fit(target, w)
    }
    /// The default at one instance `bound` of `w` (what an untuned module dispatches
    /// to, and `anyshape run` without `--micro-kernel` runs): the workload's default,
    /// unless the sketch knows a variant that suits such instances better.
    fn default_for_instance(target: &Self::Target, w: &Workload, _bound: &BoundWorkload) -> Self {
        Self::default_for_workload(target, w)
    }
    /// Parse the text form (what `Display` writes) or JSON.
    fn parse(text: &str) -> Result<Self>;
    /// Check every limit of the target; the error names the broken one.
    fn validate(&self, target: &Self::Target) -> Result<()>;
    /// Lower a program (the caller has checked [`Sketch::applies`]).
    fn lower(p: &Program<Self>, target: &Self::Target) -> Result<Func>;
    /// How `bound` maps onto this micro-kernel on `target`.
    fn adaptation(&self, target: &Self::Target, w: &Workload, bound: &BoundWorkload) -> Adaptation;

    /// A micro-kernel drawn from the space bounded by `target` (valid on it).
    fn sample(target: &Self::Target, rng: &mut impl Rng) -> Self;
    /// A proposed neighbour of `self`: one parameter changed (validity is the caller's
    /// to check).
    fn neighbour(&self, target: &Self::Target, rng: &mut impl Rng) -> Self;
    /// The neighbours one step along the parameters that matter most (validity is the
    /// caller's to check), which the search's exploitation round tries around its
    /// winners; none by default.
    fn steps(&self, _target: &Self::Target) -> Vec<Self> {
        Vec::new()
    }
    /// A proposed child of `self` and `other` (validity is the caller's to check).
    fn child(&self, other: &Self, target: &Self::Target, rng: &mut impl Rng) -> Self;
    /// The extents per-shape tuning restricts tiles to, for one instance.
    fn factors(target: &Self::Target, w: &Workload, bound: &BoundWorkload) -> Factors;
    /// The nearest micro-kernel whose tiles divide `f`, only shrinking tiles (upper
    /// limits of the target still hold; a lower one, such as a full GPU warp, may not:
    /// validity is the caller's to check).
    fn snap(&self, target: &Self::Target, f: &Factors) -> Self;
    /// Whether the tiles divide `f`.
    fn divides(&self, f: &Factors) -> bool;
}

/// Call the generic function `$f::<K>(args...)` with the CPU sketch `K` that serves the
/// class of operators `$class` (an [`OpClass`](anyshape_ir::OpClass)): the one place a
/// class names its CPU sketch.
///
/// ```ignore
/// fn name<K: Sketch>() -> &'static str { K::NAME }
/// let sketch = cpu_sketch!(workload.class, name());
/// ```
#[macro_export]
macro_rules! cpu_sketch {
    ($class:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $class {
            ::anyshape_ir::OpClass::Contraction => $f::<$crate::ContractionKernel>($($arg),*),
            ::anyshape_ir::OpClass::Normalization { .. } => $f::<$crate::RowKernel>($($arg),*),
            ::anyshape_ir::OpClass::Attention(_) => $f::<$crate::AttentionKernel>($($arg),*),
        }
    };
}
