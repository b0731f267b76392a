//! Ops that read or write elements at indices given as data: `GatherElements` (RoBERTa's
//! position ids, `torch.gather`), `ScatterElements` and `ScatterND` (in-place index
//! writes as exporters write them), each write optionally a reduction (`add`, `mul`,
//! `max`, `min`), and opset 24's `TensorScatter` (a cache's new rows written from each
//! item's position, linear or circular). Every index is checked against its axis: an
//! index out of range is an error, never a read or write elsewhere.
use super::{fail, infer_same, req, sized, strided_walk, OpSpec};
use crate::node::Node;
use crate::{Data, DataRef, Fact, Result, Tensor, TensorRef};

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "GatherElements",
        since: 11,
        infer: infer_gather_elements,
        eval: eval_gather_elements,
        eval_into: None,
    },
    OpSpec {
        // Opsets 9 and 10 name ScatterElements (without its reduction) so.
        name: "Scatter",
        since: 9,
        infer: infer_same,
        eval: eval_scatter_elements,
        eval_into: None,
    },
    OpSpec {
        name: "ScatterElements",
        since: 11,
        infer: infer_same,
        eval: eval_scatter_elements,
        eval_into: None,
    },
    OpSpec {
        name: "ScatterND",
        since: 11,
        infer: infer_same,
        eval: eval_scatter_nd,
        eval_into: None,
    },
    OpSpec {
        name: "TensorScatter",
        since: 24,
        infer: infer_same,
        eval: eval_tensor_scatter,
        eval_into: None,
    },
];

fn infer_gather_elements(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, i) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if x.rank() != i.rank() {
        return fail(node, "the indices must have the rank of the data");
    }
    Ok(vec![Fact::new(x.dtype, i.shape.to_vec())])
}

/// An index along an axis of `d` elements (negative counts from the end), checked.
fn resolve(node: &Node, given: i64, d: usize, axis: usize) -> Result<usize> {
    let d = d as i64;
    let k = if given < 0 { given + d } else { given };
    if !(0..d).contains(&k) {
        return fail(
            node,
            format!("index {given} is out of range [-{d}, {d}) of axis {axis} of the data"),
        );
    }
    Ok(k as usize)
}

/// For each element of the indices (shape `ishape`, every axis but `a` no longer than
/// the data's), the flat offset in the data (shape `xshape`) it names.
fn element_offsets(
    node: &Node,
    xshape: &[usize],
    ishape: &[usize],
    idx: &[i64],
    a: usize,
) -> Result<Vec<usize>> {
    if xshape.len() != ishape.len() {
        return fail(node, "the indices must have the rank of the data");
    }
    if let Some(d) = (0..xshape.len()).find(|&d| d != a && ishape[d] > xshape[d]) {
        return fail(
            node,
            format!(
                "the indices' axis {d} ({}) is longer than the data's ({})",
                ishape[d], xshape[d]
            ),
        );
    }
    let xs = crate::strides(xshape);
    let mut base_strides = xs.clone();
    base_strides[a] = 0;
    strided_walk(ishape, &base_strides)
        .into_iter()
        .zip(idx)
        .map(|(base, &given)| Ok(base + resolve(node, given, xshape[a], a)? * xs[a]))
        .collect()
}

fn eval_gather_elements(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, i) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let a = super::axis(node, node.int("axis", 0)?, x.shape.len())?;
    let idx = i.as_i64().map_err(|e| node.error(e))?;
    let offsets = element_offsets(node, x.shape, i.shape, idx, a)?;
    Ok(vec![Tensor::new(i.shape.to_vec(), x.data.pick(&offsets))?])
}

/// How a scatter combines an update with the element it lands on.
#[derive(Clone, Copy, PartialEq)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn reduction(node: &Node) -> Result<Reduction> {
    Ok(match node.string("reduction", "none")?.as_str() {
        "none" => Reduction::None,
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        other => return fail(node, format!("reduction `{other}` is not one ONNX defines")),
    })
}

/// A copy of `data` with `updates[j]` written (or combined by `how`) at `offsets[j]`,
/// in order.
fn scatter(
    node: &Node,
    data: DataRef,
    updates: DataRef,
    offsets: &[usize],
    how: Reduction,
) -> Result<Data> {
    fn put<T: Copy>(
        data: &[T],
        updates: &[T],
        offsets: &[usize],
        combine: impl Fn(T, T) -> T,
    ) -> Vec<T> {
        let mut out = data.to_vec();
        for (&at, &u) in offsets.iter().zip(updates) {
            out[at] = combine(out[at], u);
        }
        out
    }
    Ok(match (data, updates, how) {
        (DataRef::F32(d), DataRef::F32(u), how) => Data::F32(put(
            d,
            u,
            offsets,
            match how {
                Reduction::None => |_, u| u,
                Reduction::Add => |x, u| x + u,
                Reduction::Mul => |x, u| x * u,
                Reduction::Max => f32::max,
                Reduction::Min => f32::min,
            },
        )),
        (DataRef::I64(d), DataRef::I64(u), how) => Data::I64(put(
            d,
            u,
            offsets,
            match how {
                Reduction::None => |_, u| u,
                Reduction::Add => i64::wrapping_add,
                Reduction::Mul => i64::wrapping_mul,
                Reduction::Max => i64::max,
                Reduction::Min => i64::min,
            },
        )),
        (DataRef::Bool(d), DataRef::Bool(u), Reduction::None) => {
            Data::Bool(put(d, u, offsets, |_, u| u))
        }
        (d, u, _) => {
            return fail(
                node,
                format!(
                    "updates of {} into data of {} (with this reduction)",
                    u.dtype(),
                    d.dtype()
                ),
            )
        }
    })
}

