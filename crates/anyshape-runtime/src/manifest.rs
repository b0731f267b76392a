//! Reading a module's manifest and checking the module against it: format and version,
//! the manifest's own checksum, every file's checksum, the CPU's instruction sets.
use crate::{Result, RuntimeError};
use anyshape_abi::{sha256_hex, Manifest, FORMAT_VERSION, MANIFEST_FILE};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Read `dir/manifest.json` and check its format, checksum and version (not the files).
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
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

/// Write the manifest as `dir/manifest.json`.
pub fn write_manifest(m: &Manifest, dir: &Path) -> Result<()> {
    let path = dir.join(MANIFEST_FILE);
    std::fs::write(&path, m.to_json()).map_err(|source| RuntimeError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// The files of the module in `dir` by its manifest, `manifest.json` included,
/// whatever anyshape version wrote it (for a model module: `model.json`, `model.onnx`
/// and `tasks/`); an error if `dir` holds neither kind of manifest. (What a module writer may replace: see `anyshape-tune`.)
pub fn listed_files(dir: &Path) -> Result<BTreeSet<String>> {
    // A model module: its manifest, the source model and the task modules.
    if let Ok(text) = std::fs::read_to_string(dir.join(anyshape_abi::MODEL_FILE)) {
        if serde_json::from_str::<anyshape_abi::ModelManifest>(&text).is_ok() {
            return Ok([
                anyshape_abi::MODEL_FILE,
                anyshape_abi::MODEL_SOURCE,
                "tasks",
            ]
            .into_iter()
            .map(String::from)
            .collect());
        }
    }
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
    let listing: Listing = serde_json::from_str(&text).map_err(|e| RuntimeError::BadManifest {
        path: path.display().to_string(),
        reason: format!("not an anyshape manifest: {e}"),
    })?;
    let mut names: BTreeSet<String> = listing.files.into_keys().collect();
    names.insert(MANIFEST_FILE.to_string());
    Ok(names)
}

/// Check every file of the module in `dir` against its checksum in `m`.
pub fn check_files(m: &Manifest, dir: &Path) -> Result<()> {
    for (name, entry) in &m.files {
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
    if !m.files.contains_key(&m.library) {
        return Err(RuntimeError::BadManifest {
            path: dir.join(MANIFEST_FILE).display().to_string(),
            reason: format!("the library {} has no checksum", m.library),
        });
    }
    Ok(())
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
        Err(RuntimeError::CpuFeatures {
            missing: missing.join(", "),
            built_on: m.target_name().to_string(),
        })
    }
}
