//! Strided walks and the copies of the data-movement ops: a tensor walked one
//! innermost row at a time over the strides of its operands (transposes, broadcasts),
//! the flat indices such a walk reads, and [`Pair`] — a source and a destination of one
//! element type — copied by a walk or by rows, the work split over the [`Workers`].
use super::{shaped, Dims};
use crate::node::Node;
use crate::{Data, DataRef, Result, Tensor, Workers};

/// Walks a tensor of shape `out` (row-major, rank ≥ 1) one innermost row at a time:
/// for each row, `row` gets the flat offset at which each of `N` strided operands
/// starts it (`Σ counter[d] · strides[k][d]` over the outer axes). The walk behind
/// broadcasting and transposes; the innermost axis is left to the caller's loop.
pub(crate) fn for_each_row<const N: usize>(
    out: &[usize],
    strides: [&[usize]; N],
    row: impl FnMut([usize; N]),
) {
    let rows: usize = out[..out.len() - 1].iter().product();
    for_rows(out, strides, 0..rows, row)
}

/// [`for_each_row`] over the rows `rows` only (a part of the walk, for a worker).
pub(crate) fn for_rows<const N: usize>(
    out: &[usize],
    strides: [&[usize]; N],
    rows: std::ops::Range<usize>,
    mut row: impl FnMut([usize; N]),
) {
    let r = out.len();
    let inner = out[r - 1];
    if inner == 0 {
        return;
    }
    // The counter and offsets of the first row.
    let mut counter: Dims = smallvec::smallvec![0usize; r - 1];
    let mut at = [0usize; N];
    let mut rest = rows.start;
    for d in (0..r - 1).rev() {
        counter[d] = rest % out[d].max(1);
        rest /= out[d].max(1);
        for k in 0..N {
            at[k] += counter[d] * strides[k][d];
        }
    }
    for _ in rows {
        row(at);
        for d in (0..r - 1).rev() {
            counter[d] += 1;
            for k in 0..N {
                at[k] += strides[k][d];
            }
            if counter[d] < out[d] {
                break;
            }
            for k in 0..N {
                at[k] -= strides[k][d] * counter[d];
            }
            counter[d] = 0;
        }
    }
}

/// The elements of `data` read with `strides` over the shape `out` (row-major order):
/// a transpose or a broadcast, copied row by row without an index vector.
pub(crate) fn strided(data: DataRef, out: &[usize], strides: &[usize]) -> Data {
    let mut d = Data::zeros(data.dtype(), out.iter().product::<usize>());
    if let Some(d) = d.as_mut_of(data) {
        d.walk(out, strides, Workers::SERIAL);
    }
    d
}

/// Blocks of at least this many indices of the leading axes give a walk over the
/// workers enough parts to balance (each block one index of them).
const WALK_BLOCKS: usize = 64;

/// [`walk_into`] over `workers`: the output in blocks of its trailing axes (the
/// fewest leading axes with [`WALK_BLOCKS`] indices, at most all but the last), each
/// block walked by one thread from its own start in `v`.
fn walk_split<T: Copy + Send + Sync>(
    v: &[T],
    out: &[usize],
    strides: &[usize],
    dst: &mut [T],
    workers: Workers,
) {
    let r = out.len();
    if r == 0 || !workers.is_parallel() {
        return walk_into(v, out, strides, dst);
    }
    let lead = (1..r)
        .find(|&l| out[..l].iter().product::<usize>() >= WALK_BLOCKS)
        .unwrap_or(r - 1);
    let block: usize = out[lead..].iter().product();
    workers.chunks_mut(dst, block, |i, chunk| {
        let (mut at, mut rest) = (0, i);
        for d in (0..lead).rev() {
            at += rest % out[d] * strides[d];
            rest /= out[d];
        }
        walk_into(&v[at..], &out[lead..], &strides[lead..], chunk)
    });
}

/// Rows of `row` elements of `d`: row `i` gets `n` elements of `v` from `from(i)`, at
/// `at` within it; the rows split over `workers`.
fn rows_into<T: Copy + Send + Sync>(
    v: &[T],
    d: &mut [T],
    workers: Workers,
    [row, at, n]: [usize; 3],
    from: &(dyn Fn(usize) -> usize + Sync),
) {
    workers.chunks_mut(d, row, |i, out| {
        out[at..at + n].copy_from_slice(&v[from(i)..][..n])
    });
}

/// `v` read with `strides` over the shape `out` (row-major order) into `dst` (of
/// `out`'s elements; one element at rank 0), row by row.
fn walk_into<T: Copy>(v: &[T], out: &[usize], strides: &[usize], dst: &mut [T]) {
    let Some(&inner) = out.last() else {
        dst[0] = v[0];
        return;
    };
    let step = strides[out.len() - 1];
    let mut to = 0;
    for_each_row(out, [strides], |[at]| {
        let row = &mut dst[to..to + inner];
        to += inner;
        if step == 1 {
            row.copy_from_slice(&v[at..at + inner]);
        } else {
            for (j, o) in row.iter_mut().enumerate() {
                *o = v[at + j * step];
            }
        }
    });
}

