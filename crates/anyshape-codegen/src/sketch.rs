//! The CPU sketch for contractions and its micro-kernels.
//!
//! The sketch (BLIS-like): the output is split into cache tiles `mc x nc` (one task per
//! batch index and cache tile, tasks spread over the cores); for each reduction tile of
//! `kc` the task packs an `mc x kc` block of the M-side input and a `kc x nc` block of the
//! N-side input into local buffers, then runs a register tile of `mr x nr` accumulators
//! (vectorized along N, unrolled) over each pair of packed micro-panels, with the
//! reduction loop unrolled by `uk`.
//!
//! A [`MicroKernel`] fixes every parameter. Its validity depends on the target only
//! (registers, caches), never on a shape: any tile size is allowed, factor or not.
use crate::{CodegenError, CpuTarget, Result};
use anyshape_ir::{AxisKind, BoundWorkload, Workload};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The contraction seen as a batched GEMM: which axes play the roles of batch, M, N, K.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmView {
    /// Spatial axes used by both inputs.
    pub batch: Vec<usize>,
    /// The spatial axis of input 0 only.
    pub m: usize,
    /// The spatial axis of input 1 only.
    pub n: usize,
    /// The reduction axis.
    pub k: usize,
}

impl GemmView {
    /// Classify the axes of a two-input contraction; errors say why the sketch does not apply.
    pub fn of(w: &Workload) -> Result<GemmView> {
        let fail = |reason: &str| CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: reason.into(),
        };
        let [a, b] = w.inputs.as_slice() else {
            return Err(fail("it needs exactly two inputs"));
        };
        let (mut batch, mut ms, mut ns, mut ks) = (vec![], vec![], vec![], vec![]);
        for (i, axis) in w.axes.iter().enumerate() {
            match (axis.kind, a.uses_axis(i), b.uses_axis(i)) {
                (AxisKind::Reduction, true, true) => ks.push(i),
                (AxisKind::Spatial, true, true) => batch.push(i),
                (AxisKind::Spatial, true, false) => ms.push(i),
                (AxisKind::Spatial, false, true) => ns.push(i),
                _ => {
                    return Err(fail(&format!(
                        "axis {} is not used like a GEMM axis",
                        axis.name
                    )))
                }
            }
        }
        match (ms.as_slice(), ns.as_slice(), ks.as_slice()) {
            ([m], [n], [k]) => Ok(GemmView {
                batch,
                m: *m,
                n: *n,
                k: *k,
            }),
            _ => Err(fail("it needs exactly one M, one N and one reduction axis")),
        }
    }
}

/// One matrix of a strided batched GEMM: offset, batch, row and column strides, in
/// elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmOperand {
    /// Element offset of the first batch item's origin.
    pub offset: i64,
    /// Stride between batch items.
    pub batch: i64,
    /// Stride between rows.
    pub row: i64,
    /// Stride between columns.
    pub col: i64,
}

/// An instance of a contraction as a strided batched GEMM `c[i] = a[i] · b[i]` (what
/// BLAS-style libraries take): A is `m × k`, B `k × n`, C `m × n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StridedGemm {
    /// Batch items.
    pub batch: usize,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// The reduction.
    pub k: usize,
    /// Input 0.
    pub a: GemmOperand,
    /// Input 1.
    pub b: GemmOperand,
    /// The output.
    pub c: GemmOperand,
}

impl StridedGemm {
    /// The bound instance of `w` as a strided batched GEMM; an error for more than one
    /// batch axis (the epilogue is the caller's to refuse or apply).
    pub fn of(w: &Workload, bound: &BoundWorkload) -> Result<StridedGemm> {
        let g = GemmView::of(w)?;
        if g.batch.len() > 1 {
            return Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: "a strided batched GEMM has at most one batch axis".into(),
            });
        }
        let operand = |t: usize, [r, c]: [usize; 2]| GemmOperand {
            offset: bound.offsets[t],
            batch: g.batch.first().map_or(0, |&x| bound.axis_strides[t][x]),
            row: bound.axis_strides[t][r],
            col: bound.axis_strides[t][c],
        };
        let extent = |a: usize| bound.extents[a].max(0) as usize;
        Ok(StridedGemm {
            batch: g.batch.first().map_or(1, |&x| extent(x)),
            m: extent(g.m),
            n: extent(g.n),
            k: extent(g.k),
            a: operand(0, [g.m, g.k]),
            b: operand(1, [g.k, g.n]),
            c: operand(w.inputs.len(), [g.m, g.n]),
        })
    }
}

