//! Where a module may be written, so that replacing one never loses what the user owns.
//!
//! The rules (checked before any work, by [`check_outputs`] and [`check_out_dir`], and
//! again by the module writers just before they replace anything):
//! - a module directory is written only where nothing is, into an empty directory, or
//!   over an anyshape module that holds nothing but the files its manifest lists — at
//!   any depth: one unlisted file anywhere inside (a note in `tasks/t00/`) keeps it;
//! - never the current directory or a directory above it, never the home directory;
//! - never over, inside or around a file or directory the same command reads (the
//!   model, a target description: [`anyshape_files::Reads`]), nor a directory that
//!   holds another output of the same run (the records, the report); two outputs of one
//!   run never name the same file.
//!
//! The new module is written beside the old one (`.NAME.tmp-PID`) and swapped in whole
//! ([`anyshape_files::swap_dir`]), so the path holds the old module or the new one at
//! every moment; leftovers of a killed run are cleaned up by the next one.
use crate::{Result, TuneError};
use anyshape_abi::listed_files;
use anyshape_files::{normalized, Reads};
use std::collections::BTreeSet;
use std::path::Path;

fn refuse(message: String) -> TuneError {
    TuneError::Output(message)
}

/// Every entry under `dir` that is not a directory, as `/`-separated relative paths
/// (links and other special files included, never followed).
pub(crate) fn files_under(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((path, rel)) = stack.pop() {
        for e in std::fs::read_dir(&path)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let inner = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if e.file_type()?.is_dir() {
                stack.push((e.path(), inner));
            } else {
                out.push(inner);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Refuse a module directory at `dir` (named by `option`) unless the rules of this
/// module allow it: `reads` are what the command reads, `others` the run's other
/// outputs (records, report), which must not lie inside it.
pub fn check_out_dir(dir: &Path, option: &str, reads: &Reads, others: &[&Path]) -> Result<()> {
    let shown = dir.display();
    let target = normalized(dir);
    if let Ok(cwd) = std::env::current_dir() {
        if normalized(&cwd).starts_with(&target) {
            return Err(refuse(format!(
                "{option} {shown} is the current directory or one above it: a module is a directory of its own, e.g. {option} model.module"
            )));
        }
    }
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        if normalized(Path::new(&home)).starts_with(&target) {
            return Err(refuse(format!(
                "{option} {shown} is the home directory or one above it: a module is a directory of its own"
            )));
        }
    }
    reads
        .check(option, dir)
        .map_err(|e| refuse(e.to_string()))?;
    for k in others {
        if normalized(k).starts_with(&target) {
            return Err(refuse(format!(
                "{} lies inside {option} {shown}, which the module replaces: keep it elsewhere or choose another {option}",
                k.display()
            )));
        }
    }
    if target.exists() && !target.is_dir() {
        return Err(refuse(format!(
            "{option} {shown} is a file: a module is a directory; choose another path"
        )));
    }
    let Ok(found) = files_under(&target) else {
        return Ok(()); // absent: nothing to replace
    };
    if found.is_empty() {
        return Ok(()); // empty (at most empty directories): nothing is lost
    }
    let listed: BTreeSet<String> = listed_files(&target).map_err(|e| {
        refuse(format!(
            "{option} {shown} holds files anyshape did not write ({e}): not replacing it; choose another {option}"
        ))
    })?;
    let foreign: Vec<&String> = found.iter().filter(|n| !listed.contains(*n)).collect();
    if !foreign.is_empty() {
        let some: Vec<&str> = foreign.iter().take(5).map(|s| s.as_str()).collect();
        return Err(refuse(format!(
            "{option} {shown} is an anyshape module but also holds files its manifest does not list ({}{}): not replacing it; move them, or choose another {option}",
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

/// A tuning run's outputs checked together before any work: none is something the run
/// reads, the records, report and tuning database are distinct files, and the module
/// directory (if any) may be replaced and holds none of them.
pub fn check_outputs(
    records: &Path,
    report: Option<&Path>,
    database: Option<&Path>,
    out: Option<&Path>,
    reads: &Reads,
) -> Result<()> {
    let mut files = vec![("--records", records)];
    files.extend(database.map(|d| ("--db", d)));
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
    for (option, path) in &files {
        reads
            .check(option, path)
            .map_err(|e| refuse(e.to_string()))?;
    }
    if let Some(dir) = out {
        let others: Vec<&Path> = files.iter().map(|f| f.1).collect();
        check_out_dir(dir, "--out", reads, &others)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_compare_by_place() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("a")).unwrap();
        assert!(check_distinct(&[("x", &d.join("a/r")), ("y", &d.join("./a/r"))]).is_err());
        assert!(check_distinct(&[("x", &d.join("a/r")), ("y", &d.join("a/s"))]).is_ok());
    }

    #[test]
    fn files_are_listed_at_every_depth() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("tasks/t00")).unwrap();
        std::fs::write(d.join("a"), "").unwrap();
        std::fs::write(d.join("tasks/notes.txt"), "").unwrap();
        std::fs::write(d.join("tasks/t00/mynotes.txt"), "").unwrap();
        assert_eq!(
            files_under(d).unwrap(),
            ["a", "tasks/notes.txt", "tasks/t00/mynotes.txt"]
        );
    }
}
