//! The plan file (`plan.bin` in a model module, `anyshape_abi::MODEL_PLAN`). Version
//! [`PLAN_FORMAT`], little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | magic `ANYPLAN\0` |
//! | 8..12 | format number (u32) |
//! | 12..16 | 0 |
//! | 16..24 | header length in bytes (u64) |
//! | 24..32 | data offset (u64; a multiple of 64) |
//! | 32..40 | data length in bytes (u64) |
//! | 40..48 | xxh3-64 of the header |
//! | 48..56 | xxh3-64 of the data |
//! | 56..64 | 0 |
//! | 64.. | header: the [`Plan`], MessagePack with named fields (expressions and workloads as their text forms) |
//! | data offset.. | the constants' elements, each at its offset (multiples of 64), in their run-time layouts |
//!
//! The runtime maps the file: constants are read in place (a weight in panels is what
//! the kernels read). Opening checks the magic, the format, the lengths, both checksums
//! (a fast non-cryptographic hash: ~20 ms for 420 MB; the model manifest's SHA-256 of
//! the whole file is what `anyshape inspect` verifies), the plan's invariants
//! ([`crate::verify`]) and every bool constant's bytes.
use crate::{Constant, ConstantLayout, Plan, PlanError, Result};
use anyshape_abi::{FileEntry, HashingWriter};
use anyshape_files::Reads;
use anyshape_tensor::{DType, DataRef, TensorRef};
use std::io::Write;
use std::path::Path;
use xxhash_rust::xxh3::xxh3_64;

/// The plan file's format number; bump when the layout or the header's meaning changes
/// (3: Winograd's transforms carry their tile, F(4x4, 3x3) where `tile` is 4, which a
/// reader of format 2 took for F(2x2, 3x3) and failed on at run time).
pub const PLAN_FORMAT: u32 = 3;
const MAGIC: &[u8; 8] = b"ANYPLAN\0";
const PREAMBLE: usize = 64;

/// A plan and the constants' data, loaded (mapped) or built (in memory).
pub struct PlanFile {
    plan: Plan,
    bytes: Bytes,
    data_offset: usize,
    data_len: usize,
}

/// Where a plan file's bytes are.
enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

fn align(n: usize) -> usize {
    n.next_multiple_of(64)
}

impl std::fmt::Debug for PlanFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlanFile")
            .field("steps", &self.plan.steps.len())
            .field("data_len", &self.data_len)
            .finish_non_exhaustive()
    }
}

impl PlanFile {
    /// A plan and its constants' data (laid out as [`PlanFile::add_constant`] lays them
    /// out), verified.
    pub fn new(plan: Plan, data: Vec<u8>) -> Result<PlanFile> {
        crate::verify(&plan, data.len() as u64)?;
        check_bools(&plan, &data)?;
        let data_len = data.len();
        Ok(PlanFile {
            plan,
            bytes: Bytes::Owned(data),
            data_offset: 0,
            data_len,
        })
    }

