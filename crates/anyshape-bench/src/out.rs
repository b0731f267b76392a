//! Where a benchmark writes its reports: one directory, every file written atomically
//! beside its path (`anyshape-files`), never over or inside what the benchmark reads
//! (the module it measures), which the directory may hold; and the heading its Markdown
//! reports open with.
use crate::error::{io, Result};
use anyshape_files::Reads;
use std::path::{Path, PathBuf};

/// A report directory.
pub struct OutDir<'a> {
    dir: &'a Path,
    reads: Reads,
}

impl<'a> OutDir<'a> {
    /// The directory `dir` (`--out-dir`), made if absent; refused where it is or lies
    /// inside what the benchmark `reads` (it may hold it: the module beside its reports).
    pub fn new(dir: &'a Path, reads: Reads) -> Result<OutDir<'a>> {
        reads.check_into("--out-dir", dir)?;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        Ok(OutDir { dir, reads })
    }

    /// Write the file `name` in it; returns its path.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        let path = self.dir.join(name);
        anyshape_files::write_bytes(&path, &self.reads, "--out-dir", bytes)?;
        Ok(path)
    }
}

/// The heading of a Markdown report: its title, then the command line that made it.
pub(crate) fn heading(title: impl std::fmt::Display) -> String {
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    format!("# {title}\n\nCommand: `{command}`\n\n")
}
