//! The fused attention sketch on the CPU ([`AttentionKernel`]): one task per (batch,
//! head), the keys packed once per task transposed (`Kᵀ`, vectors along the keys),
//! then the queries in blocks of `rows` rows: the block's scores against every key into
//! a scratch row block (a register tile of `rows x vectors` vectors along the keys),
//! the softmax of each row in place, then the context (a register tile of `rows x
//! vectors` vectors along the head dim, the values read in place) scaled by each row's
//! `1 / Σ` as it is stored. The scores never reach memory beyond one block's
//! `rows x N`.
//!
//! An [`AttentionKernel`] fixes every parameter; it is valid on any target whose vector
//! registers hold the accumulators, never depending on a shape. Its tails are handled
//! one way whatever the padding strategy: the packed keys and the query block are
//! zero-filled to whole tiles, the softmax's tail is scalar and the stores past the
//! last row are skipped.
use crate::{CodegenError, CpuTarget, Result};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Every parameter of the fused attention sketch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionKernel {
    /// Query rows per block (the register tile's rows in both products).
    pub rows: usize,
    /// Vector registers per tile row: along the keys in the scores, along the head
    /// dim in the context.
    pub vectors: usize,
}

impl AttentionKernel {
    /// A reasonable kernel for `target`: the largest of a few tiles that fits its
    /// registers.
    pub fn default_for(target: &CpuTarget) -> AttentionKernel {
        [(6, 4), (4, 3), (4, 2), (2, 2), (1, 1)]
            .into_iter()
            .map(|(rows, vectors)| AttentionKernel { rows, vectors })
            .find(|k| k.validate(target).is_ok())
            .unwrap_or(AttentionKernel {
                rows: 1,
                vectors: 1,
            })
    }

    /// Elements a tile row covers.
    pub fn width(&self, target: &CpuTarget) -> usize {
        self.vectors * target.lanes_f32()
    }

    /// Check the target's limits: at least one row and vector, at most 64 rows; the
    /// accumulators, a row of loads and a broadcast fit the vector registers.
    pub fn validate(&self, target: &CpuTarget) -> Result<()> {
        let fail = |reason: String| {
            Err(CodegenError::InvalidMicroKernel {
                micro_kernel: self.to_string(),
                reason,
            })
        };
        if self.rows == 0 || self.vectors == 0 {
            return fail("rows and vectors must be at least 1".into());
        }
        if self.rows > 64 {
            return fail("at most 64 rows per block".into());
        }
        let need = self.rows * self.vectors + self.vectors + 1;
        if need > target.vector_registers {
            return fail(format!(
                "a tile of {} x {} vectors needs {need} vector registers; the target has {}",
                self.rows, self.vectors, target.vector_registers
            ));
        }
        Ok(())
    }

    /// Parse the compact form `rows=6,vectors=4` or the JSON form.
    pub fn parse(text: &str) -> Result<AttentionKernel> {
        let bad = |reason: String| CodegenError::BadMicroKernelText {
            text: text.into(),
            reason,
        };
        if text.trim_start().starts_with('{') {
            return serde_json::from_str(text).map_err(|e| bad(e.to_string()));
        }
        let v = super::parse_fields(text, &["rows", "vectors"]).map_err(bad)?;
        match (v[0], v[1]) {
            (Some(rows), Some(vectors)) => Ok(AttentionKernel { rows, vectors }),
            _ => Err(bad("need rows and vectors".into())),
        }
    }
}

impl fmt::Display for AttentionKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rows={},vectors={}", self.rows, self.vectors)
    }
}

/// The extents of an attention instance: batch, heads, query rows, keys, head dim.
fn extents(bound: &anyshape_ir::BoundWorkload) -> [f64; 5] {
    let e = |a: usize| bound.extents.get(a).copied().unwrap_or(0).max(0) as f64;
    [e(0), e(1), e(2), e(4), e(3)]
}

impl crate::Sketch for AttentionKernel {
    type Target = CpuTarget;
    const NAME: &'static str = "attention";

    fn applies(w: &anyshape_ir::Workload) -> Result<()> {
        match w.class {
            anyshape_ir::OpClass::Attention(_) => Ok(()),
            _ => Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: "the attention sketch serves fused attentions".into(),
            }),
        }
    }

    fn default_for(target: &CpuTarget) -> Self {
        AttentionKernel::default_for(target)
    }

    fn parse(text: &str) -> Result<Self> {
        AttentionKernel::parse(text)
    }

    fn validate(&self, target: &CpuTarget) -> Result<()> {
        AttentionKernel::validate(self, target)
    }

    fn lower(p: &crate::Program<Self>, target: &CpuTarget) -> Result<crate::loop_ir::Func> {
        crate::lower::attention(p, target)
    }

    /// A task is one (batch, head); the query rows are padded to whole blocks, the keys
    /// and the head dim to whole tile rows.
    fn adaptation(
        &self,
        target: &CpuTarget,
        _w: &anyshape_ir::Workload,
        bound: &anyshape_ir::BoundWorkload,
    ) -> crate::Adaptation {
        let [b, h, m, n, d] = extents(bound);
        let up = |x: f64, to: usize| (x / to as f64).ceil() * to as f64;
        let width = self.width(target);
        let padded = up(m, self.rows) * (up(n, width) * d + n * up(d, width));
        crate::Adaptation {
            tasks: (b * h).max(1.0),
            slots: target.cores as f64,
            pad: if padded > 0.0 {
                2.0 * m * n * d / padded
            } else {
                1.0
            },
        }
    }

    fn sample(target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        loop {
            let k = AttentionKernel {
                rows: rng.random_range(1..=12),
                vectors: rng.random_range(1..=4),
            };
            if k.validate(target).is_ok() {
                return k;
            }
        }
    }

    fn neighbour(&self, _target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        let step = [-1, 1][rng.random_range(0..2)];
        let mut k = *self;
        if rng.random_bool(0.5) {
            k.rows = (k.rows as i64 + step).max(1) as usize;
        } else {
            k.vectors = (k.vectors as i64 + step).max(1) as usize;
        }
        k
    }

    fn child(&self, other: &Self, _target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        AttentionKernel {
            rows: if rng.random_bool(0.5) {
                self.rows
            } else {
                other.rows
            },
            vectors: if rng.random_bool(0.5) {
                self.vectors
            } else {
                other.vectors
            },
        }
    }

    /// The query rows (M).
    fn factors(
        _target: &CpuTarget,
        _w: &anyshape_ir::Workload,
        bound: &anyshape_ir::BoundWorkload,
    ) -> crate::Factors {
        let m = bound.extents.get(2).copied().unwrap_or(1);
        crate::Factors(vec![usize::try_from(m).unwrap_or(1).max(1)])
    }

    fn snap(&self, _target: &CpuTarget, f: &crate::Factors) -> Self {
        let rows = (1..=self.rows.min(f.0[0]))
            .rev()
            .find(|r| f.0[0].is_multiple_of(*r))
            .unwrap_or(1);
        AttentionKernel { rows, ..*self }
    }

    fn divides(&self, f: &crate::Factors) -> bool {
        f.0[0].is_multiple_of(self.rows)
    }
}
