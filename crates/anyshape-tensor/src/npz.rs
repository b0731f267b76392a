//! NumPy `.npy` and `.npz` files of named tensors (a model's inputs and outputs,
//! recorded test cases): read strictly — regular files within a size limit, every
//! array's bytes exactly what its header declares (no trailing data, none missing),
//! Fortran-ordered arrays put in C order, names unique — and written atomically
//! beside their path (`anyshape-files`), never over a file the command reads. The
//! container and header are the `npyz` crate's.
use crate::error::{Result, TensorError};
use crate::tensor::{Data, Tensor};
use anyshape_files::{Reads, GIB};
use npyz::WriterBuilder as _;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

/// The largest `.npy` or `.npz` file, and the largest array, anyshape reads.
pub const NPZ_LIMIT: u64 = 32 * GIB;

fn format(path: &Path, what: impl std::fmt::Display) -> TensorError {
    TensorError::Npz(format!("{}: {what}", path.display()))
}

/// The arrays of a `.npz` file as tensors, by name, in the file's order (float32,
/// int64 and bool arrays; any other dtype, a member that is not an array, or a name
/// given twice is an error that names it).
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let (file, _) = anyshape_files::open(path, NPZ_LIMIT, "a .npz file of arrays")?;
    let mut zip = npyz::npz::NpzArchive::new(std::io::BufReader::new(file))
        .map_err(|e| format(path, format_args!("not a .npz file ({e})")))?;
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for i in 0..zip.zip_archive().len() {
        let mut entry = zip
            .zip_archive()
            .by_index(i)
            .map_err(|e| format(path, format_args!("member {i}: {e}")))?;
        let member = entry.name().to_string();
        let Some(name) = npyz::npz::array_name_from_file_name(&member).map(String::from) else {
            return Err(format(
                path,
                format_args!("member `{member}` is not a NumPy array (.npy)"),
            ));
        };
        if !seen.insert(name.clone()) {
            return Err(format(path, format_args!("array `{name}` is stored twice")));
        }
        if entry.size() > NPZ_LIMIT {
            return Err(format(
                path,
                format_args!(
                    "array {name} is {} bytes, more than anyshape reads ({NPZ_LIMIT})",
                    entry.size()
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| format(path, format_args!("array {name}: {e}")))?;
        let t = array(&bytes, path, &name)?;
        out.push((name, t));
    }
    Ok(out)
}

/// The array of a `.npy` file as a tensor.
pub fn read_npy(path: &Path) -> Result<Tensor> {
    let bytes = anyshape_files::read(path, NPZ_LIMIT, "a .npy array")?;
    let name = path
        .file_stem()
        .map_or(String::new(), |s| s.to_string_lossy().into_owned());
    array(&bytes, path, &name)
}

/// One NumPy array from its file's bytes: float32, int64 (little- or big-endian) or
/// bool, in C or Fortran order; the data must be exactly what the header declares.
fn array(bytes: &[u8], path: &Path, name: &str) -> Result<Tensor> {
    let bad = |what: String| format(path, format_args!("array {name}: {what}"));
    check_header_shape(bytes).map_err(bad)?;
    let npy = npyz::NpyFile::new(bytes).map_err(|e| bad(format!("not a .npy array ({e})")))?;
    let shape: Vec<usize> = npy
        .shape()
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| bad("a dim past this machine's address space".into()))?;
    let order = npy.order();
    let descr = npy.dtype().descr();
    let data = npy.into_inner();
    let n = crate::tensor::numel(&shape).map_err(|_| bad(format!("shape {shape:?} overflows")))?;
    let width = match descr.as_str() {
        "'<f4'" | "'>f4'" => 4,
        "'<i8'" | "'>i8'" => 8,
        "'|b1'" => 1,
        d => {
            return Err(bad(format!(
                "dtype {d}; anyshape takes float32, int64 and bool"
            )))
        }
    };
    let want = n
        .checked_mul(width)
        .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    if data.len() != want {
        return Err(bad(format!(
            "{} bytes of data where its header ({shape:?} of {descr}) declares {want}{}",
            data.len(),
            if data.len() > want {
                " (trailing bytes: not an array NumPy wrote)"
            } else {
                " (truncated)"
            }
        )));
    }
    let big = descr.starts_with("'>");
    let elements = match width {
        4 => Data::F32(
            data.chunks_exact(4)
                .map(|b| {
                    let b = [b[0], b[1], b[2], b[3]];
                    if big {
                        f32::from_be_bytes(b)
                    } else {
                        f32::from_le_bytes(b)
                    }
                })
                .collect(),
        ),
        8 => Data::I64(
            data.chunks_exact(8)
                .map(|b| {
                    let b: [u8; 8] = b.try_into().expect("chunks of 8");
                    if big {
                        i64::from_be_bytes(b)
                    } else {
                        i64::from_le_bytes(b)
                    }
                })
                .collect(),
        ),
        _ => Data::Bool(
            data.iter()
                .map(|&b| match b {
                    0 => Ok(false),
                    1 => Ok(true),
                    _ => Err(bad(format!("a bool byte {b} (NumPy writes 0 or 1)"))),
                })
                .collect::<Result<_>>()?,
        ),
    };
    let elements = match order {
        npyz::Order::C => elements,
        // Fortran order: the first axis varies fastest; read it with those strides.
        npyz::Order::Fortran => {
            let mut strides = vec![0usize; shape.len()];
            let mut s = 1;
            for (k, &d) in shape.iter().enumerate() {
                strides[k] = s;
                s *= d;
            }
            if n == 0 {
                elements
            } else {
                crate::ops::strided(elements.view(), &shape, &strides)
            }
        }
    };
    Tensor::new(shape, elements)
}

/// Refuse a header whose shape has more elements than 64 bits count, before the
/// header parser multiplies them out.
fn check_header_shape(bytes: &[u8]) -> std::result::Result<(), String> {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(65_536 + 12)]);
    let Some(at) = text.find("'shape'") else {
        return Ok(()); // the parser reports what is missing
    };
    let rest = &text[at..];
    let (Some(open), Some(close)) = (rest.find('('), rest.find(')')) else {
        return Ok(());
    };
    if open > close {
        return Ok(());
    }
    let mut n = 1u64;
    for dim in rest[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let d: u64 = dim
            .trim_end_matches('L')
            .parse()
            .map_err(|_| format!("the header's shape has the dim `{dim}`"))?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| "the header's shape has more elements than 64 bits count".to_string())?;
    }
    Ok(())
}

