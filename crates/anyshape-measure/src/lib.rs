//! Measuring programs: the builder (C sources to one shared library, in parallel, cached
//! by source hash), the reference implementation every result is checked against, and
//! the runner (times programs in a separate worker process with a time limit, so that a
//! crashing or hanging candidate fails alone).
//!
//! It knows programs as C source and symbols; it knows nothing of search or dispatch.
#![deny(missing_docs)]

mod builder;
mod error;
mod reference;
mod runner;
pub mod worker;

pub use builder::{Builder, BuiltLibrary, KernelSource};
pub use error::{MeasureError, Result};
pub use reference::{check_output, random_inputs, reference_output, CheckReport, Reference};
pub use runner::{Candidate, MeasureOptions, Measurement, Outcome, Runner, WorkerCommand};

/// The measurer: a builder that compiles programs and a runner that times them.
#[derive(Clone, Debug)]
pub struct Measurer {
    /// Compiles kernels.
    pub builder: Builder,
    /// Times them in isolated workers.
    pub runner: Runner,
}

/// Signature of every generated kernel (see `anyshape_codegen::c`).
pub type KernelFn = unsafe extern "C" fn(*const i64, *const *const f32, *const *mut f32) -> i32;

/// Load a kernel library. It is never unloaded (`RTLD_NODELETE`): its OpenMP runtime
/// keeps worker threads alive, and unloading their code under them would crash.
///
/// # Safety
/// The library must be one the builder produced (its initializers are the C runtime's).
pub unsafe fn load_library(
    path: &std::path::Path,
) -> Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        #[cfg(target_os = "linux")]
        const RTLD_NODELETE: i32 = 0x1000;
        #[cfg(not(target_os = "linux"))]
        const RTLD_NODELETE: i32 = 0x80;
        // SAFETY: forwarded to the caller.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: forwarded to the caller.
        unsafe { libloading::Library::new(path) }
    }
}
