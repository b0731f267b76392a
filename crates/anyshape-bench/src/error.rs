//! Errors of the benchmarks. Each variant's doc says whose fault it is.

/// Result alias for this crate.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A workload, shape or domain problem (user input).
    #[error(transparent)]
    Ir(#[from] anyshape_ir::IrError),
    /// A code generation problem (user input or an internal bug; the variant says).
    #[error(transparent)]
    Codegen(#[from] anyshape_codegen::CodegenError),
    /// Building or measuring failed as a whole (environment).
    #[error(transparent)]
    Measure(#[from] anyshape_measure::MeasureError),
    /// A module could not be loaded or called (its error says whose fault).
    #[error(transparent)]
    Runtime(#[from] anyshape_runtime::RuntimeError),
    /// Tuning a baseline failed.
    #[error(transparent)]
    Tune(#[from] anyshape_tune::TuneError),
    /// A file could not be read or written (environment).
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A file could not be read or written as anyshape reads and writes them (not a
    /// regular file, read by the same command, or the system refused).
    #[error(transparent)]
    File(#[from] anyshape_files::FileError),
    /// The machine cannot run the benchmark (a library that does not load).
    #[error("{0}")]
    Environment(String),
    /// Options that do not fit the benchmark (user input).
    #[error("{0}")]
    Options(String),
}

/// The I/O error of `path`, for `map_err`.
pub(crate) fn io(path: &std::path::Path) -> impl Fn(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}
