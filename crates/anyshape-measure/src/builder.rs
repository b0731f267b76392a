//! The builder: compiles a batch of kernels into one shared library with the system C
//! compiler, splitting the batch into one translation unit per job so they compile in
//! parallel, and caching the library by the hash of everything that goes into it.
use crate::{MeasureError, Result};
use anyshape_codegen::{c, CpuTarget};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One kernel to build: its exported symbol and its C function.
#[derive(Clone, Debug)]
pub struct KernelSource {
    /// The exported symbol.
    pub symbol: String,
    /// The C function (without the shared prelude).
    pub code: String,
}

/// A built library and the kernels that failed to compile (left out of it).
#[derive(Clone, Debug)]
pub struct BuiltLibrary {
    /// The shared library.
    pub path: PathBuf,
    /// Symbol -> compiler messages, for kernels that did not compile.
    pub failed: BTreeMap<String, String>,
    /// Whether it came from the cache.
    pub cached: bool,
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
    /// A builder caching in `cache_dir`, with `-O3 -march=native -fopenmp`.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Builder {
        let flags = [
            "-O3",
            "-march=native",
            "-fPIC",
            "-fopenmp",
            "-std=gnu11",
            "-w",
        ];
        Builder {
            cache_dir: cache_dir.into(),
            cc: std::env::var("CC").unwrap_or_else(|_| "cc".into()),
            flags: flags.map(String::from).to_vec(),
            link_flags: Vec::new(),
            jobs: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        }
    }

    /// The default cache directory: `$ANYSHAPE_CACHE`, else `$XDG_CACHE_HOME/anyshape`,
    /// else `~/.cache/anyshape`, else the system temp dir.
    pub fn default_cache_dir() -> PathBuf {
        if let Some(dir) = std::env::var_os("ANYSHAPE_CACHE") {
            return PathBuf::from(dir);
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
        base.unwrap_or_else(std::env::temp_dir).join("anyshape")
    }

    /// Build `kernels` for `target` into one library. Kernels that fail to compile are
    /// reported in [`BuiltLibrary::failed`] and left out; the others are built.
    pub fn build(&self, target: &CpuTarget, kernels: &[KernelSource]) -> Result<BuiltLibrary> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| MeasureError::Io { path, source }
        };
        std::fs::create_dir_all(&self.cache_dir).map_err(io(&self.cache_dir))?;
        let header = c::header(target);
        let mut h = Sha256::new();
        h.update(format!("{}|{}|{header}", self.cc, self.flags.join(" ")));
        if !self.link_flags.is_empty() {
            h.update(format!("|link {}", self.link_flags.join(" ")));
        }
        for k in kernels {
            h.update(&k.code);
        }
        let hash: String = h
            .finalize()
            .iter()
            .take(12)
            .map(|b| format!("{b:02x}"))
            .collect();
        let path = self.cache_dir.join(format!("lib{hash}.so"));
        let failed_path = path.with_extension("failed.json");
        if path.exists() {
            let failed = std::fs::read_to_string(&failed_path)
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .unwrap_or_default();
            return Ok(BuiltLibrary {
                path,
                failed,
                cached: true,
            });
        }
        let work = self
            .cache_dir
            .join(format!("build-{hash}-{}", std::process::id()));
        std::fs::create_dir_all(&work).map_err(io(&work))?;
        let result = self.build_in(&work, &header, kernels, &path);
        let _ = std::fs::remove_dir_all(&work);
        let failed = result?;
        if !failed.is_empty() {
            let _ = std::fs::write(
                &failed_path,
                serde_json::to_string(&failed).unwrap_or_default(),
            );
        }
        Ok(BuiltLibrary {
            path,
            failed,
            cached: false,
        })
    }

    fn build_in(
        &self,
        work: &Path,
        header: &str,
        kernels: &[KernelSource],
        out: &Path,
    ) -> Result<BTreeMap<String, String>> {
        let chunks: Vec<&[KernelSource]> = if kernels.is_empty() {
            vec![&[]]
        } else {
            kernels
                .chunks(kernels.len().div_ceil(self.jobs.max(1)))
                .collect()
        };
        let mut objects = Vec::new();
        let mut failed = BTreeMap::new();
        let results = self.compile_all(
            work,
            header,
            &chunks
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("chunk{i}"), *c))
                .collect::<Vec<_>>(),
        )?;
        for ((obj, err), chunk) in results.into_iter().zip(&chunks) {
            match err {
                None => objects.push(obj),
                // Find the culprits: compile each kernel of the failed chunk on its own.
                Some(_) => {
                    let singles: Vec<_> = chunk
                        .iter()
                        .map(|k| (k.symbol.clone(), std::slice::from_ref(k)))
                        .collect();
                    for ((obj, err), k) in self
                        .compile_all(work, header, &singles)?
                        .into_iter()
                        .zip(chunk.iter())
                    {
                        match err {
                            None => objects.push(obj),
                            Some(e) => {
                                failed.insert(k.symbol.clone(), e);
                            }
                        }
                    }
                }
            }
        }
        if objects.is_empty() {
            // Every kernel failed: build an empty library so callers still get one.
            let (obj, err) = self
                .compile_all(work, header, &[("empty".to_string(), &[])])?
                .remove(0);
            if let Some(stderr) = err {
                return Err(MeasureError::Compile {
                    what: "the shared prelude".into(),
                    stderr,
                });
            }
            objects.push(obj);
        }
        let tmp = work.join("out.so");
        let mut cmd = Command::new(&self.cc);
        cmd.args(&self.flags)
            .arg("-shared")
            .arg("-o")
            .arg(&tmp)
            .args(&objects)
            .args(&self.link_flags);
        let (ok, stderr) = run(&self.cc, &mut cmd)?;
        if !ok {
            return Err(MeasureError::Compile {
                what: "the link step".into(),
                stderr,
            });
        }
        std::fs::rename(&tmp, out).map_err(|source| MeasureError::Io {
            path: out.display().to_string(),
            source,
        })?;
        Ok(failed)
    }

    /// Compile each `(name, kernels)` unit to an object file, `jobs` at a time.
    fn compile_all(
        &self,
        work: &Path,
        header: &str,
        units: &[(String, &[KernelSource])],
    ) -> Result<Vec<(PathBuf, Option<String>)>> {
        let mut out = Vec::new();
        for group in units.chunks(self.jobs.max(1)) {
            let mut running = Vec::new();
            for (name, kernels) in group {
                let src = work.join(format!("{name}.c"));
                let obj = work.join(format!("{name}.o"));
                let mut text = header.to_string();
                for k in kernels.iter() {
                    text.push('\n');
                    text.push_str(&k.code);
                }
                std::fs::write(&src, text).map_err(|source| MeasureError::Io {
                    path: src.display().to_string(),
                    source,
                })?;
                let child = Command::new(&self.cc)
                    .args(&self.flags)
                    .arg("-c")
                    .arg(&src)
                    .arg("-o")
                    .arg(&obj)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|source| MeasureError::NoCompiler {
                        cc: self.cc.clone(),
                        source,
                    })?;
                running.push((obj, child));
            }
            for (obj, child) in running {
                let output =
                    child
                        .wait_with_output()
                        .map_err(|source| MeasureError::NoCompiler {
                            cc: self.cc.clone(),
                            source,
                        })?;
                let err = (!output.status.success())
                    .then(|| String::from_utf8_lossy(&output.stderr).into_owned());
                out.push((obj, err));
            }
        }
        Ok(out)
    }
}

fn run(cc: &str, cmd: &mut Command) -> Result<(bool, String)> {
    let output = cmd
        .stdout(Stdio::null())
        .output()
        .map_err(|source| MeasureError::NoCompiler {
            cc: cc.into(),
            source,
        })?;
    Ok((
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}