/// A source's elements and a destination of the same element type, for the copies of
/// the data-movement ops (`Transpose`, `Slice`, `Expand`, …) into given outputs.
pub(crate) enum Pair<'a, 'b> {
    F32(&'a [f32], &'b mut [f32]),
    I64(&'a [i64], &'b mut [i64]),
    Bool(&'a [bool], &'b mut [bool]),
}

impl Pair<'_, '_> {
    /// The source read with `strides` over the shape `out` into the destination, in
    /// blocks split over `workers`.
    pub(crate) fn walk(self, out: &[usize], strides: &[usize], workers: Workers) {
        match self {
            Pair::F32(v, d) => walk_split(v, out, strides, d, workers),
            Pair::I64(v, d) => walk_split(v, out, strides, d, workers),
            Pair::Bool(v, d) => walk_split(v, out, strides, d, workers),
        }
    }

    /// The destination as rows of `row` elements: row `i` gets `n` elements of the
    /// source from `from(i)`, at `at` within it (`Split`'s parts, one input's blocks of
    /// a `Concat`); the rows split over `workers`.
    pub(crate) fn rows(
        self,
        workers: Workers,
        [row, at, n]: [usize; 3],
        from: &(dyn Fn(usize) -> usize + Sync),
    ) {
        let shape = [row, at, n];
        match self {
            Pair::F32(v, d) => rows_into(v, d, workers, shape, from),
            Pair::I64(v, d) => rows_into(v, d, workers, shape, from),
            Pair::Bool(v, d) => rows_into(v, d, workers, shape, from),
        }
    }

    /// `n` elements of the source from `from` to the destination at `to`.
    pub(crate) fn copy(&mut self, from: usize, to: usize, n: usize) {
        match self {
            Pair::F32(v, d) => d[to..to + n].copy_from_slice(&v[from..from + n]),
            Pair::I64(v, d) => d[to..to + n].copy_from_slice(&v[from..from + n]),
            Pair::Bool(v, d) => d[to..to + n].copy_from_slice(&v[from..from + n]),
        }
    }
}

impl Data {
    /// These elements as the destination of a copy from `src`, where the types match.
    pub(crate) fn as_mut_of<'a, 'b>(&'b mut self, src: DataRef<'a>) -> Option<Pair<'a, 'b>> {
        match (src, self) {
            (DataRef::F32(v), Data::F32(d)) => Some(Pair::F32(v, d)),
            (DataRef::I64(v), Data::I64(d)) => Some(Pair::I64(v, d)),
            (DataRef::Bool(v), Data::Bool(d)) => Some(Pair::Bool(v, d)),
            _ => None,
        }
    }
}

/// Output `i` of `outs` as the destination of a copy from `src`: an error unless it
/// has `shape` and `src`'s element type.
pub(crate) fn out_of<'a, 'b>(
    node: &Node,
    outs: &'b mut [Tensor],
    i: usize,
    shape: &[usize],
    src: DataRef<'a>,
) -> Result<Pair<'a, 'b>> {
    let o = shaped(node, outs, i, shape)?;
    o.data
        .as_mut_of(src)
        .ok_or_else(|| node.error("the output's element type is not the input's"))
}

