//! Baselines and reports for `anyshape bench`: vendor libraries called through their C
//! interfaces as kernels with anyshape's ABI (so the same isolated runner times and
//! checks them), and the side-by-side report.
//!
//! It knows workloads, the builder and the runner; it knows nothing of search.
#![deny(missing_docs)]

mod vendor;

pub use vendor::{build_vendors, VendorKernel, VendorLibrary};
