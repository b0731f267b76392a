//! How anyshape touches the file system, in one place, so that no command can lose a
//! user's file or hang on one:
//!
//! - **Reading** ([`read`], [`open`]): only regular files (a FIFO, a device or a
//!   directory is refused by name, never read), and their size is checked against a
//!   limit before a byte is read, so `/dev/zero` or a 100 GB file is an error, not a
//!   hang or an allocation failure.
//! - **What a command reads** ([`Reads`]): the files and directories it takes as input,
//!   known by device and inode, so that an output naming one of them (by any spelling:
//!   a link, `./`, `..`) is refused before any work.
//! - **Writing** ([`write_atomic`], [`Temp`]): an output is written beside its path
//!   (`.NAME.tmp-N-PID`), flushed to disk, and renamed over the path in one step, so the
//!   path holds the old content or the new, whole, at every moment — also on a full disk
//!   or a kill. What an interrupted write leaves is removed by the next write to that
//!   path ([`clean_leftovers`]); a failed write removes its own.
//! - **Directories** ([`swap_dir`]): a module directory is replaced the same way, by an
//!   atomic exchange.
//!
//! It depends on no other anyshape crate: every crate that reads or writes a file uses it.
#![deny(missing_docs)]

mod error;
mod read;
mod reads;
mod write;

pub use error::{FileError, Result};
pub use read::{open, read, read_to_string, regular_file_len};
pub use reads::{normalized, FileId, Reads};
pub use write::{
    clean_leftovers, process_alive, swap_dir, temp_dir, temp_owner, write_atomic, write_bytes, Temp,
};

/// 1 KiB, for limits.
pub const KIB: u64 = 1 << 10;
/// 1 MiB, for limits.
pub const MIB: u64 = 1 << 20;
/// 1 GiB, for limits.
pub const GIB: u64 = 1 << 30;
