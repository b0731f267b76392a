//! The module manifest: what a module computes, for which device, with which kernels
//! and dispatcher, and checksums of its files and of itself. The code generator's
//! types (targets, micro-kernels, padding strategies) appear here in their text or JSON
//! form, so that reading a manifest needs no code generator.
use crate::DispatchTree;
use anyshape_ir::{Bindings, ShapeVar};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Module format number; bump when the layout or the manifest changes meaning.
pub const FORMAT_VERSION: u32 = 2;
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
    /// Its latency on the instance, seconds; none where no candidate could be measured
    /// or predicted there (every one failed, e.g. timed out; or the module is untuned).
    pub latency_seconds: Option<f64>,
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
    /// The target it was tuned for, as the code generator describes it (JSON); its
    /// `name` names the machine in messages.
    pub target: serde_json::Value,
    /// Instruction-set extensions of the CPU it was compiled on (all may be used).
    pub cpu_features: Vec<String>,
    /// Padding strategy of every kernel (its command-line name).
    pub strategy: String,
    /// The micro-kernels the dispatcher chooses from, in their text form.
    pub micro_kernels: Vec<String>,
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
    /// Of `resumed_trials`, those taken from the tuning database (measured by an
    /// earlier run; `seconds` leaves them out).
    #[serde(default)]
    pub reused_trials: usize,
}

/// SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer that passes bytes on and keeps their SHA-256 and count: a file's
/// [`FileEntry`] as it is written, without reading it back.
pub struct HashingWriter<W: std::io::Write> {
    inner: W,
    hasher: Sha256,
    bytes: u64,
}

impl<W: std::io::Write> HashingWriter<W> {
    /// Hash what is written to `inner`.
    pub fn new(inner: W) -> HashingWriter<W> {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// The writer and the entry of what went through it.
    pub fn finish(self) -> (W, FileEntry) {
        let entry = FileEntry {
            sha256: hex(&self.hasher.finalize()),
            bytes: self.bytes,
        };
        (self.inner, entry)
    }
}

impl<W: std::io::Write> std::io::Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// SHA-256 of `value`'s JSON with its checksum field (reached by `field`) empty: how a
/// manifest seals itself.
pub(crate) fn sealed_digest<T: Serialize + Clone>(
    value: &T,
    field: impl FnOnce(&mut T) -> &mut String,
) -> String {
    let mut unsealed = value.clone();
    field(&mut unsealed).clear();
    sha256_hex(
        serde_json::to_string(&unsealed)
            .expect("manifests serialize")
            .as_bytes(),
    )
}

impl Manifest {
    /// The checksum of the content (with `checksum` itself empty).
    pub fn digest(&self) -> String {
        sealed_digest(self, |m| &mut m.checksum)
    }

    /// Set the checksum over the current content.
    pub fn seal(&mut self) {
        self.checksum = self.digest();
    }

    /// The name of the machine it was built for (from the target description).
    pub fn target_name(&self) -> &str {
        self.target["name"].as_str().unwrap_or("an unnamed target")
    }

    /// As pretty JSON, the form of `manifest.json`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("manifests serialize")
    }
}

#[cfg(test)]
mod tests {
    /// A float that serde_json's default parser reads one ulp off (found in a tuned
    /// GPT-2 module's dispatch tree) reads back exactly, so a manifest holding it keeps
    /// its checksum. `cargo test --workspace` links forust-ml, which turns the feature
    /// on anyway; `scripts/test.sh` also runs this crate's tests alone, where only
    /// this crate's own dependency can.
    #[test]
    fn floats_read_back_to_the_same_bits() {
        let text = "11.115486813999983";
        let parsed: f64 = serde_json::from_str(text).unwrap();
        assert_eq!(parsed.to_bits(), text.parse::<f64>().unwrap().to_bits());
        let value = serde_json::json!({ "threshold": parsed });
        let again: serde_json::Value = serde_json::from_str(&value.to_string()).unwrap();
        assert_eq!(
            super::sha256_hex(value.to_string().as_bytes()),
            super::sha256_hex(again.to_string().as_bytes())
        );
    }
}
