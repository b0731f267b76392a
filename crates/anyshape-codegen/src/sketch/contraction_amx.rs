//! The contraction sketch's AMX variant (`ContractionKernel::amx`): the shapes of its
//! register tiles, a micro-kernel as such a tile, and which workloads the tiles run.
//! Its lowering is `lower/amx.rs`, its default among the seeds in `contraction_seeds.rs`.
use super::contraction::ContractionKernel;
use crate::GemmView;
use anyshape_ir::{Precision, TensorRef, Workload};

/// The shapes (`mr/16`, `nr/16`) of an AMX register tile: its output tiles, one A tile
/// per row of them and one B tile per column, within the eight tile registers.
pub const AMX_TILES: [(usize, usize); 6] = [(1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (2, 2)];

/// Rows (and columns, and reduction words) of one AMX tile.
pub const AMX_EDGE: usize = 16;

impl ContractionKernel {
    /// As an AMX register tile: the allowed shape nearest `mr x nr` (in tiles of 16),
    /// the cache tiles keeping their counts of register tiles, `kc` 16 and `uk` 1, the
    /// other variants' flags cleared.
    pub(super) fn fit_amx(&self) -> Self {
        let (rows, cols) = (self.mr.div_ceil(AMX_EDGE), self.nr.div_ceil(AMX_EDGE));
        let (r, c) = AMX_TILES
            .into_iter()
            .min_by_key(|&(r, c)| r.abs_diff(rows) + c.abs_diff(cols))
            .expect("AMX tile shapes");
        let (mr, nr) = (r * AMX_EDGE, c * AMX_EDGE);
        ContractionKernel {
            mr,
            nr,
            mc: (self.mc / self.mr).max(1) * mr,
            nc: (self.nc / self.nr).max(1) * nr,
            kc: AMX_EDGE,
            uk: 1,
            dot: false,
            pf: false,
            ia: false,
            ib: false,
            vm: false,
            amx: true,
        }
    }
}

/// Whether `w` can run on AMX tiles (`ContractionKernel::amx`): a bf16 contraction whose
/// second operand is a weight in panels of 16 words along N, each panel `[K, 16]` (a
/// tile's rows 64 bytes apart), or is read in pairs (attention's keys, packed so), whose
/// first operand's pairs are contiguous along K, whose reduction is a constant number of
/// whole tiles (16 words, 32 bfloat16), and whose output is contiguous along N.
pub fn amx_runs(w: &Workload) -> bool {
    let Ok(g) = GemmView::of(w) else {
        return false;
    };
    let stride = |t: &TensorRef, axis: usize| t.axis_stride(axis).simplify().as_const();
    let (a, b) = (&w.inputs[0], &w.inputs[1]);
    let b_tiles = match b.panels {
        Some(p) => {
            p == AMX_EDGE as i64
                && stride(b, g.n) == Some(1)
                && stride(b, g.k) == Some(AMX_EDGE as i64)
        }
        None => stride(b, g.k) == Some(2),
    };
    w.precision == Precision::Bf16
        && b_tiles
        && stride(a, g.k) == Some(2)
        && stride(&w.output, g.n) == Some(1)
        && w.axes[g.k]
            .extent
            .as_const()
            .is_some_and(|k| k > 0 && k % AMX_EDGE as i64 == 0)
}
