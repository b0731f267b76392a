//! Writing: every output written beside its path, flushed, and renamed into place, so
//! the path holds the old content or the new at every moment; directories swapped the
//! same way; leftovers of interrupted writes removed by the next write to the path.
use crate::{normalized, FileError, Reads, Result};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Whether the process `pid` is alive (on systems without `/proc`, assumed alive, so
/// nothing of a running process is ever removed).
pub fn process_alive(pid: u32) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new("/proc").join(pid.to_string()).exists()
}

/// The process id in a temporary name `<anything>-<pid>`, if it ends in one.
pub fn temp_owner(name: &str) -> Option<u32> {
    name.rsplit_once('-')?.1.parse().ok()
}

/// The temporary sibling of `path` of a kind (`tmp`, `old`, `tmp-N` for a file's
/// N-th write in its process) and process: `.NAME.KIND-PID`.
fn sibling(path: &Path, kind: &str, pid: u32) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "output".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{kind}-{pid}"))
}

/// The parent directory of `path` ("." for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Clean up what killed writers left beside `path`: their temporary files and
/// directories (`.NAME.tmp-PID`) are removed; a directory renamed aside
/// (`.NAME.old-PID`) is put back if nothing took its place, removed otherwise. Those
/// of live processes are left alone.
pub fn clean_leftovers(path: &Path) {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(parent(path)) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix(&format!(".{name}.")) else {
            continue;
        };
        let Some(pid) = temp_owner(rest) else {
            continue;
        };
        if pid == std::process::id() || process_alive(pid) {
            continue;
        }
        let stale = e.path();
        if rest.starts_with("old-") && std::fs::symlink_metadata(path).is_err() {
            if std::fs::rename(&stale, path).is_ok() {
                tracing::warn!(
                    "{} was left aside by a killed run: put back",
                    path.display()
                );
            }
        } else if rest.starts_with("tmp-") || rest.starts_with("old-") {
            let removed = match std::fs::symlink_metadata(&stale) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&stale),
                _ => std::fs::remove_file(&stale),
            };
            if removed.is_ok() {
                tracing::debug!("removed {}, left by a killed run", stale.display());
            }
        }
    }
}

/// A temporary file beside its destination, removed when dropped unless
/// [`Temp::commit`] renamed it into place.
pub struct Temp {
    path: PathBuf,
    dest: PathBuf,
    file: File,
    committed: bool,
}

impl Temp {
    /// A new temporary file for `dest` (which, where it exists, must be a regular
    /// file), after cleaning up what interrupted writes left beside it.
    pub fn create(dest: &Path) -> Result<Temp> {
        let dest = normalized(dest);
        if let Ok(m) = std::fs::metadata(&dest) {
            if !m.is_file() {
                return Err(FileError::NotRegular {
                    path: dest,
                    kind: if m.is_dir() {
                        "a directory"
                    } else {
                        "a device, FIFO or socket"
                    },
                });
            }
        }
        clean_leftovers(&dest);
        // One name per file written, not per process: threads of one process writing
        // the same destination at once (the kernel cache's checksum of a library two
        // compiles build) would remove each other's temporary file.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = sibling(&dest, &format!("tmp-{n}"), std::process::id());
        let file = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .open(&path)
            .map_err(FileError::io(&path))?;
        Ok(Temp {
            path,
            dest,
            file,
            committed: false,
        })
    }

