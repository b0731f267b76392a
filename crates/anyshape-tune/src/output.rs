//! Where outputs may go, and replacing a module directory without ever losing what the
//! user owns.
//!
//! The rules (checked before any work, by [`check_outputs`], and again by the module
//! writer just before it replaces anything):
//! - a module directory is written only where nothing is, into an empty directory, or
//!   over an anyshape module: a directory whose `manifest.json` is an anyshape manifest
//!   and which holds nothing but the files that manifest lists;
//! - never the current directory or a directory above it, never the home directory;
//! - never a directory that holds an input or another output of the same run (the
//!   records, the report); and two outputs of one run never name the same file.
//!
//! The new module is written beside the old one (`.NAME.tmp-PID`) and swapped in with
//! one atomic `renameat2(RENAME_EXCHANGE)` on Linux (elsewhere, or where the file
//! system lacks it: the old one is renamed aside to `.NAME.old-PID` first), so the path
//! holds the old module or the new one, complete, at every moment. Leftovers of a
//! killed run are cleaned up by the next one.
use crate::{Result, TuneError};
use anyshape_measure::cache::{process_alive, temp_owner};
use anyshape_runtime::listed_files;
use std::path::{Component, Path, PathBuf};

fn refuse(message: String) -> TuneError {
    TuneError::Output(message)
}

/// `path` made absolute, with `.` and `..` resolved and its existing prefix's symbolic
/// links followed, so that two spellings of one place compare equal.
pub fn normalized(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    // Follow links in the longest existing prefix; keep the rest as written.
    let mut existing = out.clone();
    let mut rest = Vec::new();
    while !existing.exists() {
        match existing.file_name() {
            Some(name) => {
                rest.push(name.to_os_string());
                existing.pop();
            }
            None => break,
        }
    }
    let mut resolved = existing.canonicalize().unwrap_or(existing);
    for name in rest.into_iter().rev() {
        resolved.push(name);
    }
    resolved
}