/// Every parameter of the contraction sketch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MicroKernel {
    /// Register tile rows (along M).
    pub mr: usize,
    /// Register tile columns (along N, vectorized; a multiple of the vector lanes).
    pub nr: usize,
    /// Cache tile along M (a multiple of `mr`).
    pub mc: usize,
    /// Cache tile along N (a multiple of `nr`).
    pub nc: usize,
    /// Cache tile along the reduction (a multiple of `uk`).
    pub kc: usize,
    /// Unroll factor of the reduction loop.
    pub uk: usize,
}

const FIELDS: [&str; 6] = ["mr", "nr", "mc", "nc", "kc", "uk"];

impl MicroKernel {
    /// A reasonable micro-kernel for `target`, used when none is given.
    pub fn default_for(target: &CpuTarget) -> MicroKernel {
        let lanes = target.lanes_f32();
        let nv = 2;
        let mr = ((target.vector_registers - nv - 1) / nv).clamp(1, 12);
        let nr = nv * lanes;
        let kc = (target.l1d_bytes / 2 / (4 * nr)).clamp(4, 512) / 4 * 4;
        let mc = ((target.l2_bytes / 2 / (4 * kc)).clamp(mr, 16 * mr) / mr) * mr;
        MicroKernel {
            mr,
            nr,
            mc: mc.min(8 * mr),
            nc: (12 * nr).min(384.max(nr)),
            kc,
            uk: 4,
        }
    }

    fn values(&self) -> [usize; 6] {
        [self.mr, self.nr, self.mc, self.nc, self.kc, self.uk]
    }

