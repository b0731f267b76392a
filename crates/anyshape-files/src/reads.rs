//! What one command reads, known by device and inode, so that none of its outputs can
//! replace or land inside one of its inputs, however the paths are spelled.
use crate::{FileError, Result};
use std::path::{Component, Path, PathBuf};

/// A file's identity: its device and inode (links and spellings of one file compare
/// equal; on systems without inodes, its canonical path).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    #[cfg(unix)]
    dev: u64,
    #[cfg(unix)]
    ino: u64,
    #[cfg(not(unix))]
    path: PathBuf,
}

impl FileId {
    /// The identity of what `path` names (links followed), if it exists.
    pub fn of(path: &Path) -> Option<FileId> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(path).ok()?;
            Some(FileId {
                dev: m.dev(),
                ino: m.ino(),
            })
        }
        #[cfg(not(unix))]
        {
            Some(FileId {
                path: path.canonicalize().ok()?,
            })
        }
    }
}

/// `path` made absolute, with `.` and `..` resolved and its existing prefix's symbolic
/// links followed, so that two spellings of one place compare equal (also for paths
/// that do not exist yet).
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

/// One input of a command.
#[derive(Clone, Debug)]
struct Input {
    /// As the user gave it.
    path: PathBuf,
    id: FileId,
    /// A directory read whole (a module): nothing may be written inside it either.
    dir: bool,
}

/// The files and directories a command reads. An output is checked against them
/// ([`Reads::check`]) before any work, and again by [`crate::write_atomic`] just before
/// it replaces anything.
#[derive(Clone, Debug, Default)]
pub struct Reads {
    inputs: Vec<Input>,
}

/// The identities of `path` and every directory above it that exists.
fn ancestry(path: &Path) -> Vec<(PathBuf, FileId)> {
    normalized(path)
        .ancestors()
        .filter_map(|p| FileId::of(p).map(|id| (p.to_path_buf(), id)))
        .collect()
}

impl Reads {
    /// No inputs.
    pub fn new() -> Reads {
        Reads::default()
    }

    /// The command reads the file `path` (ignored if it does not exist: reading it
    /// will fail on its own).
    pub fn file(&mut self, path: &Path) -> &mut Reads {
        if let Some(id) = FileId::of(path) {
            self.inputs.push(Input {
                path: path.to_path_buf(),
                id,
                dir: false,
            });
        }
        self
    }

    /// The command reads the directory `path` whole (a module): an output may not be
    /// it, lie inside it, or hold it.
    pub fn dir(&mut self, path: &Path) -> &mut Reads {
        if let Some(id) = FileId::of(path) {
            self.inputs.push(Input {
                path: path.to_path_buf(),
                id,
                dir: true,
            });
        }
        self
    }

    /// Refuse the output `out` (named by `option`, e.g. `--output`) if writing or
    /// replacing it would replace, land inside, or remove something this command reads.
    pub fn check(&self, option: &str, out: &Path) -> Result<()> {
        self.check_as(option, out, true)
    }

    /// Refuse the directory `dir` that outputs will be written into, file by file (a
    /// report directory, `--out-dir`), if it is or lies inside something this command
    /// reads. It may hold inputs: nothing replaces it whole, and each file written into
    /// it is checked on its own ([`Reads::check`]).
    pub fn check_into(&self, option: &str, dir: &Path) -> Result<()> {
        self.check_as(option, dir, false)
    }

    fn check_as(&self, option: &str, out: &Path, whole: bool) -> Result<()> {
        let refuse = |why: String| {
            Err(FileError::ReadByCommand {
                option: option.to_string(),
                path: out.to_path_buf(),
                why,
            })
        };
        let out_id = FileId::of(out);
        // The directories above `out` (its own identity apart, where it exists).
        let above: Vec<(PathBuf, FileId)> = match normalized(out).parent() {
            Some(parent) => ancestry(parent),
            None => Vec::new(),
        };
        for input in &self.inputs {
            let shown = input.path.display();
            if out_id.as_ref() == Some(&input.id) {
                return refuse(format!(
                    "{} is {}, which this command reads",
                    normalized(out).display(),
                    if input.dir {
                        format!("the directory {shown}")
                    } else {
                        format!("the file {shown}")
                    }
                ));
            }
            if input.dir && above.iter().any(|(_, id)| *id == input.id) {
                return refuse(format!("it lies inside {shown}, which this command reads"));
            }
            // Replacing a directory that holds an input would remove the input.
            if let Some(out_id) = out_id.as_ref().filter(|_| whole) {
                if std::fs::metadata(out).is_ok_and(|m| m.is_dir())
                    && ancestry(&input.path)
                        .iter()
                        .skip(1)
                        .any(|(_, id)| id == out_id)
                {
                    return refuse(format!("it holds {shown}, which this command reads"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_never_replace_or_enter_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("m")).unwrap();
        std::fs::write(d.join("m/model.onnx"), "x").unwrap();
        std::fs::write(d.join("case.npz"), "x").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(d.join("case.npz"), d.join("link.npz")).unwrap();
        let mut reads = Reads::new();
        reads.file(&d.join("case.npz")).dir(&d.join("m"));
        // The same file by another spelling, or through a link.
        for out in [d.join("case.npz"), d.join("m/../case.npz")] {
            let e = reads.check("--output", &out).unwrap_err().to_string();
            assert!(e.contains("which this command reads"), "{e}");
        }
        #[cfg(unix)]
        assert!(reads.check("--output", &d.join("link.npz")).is_err());
        // Inside the directory it reads, existing or not.
        for out in [d.join("m/model.onnx"), d.join("m/new.npz")] {
            let e = reads.check("--output", &out).unwrap_err().to_string();
            assert!(e.contains("lies inside") || e.contains("reads"), "{e}");
        }
        // A directory that holds an input, replaced whole; written into, it may hold
        // one (each file is checked on its own), but never be or lie inside one.
        let e = reads.check("--out", d).unwrap_err().to_string();
        assert!(e.contains("holds"), "{e}");
        reads.check_into("--out-dir", d).unwrap();
        assert!(reads.check_into("--out-dir", &d.join("m")).is_err());
        assert!(reads.check_into("--out-dir", &d.join("m/reports")).is_err());
        // Elsewhere is fine.
        reads.check("--output", &d.join("out.npz")).unwrap();
        reads.check("--output", &d.join("new/out.npz")).unwrap();
        // A path that is not there is no input.
        let mut none = Reads::new();
        none.file(&d.join("absent"));
        none.check("--output", &d.join("absent")).unwrap();
    }

    #[test]
    fn paths_compare_by_place() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("a")).unwrap();
        assert_eq!(
            normalized(&d.join("a/../b/./c")),
            normalized(&d.join("b/c"))
        );
    }
}
