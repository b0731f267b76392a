//! Binding a workload to an instance: every shape var given a value, its extents,
//! shapes, strides and offsets evaluated ([`BoundWorkload`], on every kernel call, so
//! allocation-free when its vectors are reused) and every access checked to stay inside
//! its tensor.
use crate::workload::AffineIndex;
use crate::{Bindings, Expr, IrError, Result, Workload};

/// A workload with every shape var bound: concrete extents, shapes and strides.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoundWorkload {
    /// Extent of each axis.
    pub extents: Vec<i64>,
    /// Shape of each input, then the output.
    pub shapes: Vec<Vec<i64>>,
    /// Per tensor (inputs, then output): element stride of each axis.
    pub axis_strides: Vec<Vec<i64>>,
    /// Per tensor: element offset at the origin.
    pub offsets: Vec<i64>,
    /// Per tensor: number of elements.
    pub lens: Vec<usize>,
    /// Per tensor: how its rows are grouped when it is stored in panels.
    pub panels: Vec<Option<BoundPanels>>,
}

/// A bound tensor in panels (see [`TensorRef::panels`](crate::TensorRef::panels)): the axis of its rows, the
/// panel width and the distance between panels; its `axis_strides` are those inside a
/// panel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundPanels {
    /// The axis indexing the rows.
    pub axis: usize,
    /// Rows per panel.
    pub width: i64,
    /// Elements from one panel to the next.
    pub stride: i64,
}

impl BoundPanels {
    /// The offset of row `r`: its panel's, then its place inside the panel (a column's
    /// offset, `c · width`, comes on top).
    pub fn row_offset(&self, r: i64) -> i64 {
        r / self.width * self.stride + r % self.width
    }
}

impl BoundWorkload {
    /// The element offset of tensor `t` at `point` (one value per axis).
    pub fn offset(&self, t: usize, point: &[i64]) -> i64 {
        let strided: i64 = point
            .iter()
            .zip(&self.axis_strides[t])
            .map(|(p, s)| p * s)
            .sum();
        match self.panels[t] {
            // The row axis's stride is 1 inside a panel: move whole panels apart.
            Some(p) => {
                let r = point[p.axis];
                self.offsets[t] + strided - r + p.row_offset(r)
            }
            None => self.offsets[t] + strided,
        }
    }
}

fn product(name: &str, dims: &[i64]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
        .filter(|&n| n <= (isize::MAX as usize) / 16)
        .ok_or_else(|| IrError::TooLarge(name.to_string()))
}

impl Workload {
    /// Bind every shape var: evaluate extents, shapes and strides and check that every
    /// access stays inside its tensor.
    pub fn bind(&self, bindings: &Bindings) -> Result<BoundWorkload> {
        let mut bound = BoundWorkload::default();
        self.bind_into(bindings, &mut bound)?;
        Ok(bound)
    }