/// Row-major strides of `shape`, on the stack.
pub(crate) fn row_strides(shape: &[usize]) -> Dims {
    let mut s: Dims = smallvec::smallvec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// For each element of a tensor of shape `out` (row-major order), the flat index
/// `Σ counter[d] · strides[d]` it reads.
pub(crate) fn strided_walk(out: &[usize], strides: &[usize]) -> Vec<usize> {
    if out.is_empty() {
        return vec![0];
    }
    let (inner, step) = (out[out.len() - 1], strides[out.len() - 1]);
    let mut idx = Vec::with_capacity(out.iter().product());
    for_each_row(out, [strides], |[at]| {
        idx.extend((0..inner).map(|j| at + j * step))
    });
    idx
}

/// The strides with which a row-major tensor of shape `inp` is read when broadcast
/// to rank `r`: 0 along the axes it is broadcast over.
pub(crate) fn broadcast_strides(inp: &[usize], r: usize) -> Dims {
    let lead = r - inp.len();
    let mut strides: Dims = smallvec::smallvec![0usize; r];
    let mut s = 1;
    for i in (0..inp.len()).rev() {
        strides[lead + i] = if inp[i] == 1 { 0 } else { s };
        s *= inp[i];
    }
    strides
}

/// For each element of a tensor of shape `out`, the flat index of the element of a
/// tensor of shape `inp` (broadcast to `out`) it reads.
pub(crate) fn broadcast_indices(inp: &[usize], out: &[usize]) -> Vec<usize> {
    strided_walk(out, &broadcast_strides(inp, out.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::op;
    use crate::{DType, TensorRef};

    /// Row-wise strided copies read what the index walk reads: every transpose of a
    /// 2×3×4 tensor, broadcasts, and rank 0.
    #[test]
    fn strided_copies_match_the_index_walk() {
        let shape = [2usize, 3, 4];
        let data = Data::I64((0..24).collect());
        let st = crate::strides(&shape);
        for p in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let out: Vec<usize> = p.iter().map(|&a| shape[a]).collect();
            let strides: Vec<usize> = p.iter().map(|&a| st[a]).collect();
            let want = data.pick(&strided_walk(&out, &strides));
            assert_eq!(strided(data.view(), &out, &strides), want, "{p:?}");
        }
        for (inp, out) in [
            (vec![3, 1], vec![2, 3, 5]),
            (vec![1], vec![4, 2]),
            (vec![], vec![3]),
        ] {
            let n: usize = inp.iter().product();
            let d = Data::F32((0..n).map(|i| i as f32).collect());
            let s = broadcast_strides(&inp, out.len());
            assert_eq!(
                strided(d.view(), &out, &s),
                d.pick(&broadcast_indices(&inp, &out))
            );
        }
        assert_eq!(strided(data.view(), &[], &[]), Data::I64(vec![0]));
    }

    /// The copies of `Transpose`, `Expand`, `Split` and `Concat` split over two
    /// threads write what they write on one: shapes large enough to split (and an
    /// empty part), each element type, several axes.
    #[test]
    fn movement_split_over_threads_matches_one_thread() {
        use crate::node::Attr;
        let t = |shape: &[usize], dtype: DType| {
            let n: usize = shape.iter().product();
            let data = match dtype {
                DType::F32 => Data::F32((0..n).map(|i| i as f32).collect()),
                DType::I64 => Data::I64((0..n as i64).collect()),
                DType::Bool => Data::Bool((0..n).map(|i| i % 3 == 0).collect()),
            };
            Tensor::new(shape.to_vec(), data).unwrap()
        };
        let ints = |v: &[i64]| Tensor::new(vec![v.len()], Data::I64(v.to_vec())).unwrap();
        // (op, attributes, inputs, outputs)
        type Case<'a> = (&'a str, Vec<(&'a str, Attr)>, Vec<Tensor>, usize);
        let cases: Vec<Case> = vec![
            (
                "Transpose",
                vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))],
                vec![t(&[1, 256, 12, 64], DType::F32)],
                1,
            ),
            (
                "Transpose",
                vec![("perm", Attr::Ints(vec![1, 0, 2]))],
                vec![t(&[2, 40, 300], DType::I64)],
                1,
            ),
            ("Transpose", vec![], vec![t(&[300, 70], DType::Bool)], 1),
            (
                "Expand",
                vec![],
                vec![t(&[1, 300], DType::F32), ints(&[70, 300])],
                1,
            ),
            (
                "Expand",
                vec![],
                vec![t(&[5, 1, 3], DType::I64), ints(&[5, 4000, 3])],
                1,
            ),
            (
                "Split",
                vec![("axis", Attr::Int(1))],
                vec![t(&[256, 2304], DType::F32)],
                3,
            ),
            (
                "Split",
                vec![("axis", Attr::Int(1))],
                vec![t(&[3, 5000, 4], DType::I64), ints(&[1000, 0, 4000])],
                3,
            ),
            (
                "Split",
                vec![("axis", Attr::Int(0))],
                vec![t(&[64, 600], DType::Bool)],
                2,
            ),
            (
                "Concat",
                vec![("axis", Attr::Int(1))],
                vec![t(&[12, 0, 64], DType::F32), t(&[12, 256, 64], DType::F32)],
                1,
            ),
            (
                "Concat",
                vec![("axis", Attr::Int(1))],
                vec![
                    t(&[64, 300], DType::I64),
                    t(&[64, 100], DType::I64),
                    t(&[64, 7], DType::I64),
                ],
                1,
            ),
            (
                "Concat",
                vec![("axis", Attr::Int(0))],
                vec![t(&[40, 500], DType::Bool), t(&[3, 500], DType::Bool)],
                1,
            ),
        ];
        for (name, attrs, inputs, outputs) in cases {
            let node = Node {
                name: name.into(),
                op: name.into(),
                inputs: (0..inputs.len()).map(Some).collect(),
                outputs: (inputs.len()..inputs.len() + outputs).collect(),
                attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            };
            let ins: Vec<Option<TensorRef>> = inputs.iter().map(|t| Some(t.view())).collect();
            let spec = op(name).unwrap();
            let serial = (spec.eval)(&node, &ins).unwrap();
            let mut split: Vec<Tensor> = serial
                .iter()
                .map(|o| Tensor::zeros(o.dtype(), o.shape.clone()).unwrap())
                .collect();
            let two = crate::workers::Two;
            (spec.eval_into.unwrap())(&node, &ins, &mut split, Workers::new(&two)).unwrap();
            assert!(
                split == serial,
                "{name} of {:?}",
                inputs.iter().map(|t| &t.shape).collect::<Vec<_>>()
            );
        }
    }
}
