//! The builder: compiles a batch of kernels for a device — C into one shared library
//! with the system C compiler (one translation unit per kernel, compiled in parallel
//! and cached as an object file, so a kernel is compiled once whatever batches it is
//! linked into), CUDA into one PTX file with NVRTC (`nvrtc.rs`) — caching the result
//! by the hash of everything that goes into it.
//!
//! A kernel the compiler rejects is the code generator's fault and fails alone
//! ([`BuiltLibrary::failed`], cached with the library). A compile the environment stops
//! (the compiler killed by a signal, out of memory, no disk space) is nobody's fault in
//! the candidate: it is reported apart ([`BuiltLibrary::unavailable`]) and such a
//! partial library is never cached, so the kernel is built again next time.
use crate::cache;
use crate::Kernels;
use crate::{MeasureError, Result};
use anyshape_codegen::{DeviceKind, Program, Sketch, Target};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The C compilers this process runs at once: at most a builder's `jobs`, however many
/// pools ask (the untuned compile builds its tasks' modules `jobs` at a time, each
/// compiling its kernels `jobs` at a time: without this, `jobs²` compilers).
static COMPILERS: crate::threads::Slots = crate::threads::Slots::new();

/// One kernel to build: its exported symbol and its C function.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct KernelSource {
    /// The exported symbol.
    pub symbol: String,
    /// The C function (without the shared prelude).
    pub code: String,
}

/// A built library and the kernels that failed to compile (left out of it).
#[derive(Clone, Debug)]
pub struct BuiltLibrary {
    /// The shared library (CPU) or PTX file (CUDA).
    pub path: PathBuf,
    /// The device it is for.
    pub device: DeviceKind,
    /// Symbol -> compiler messages, for kernels the compiler rejected.
    pub failed: BTreeMap<String, String>,
    /// Symbol -> what happened, for kernels the environment kept from compiling (the
    /// compiler killed, out of memory, no disk space): worth building again.
    pub unavailable: BTreeMap<String, String>,
    /// Whether it came from the cache.
    pub cached: bool,
}

impl BuiltLibrary {
    /// Where a worker finds its kernels.
    pub fn kernels(&self) -> Kernels {
        match self.device {
            DeviceKind::Cpu => Kernels::Library(self.path.clone()),
            DeviceKind::Cuda => Kernels::Ptx(self.path.clone()),
        }
    }

    /// Fail unless every kernel was built: an environment error for a kernel the
    /// environment kept from compiling, a compile error (a code generation bug) for one
    /// the compiler rejected.
    pub fn require_all(&self) -> Result<()> {
        if let Some((symbol, why)) = self.unavailable.iter().next() {
            return Err(MeasureError::Environment(format!(
                "compiling {symbol}: {why}"
            )));
        }
        if let Some((symbol, stderr)) = self.failed.iter().next() {
            return Err(MeasureError::Compile {
                what: symbol.clone(),
                stderr: stderr.clone(),
            });
        }
        Ok(())
    }
}

/// Why a compile failed, if the environment rather than the source is to blame: the
/// compiler killed by a signal, or its messages telling of memory or disk exhaustion.
fn environment_failure(status: std::process::ExitStatus, stderr: &str) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if status.signal().is_some() {
            return Some(format!(
                "the compiler was killed ({}); out of memory?",
                crate::runner::describe_exit(status)
            ));
        }
    }
    const SIGNS: [&str; 6] = [
        "out of memory",
        "Cannot allocate memory",
        "virtual memory exhausted",
        "No space left on device",
        "Killed signal terminated program",
        "Disk quota exceeded",
    ];
    let _ = status;
    SIGNS
        .iter()
        .find(|s| stderr.contains(*s))
        .map(|_| first_line(stderr).to_string())
}

