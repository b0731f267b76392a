//! The row-wise sketch (normalizations: softmax): rows spread over the cores in tasks
//! of `rows` rows; each row swept in passes (maximum, sum of exponentials, scale),
//! vectorized along the row `vectors` vector registers at a time; the row's tail
//! handled by the padding strategy (local padding fills a vector-sized buffer with the
//! identity of the pass, -inf).
//!
//! A [`RowKernel`] fixes every parameter; it is valid on any target (registers bound
//! `vectors`), never depending on a shape.
use crate::{CodegenError, CpuTarget, Result};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Every parameter of the row-wise sketch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowKernel {
    /// Rows per task.
    pub rows: usize,
    /// Vector registers per step along the row.
    pub vectors: usize,
}

impl RowKernel {
    /// A reasonable row kernel for `target`.
    pub fn default_for(_target: &CpuTarget) -> RowKernel {
        RowKernel {
            rows: 4,
            vectors: 2,
        }
    }

    /// Elements a step covers.
    pub fn step(&self, target: &CpuTarget) -> usize {
        self.vectors * target.lanes_f32()
    }

    /// Check the target's limits: at least one row and vector; the accumulators and
    /// the step's values fit the vector registers.
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
        if self.rows > 4096 {
            return fail("at most 4096 rows per task".into());
        }
        if 2 * self.vectors + 1 > target.vector_registers {
            return fail(format!(
                "{} vectors per step need {} vector registers; the target has {}",
                self.vectors,
                2 * self.vectors + 1,
                target.vector_registers
            ));
        }
        Ok(())
    }

    /// Parse the compact form `rows=4,vectors=2` or the JSON form.
    pub fn parse(text: &str) -> Result<RowKernel> {
        let bad = |reason: String| CodegenError::BadMicroKernelText {
            text: text.into(),
            reason,
        };
        if text.trim_start().starts_with('{') {
            return serde_json::from_str(text).map_err(|e| bad(e.to_string()));
        }
        let v = super::parse_fields(text, &["rows", "vectors"]).map_err(bad)?;
        let (rows, vectors) = (v[0], v[1]);
        match (rows, vectors) {
            (Some(rows), Some(vectors)) => Ok(RowKernel { rows, vectors }),
            _ => Err(bad("need rows and vectors".into())),
        }
    }
}

impl fmt::Display for RowKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rows={},vectors={}", self.rows, self.vectors)
    }
}

impl crate::Sketch for RowKernel {
    type Target = CpuTarget;
    const NAME: &'static str = "rows";

    fn applies(w: &anyshape_ir::Workload) -> Result<()> {
        match w.class {
            anyshape_ir::OpClass::Normalization { .. } => Ok(()),
            _ => Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: "the row-wise sketch serves normalizations".into(),
            }),
        }
    }

    fn default_for(target: &CpuTarget) -> Self {
        RowKernel::default_for(target)
    }

    fn parse(text: &str) -> Result<Self> {
        RowKernel::parse(text)
    }

    fn validate(&self, target: &CpuTarget) -> Result<()> {
        RowKernel::validate(self, target)
    }

    fn lower(p: &crate::Program<Self>, target: &CpuTarget) -> Result<crate::loop_ir::Func> {
        crate::lower::rows(p, target)
    }

    /// A task is `rows` rows; a row is padded to whole steps.
    fn adaptation(
        &self,
        target: &CpuTarget,
        w: &anyshape_ir::Workload,
        bound: &anyshape_ir::BoundWorkload,
    ) -> crate::Adaptation {
        let axes = w.output_axes();
        let extent = |a: Option<&usize>| a.map_or(1.0, |&a| bound.extents[a].max(0) as f64);
        let n = extent(axes.last());
        let rows: f64 = axes[..axes.len().saturating_sub(1)]
            .iter()
            .map(|&a| bound.extents[a].max(0) as f64)
            .product();
        let step = self.step(target) as f64;
        let padded = (n / step).ceil() * step;
        crate::Adaptation {
            tasks: (rows / self.rows as f64).ceil().max(1.0),
            slots: target.cores as f64,
            pad: if padded > 0.0 { n / padded } else { 1.0 },
        }
    }

    fn sample(target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        let max_vectors = ((target.vector_registers - 1) / 2).clamp(1, 8);
        RowKernel {
            rows: [1, 2, 4, 8, 16, 32, 64][rng.random_range(0..7)],
            vectors: rng.random_range(1..=max_vectors),
        }
    }

    fn neighbour(&self, _target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        let mut m = *self;
        if rng.random_bool(0.5) {
            m.rows = if rng.random_bool(0.5) {
                m.rows * 2
            } else {
                (m.rows / 2).max(1)
            };
        } else {
            m.vectors = (m.vectors as i64 + [-1, 1][rng.random_range(0..2)]).max(1) as usize;
        }
        m
    }

    fn child(&self, other: &Self, _target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        RowKernel {
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

    /// The rows (M).
    fn factors(
        _target: &CpuTarget,
        w: &anyshape_ir::Workload,
        bound: &anyshape_ir::BoundWorkload,
    ) -> crate::Factors {
        let axes = w.output_axes();
        let rows: i64 = axes[..axes.len().saturating_sub(1)]
            .iter()
            .map(|&a| bound.extents[a])
            .product();
        crate::Factors(vec![usize::try_from(rows).unwrap_or(1).max(1)])
    }

    fn snap(&self, _target: &CpuTarget, f: &crate::Factors) -> Self {
        let rows = (1..=self.rows.min(f.0[0]))
            .rev()
            .find(|r| f.0[0].is_multiple_of(*r))
            .unwrap_or(1);
        RowKernel { rows, ..*self }
    }

    fn divides(&self, f: &crate::Factors) -> bool {
        f.0[0].is_multiple_of(self.rows)
    }
}
