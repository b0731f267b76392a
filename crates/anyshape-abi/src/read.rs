//! Reading and writing modules' manifests and checking a module against its manifest:
//! which kind of module a directory is, format and version, the manifest's own
//! checksum, every file's size and checksum (regular files only, read within limits),
//! the CPU's instruction sets; and which files a module owns, whatever anyshape version
//! wrote it. Below both the module writers (`anyshape-tune`) and the runtime.
use crate::MODEL_PLAN;
use crate::{
    sha256_hex, FileEntry, Manifest, ModelManifest, ModuleError, FORMAT_VERSION, MANIFEST_FILE,
    MODEL_FILE,
};
use anyshape_files::MIB;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path};

type Result<T, E = ModuleError> = std::result::Result<T, E>;

/// The largest manifest anyshape reads.
pub const MANIFEST_LIMIT: u64 = 64 * MIB;
/// The largest file of a module anyshape reads (a model module's plan holds its
/// weights).
pub const MODULE_FILE_LIMIT: u64 = 64 << 30;

/// What a directory holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleKind {
    /// An operator module (`anyshape tune --out`): `manifest.json`, kernels, header.
    Operator,
    /// A model module (`anyshape compile`): `model.json`, the model, task modules.
    Model,
}

impl ModuleKind {
    /// Which kind of module `dir` is, or why it is none: a directory that holds
    /// neither manifest, or a model module whose `model.json` is gone.
    pub fn of(dir: &Path) -> Result<ModuleKind> {
        let shown = dir.display().to_string();
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ModuleError::NotAModule {
                    path: shown,
                    why: "it is a file; a module is a directory (from `anyshape tune --out` or `anyshape compile --out`)".into(),
                })
            }
            Err(e) => {
                return Err(ModuleError::NotAModule {
                    path: shown,
                    why: e.to_string(),
                })
            }
        }
        if dir.join(MODEL_FILE).exists() {
            return Ok(ModuleKind::Model);
        }
        if dir.join(MANIFEST_FILE).exists() {
            return Ok(ModuleKind::Operator);
        }
        if dir.join(MODEL_PLAN).exists() || dir.join("tasks").exists() {
            return Err(ModuleError::Missing {
                path: shown,
                file: MODEL_FILE.into(),
            });
        }
        Err(ModuleError::NotAModule {
            path: shown,
            why: format!(
                "it holds neither {MODEL_FILE} (a model module, from `anyshape compile`) nor {MANIFEST_FILE} (an operator module, from `anyshape tune --out`)"
            ),
        })
    }
}

/// A module's file, read as a regular file within [`MODULE_FILE_LIMIT`] (a missing
/// one is reported as the module being incomplete).
pub fn read_file(dir: &Path, name: &str, limit: u64) -> Result<Vec<u8>> {
    let path = dir.join(name);
    anyshape_files::read(&path, limit, &format!("a module's {name}")).map_err(|e| match e {
        e if e.is_missing() => ModuleError::Missing {
            path: dir.display().to_string(),
            file: name.to_string(),
        },
        e => ModuleError::File(e),
    })
}

/// A manifest's text.
fn read_manifest_text(dir: &Path, name: &str) -> Result<String> {
    let bytes = read_file(dir, name, MANIFEST_LIMIT)?;
    String::from_utf8(bytes).map_err(|_| ModuleError::BadManifest {
        path: dir.join(name).display().to_string(),
        reason: "not UTF-8 text".into(),
    })
}

/// A sealed manifest of either kind, as its reader needs it.
trait Sealed: serde::de::DeserializeOwned {
    /// Its kind, file name and format number.
    const KIND: ModuleKind;
    const FILE: &'static str;
    const FORMAT: u32;
    /// Its checksum field and the digest of its content.
    fn sealed(&self) -> (&str, String);
}

