//! Errors of reading and writing files; each variant says whose fault it is.
use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = FileError> = std::result::Result<T, E>;

/// Why a file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The system refused (environment: permissions, a full disk, a missing file).
    #[error("{}: {error}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Why (not a `source`: the message says it already).
        error: std::io::Error,
    },
    /// The path is not a regular file: a directory, a FIFO, a device or a socket (user
    /// input). Such a file could hang a reader or never end.
    #[error("{path} is {kind}, not a regular file")]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is instead ("a directory", "a FIFO (named pipe)", ...).
        kind: &'static str,
    },
    /// The file is larger than anyshape reads for its purpose (user input).
    #[error("{path} is {bytes} bytes, more than the {limit} bytes anyshape reads as {what}")]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
        /// What it was read as.
        what: String,
    },
    /// An output would replace, or land inside, something the same command reads (user
    /// input): refused before anything is written.
    #[error("{option} {path}: {why}; write it elsewhere")]
    ReadByCommand {
        /// The option that named the output (`--output`, `--records`, ...).
        option: String,
        /// The output's path as given.
        path: PathBuf,
        /// Which input it collides with, and how.
        why: String,
    },
}

impl FileError {
    /// Whether the file is not there (as opposed to unreadable or refused).
    pub fn is_missing(&self) -> bool {
        matches!(self, FileError::Io { error, .. } if error.kind() == std::io::ErrorKind::NotFound)
    }

    /// An I/O error at `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> FileError {
        let path = path.into();
        move |error| FileError::Io { path, error }
    }
}
