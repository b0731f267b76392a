//! The kernel cache's integrity, and writing files so that a killed process never
//! leaves half of one.
//!
//! Every cached build (a kernel library, a PTX file) is moved into place by `rename`
//! and carries a sidecar `<entry>.sha256` holding its size and SHA-256. An entry is
//! used only when both match; a damaged one (truncated by a full disk, changed by hand)
//! is rebuilt with a warning instead of crashing every worker that loads it.
use sha2::{Digest, Sha256};
use std::io;
use std::path::{Path, PathBuf};

/// The sidecar of a cache entry.
fn sidecar(entry: &Path) -> PathBuf {
    let mut name = entry.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    entry.with_file_name(name)
}

fn digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Write `bytes` to `path` atomically (`anyshape-files`): readers see the old content
/// or the new, never part of it.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    anyshape_files::write_bytes(
        path,
        &anyshape_files::Reads::new(),
        "the kernel cache",
        bytes,
    )
    .map_err(io::Error::other)
}

/// The largest cache entry read (a kernel library, PTX).
const ENTRY_LIMIT: u64 = anyshape_files::GIB;

/// A cache file's bytes, as a regular file within [`ENTRY_LIMIT`]; `Ok(None)` if absent.
fn read_entry(path: &Path) -> Result<Option<Vec<u8>>, String> {
    match anyshape_files::read(path, ENTRY_LIMIT, "a kernel cache entry") {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.is_missing() => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Move the finished file `built` to the cache entry `entry`, with its sidecar.
pub(crate) fn store(built: &Path, entry: &Path) -> io::Result<()> {
    let bytes = read_entry(built)
        .map_err(io::Error::other)?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    // The sidecar first: an entry without a matching sidecar is rebuilt, so a kill
    // between the two renames costs a rebuild, never a damaged entry in use.
    write_atomic(
        &sidecar(entry),
        format!("{} {}\n", digest(&bytes), bytes.len()).as_bytes(),
    )?;
    std::fs::rename(built, entry)
}

/// Write `bytes` as the cache entry `entry`, with its sidecar.
pub(crate) fn store_bytes(entry: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic(
        &sidecar(entry),
        format!("{} {}\n", digest(bytes), bytes.len()).as_bytes(),
    )?;
    write_atomic(entry, bytes)
}

/// Whether `entry` is in the cache: `Ok(true)` if present and intact, `Ok(false)` if
/// absent, `Err(why)` if present but damaged (the caller rebuilds it).
pub(crate) fn lookup(entry: &Path) -> Result<bool, String> {
    let Some(bytes) = read_entry(entry)? else {
        return Ok(false);
    };
    let Ok(Some(expected)) = read_entry(&sidecar(entry)) else {
        return Err("its checksum file is missing".into());
    };
    let expected = String::from_utf8_lossy(&expected);
    let mut parts = expected.split_whitespace();
    let (Some(sha), Some(len)) = (parts.next(), parts.next()) else {
        return Err("its checksum file is unreadable".into());
    };
    if len != bytes.len().to_string() {
        return Err(format!("{} bytes, {len} expected", bytes.len()));
    }
    if sha != digest(&bytes) {
        return Err("its SHA-256 differs from the one recorded".into());
    }
    Ok(true)
}

/// Kernels a build left out, by symbol, with the compiler's reason.
pub(crate) type Failures = std::collections::BTreeMap<String, String>;

/// Where the kernels a cached build left out are recorded, beside the entry.
fn failures_path(entry: &Path) -> PathBuf {
    entry.with_extension("failed.json")
}

/// A cached build: the kernels it left out when `entry` is present and intact; `None`
/// when it must be built (a damaged entry is warned about, then rebuilt).
pub(crate) fn cached_build(entry: &Path) -> Option<Failures> {
    match lookup(entry) {
        Ok(true) => Some(
            read_entry(&failures_path(entry))
                .ok()
                .flatten()
                .and_then(|s| serde_json::from_slice(&s).ok())
                .unwrap_or_default(),
        ),
        Ok(false) => None,
        Err(why) => {
            tracing::warn!(
                "kernel cache entry {} is damaged ({why}); rebuilding it",
                entry.display()
            );
            None
        }
    }
}

/// Record beside `entry` the kernels its build left out (before storing the entry).
pub(crate) fn record_failures(entry: &Path, failed: &Failures) -> io::Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    let json = serde_json::to_string(failed).unwrap_or_default();
    write_atomic(&failures_path(entry), json.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_entries_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let entry = dir.path().join("lib0.so");
        assert_eq!(lookup(&entry), Ok(false));
        store_bytes(&entry, b"kernel code").unwrap();
        assert_eq!(lookup(&entry), Ok(true));
        std::fs::write(&entry, b"kernel").unwrap();
        assert!(lookup(&entry).unwrap_err().contains("bytes"));
        std::fs::write(&entry, b"kernel cod3").unwrap();
        assert!(lookup(&entry).unwrap_err().contains("SHA-256"));
        std::fs::remove_file(sidecar(&entry)).unwrap();
        assert!(lookup(&entry).unwrap_err().contains("missing"));
    }
}