/// A cache entry's name: the first 12 bytes of a digest, in hex.
fn short_hash(h: Sha256) -> String {
    h.finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The first line of a compiler's messages (all of them if there is none).
fn first_line(text: &str) -> &str {
    text.lines().find(|l| !l.trim().is_empty()).unwrap_or(text)
}

/// The outcome of one compiler process.
enum Compiled {
    Ok,
    /// The compiler rejected the source: its messages.
    Rejected(String),
    /// The environment stopped it: why.
    Unavailable(String),
}

/// The sources of `programs` for `target`, each symbol once, and the programs their
/// sketch could not lower (symbol → why).
pub fn render_programs<K: Sketch>(
    target: &K::Target,
    programs: &[Program<K>],
) -> (Vec<KernelSource>, BTreeMap<String, String>) {
    let mut sources = Vec::new();
    let mut unlowered = BTreeMap::new();
    for p in programs {
        let symbol = p.symbol(target);
        if sources.iter().any(|s: &KernelSource| s.symbol == symbol) {
            continue;
        }
        match p.source(target) {
            Ok(code) => sources.push(KernelSource { symbol, code }),
            Err(e) => {
                unlowered.insert(symbol, e.to_string());
            }
        }
    }
    (sources, unlowered)
}

/// Compiles kernels with the system C compiler.
#[derive(Clone, Debug)]
pub struct Builder {
    /// Where libraries are kept, named by content hash.
    pub cache_dir: PathBuf,
    /// The C compiler (`$CC`, else `cc`).
    pub cc: String,
    /// Compiler flags.
    pub flags: Vec<String>,
    /// Extra flags for the link step, after the objects (e.g. `-lopenblas`).
    pub link_flags: Vec<String>,
    /// Parallel compiler processes.
    pub jobs: usize,
}

impl Builder {
    /// A builder caching in `cache_dir` (made absolute, so libraries are never looked up
    /// on the system's library path), with `-O3 -march=native -fopenmp`, and
    /// `-fno-trapping-math`: no kernel reads the floating-point exception flags, and
    /// without it GCC keeps the clamps of `as_erf`/`as_tanh` as branches, so the
    /// epilogue loops over GELU and tanh stay scalar (measured: 4.4 ns per GELU).
    /// `-fno-unswitch-loops -fno-peel-loops`: the edge-tile branches stay branches
    /// instead of copies of the loops around them, which cut a kernel over weights in
    /// panels from 1.22 to 0.89 s of GCC 12 with no change on `scripts/hot-path.sh`
    /// (0.998-1.011x); `-O2` builds in half the time but runs batch matmuls 15-19 %
    /// slower (Zen 3).
    pub fn new(cache_dir: impl Into<PathBuf>) -> Builder {
        let cache_dir: PathBuf = cache_dir.into();
        let cache_dir = std::path::absolute(&cache_dir).unwrap_or(cache_dir);
        let flags = [
            "-O3",
            "-fno-unswitch-loops",
            "-fno-peel-loops",
            "-march=native",
            "-fPIC",
            "-fopenmp",
            "-fno-trapping-math",
            "-std=gnu11",
            "-w",
        ];
        Builder {
            cache_dir,
            cc: std::env::var("CC")
                .ok()
                .filter(|cc| !cc.trim().is_empty())
                .unwrap_or_else(|| "cc".into()),
            flags: flags.map(String::from).to_vec(),
            link_flags: Vec::new(),
            jobs: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        }
    }

    /// The default cache directory: `$ANYSHAPE_CACHE`, else `$XDG_CACHE_HOME/anyshape`,
    /// else `~/.cache/anyshape`, else the system temp dir (empty variables count as
    /// unset).
    pub fn default_cache_dir() -> PathBuf {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(dir) = var("ANYSHAPE_CACHE") {
            return PathBuf::from(dir);
        }
        let base = var("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache")));
        base.unwrap_or_else(std::env::temp_dir).join("anyshape")
    }

    /// Build `kernels` for `target` into one library (C with the system compiler for a
    /// CPU, CUDA with NVRTC for a GPU). Kernels that fail to compile are reported in
    /// [`BuiltLibrary::failed`] and left out; the others are built.
    pub fn build<T: Target>(&self, target: &T, kernels: &[KernelSource]) -> Result<BuiltLibrary> {
        match T::DEVICE {
            DeviceKind::Cpu => self.build_c(&target.prelude(), kernels),
            DeviceKind::Cuda => crate::nvrtc::build(self, target, kernels),
        }
    }

    /// Render `programs` for `target` and build them (see [`Builder::build`]); a program
    /// its sketch cannot lower fails alone, listed in [`BuiltLibrary::failed`].
    pub fn build_programs<K: Sketch>(
        &self,
        target: &K::Target,
        programs: &[Program<K>],
    ) -> Result<BuiltLibrary> {
        let (sources, unlowered) = render_programs(target, programs);
        let mut lib = self.build(target, &sources)?;
        lib.failed.extend(unlowered);
        Ok(lib)
    }

    /// Build C kernels after `header` into one shared library, cached.
    fn build_c(&self, header: &str, kernels: &[KernelSource]) -> Result<BuiltLibrary> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| MeasureError::Io { path, source }
        };
        std::fs::create_dir_all(&self.cache_dir).map_err(io(&self.cache_dir))?;
        let mut h = Sha256::new();
        h.update(format!("{}|{}|{header}", self.cc, self.flags.join(" ")));
        if !self.link_flags.is_empty() {
            h.update(format!("|link {}", self.link_flags.join(" ")));
        }
        for k in kernels {
            h.update(&k.code);
        }
        let hash = short_hash(h);
        let path = self.cache_dir.join(format!("lib{hash}.so"));
        if let Some(failed) = cache::cached_build(&path) {
            return Ok(BuiltLibrary {
                path,
                device: DeviceKind::Cpu,
                failed,
                unavailable: BTreeMap::new(),
                cached: true,
            });
        }
        // One work directory per build, not per process: threads of one process
        // building the same library at once (two models' compiles sharing a kernel)
        // each removed the directory the other was still writing into.
        static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let work = self
            .cache_dir
            .join(format!("build-{hash}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&work).map_err(io(&work))?;
        let result = self.build_in(&work, header, kernels);
        let result = result.and_then(|(built, failed, unavailable)| {
            // A library missing kernels for the environment's sake is not cached: those
            // kernels are built again next time.
            let dest = if unavailable.is_empty() {
                cache::record_failures(&path, &failed).map_err(io(&path))?;
                cache::store(&built, &path).map_err(io(&path))?;
                path
            } else {
                let partial = self
                    .cache_dir
                    .join(format!("partial-{hash}-{}-{n}.so", std::process::id()));
                std::fs::rename(&built, &partial).map_err(io(&partial))?;
                partial
            };
            Ok(BuiltLibrary {
                path: dest,
                device: DeviceKind::Cpu,
                failed,
                unavailable,
                cached: false,
            })
        });
        let _ = std::fs::remove_dir_all(&work);
        result
    }

    /// Compile `kernels` in `work` and link them into `work/out.so`; returns its path,
    /// the kernels the compiler rejected and those the environment kept from compiling.
    /// Each kernel is its own translation unit, cached as an object file by the hash of
    /// everything that goes into it ([`Builder::object_entry`]): a micro-kernel is
    /// compiled once for every batch, vote round and module that links it (before, a
    /// vote round's candidates and each module were compiled again as new libraries:
    /// 1-2 s of GCC per task and round).
    #[allow(clippy::type_complexity)]
    fn build_in(
        &self,
        work: &Path,
        header: &str,
        kernels: &[KernelSource],
    ) -> Result<(PathBuf, BTreeMap<String, String>, BTreeMap<String, String>)> {
        let mut objects = Vec::new();
        let mut failed = BTreeMap::new();
        let mut unavailable = BTreeMap::new();
        let mut missing = Vec::new();
        for (i, k) in kernels.iter().enumerate() {
            let entry = self.object_entry(header, k);
            match cache::lookup(&entry) {
                Ok(true) => objects.push(entry),
                Ok(false) => missing.push((i, entry)),
                Err(why) => {
                    tracing::warn!(
                        "kernel cache entry {} is damaged ({why}); rebuilding it",
                        entry.display()
                    );
                    missing.push((i, entry));
                }
            }
        }
        let units: Vec<(String, &[KernelSource])> = missing
            .iter()
            .map(|&(i, _)| (format!("kernel{i}"), std::slice::from_ref(&kernels[i])))
            .collect();
        for ((obj, outcome), (i, entry)) in self
            .compile_all(work, header, &units)?
            .into_iter()
            .zip(missing)
        {
            let symbol = kernels[i].symbol.clone();
            match outcome {
                Compiled::Ok => {
                    cache::store(&obj, &entry).map_err(|source| MeasureError::Io {
                        path: entry.display().to_string(),
                        source,
                    })?;
                    objects.push(entry);
                }
                Compiled::Rejected(e) => {
                    failed.insert(symbol, e);
                }
                Compiled::Unavailable(e) => {
                    unavailable.insert(symbol, e);
                }
            }
        }
        if objects.is_empty() {
            // Every kernel failed: build an empty library so callers still get one.
            let (obj, outcome) = self
                .compile_all(work, header, &[("empty".to_string(), &[])])?
                .remove(0);
            match outcome {
                Compiled::Ok => objects.push(obj),
                Compiled::Rejected(stderr) => {
                    return Err(MeasureError::Compile {
                        what: "the shared prelude".into(),
                        stderr,
                    })
                }
                Compiled::Unavailable(why) => {
                    return Err(MeasureError::Environment(format!(
                        "compiling the shared prelude: {why}"
                    )))
                }
            }
        }
        let tmp = work.join("out.so");
        let _slot = COMPILERS.take(self.jobs);
        let mut cmd = Command::new(&self.cc);
        cmd.args(&self.flags)
            .arg("-shared")
            .arg("-o")
            .arg(&tmp)
            .args(&objects)
            .args(&self.link_flags)
            .stdout(Stdio::null());
        let output = cmd.output().map_err(|source| MeasureError::NoCompiler {
            cc: self.cc.clone(),
            source,
        })?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if let Some(why) = environment_failure(output.status, &stderr) {
            return Err(MeasureError::Environment(format!("linking: {why}")));
        }
        if !output.status.success() {
            return Err(MeasureError::Compile {
                what: "the link step".into(),
                stderr,
            });
        }
        Ok((tmp, failed, unavailable))
    }

    /// Where the object file of one kernel is cached: named by the hash of the
    /// compiler, its flags, the shared prelude and the kernel's code.
    fn object_entry(&self, header: &str, kernel: &KernelSource) -> PathBuf {
        let mut h = Sha256::new();
        h.update(format!("{}|{}|{header}|", self.cc, self.flags.join(" ")));
        h.update(&kernel.code);
        self.cache_dir.join(format!("obj{}.o", short_hash(h)))
    }

    /// Compile each `(name, kernels)` unit to an object file, `jobs` compilers at a
    /// time (each takes the next unit as soon as it is done).
    fn compile_all(
        &self,
        work: &Path,
        header: &str,
        units: &[(String, &[KernelSource])],
    ) -> Result<Vec<(PathBuf, Compiled)>> {
        crate::each_on_threads(
            units.len(),
            self.jobs,
            |_| {},
            |i| self.compile_unit(work, header, &units[i].0, units[i].1),
        )
        .into_iter()
        .collect()
    }

    /// Compile one translation unit (the header, then `kernels`) to `work/<name>.o`.
    fn compile_unit(
        &self,
        work: &Path,
        header: &str,
        name: &str,
        kernels: &[KernelSource],
    ) -> Result<(PathBuf, Compiled)> {
        let src = work.join(format!("{name}.c"));
        let obj = work.join(format!("{name}.o"));
        let mut text = header.to_string();
        for k in kernels {
            text.push('\n');
            text.push_str(&k.code);
        }
        std::fs::write(&src, text).map_err(|source| MeasureError::Io {
            path: src.display().to_string(),
            source,
        })?;
        let _slot = COMPILERS.take(self.jobs);
        let output = Command::new(&self.cc)
            .args(&self.flags)
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|source| MeasureError::NoCompiler {
                cc: self.cc.clone(),
                source,
            })?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let outcome = match environment_failure(output.status, &stderr) {
            Some(why) => Compiled::Unavailable(why),
            None if output.status.success() => Compiled::Ok,
            None if stderr.trim().is_empty() => Compiled::Rejected(format!(
                "the compiler failed without a message ({})",
                crate::runner::describe_exit(output.status)
            )),
            None => Compiled::Rejected(stderr),
        };
        Ok((obj, outcome))
    }
}
