//! The module manifest: what a module computes, for which CPU, with which kernels and
//! dispatcher, and checksums of its files and of itself.
use crate::{Result, RuntimeError};
use anyshape_codegen::{CpuTarget, DispatchTree, MicroKernel, PaddingStrategy};
use anyshape_ir::{Bindings, ShapeVar};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

/// Module format number; bump when the layout or the manifest changes meaning.
pub const FORMAT_VERSION: u32 = 1;
/// The manifest's file name inside a module directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The C header's file name inside a module directory.
pub const HEADER_FILE: &str = "module.h";

/// A file of the module and its checksum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// SHA-256 of the content, hex.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// A kernel specialized for one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecializedKernel {
    /// The instance.
    pub bindings: Bindings,
    /// Index of its micro-kernel.
    pub micro_kernel: usize,
    /// Its symbol.
    pub symbol: String,
}

/// An instance's vote: the micro-kernel it chose and what it was worth.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Vote {
    /// The instance.
    pub bindings: Bindings,
    /// Index of the chosen micro-kernel.
    pub micro_kernel: usize,
    /// Its latency on the instance, seconds.
    pub latency_seconds: f64,
    /// Measured (true) or predicted by the cost model (false).
    pub measured: bool,
}

/// Everything a module holds besides its files' content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Module format number ([`FORMAT_VERSION`]).
    pub format: u32,
    /// The anyshape version that wrote it.
    pub anyshape: String,
    /// The workload (the form `Workload::parse` reads).
    pub workload: String,
    /// The tuned domain of each shape var.
    pub shape_vars: Vec<ShapeVar>,
    /// The target it was tuned for.
    pub target: CpuTarget,
    /// Instruction-set extensions of the CPU it was compiled on (all may be used).
    pub cpu_features: Vec<String>,
    /// Padding strategy of every kernel.
    pub strategy: PaddingStrategy,
    /// The micro-kernels the dispatcher chooses from.
    pub micro_kernels: Vec<MicroKernel>,
    /// Symbol of the symbolic kernel of each micro-kernel (same order).
    pub symbolic: Vec<String>,
    /// Kernels specialized for single instances (tried before the tree).
    pub specialized: Vec<SpecializedKernel>,
    /// The decision tree over shape vars; leaves index `micro_kernels`.
    pub dispatch: DispatchTree,
    /// Every tuned instance's vote (what the tree was trained on).
    pub votes: Vec<Vote>,
    /// Fraction of votes the tree reproduces.
    pub tree_accuracy: f64,
    /// The shared library's file name (named by its hash, so a rebuilt module is never
    /// confused with one already loaded from the same path).
    pub library: String,
    /// Checksums of the module's files by name.
    pub files: BTreeMap<String, FileEntry>,
    /// How long tuning took (absent in modules written without tuning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<TuningInfo>,
    /// SHA-256 of this manifest with this field empty.
    pub checksum: String,
}

/// The tuning run behind a module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuningInfo {
    /// Tuning wall time (search and votes) summed over the records, resumed runs'
    /// included, seconds.
    pub seconds: f64,
    /// Trials in the records, votes included.
    pub trials: usize,
    /// Trials taken from earlier runs' records.
    pub resumed_trials: usize,
    /// Trials whose records carry no time (written by an older version): `seconds`
    /// leaves them out.
    #[serde(default)]
    pub untimed_trials: usize,
}

/// SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Manifest {
    fn digest(&self) -> String {
        let mut unsealed = self.clone();
        unsealed.checksum.clear();
        sha256_hex(
            serde_json::to_string(&unsealed)
                .expect("manifests serialize")
                .as_bytes(),
        )
    }

    /// Set the checksum over the current content.
    pub fn seal(&mut self) {
        self.checksum = self.digest();
    }

    /// Write as pretty JSON to `path`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("manifests serialize");
        std::fs::write(path, text).map_err(|source| RuntimeError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Read `dir/manifest.json` and check its format, checksum and version (not the files).
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|source| RuntimeError::NotAModule {
            path: dir.display().to_string(),
            source,
        })?;
        // The version fields first, so that another format is reported as such.
        #[derive(Deserialize)]
        struct Head {
            format: u32,
            anyshape: String,
        }
        let head: Head = serde_json::from_str(&text).map_err(|e| RuntimeError::BadManifest {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let running = env!("CARGO_PKG_VERSION");
        if head.format != FORMAT_VERSION || head.anyshape != running {
            return Err(RuntimeError::Version {
                built: head.anyshape,
                format: head.format,
                running: running.into(),
                expected: FORMAT_VERSION,
            });
        }
        let m: Manifest = serde_json::from_str(&text).map_err(|e| RuntimeError::BadManifest {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        if m.checksum != m.digest() {
            return Err(RuntimeError::Tampered { path: shown });
        }
        Ok(m)
    }

    /// The files of the module in `dir` by its manifest, `manifest.json` included,
    /// whatever anyshape version wrote it; an error if `dir/manifest.json` is not an
    /// anyshape manifest. (What a module writer may replace: see `anyshape-tune`.)
    pub fn listed_files(dir: &Path) -> Result<std::collections::BTreeSet<String>> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| RuntimeError::NotAModule {
            path: dir.display().to_string(),
            source,
        })?;
        /// The part of the format every version keeps.
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Listing {
            format: u32,
            anyshape: String,
            files: BTreeMap<String, serde_json::Value>,
            checksum: String,
        }
        let listing: Listing =
            serde_json::from_str(&text).map_err(|e| RuntimeError::BadManifest {
                path: path.display().to_string(),
                reason: format!("not an anyshape manifest: {e}"),
            })?;
        let mut names: std::collections::BTreeSet<String> = listing.files.into_keys().collect();
        names.insert(MANIFEST_FILE.to_string());
        Ok(names)
    }

    /// Check every file against its checksum.
    pub fn check_files(&self, dir: &Path) -> Result<()> {
        for (name, entry) in &self.files {
            let path = dir.join(name);
            let bytes = std::fs::read(&path).map_err(|source| RuntimeError::Io {
                path: path.display().to_string(),
                source,
            })?;
            let corrupt = |reason: String| RuntimeError::CorruptFile {
                path: path.display().to_string(),
                reason,
            };
            if bytes.len() as u64 != entry.bytes {
                return Err(corrupt(format!(
                    "{} bytes, the manifest says {}",
                    bytes.len(),
                    entry.bytes
                )));
            }
            if sha256_hex(&bytes) != entry.sha256 {
                return Err(corrupt("SHA-256 differs from the manifest's".into()));
            }
        }
        if !self.files.contains_key(&self.library) {
            return Err(RuntimeError::BadManifest {
                path: dir.join(MANIFEST_FILE).display().to_string(),
                reason: format!("the library {} has no checksum", self.library),
            });
        }
        Ok(())
    }

    /// Fail unless this CPU has every instruction-set extension the module may use.
    pub fn check_cpu(&self, host: &[String]) -> Result<()> {
        let missing: Vec<&str> = self
            .cpu_features
            .iter()
            .filter(|f| !host.contains(f))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(RuntimeError::CpuFeatures {
                missing: missing.join(", "),
                built_on: self.target.name.clone(),
            })
        }
    }
}
