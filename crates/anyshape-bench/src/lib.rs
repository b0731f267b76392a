//! Baselines and reports for `anyshape bench`: vendor libraries called through their C
//! interfaces as kernels with anyshape's ABI, and the `gemm` crate as kernels built into
//! the worker (so the same isolated runner times and checks them all); and the plots of
//! a comparison.
//!
//! It knows workloads, the builder and the runner; it knows nothing of search.
#![deny(missing_docs)]

pub mod plot;
mod rust_gemm;
mod vendor;

pub use rust_gemm::BUILTINS;
pub use vendor::{build_vendors, VendorKernel, VendorLibrary};