/// Refuse a module directory at `dir` unless the rules of this module allow it; `keep`
/// are the run's other files (records, report), which must not lie inside it.
pub fn check_out_dir(dir: &Path, keep: &[&Path]) -> Result<()> {
    let shown = dir.display();
    let target = normalized(dir);
    if let Ok(cwd) = std::env::current_dir() {
        if normalized(&cwd).starts_with(&target) {
            return Err(refuse(format!(
                "--out {shown} is the current directory or one above it: a module is a directory of its own, e.g. --out model.module"
            )));
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        if normalized(Path::new(&home)).starts_with(&target) {
            return Err(refuse(format!(
                "--out {shown} is the home directory or one above it: a module is a directory of its own"
            )));
        }
    }
    for k in keep {
        if normalized(k).starts_with(&target) {
            return Err(refuse(format!(
                "{} lies inside --out {shown}, which the module replaces: keep it elsewhere or choose another --out",
                k.display()
            )));
        }
    }
    if target.exists() && !target.is_dir() {
        return Err(refuse(format!(
            "--out {shown} is a file: a module is a directory; choose another path"
        )));
    }
    let Ok(entries) = std::fs::read_dir(&target) else {
        return Ok(()); // absent: nothing to replace
    };
    let names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let listed = listed_files(&target).map_err(|e| {
        refuse(format!(
            "--out {shown} holds files anyshape did not write ({e}): not replacing it; choose another --out"
        ))
    })?;
    let foreign: Vec<&String> = names.iter().filter(|n| !listed.contains(*n)).collect();
    if !foreign.is_empty() {
        let some: Vec<&str> = foreign.iter().take(5).map(|s| s.as_str()).collect();
        return Err(refuse(format!(
            "--out {shown} is an anyshape module but also holds files it does not list ({}{}): not replacing it; move them, or choose another --out",
            some.join(", "),
            if foreign.len() > 5 { ", ..." } else { "" }
        )));
    }
    Ok(())
}

/// Refuse outputs of one run that name the same file: `(option, path)` pairs.
pub fn check_distinct(outputs: &[(&str, &Path)]) -> Result<()> {
    for (i, (a, pa)) in outputs.iter().enumerate() {
        for (b, pb) in &outputs[..i] {
            if normalized(pa) == normalized(pb) {
                return Err(refuse(format!(
                    "{b} and {a} name the same file ({}): one would overwrite the other",
                    pa.display()
                )));
            }
        }
    }
    Ok(())
}

/// The run's outputs checked together before any work: the module directory (if any)
/// against the records and report, and the report against the records.
pub fn check_outputs(records: &Path, report: Option<&Path>, out: Option<&Path>) -> Result<()> {
    let mut files = vec![("--records", records)];
    if let Some(r) = report {
        if r.is_dir() {
            return Err(refuse(format!(
                "--report {} is a directory: name a file, e.g. report.json",
                r.display()
            )));
        }
        files.push(("--report", r));
    }
    check_distinct(&files)?;
    if let Some(dir) = out {
        let keep: Vec<&Path> = files.iter().map(|f| f.1).collect();
        check_out_dir(dir, &keep)?;
    }
    Ok(())
}

/// The names of a directory's temporary siblings: `.NAME.tmp-PID`, `.NAME.old-PID`.
fn sibling(dir: &Path, kind: &str, pid: u32) -> PathBuf {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("module");
    dir.with_file_name(format!(".{name}.{kind}-{pid}"))
}

/// Clean up what killed runs left beside `dir`: their half-written modules are removed;
/// an old module renamed aside is put back if nothing took its place.
pub fn clean_leftovers(dir: &Path) {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
    else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(entries) = std::fs::read_dir(parent) else {
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
        if rest.starts_with("old-") && !dir.exists() {
            if std::fs::rename(e.path(), dir).is_ok() {
                tracing::warn!("{} was left aside by a killed run: put back", dir.display());
            }
        } else if rest.starts_with("tmp-") || rest.starts_with("old-") {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A fresh temporary directory beside `dir` for a new module.
pub fn temp_dir_for(dir: &Path) -> PathBuf {
    sibling(dir, "tmp", std::process::id())
}

/// Put the complete module in `tmp` at `dir`, atomically: `dir` holds the old module or
/// the new one at every moment; the old one is removed afterwards.
pub fn swap_into_place(tmp: &Path, dir: &Path) -> std::io::Result<()> {
    if std::fs::rename(tmp, dir).is_ok() {
        return Ok(()); // nothing was there (or an empty directory)
    }
    if exchange(tmp, dir).is_ok() {
        // `tmp` now holds the old module.
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
    fn paths_compare_by_place() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("a")).unwrap();
        assert_eq!(
            normalized(&d.join("a/../b/./c")),
            normalized(&d.join("b/c"))
        );
        assert!(check_distinct(&[("x", &d.join("a/r")), ("y", &d.join("./a/r"))]).is_err());
        assert!(check_distinct(&[("x", &d.join("a/r")), ("y", &d.join("a/s"))]).is_ok());
    }

    /// What a run killed between the steps of a swap leaves is put right by the next:
    /// a half-written new module removed; an old module renamed aside (where the file
    /// system lacks the atomic exchange) put back if nothing took its place.
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
        // With a module in place the old copy is stale: removed.
        let old = leftover("old");
        clean_leftovers(&m);
        assert!(!old.exists());
        assert_eq!(std::fs::read_to_string(m.join("f")).unwrap(), "old");
        // A live process's temporaries are left alone.
        let mine = sibling(&m, "tmp", std::process::id());
        std::fs::create_dir(&mine).unwrap();
        clean_leftovers(&m);
        assert!(mine.exists());
    }

    #[test]
    fn swaps_directories_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (tmp, dest) = (dir.path().join("new"), dir.path().join("m"));
        for (content, exists) in [("one", false), ("two", true)] {
            std::fs::create_dir(&tmp).unwrap();
            std::fs::write(tmp.join("f"), content).unwrap();
            assert_eq!(dest.exists(), exists);
            swap_into_place(&tmp, &dest).unwrap();
            assert_eq!(std::fs::read_to_string(dest.join("f")).unwrap(), content);
            assert!(!tmp.exists());
        }
    }
}