impl Sealed for Manifest {
    const KIND: ModuleKind = ModuleKind::Operator;
    const FILE: &'static str = MANIFEST_FILE;
    const FORMAT: u32 = FORMAT_VERSION;
    fn sealed(&self) -> (&str, String) {
        (&self.checksum, self.digest())
    }
}

impl Sealed for ModelManifest {
    const KIND: ModuleKind = ModuleKind::Model;
    const FILE: &'static str = MODEL_FILE;
    const FORMAT: u32 = crate::MODEL_FORMAT;
    fn sealed(&self) -> (&str, String) {
        (&self.checksum, self.digest())
    }
}

/// Read the manifest of kind `M` in `dir` and check its kind, format and version (the
/// fields every format keeps, read first so that another format is reported as such)
/// and its checksum.
fn read_sealed<M: Sealed>(dir: &Path) -> Result<M> {
    /// The version fields every format keeps.
    #[derive(Deserialize)]
    struct Head {
        format: u32,
        anyshape: String,
    }
    expect_kind(dir, M::KIND)?;
    let shown = dir.join(M::FILE).display().to_string();
    let text = read_manifest_text(dir, M::FILE)?;
    let bad = |e: serde_json::Error| ModuleError::BadManifest {
        path: shown.clone(),
        reason: e.to_string(),
    };
    let head: Head = serde_json::from_str(&text).map_err(bad)?;
    let running = env!("CARGO_PKG_VERSION");
    if head.format != M::FORMAT || head.anyshape != running {
        return Err(ModuleError::Version {
            built: head.anyshape,
            format: head.format,
            running: running.into(),
            expected: M::FORMAT,
        });
    }
    let m: M = serde_json::from_str(&text).map_err(bad)?;
    let (checksum, digest) = m.sealed();
    if checksum != digest {
        return Err(ModuleError::Tampered { path: shown });
    }
    Ok(m)
}

/// Refuse `dir` unless it is a module of `kind` (saying what it is instead).
fn expect_kind(dir: &Path, kind: ModuleKind) -> Result<()> {
    let found = ModuleKind::of(dir)?;
    if found == kind {
        return Ok(());
    }
    Err(ModuleError::NotAModule {
        path: dir.display().to_string(),
        why: match found {
            ModuleKind::Model => {
                "it is a model module (from `anyshape compile`), not an operator module".into()
            }
            ModuleKind::Operator => {
                "it is an operator module (from `anyshape tune --out`), not a model module".into()
            }
        },
    })
}

/// Read `dir/manifest.json` and check its format, checksum and version (not the files).
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    read_sealed(dir)
}

/// Read `dir/model.json` and check its format, checksum, version and file names (not
/// the files).
pub fn read_model_manifest(dir: &Path) -> Result<ModelManifest> {
    let m: ModelManifest = read_sealed(dir)?;
    for name in m.files.keys().chain(m.tasks.iter().map(|t| &t.module)) {
        if !inside(name) {
            return Err(ModuleError::BadManifest {
                path: dir.join(MODEL_FILE).display().to_string(),
                reason: format!("`{name}` lies outside the module"),
            });
        }
    }
    Ok(m)
}