/// Write tensors to the `.npz` file `path` (named by `option` in messages), atomically:
/// never over a file of `reads`; on any error `path` keeps what it held.
pub fn write(path: &Path, arrays: &[(String, Tensor)], reads: &Reads, option: &str) -> Result<()> {
    anyshape_files::write_atomic(path, reads, option, |file| {
        let mut npz = npyz::npz::NpzWriter::new(std::io::BufWriter::new(file));
        for (name, t) in arrays {
            let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
            // One writer per element type.
            macro_rules! put {
                ($t:ty, $v:expr) => {{
                    let mut w = npz
                        .array::<$t>(name, Default::default())?
                        .default_dtype()
                        .shape(&shape)
                        .begin_nd()?;
                    w.extend($v.iter().copied())?;
                    w.finish()?;
                }};
            }
            match &t.data {
                Data::F32(v) => put!(f32, v),
                Data::I64(v) => put!(i64, v),
                Data::Bool(v) => put!(bool, v),
            }
        }
        npz.zip_writer()
            .finish()?
            .into_inner()
            .map_err(|e| e.into_error())?;
        Ok(())
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `.npy` file's bytes as `npyz` writes them: `data` in the given order.
    fn npy<T: npyz::AutoSerialize + Copy>(fortran: bool, shape: &[u64], data: &[T]) -> Vec<u8> {
        let mut out = Vec::new();
        let order = if fortran {
            npyz::Order::Fortran
        } else {
            npyz::Order::C
        };
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(shape)
            .order(order)
            .writer(&mut out)
            .begin_nd()
            .unwrap();
        w.extend(data.iter().copied()).unwrap();
        w.finish().unwrap();
        out
    }

    /// `bytes` with `from` in the header replaced by `to`, taking the difference in
    /// length from the header's padding, so the header keeps its length.
    fn retyped(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
        let at = bytes
            .windows(from.len())
            .position(|w| w == from.as_bytes())
            .unwrap();
        let mut out = bytes[..at].to_vec();
        out.extend(to.as_bytes());
        out.extend(&bytes[at + from.len()..]);
        let end = out.iter().position(|&b| b == b'\n').unwrap();
        out.drain(end - (to.len() - from.len())..end);
        out
    }

    #[test]
    fn fortran_order_is_honoured() {
        // [[0, 1, 2], [3, 4, 5]] stored column by column.
        let bytes = npy(true, &[2, 3], &[0f32, 3., 1., 4., 2., 5.]);
        let t = array(&bytes, Path::new("x.npy"), "x").unwrap();
        assert_eq!(t.as_f32().unwrap(), &[0., 1., 2., 3., 4., 5.]);
        let c = npy(false, &[2, 3], &[0f32, 1., 2., 3., 4., 5.]);
        assert_eq!(array(&c, Path::new("x.npy"), "x").unwrap(), t);
        // Rank 3: element (i, j, k) at i + 2j + 6k.
        let shape = [2u64, 3, 4];
        let fortran: Vec<f32> = (0..24)
            .map(|f| {
                let (i, j, k) = (f % 2, (f / 2) % 3, f / 6);
                (i * 12 + j * 4 + k) as f32
            })
            .collect();
        let t = array(&npy(true, &shape, &fortran), Path::new("y"), "y").unwrap();
        assert_eq!(
            t.as_f32().unwrap(),
            (0..24).map(|x| x as f32).collect::<Vec<_>>()
        );
    }

    #[test]
    fn data_must_be_what_the_header_declares() {
        let mut long = npy(false, &[2], &[1f32, 2.]);
        long.push(0);
        let e = array(&long, Path::new("a.npy"), "a")
            .unwrap_err()
            .to_string();
        assert!(e.contains("trailing"), "{e}");
        let short = npy(false, &[3], &[1f32, 2., 3.]);
        let e = array(&short[..short.len() - 4], Path::new("a"), "a")
            .unwrap_err()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        let half = retyped(&npy(false, &[2], &[0i16, 0]), "'<i2'", "'<f2'");
        let e = array(&half, Path::new("a"), "a").unwrap_err().to_string();
        assert!(e.contains("dtype"), "{e}");
        let mut flags = npy(false, &[1], &[true]);
        *flags.last_mut().unwrap() = 7;
        let e = array(&flags, Path::new("a"), "a").unwrap_err().to_string();
        assert!(e.contains("bool byte"), "{e}");
        let huge = retyped(
            &npy(false, &[1], &[1f32]),
            "(1, )",
            "(1099511627776, 1073741824)",
        );
        assert!(array(&huge, Path::new("a"), "a").is_err());
        let be = retyped(&npy(false, &[2], &[0f32, 0.]), "'<f4'", "'>f4'");
        let mut be = be[..be.len() - 8].to_vec();
        be.extend([1.5f32, -2.0].iter().flat_map(|x| x.to_be_bytes()));
        let t = array(&be, Path::new("a"), "a").unwrap();
        assert_eq!(t.as_f32().unwrap(), &[1.5, -2.0]);
    }

    #[test]
    fn written_arrays_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.npz");
        let arrays = vec![
            (
                "a".to_string(),
                Tensor::f32(vec![2, 2], vec![1., 2., 3., 4.]).unwrap(),
            ),
            (
                "b".to_string(),
                Tensor::i64(vec![3], vec![1, -2, 3]).unwrap(),
            ),
            ("c".to_string(), Tensor::bool(vec![], vec![true]).unwrap()),
        ];
        write(&p, &arrays, &Reads::new(), "--output").unwrap();
        assert_eq!(read(&p).unwrap(), arrays);
        // Never over a file the command reads.
        let mut reads = Reads::new();
        reads.file(&p);
        assert!(write(&p, &arrays[..1], &reads, "--output").is_err());
        assert_eq!(read(&p).unwrap(), arrays);
    }
}