    /// The file to write.
    pub fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Flush the file to disk and rename it over its destination — after checking once
    /// more that the destination is none of `reads` (for `option`'s message) — then
    /// flush the directory. The destination keeps its permissions where it existed.
    pub fn commit(mut self, reads: &Reads, option: &str) -> Result<()> {
        let io = |p: &Path| FileError::io(p.to_path_buf());
        self.file.flush().map_err(io(&self.path))?;
        if let Ok(m) = std::fs::metadata(&self.dest) {
            let _ = self.file.set_permissions(m.permissions());
        }
        self.file.sync_all().map_err(io(&self.path))?;
        reads.check(option, &self.dest)?;
        std::fs::rename(&self.path, &self.dest).map_err(io(&self.dest))?;
        self.committed = true;
        if let Ok(d) = File::open(parent(&self.dest)) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Write the output `dest` (named by `option`, for messages) with `write`, atomically:
/// refused up front if it is something the command `reads`; written beside, flushed,
/// renamed over `dest`. On any error `dest` is untouched and nothing is left behind.
pub fn write_atomic(
    dest: &Path,
    reads: &Reads,
    option: &str,
    write: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<()> {
    reads.check(option, dest)?;
    let mut temp = Temp::create(dest)?;
    write(temp.file()).map_err(FileError::io(dest))?;
    temp.commit(reads, option)
}

/// [`write_atomic`] of `bytes`.
pub fn write_bytes(dest: &Path, reads: &Reads, option: &str, bytes: &[u8]) -> Result<()> {
    write_atomic(dest, reads, option, |f| f.write_all(bytes))
}

/// Put the complete directory `tmp` at `dir`, atomically: `dir` holds what it held or
/// the new directory at every moment (Linux: one `renameat2(RENAME_EXCHANGE)`;
/// elsewhere, or where the file system lacks it, the old one is renamed aside to
/// `.NAME.old-PID` first, which [`clean_leftovers`] puts back after a kill). The old
/// directory is removed afterwards.
pub fn swap_dir(tmp: &Path, dir: &Path) -> std::io::Result<()> {
    if std::fs::rename(tmp, dir).is_ok() {
        return Ok(()); // nothing was there (or an empty directory)
    }
    if exchange(tmp, dir).is_ok() {
        // `tmp` now holds the old directory.
        let _ = std::fs::remove_dir_all(tmp);
        return Ok(());
    }
    let old = sibling(dir, "old", std::process::id());
    std::fs::rename(dir, &old)?;
    if let Err(e) = std::fs::rename(tmp, dir) {
        let _ = std::fs::rename(&old, dir);
        return Err(e);
    }
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// A fresh temporary directory name beside `dir` for its replacement.
pub fn temp_dir(dir: &Path) -> PathBuf {
    sibling(dir, "tmp", std::process::id())
}

/// Swap two paths in one step (Linux `renameat2` with `RENAME_EXCHANGE`).
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    };
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths; renameat2 only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_the_old_file_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("prev.npz");
        std::fs::write(&out, "old").unwrap();
        let e = write_atomic(&out, &Reads::new(), "--output", |f| {
            f.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        });
        assert!(e.unwrap_err().to_string().contains("disk full"));
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "old");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left");
        write_bytes(&out, &Reads::new(), "--output", b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        // Never over a directory or a device.
        assert!(write_bytes(dir.path(), &Reads::new(), "--output", b"x").is_err());
        assert!(Temp::create(Path::new("/dev/null")).is_err());
    }

    #[test]
    fn never_over_an_input() {
        let dir = tempfile::tempdir().unwrap();
        let case = dir.path().join("case.npz");
        std::fs::write(&case, "inputs").unwrap();
        let mut reads = Reads::new();
        reads.file(&case);
        assert!(write_bytes(&case, &reads, "--output", b"outputs").is_err());
        assert_eq!(std::fs::read_to_string(&case).unwrap(), "inputs");
    }

    #[test]
    fn permissions_are_kept() {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("o");
            std::fs::write(&out, "old").unwrap();
            std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
            write_bytes(&out, &Reads::new(), "--output", b"new").unwrap();
            let mode = std::fs::metadata(&out).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o640);
        }
    }

    /// What a run killed between the steps of a write leaves is put right by the next:
    /// temporary files and half-written directories removed; a directory renamed aside
    /// put back if nothing took its place.
    #[test]
    fn leftovers_of_killed_runs_are_cleaned() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("m");
        let dead = 999_999_999; // no such process
        let leftover = |kind: &str| {
            let p = sibling(&m, kind, dead);
            std::fs::create_dir(&p).unwrap();
            std::fs::write(p.join("f"), kind).unwrap();
            p
        };
        let (tmp, old) = (leftover("tmp"), leftover("old"));
        clean_leftovers(&m);
        assert!(!tmp.exists() && !old.exists());
        assert_eq!(std::fs::read_to_string(m.join("f")).unwrap(), "old");
        let old = leftover("old");
        clean_leftovers(&m);
        assert!(!old.exists());
        let mine = sibling(&m, "tmp", std::process::id());
        std::fs::create_dir(&mine).unwrap();
        clean_leftovers(&m);
        assert!(mine.exists(), "a live process's temporaries are left alone");
        // A temporary file of a killed write.
        let out = dir.path().join("o.npz");
        let stale = sibling(&out, "tmp", dead);
        std::fs::write(&stale, "half").unwrap();
        write_bytes(&out, &Reads::new(), "--output", b"x").unwrap();
        assert!(!stale.exists());
        assert_eq!(temp_owner(".m.tmp-123"), Some(123));
        assert_eq!(temp_owner(".m.tmp-7-123"), Some(123));
        assert_eq!(temp_owner("m"), None);
        assert!(process_alive(std::process::id()));
    }

    #[test]
    fn swaps_directories_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, dest) = (dir.path().join("new"), dir.path().join("m"));
        for (content, exists) in [("one", false), ("two", true)] {
            std::fs::create_dir(&tmp).unwrap();
            std::fs::write(tmp.join("f"), content).unwrap();
            assert_eq!(dest.exists(), exists);
            swap_dir(&tmp, &dest).unwrap();
            assert_eq!(std::fs::read_to_string(dest.join("f")).unwrap(), content);
            assert!(!tmp.exists());
        }
    }
}