    /// Append a constant to `data` on a cache line — its `bytes` little-endian elements,
    /// zeroed, then written by `fill` in place — and its entry to `plan.constants`;
    /// returns its index.
    #[allow(clippy::too_many_arguments)]
    pub fn add_constant(
        plan: &mut Plan,
        data: &mut Vec<u8>,
        name: &str,
        dtype: DType,
        shape: Vec<usize>,
        layout: ConstantLayout,
        bytes: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> usize {
        let offset = align(data.len());
        data.resize(offset + bytes, 0);
        fill(&mut data[offset..]);
        plan.constants.push(Constant {
            name: name.to_string(),
            dtype,
            shape,
            layout,
            offset: offset as u64,
            bytes: bytes as u64,
        });
        plan.constants.len() - 1
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The constants' data.
    pub fn data(&self) -> &[u8] {
        &self.bytes.as_slice()[self.data_offset..self.data_offset + self.data_len]
    }

    /// Constant `c`'s elements, in place.
    pub fn constant(&self, c: usize) -> TensorRef<'_> {
        let k = &self.plan.constants[c];
        let bytes = &self.data()[k.offset as usize..(k.offset + k.bytes) as usize];
        let data = match k.dtype {
            // SAFETY (all three): the bytes start on a cache line (verified: offsets are
            // multiples of 64 from the data's start, itself on a page or 64 bytes into
            // the file), hold a whole number of elements, and every bit pattern is a
            // valid f32 and i64; bool constants were checked to hold only 0 and 1.
            DType::F32 => DataRef::F32(unsafe { cast::<f32>(bytes) }),
            DType::I64 => DataRef::I64(unsafe { cast::<i64>(bytes) }),
            DType::Bool => DataRef::Bool(unsafe { cast::<bool>(bytes) }),
        };
        TensorRef {
            shape: &k.shape,
            data,
        }
    }

    /// Write the plan file to `path` (atomically, never over what `reads` holds); its
    /// size and SHA-256, taken as it is written.
    pub fn write(&self, path: &Path, reads: &Reads) -> Result<FileEntry> {
        let header = rmp_serde::to_vec_named(&self.plan)
            .map_err(|e| PlanError::Invalid(format!("the plan does not serialize (a bug): {e}")))?;
        let data = self.data();
        let data_offset = align(PREAMBLE + header.len());
        let mut pre = Vec::with_capacity(PREAMBLE);
        pre.extend_from_slice(MAGIC);
        pre.extend_from_slice(&PLAN_FORMAT.to_le_bytes());
        pre.extend_from_slice(&0u32.to_le_bytes());
        for x in [
            header.len() as u64,
            data_offset as u64,
            data.len() as u64,
            xxh3_64(&header),
            xxh3_64(data),
            0,
        ] {
            pre.extend_from_slice(&x.to_le_bytes());
        }
        let mut entry = None;
        anyshape_files::write_atomic(path, reads, "the plan", |f| {
            let mut w = HashingWriter::new(std::io::BufWriter::with_capacity(1 << 20, f));
            w.write_all(&pre)?;
            w.write_all(&header)?;
            w.write_all(&vec![0u8; data_offset - PREAMBLE - header.len()])?;
            w.write_all(data)?;
            w.flush()?;
            entry = Some(w.finish().1);
            Ok(())
        })?;
        Ok(entry.expect("written"))
    }

    /// Map and check the plan file at `path` (see the module doc).
    pub fn open(path: &Path) -> Result<PlanFile> {
        let bad = |why: String| PlanError::File {
            path: path.display().to_string(),
            why,
        };
        if cfg!(target_endian = "big") {
            return Err(bad("plans are little-endian; this machine is not".into()));
        }
        let (file, len) = anyshape_files::open(path, u64::MAX, "a plan")?;
        if len < PREAMBLE as u64 {
            return Err(bad(format!("{len} bytes: too short for a plan")));
        }
        // SAFETY: the module's files are not changed while it is loaded (as for any
        // loaded library); the mapping is read-only and private.
        let map =
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(format!("cannot map it: {e}")))?;
        let b = &map[..];
        if &b[..8] != MAGIC {
            return Err(bad(
                "not an anyshape plan (its first bytes are not `ANYPLAN`)".into(),
            ));
        }
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let format = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if format != PLAN_FORMAT {
            return Err(bad(format!(
                "plan format {format}; this anyshape reads format {PLAN_FORMAT}: compile the model again"
            )));
        }
        let (header_len, data_offset, data_len) = (u64_at(16), u64_at(24), u64_at(32));
        let fits = |start: u64, n: u64| start.checked_add(n).is_some_and(|e| e <= len);
        if !fits(PREAMBLE as u64, header_len)
            || data_offset % 64 != 0
            || data_offset < PREAMBLE as u64 + header_len
            || !fits(data_offset, data_len)
        {
            return Err(bad(format!(
                "its lengths (header {header_len}, data {data_len} at {data_offset}) do not fit its {len} bytes: truncated or damaged"
            )));
        }
        let header = &b[PREAMBLE..PREAMBLE + header_len as usize];
        let data = &b[data_offset as usize..(data_offset + data_len) as usize];
        if xxh3_64(header) != u64_at(40) || xxh3_64(data) != u64_at(48) {
            return Err(bad(
                "its checksum does not match its content: damaged".into()
            ));
        }
        let plan: Plan = rmp_serde::from_slice(header)
            .map_err(|e| bad(format!("its header is not a plan: {e}")))?;
        crate::verify(&plan, data_len)?;
        check_bools(&plan, data)?;
        Ok(PlanFile {
            plan,
            bytes: Bytes::Mapped(map),
            data_offset: data_offset as usize,
            data_len: data_len as usize,
        })
    }
}

/// Every bool constant's bytes are 0 or 1 (the only valid `bool`s).
fn check_bools(plan: &Plan, data: &[u8]) -> Result<()> {
    for c in plan.constants.iter().filter(|c| c.dtype == DType::Bool) {
        let bytes = &data[c.offset as usize..(c.offset + c.bytes) as usize];
        if bytes.iter().any(|&x| x > 1) {
            return Err(PlanError::Invalid(format!(
                "the bool constant `{}` holds bytes other than 0 and 1",
                c.name
            )));
        }
    }
    Ok(())
}

/// `bytes` as elements of `T`.
///
/// # Safety
/// `bytes` must start at an address aligned for `T`, hold a whole number of `T`, and
/// every group of `size_of::<T>()` bytes must be a valid `T`.
unsafe fn cast<T>(bytes: &[u8]) -> &[T] {
    let n = bytes.len() / std::mem::size_of::<T>();
    debug_assert_eq!(bytes.as_ptr() as usize % std::mem::align_of::<T>(), 0);
    // SAFETY: by the caller's promise.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), n) }
}
