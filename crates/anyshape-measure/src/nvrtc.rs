//! Building CUDA kernels: NVRTC compiles a batch into one PTX file in the builder's
//! cache, named by the hash of its source and flags. A kernel NVRTC rejects fails alone
//! (the batch is compiled once more without it). Where NVRTC is missing the build is
//! [`MeasureError::NoGpu`], an error, never a crash.
use crate::{cache, Builder, BuiltLibrary, KernelSource, MeasureError, Result};
use anyshape_codegen::{DeviceKind, Target};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// Build `kernels` (CUDA C) for `target` with NVRTC into a cached PTX file.
pub(crate) fn build<T: Target>(
    builder: &Builder,
    target: &T,
    kernels: &[KernelSource],
) -> Result<BuiltLibrary> {
    let prelude = target.prelude();
    let options = target.compile_flags();
    let unit = |sources: &[&KernelSource]| -> String {
        let mut src = prelude.clone();
        for k in sources {
            src.push_str(&k.code);
        }
        src
    };
    let mut sources: Vec<&KernelSource> = kernels.iter().collect();
    let mut h = Sha256::new();
    h.update(options.join(" "));
    h.update(unit(&sources));
    let hash: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = builder.cache_dir.join(format!("gpu-{hash}.ptx"));
    let library = |failed, cached| BuiltLibrary {
        path: path.clone(),
        device: DeviceKind::Cuda,
        failed,
        unavailable: BTreeMap::new(),
        cached,
    };
    if let Some(failed) = cache::cached_build(&path) {
        return Ok(library(failed, true));
    }
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(MeasureError::NoGpu(
            "NVRTC (libnvrtc.so, CUDA 12 or 13) is not installed".into(),
        ));
    }
    let compile = |src: &str| {
        cudarc::nvrtc::compile_ptx_with_opts(
            src,
            cudarc::nvrtc::CompileOptions {
                options: options.clone(),
                ..Default::default()
            },
        )
        .map(|ptx| ptx.to_src())
        .map_err(|e| format!("{e:?}"))
    };
    let mut failed = BTreeMap::new();
    let ptx = match compile(&unit(&sources)) {
        Ok(ptx) => ptx,
        Err(_) => {
            // Find the kernels NVRTC rejects, one by one; build the others.
            sources.retain(|k| match compile(&unit(&[k])) {
                Ok(_) => true,
                Err(e) => {
                    failed.insert(k.symbol.clone(), e);
                    false
                }
            });
            compile(&unit(&sources)).map_err(|stderr| MeasureError::Compile {
                what: "CUDA kernels (NVRTC)".into(),
                stderr,
            })?
        }
    };
    let io = |p: &std::path::Path| {
        let p = p.display().to_string();
        move |source| MeasureError::Io { path: p, source }
    };
    std::fs::create_dir_all(&builder.cache_dir).map_err(io(&builder.cache_dir))?;
    cache::record_failures(&path, &failed).map_err(io(&path))?;
    cache::store_bytes(&path, ptx.as_bytes()).map_err(io(&path))?;
    Ok(library(failed, false))
}