/// Whether a manifest's relative path stays inside its module (plain names only).
fn inside(name: &str) -> bool {
    !name.is_empty()
        && Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

/// Write the manifest as `dir/manifest.json` (into a module being built beside its
/// destination, see `anyshape-tune`'s `output.rs`).
pub fn write_manifest(m: &Manifest, dir: &Path) -> Result<()> {
    let path = dir.join(MANIFEST_FILE);
    std::fs::write(&path, m.to_json()).map_err(|source| ModuleError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Check the file `name` of the module in `dir` against its entry: size, then checksum.
/// Returns its bytes.
pub fn check_file(dir: &Path, name: &str, entry: &FileEntry) -> Result<Vec<u8>> {
    let path = dir.join(name);
    let corrupt = |reason: String| ModuleError::CorruptFile {
        path: path.display().to_string(),
        reason,
    };
    // The size first, from the metadata: a truncated file is reported without reading.
    let len = anyshape_files::regular_file_len(&path).map_err(|e| match e {
        e if e.is_missing() => ModuleError::Missing {
            path: dir.display().to_string(),
            file: name.to_string(),
        },
        e => ModuleError::File(e),
    })?;
    if len != entry.bytes {
        return Err(corrupt(format!(
            "{len} bytes, the manifest says {}",
            entry.bytes
        )));
    }
    let bytes = read_file(dir, name, entry.bytes.min(MODULE_FILE_LIMIT))?;
    if sha256_hex(&bytes) != entry.sha256 {
        return Err(corrupt("SHA-256 differs from the manifest's".into()));
    }
    Ok(bytes)
}

/// Check every file of the module in `dir` against its checksum in `m`.
pub fn check_files(m: &Manifest, dir: &Path) -> Result<()> {
    for (name, entry) in &m.files {
        check_file(dir, name, entry)?;
    }
    if !m.files.contains_key(&m.library) {
        return Err(ModuleError::BadManifest {
            path: dir.join(MANIFEST_FILE).display().to_string(),
            reason: format!("the library {} has no checksum", m.library),
        });
    }
    Ok(())
}

/// The files of the module in `dir` by its manifest, paths relative to `dir`
/// (`/`-separated), its manifest included, whatever anyshape version wrote it; an
/// error if `dir` holds no manifest anyshape wrote. A module holds these and nothing
/// else. (What a module writer may replace: see `anyshape-tune`.)
pub fn listed_files(dir: &Path) -> Result<BTreeSet<String>> {
    /// The part of every format that lists files.
    #[derive(Deserialize)]
    struct Listing {
        #[allow(dead_code)]
        format: u32,
        #[allow(dead_code)]
        anyshape: String,
        #[serde(default)]
        files: Option<BTreeMap<String, serde_json::Value>>,
        #[serde(default)]
        tasks: Option<Vec<serde_json::Value>>,
        #[allow(dead_code)]
        #[serde(default)]
        checksum: Option<String>,
    }
    let (name, model) = match ModuleKind::of(dir)? {
        ModuleKind::Model => (MODEL_FILE, true),
        ModuleKind::Operator => (MANIFEST_FILE, false),
    };
    let path = dir.join(name);
    let text = read_manifest_text(dir, name)?;
    let listing: Listing = serde_json::from_str(&text).map_err(|e| ModuleError::BadManifest {
        path: path.display().to_string(),
        reason: format!("not an anyshape manifest: {e}"),
    })?;
    let mut names: BTreeSet<String> = BTreeSet::from([name.to_string()]);
    match (listing.files, model) {
        (Some(files), _) => names.extend(files.into_keys()),
        (None, false) => {
            return Err(ModuleError::BadManifest {
                path: path.display().to_string(),
                reason: "not an anyshape manifest: it lists no files".into(),
            })
        }
        // A model module of format 2 listed no files: its source, its tuning log and
        // its task modules, each listing its own.
        (None, true) => {
            names.extend(["model.onnx".to_string(), "tuning.json".to_string()]);
            for t in listing.tasks.unwrap_or_default() {
                let Some(module) = t.get("module").and_then(|m| m.as_str()) else {
                    continue;
                };
                if !inside(module) {
                    continue;
                }
                if let Ok(inner) = listed_files(&dir.join(module)) {
                    names.extend(inner.into_iter().map(|f| format!("{module}/{f}")));
                }
            }
        }
    }
    Ok(names)
}

/// Fail unless this CPU (`host`) has every instruction-set extension the module may use.
pub fn check_cpu(m: &Manifest, host: &[String]) -> Result<()> {
    let missing: Vec<&str> = m
        .cpu_features
        .iter()
        .filter(|f| !host.contains(f))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ModuleError::CpuFeatures {
            missing: missing.join(", "),
            built_on: m.target_name().to_string(),
        })
    }
}