    /// Parse the compact form `mr=12,nr=32,mc=96,nc=384,kc=256,uk=4` or the JSON form.
    pub fn parse(text: &str) -> Result<MicroKernel> {
        let bad = |reason: String| CodegenError::BadMicroKernelText {
            text: text.into(),
            reason,
        };
        if text.trim_start().starts_with('{') {
            return serde_json::from_str(text).map_err(|e| bad(e.to_string()));
        }
        let mut v: [Option<usize>; 6] = [None; 6];
        for part in text.split(',') {
            let (k, val) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("`{part}` is not `NAME=VALUE`")))?;
            let slot = FIELDS.iter().position(|f| *f == k.trim()).ok_or_else(|| {
                bad(format!(
                    "unknown parameter `{}` (known: {})",
                    k.trim(),
                    FIELDS.join(", ")
                ))
            })?;
            let val = val
                .trim()
                .parse()
                .map_err(|_| bad(format!("`{}` is not a positive whole number", val.trim())))?;
            if v[slot].is_some() {
                return Err(bad(format!("`{}` is given twice", FIELDS[slot])));
            }
            v[slot] = Some(val);
        }
        let missing: Vec<_> = FIELDS
            .iter()
            .zip(&v)
            .filter(|(_, x)| x.is_none())
            .map(|(f, _)| *f)
            .collect();
        if !missing.is_empty() {
            return Err(bad(format!("missing {}", missing.join(", "))));
        }
        let [mr, nr, mc, nc, kc, uk] = v.map(|x| x.unwrap_or(0));
        Ok(MicroKernel {
            mr,
            nr,
            mc,
            nc,
            kc,
            uk,
        })
    }

    /// Vector registers the register tile needs: accumulators, one row of B, one broadcast.
    pub fn registers_needed(&self, lanes: usize) -> usize {
        let nv = self.nr / lanes.max(1);
        self.mr * nv + nv + 1
    }

    /// Check every limit of the target; the error names the broken one.
    pub fn validate(&self, target: &CpuTarget) -> Result<()> {
        let fail = |reason: String| {
            Err(CodegenError::InvalidMicroKernel {
                micro_kernel: self.to_string(),
                reason,
            })
        };
        let lanes = target.lanes_f32();
        if self.values().contains(&0) {
            return fail("every parameter must be at least 1".into());
        }
        if !self.nr.is_multiple_of(lanes) {
            return fail(format!(
                "nr = {} is not a multiple of the {lanes} vector lanes",
                self.nr
            ));
        }
        for (tile, reg, name) in [
            (self.mc, self.mr, "mc/mr"),
            (self.nc, self.nr, "nc/nr"),
            (self.kc, self.uk, "kc/uk"),
        ] {
            if !tile.is_multiple_of(reg) {
                return fail(format!("{name}: {tile} is not a multiple of {reg}"));
            }
        }
        if self.uk > 16 || self.mr > 32 {
            return fail("uk must be <= 16 and mr <= 32 (code size)".into());
        }
        let regs = self.registers_needed(lanes);
        if regs > target.vector_registers {
            return fail(format!(
                "the {}x{} register tile needs {regs} vector registers; the target has {}",
                self.mr, self.nr, target.vector_registers
            ));
        }
        let bytes = |a: usize, b: usize| a.saturating_mul(b).saturating_mul(4);
        let checks = [
            (
                bytes(self.kc, self.nr),
                target.l1d_bytes,
                "packed kc x nr micro-panel",
                "L1d",
            ),
            (
                bytes(self.mc, self.kc),
                target.l2_bytes,
                "packed mc x kc block",
                "L2",
            ),
            (
                bytes(self.kc, self.nc),
                target.l3_bytes,
                "packed kc x nc block",
                "L3",
            ),
        ];
        for (need, have, what, cache) in checks {
            if need > have {
                return fail(format!(
                    "the {what} takes {need} bytes; {cache} holds {have}"
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for MicroKernel {
    /// The compact form [`MicroKernel::parse`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<_> = FIELDS
            .iter()
            .zip(self.values())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        write!(f, "{}", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Simd;

    fn avx512() -> CpuTarget {
        CpuTarget {
            name: "test".into(),
            cores: 2,
            simd: Simd::Avx512,
            vector_registers: 32,
            l1d_bytes: 48 << 10,
            l2_bytes: 2 << 20,
            l3_bytes: 32 << 20,
        }
    }

    #[test]
    fn default_is_valid_on_several_targets() {
        for simd in [Simd::None, Simd::Sse, Simd::Avx2, Simd::Avx512] {
            let t = CpuTarget {
                simd,
                vector_registers: if simd == Simd::Avx512 { 32 } else { 16 },
                ..avx512()
            };
            let mk = MicroKernel::default_for(&t);
            mk.validate(&t).unwrap_or_else(|e| panic!("{simd:?}: {e}"));
            assert_eq!(MicroKernel::parse(&mk.to_string()).unwrap(), mk);
        }
    }

    #[test]
    fn rejects_what_breaks_the_target() {
        let t = avx512();
        for text in [
            "mr=16,nr=32,mc=96,nc=384,kc=256,uk=4",
            "mr=12,nr=24,mc=96,nc=384,kc=256,uk=4",
            "mr=12,nr=32,mc=100,nc=384,kc=256,uk=4",
            "mr=12,nr=32,mc=96,nc=384,kc=8192,uk=4",
            "mr=0,nr=32,mc=96,nc=384,kc=256,uk=4",
        ] {
            let err = MicroKernel::parse(text).unwrap().validate(&t).unwrap_err();
            assert!(
                matches!(err, CodegenError::InvalidMicroKernel { .. }),
                "{text}"
            );
        }
        for text in [
            "mr=12",
            "mr=x,nr=1,mc=1,nc=1,kc=1,uk=1",
            "zz=1",
            "{\"mr\":1}",
            "mr=1,mr=2,nr=16,mc=1,nc=16,kc=4,uk=4",
            "{\"mr\":1,\"nr\":16,\"mc\":1,\"nc\":16,\"kc\":4,\"uk\":4,\"zz\":1}",
            "{\"mr\":1,\"mr\":2,\"nr\":16,\"mc\":1,\"nc\":16,\"kc\":4,\"uk\":4}",
        ] {
            assert!(MicroKernel::parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn classifies_builtin_contractions() {
        let w = Workload::parse("batch_matmul_nn(B=2,M=T,N=64,K=T)").unwrap();
        assert_eq!(
            GemmView::of(&w).unwrap(),
            GemmView {
                batch: vec![0],
                m: 1,
                n: 2,
                k: 3
            }
        );
        let w = Workload::parse("dense(M=T,N=64,K=T)").unwrap();
        assert_eq!(
            GemmView::of(&w).unwrap(),
            GemmView {
                batch: vec![],
                m: 0,
                n: 1,
                k: 2
            }
        );
    }
}