    /// [`Workload::bind`] into `bound`, whose vectors are reused: binding the same
    /// workload again allocates nothing (a decoder's step binds its attention at a new
    /// past length every run). On an error `bound` holds a partial binding.
    pub fn bind_into(&self, bindings: &Bindings, bound: &mut BoundWorkload) -> Result<()> {
        // Unbound vars are reported by `eval`; nothing here allocates on success, since
        // binding sits on every module call.
        if let Some((name, value)) = bindings.iter().find(|(_, v)| *v < 0) {
            return Err(IrError::NegativeVar {
                name: name.to_string(),
                value,
            });
        }
        // The message is built only on failure: binding sits on the module's call path.
        let nonneg = |what: &dyn Fn() -> String, e: &Expr| -> Result<i64> {
            let v = e.eval(bindings)?;
            if v < 0 {
                return Err(IrError::NegativeExtent {
                    what: format!("{} = {e}", what()),
                    value: v,
                });
            }
            Ok(v)
        };
        let BoundWorkload {
            extents,
            shapes,
            axis_strides,
            offsets,
            lens,
            panels,
        } = bound;
        extents.clear();
        for a in &self.axes {
            extents.push(nonneg(&|| format!("extent of axis {}", a.name), &a.extent)?);
        }
        let empty = extents.contains(&0);
        let n = self.inputs.len() + 1;
        shapes.resize_with(n, Vec::new);
        axis_strides.resize_with(n, Vec::new);
        offsets.clear();
        lens.clear();
        panels.clear();
        for ((t, shape), strides_of) in self
            .tensors()
            .zip(shapes.iter_mut())
            .zip(axis_strides.iter_mut())
        {
            shape.clear();
            for (d, e) in t.shape.iter().enumerate() {
                shape.push(nonneg(&|| format!("{}.shape[{d}]", t.name), e)?);
            }
            // A batch of matrices in panels: the rows and columns are the last two
            // dimensions (validation allows no other rank).
            let rows_dim = shape.len().saturating_sub(2);
            let bound_panels = match t.panels {
                Some(width) => Some(BoundPanels {
                    axis: t.index[rows_dim].plain_axis().unwrap_or(0),
                    width,
                    stride: width
                        .checked_mul(shape[rows_dim + 1])
                        .ok_or_else(|| IrError::TooLarge(t.name.clone()))?,
                }),
                None => None,
            };
            // Whole panels: ⌈rows / width⌉ (without overflow for any width).
            let panels_of = |p: &BoundPanels| match shape[rows_dim] {
                0 => 0,
                rows => (rows - 1) / p.width + 1,
            };
            // (Binding runs before every kernel call: nothing here allocates.)
            let len = match &bound_panels {
                Some(p) => product(&t.name, &shape[..rows_dim])?
                    .checked_mul(product(&t.name, &[panels_of(p), p.stride])?)
                    .filter(|&n| n <= (isize::MAX as usize) / 16)
                    .ok_or_else(|| IrError::TooLarge(t.name.clone()))?,
                None => product(&t.name, shape)?,
            };
            for (d, ix) in t.index.iter().enumerate() {
                let (mut lo, mut hi) = (ix.offset, ix.offset);
                for &(a, c) in &ix.terms {
                    let reach = c
                        .checked_mul(extents[a].saturating_sub(1))
                        .ok_or_else(|| IrError::TooLarge(t.name.clone()))?;
                    if reach < 0 {
                        lo += reach
                    } else {
                        hi += reach
                    }
                }
                if !empty && (lo < 0 || hi >= shape[d]) {
                    return Err(IrError::OutOfBounds {
                        tensor: t.name.clone(),
                        dim: d,
                        index: if lo < 0 { lo } else { hi },
                        extent: shape[d],
                    });
                }
            }
            // Numerically from the bound shape (the same values `axis_stride` and
            // `base_offset` give symbolically, without building expressions); the
            // tensor's strides are kept in `strides_of` until they are dotted.
            let rank = shape.len();
            strides_of.clear();
            strides_of.resize(rank, 1);
            match &bound_panels {
                Some(p) => {
                    strides_of[rows_dim + 1] = p.width;
                    if rows_dim == 1 {
                        strides_of[0] = panels_of(p)
                            .checked_mul(p.stride)
                            .ok_or_else(|| IrError::TooLarge(t.name.clone()))?;
                    }
                }
                None => {
                    for d in (0..rank.saturating_sub(1)).rev() {
                        strides_of[d] = strides_of[d + 1] * shape[d + 1];
                    }
                }
            }
            let dot = |strides: &[i64], f: &dyn Fn(&AffineIndex) -> i64| -> Result<i64> {
                strides.iter().zip(&t.index).try_fold(0i64, |acc, (s, ix)| {
                    s.checked_mul(f(ix))
                        .and_then(|x| acc.checked_add(x))
                        .ok_or_else(|| IrError::TooLarge(t.name.clone()))
                })
            };
            offsets.push(dot(strides_of, &|ix| ix.offset)?);
            // The axes' strides follow the tensor's in the same vector, then replace
            // them (no second vector per tensor).
            for a in 0..self.axes.len() {
                let v = dot(&strides_of[..rank], &|ix| ix.coeff(a))?;
                strides_of.push(v);
            }
            strides_of.drain(..rank);
            lens.push(len);
            panels.push(bound_panels);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_instances() {
        let w = Workload::parse("batch_matmul_nn(B=2,M=T,N=64,K=T)").unwrap();
        let b = w.bind(&Bindings::from_pairs([("T", 5)])).unwrap();
        assert_eq!(b.extents, vec![2, 5, 64, 5]);
        // W[b,k,n]: strides b = 5*64, k = 64, n = 1.
        assert_eq!(b.axis_strides[1], vec![320, 0, 1, 64]);
        assert_eq!(b.lens, vec![50, 640, 640]);
        assert_eq!(w.flops(&b), 2.0 * 2.0 * 5.0 * 64.0 * 5.0);
        assert_eq!(w.bytes(&b), 4.0 * (50.0 + 640.0 + 640.0));
    }

    #[test]
    fn rejects_bad_bindings_clearly() {
        let w = Workload::parse("dense(M=16*T,N=2304,K=768)").unwrap();
        assert_eq!(
            w.bind(&Bindings::default()),
            Err(IrError::Unbound("T".into()))
        );
        assert!(matches!(
            w.bind(&Bindings::from_pairs([("T", -1)])),
            Err(IrError::NegativeVar { .. })
        ));
        let w = Workload::parse("dense(M=T-10,N=4,K=4)").unwrap();
        assert!(matches!(
            w.bind(&Bindings::from_pairs([("T", 3)])),
            Err(IrError::NegativeExtent { .. })
        ));
    }
}