fn eval_scatter_elements(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, i, u) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    if i.shape != u.shape {
        return fail(node, "the updates must have the indices' shape");
    }
    let a = super::axis(node, node.int("axis", 0)?, x.shape.len())?;
    let idx = i.as_i64().map_err(|e| node.error(e))?;
    let offsets = element_offsets(node, x.shape, i.shape, idx, a)?;
    let data = scatter(node, x.data, u.data, &offsets, reduction(node)?)?;
    Ok(vec![Tensor::new(x.shape.to_vec(), data)?])
}

/// `ScatterND(data, indices, updates)`: each row of the indices' last axis (`k` long)
/// names a slice `data[i_0, …, i_{k-1}, :, …]`, which the matching block of the updates
/// (shape `indices.shape[..-1] ++ data.shape[k..]`) replaces or is combined into.
fn eval_scatter_nd(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, i, u) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let Some((&k, lead)) = i.shape.split_last() else {
        return fail(node, "the indices must have rank 1 or more");
    };
    if k > x.shape.len() {
        return fail(node, "indices deeper than the data");
    }
    let want: Vec<usize> = lead.iter().chain(&x.shape[k..]).copied().collect();
    if u.shape != want.as_slice() {
        return fail(
            node,
            format!("the updates' shape {:?} is not {want:?}", u.shape),
        );
    }
    let idx = i.as_i64().map_err(|e| node.error(e))?;
    let inner: usize = x.shape[k..].iter().product();
    let xs = crate::strides(x.shape);
    let rows: usize = lead.iter().product();
    let mut offsets = Vec::with_capacity(sized(node, &[rows, inner])?);
    for r in 0..rows {
        let mut at = 0;
        for j in 0..k {
            at += resolve(node, idx[r * k + j], x.shape[j], j)? * xs[j];
        }
        offsets.extend(at..at + inner);
    }
    let data = scatter(node, x.data, u.data, &offsets, reduction(node)?)?;
    Ok(vec![Tensor::new(x.shape.to_vec(), data)?])
}

/// `TensorScatter` (opset 24): a copy of the cache (`past_cache`) with `update` written
/// along `axis` from each batch item's write index (`write_indices`, zeros without it);
/// `circular` wraps past the cache's end, `linear` must fit (an error otherwise).
fn eval_tensor_scatter(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (cache, update) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let rank = cache.shape.len();
    let a = super::axis(node, node.int("axis", -2)?, rank)?;
    let circular = match node.string("mode", "linear")?.as_str() {
        "linear" => false,
        "circular" => true,
        other => return fail(node, format!("mode `{other}`: linear or circular")),
    };
    if a == 0 || update.shape.len() != rank {
        return fail(
            node,
            "the update must have the cache's rank, the axis after the batch",
        );
    }
    let fits = (0..rank).all(|i| match i == a {
        true => update.shape[i] <= cache.shape[i],
        false => update.shape[i] == cache.shape[i],
    });
    if !fits {
        return fail(
            node,
            format!(
                "an update of {:?} into a cache of {:?}",
                update.shape, cache.shape
            ),
        );
    }
    let batch = cache.shape[0];
    let starts: Vec<i64> = match ins.get(2).copied().flatten() {
        Some(w) if w.shape == [batch] => w.as_i64().map_err(|e| node.error(e))?.to_vec(),
        Some(w) => {
            return fail(
                node,
                format!("write indices of {:?} for {batch} items", w.shape),
            )
        }
        None => vec![0; batch],
    };
    let (max_len, len) = (cache.shape[a], update.shape[a]);
    let inner: usize = cache.shape[a + 1..].iter().product();
    // The cache's rows before the axis, each `max_len` slots of `inner` elements.
    let rows: usize = cache.shape[..a].iter().product();
    let per_item = rows / batch.max(1);
    let mut out = cache.to_tensor();
    let dst = out.f32_mut().map_err(|e| node.error(e))?;
    let src = update.as_f32().map_err(|e| node.error(e))?;
    for row in 0..rows {
        let start = starts[row / per_item.max(1)];
        for s in 0..len {
            let at = start + s as i64;
            let slot = match circular {
                true => at.rem_euclid(max_len.max(1) as i64) as usize,
                false if (0..max_len as i64).contains(&at) => at as usize,
                false => {
                    return fail(
                        node,
                        format!("write position {at} is outside the cache's {max_len} slots"),
                    )
                }
            };
            dst[(row * max_len + slot) * inner..][..inner]
                .copy_from_slice(&src[(row * len + s) * inner..][..inner]);
        }
    }
    Ok(vec![out])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A linear write past the cache's end is an error; a circular one wraps.
    #[test]
    fn tensor_scatter_wraps_or_refuses_past_the_end() {
        let node = |mode: &str| Node {
            name: "s".into(),
            op: "TensorScatter".into(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: vec![3],
            attrs: [("mode".to_string(), crate::node::Attr::Str(mode.into()))].into(),
        };
        let cache = Tensor::f32(vec![1, 3, 1], vec![0.0, 0.0, 0.0]).unwrap();
        let update = Tensor::f32(vec![1, 2, 1], vec![1.0, 2.0]).unwrap();
        let at = Tensor::i64(vec![1], vec![2]).unwrap();
        let ins = [Some(cache.view()), Some(update.view()), Some(at.view())];
        let wrapped = eval_tensor_scatter(&node("circular"), &ins).unwrap();
        assert_eq!(wrapped[0].as_f32().unwrap(), [2.0, 0.0, 1.0]);
        let e = eval_tensor_scatter(&node("linear"), &ins).unwrap_err();
        assert!(e.to_string().contains("outside the cache"), "{e}");
    }
}
