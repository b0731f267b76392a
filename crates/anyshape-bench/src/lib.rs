//! Baselines and reports for `anyshape bench` and `anyshape gpu`: vendor libraries
//! called through their C interfaces as kernels with anyshape's ABI, the `gemm` crate
//! and cuBLAS as kernels built into the worker (so the same isolated runner times and
//! checks them all), the tuned baselines (per-shape, Nimble-style, bucketing), the FMA
//! peak, and the reports and plots of a comparison; and whole model modules raced
//! against onnxruntime, OpenVINO and tract ([`compare_model`]), decoders at generating
//! text too ([`compare_generate`]).
//!
//! It knows workloads, the builder, the runner and the tuning pipeline (to tune the
//! baselines); the front end gives it a [`Harness`] and a [`Progress`](anyshape_measure::Progress)
//! to report to.
#![deny(missing_docs)]

mod bandwidth;
mod bucket;
mod compare;
mod conv;
mod cublas;
mod dispatch;
mod error;
mod generate;
mod gpu;
mod model;
mod out;
pub mod peak;
mod peers;
pub mod plot;
mod report;
mod rust_gemm;
mod tuned;
mod tuning;
mod vendor;

pub use bucket::bucket_c;
pub use compare::{compare, CompareOptions};
pub use conv::{compare_convolutions, ConvCompareOptions};
pub use cublas::{CUBLAS_SYMBOL, GPU_BUILTINS};
pub use dispatch::{dispatch_loss, overhead};
pub use error::{BenchError, Result};
pub use generate::{compare_generate, GenerateCompareOptions};
pub use gpu::{compare_gpu, GpuComparison, GpuReport};
pub use model::{compare_model, ModelCompareOptions};
pub use out::OutDir;
pub use peers::{PeerKind, PeerOptions};
pub use rust_gemm::BUILTINS;
pub use tuning::{read_tuning, Milestone, TuningComparison, MILESTONES};
pub use vendor::{build_vendors, VendorKernel, VendorLibrary};

use anyshape_codegen::CpuTarget;
use anyshape_measure::{Builder, MeasureOptions, Runner, WorkerCommand};

/// Every builtin kernel of the `anyshape` worker: the `gemm` crate on the CPU, cuBLAS on
/// the GPU.
pub const WORKER_BUILTINS: anyshape_measure::Builtins = anyshape_measure::Builtins {
    cpu: BUILTINS,
    gpu: GPU_BUILTINS,
};

/// What a benchmark builds and measures with: the CPU target, the builder, and the
/// worker command (an executable serving [`WORKER_BUILTINS`]).
#[derive(Clone, Debug)]
pub struct Harness {
    /// The CPU the kernels are built for.
    pub target: CpuTarget,
    /// Builds kernels (cached).
    pub builder: Builder,
    /// Starts a measuring worker.
    pub worker: WorkerCommand,
}

impl Harness {
    /// A runner of this harness's worker with `options`.
    pub fn runner(&self, options: MeasureOptions) -> Runner {
        Runner {
            worker: self.worker.clone(),
            options,
        }
    }
}
