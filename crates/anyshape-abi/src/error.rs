//! Why a module cannot be read: each variant says whose fault it is.

/// Why a module (operator or model) cannot be read or checked.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// A file of the module cannot be read (environment).
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The path is not a module (user input): what it is instead.
    #[error("{path} is not an anyshape module: {why}")]
    NotAModule {
        /// The module path.
        path: String,
        /// Why.
        why: String,
    },
    /// A file the module needs is gone (user input: the module was changed by hand).
    #[error("{path} is an incomplete module: its {file} is missing; compile (or tune) it again")]
    Missing {
        /// The module path.
        path: String,
        /// The missing file, relative to the module.
        file: String,
    },
    /// A file could not be read as anyshape reads files (not a regular file, too large,
    /// unreadable).
    #[error(transparent)]
    File(#[from] anyshape_files::FileError),
    /// The manifest is not valid JSON of the module format (a damaged module).
    #[error("{path}: corrupted manifest: {reason}")]
    BadManifest {
        /// The manifest path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The manifest's content does not match its checksum (a changed module).
    #[error("{path}: the manifest was modified after the module was written (checksum mismatch); rebuild the module")]
    Tampered {
        /// The manifest path.
        path: String,
    },
    /// A file does not match the checksum in the manifest (a damaged module).
    #[error("{path}: corrupted or truncated ({reason}); rebuild the module")]
    CorruptFile {
        /// The file.
        path: String,
        /// What differs.
        reason: String,
    },
    /// Written by another anyshape version or module format (user input: rebuild).
    #[error("the module was written by anyshape {built} (format {format}); this is anyshape {running} (format {expected}): rebuild the module with this version")]
    Version {
        /// The version that wrote it.
        built: String,
        /// Its format number.
        format: u32,
        /// This version.
        running: String,
        /// This version's format number.
        expected: u32,
    },
    /// This CPU lacks instructions the module's kernels may use (environment).
    #[error("the module was built for a CPU with {missing}, which this CPU lacks (built on: {built_on}); rebuild it on this machine")]
    CpuFeatures {
        /// The missing features, comma-separated.
        missing: String,
        /// The CPU the module was built on.
        built_on: String,
    },
}
