//! NumPy `.npz` files of named tensors (a model's inputs and outputs, recorded test
//! cases), read and written with the `npyz` crate.
use crate::error::{GraphError, Result};
use crate::tensor::{Data, Tensor};
use npyz::WriterBuilder as _;
use std::path::Path;

fn format(path: &Path, what: impl std::fmt::Display) -> GraphError {
    GraphError::Npz(format!("{}: {what}", path.display()))
}

/// The arrays of a `.npz` file as tensors, by name, in the file's order (float32,
/// int64 and bool arrays; any other dtype is an error that names it).
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = std::fs::File::open(path).map_err(|source| GraphError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mut archive = npyz::npz::NpzArchive::new(std::io::BufReader::new(file))
        .map_err(|e| format(path, format_args!("not a .npz file ({e})")))?;
    let names: Vec<String> = archive.array_names().map(String::from).collect();
    let mut out = Vec::new();
    for name in names {
        let arr = archive
            .by_name(&name)
            .map_err(|e| format(path, format_args!("array {name}: {e}")))?
            .ok_or_else(|| format(path, format_args!("no array {name}")))?;
        let t = tensor(arr, path, &name)?;
        out.push((name, t));
    }
    Ok(out)
}

/// One NumPy array as a tensor (float32, int64 or bool).
fn tensor<R: std::io::Read>(arr: npyz::NpyFile<R>, path: &Path, name: &str) -> Result<Tensor> {
    let shape: Vec<usize> = arr.shape().iter().map(|&d| d as usize).collect();
    let bad = |e: std::io::Error| format(path, format_args!("array {name}: {e}"));
    Ok(match arr.dtype().descr().as_str() {
        "'<i8'" => Tensor::i64(shape, arr.into_vec::<i64>().map_err(bad)?)?,
        "'<f4'" => Tensor::f32(shape, arr.into_vec::<f32>().map_err(bad)?)?,
        "'|b1'" => Tensor::bool(shape, arr.into_vec::<bool>().map_err(bad)?)?,
        d => {
            return Err(format(
                path,
                format_args!("array {name} has dtype {d}; anyshape takes float32, int64 and bool"),
            ))
        }
    })
}

/// The array of a `.npy` file as a tensor.
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let file = std::fs::File::open(path).map_err(|source| GraphError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let arr = npyz::NpyFile::new(std::io::BufReader::new(file))
        .map_err(|e| format(path, format_args!("not a .npy file ({e})")))?;
    let name = path
        .file_stem()
        .map_or(String::new(), |s| s.to_string_lossy().into_owned());
    tensor(arr, path, &name)
}

/// Write tensors to a `.npz` file.
pub fn write(path: &Path, arrays: &[(String, Tensor)]) -> Result<()> {
    let io = |source| GraphError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut npz = npyz::npz::NpzWriter::new(std::io::BufWriter::new(file));
    for (name, t) in arrays {
        let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
        // One writer per element type.
        macro_rules! put {
            ($t:ty, $v:expr) => {
                npz.array::<$t>(name, Default::default())
                    .map_err(io)?
                    .default_dtype()
                    .shape(&shape)
                    .begin_nd()
                    .map_err(io)?
                    .extend($v.iter().copied())
                    .map_err(io)?
            };
        }
        match &t.data {
            Data::F32(v) => put!(f32, v),
            Data::I64(v) => put!(i64, v),
            Data::Bool(v) => put!(bool, v),
        }
    }
    Ok(())
}
