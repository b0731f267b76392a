//! The ONNX operators anyshape imports, a name → [`OpSpec`] registry with one file per
//! family: what each op's outputs are from what is known of its inputs (`infer`: shapes
//! as expressions, shape plumbing folded into expressions) and what it computes on
//! concrete tensors (`eval`: the reference executor, also used to fold constants).
//!
//! - `activation.rs`: activations with parameters (`LeakyRelu`, `Elu`, `Selu`,
//!   `PRelu`, `Clip`, `SwiGLU`, …);
//! - `attention.rs`: `Attention` (opset 23 on: heads, a past, grouped-query heads,
//!   masks, causal and windowed);
//! - `elementwise.rs`: arithmetic (`Mod` too, the variadic `Sum`, `Mean`, `Max`,
//!   `Min`), comparisons, logic, `Where` (broadcasting);
//! - `unary.rs`: activations, trigonometric and rounding math, `Neg`, `IsNaN`,
//!   `Identity`, `Dropout`, `Cast`, `CastLike`, `Trilu`;
//! - `shape.rs`: `Shape`, `Size`, `Reshape`, `Unsqueeze`, `Expand`, `Range`, `Constant`, …;
//! - `movement.rs`: `Transpose`, `Concat`, `Slice`, `Gather`, `Split`,
//!   `ReverseSequence`, …;
//! - `index.rs`: `GatherElements`, `ScatterElements` (and opset 9's `Scatter`),
//!   `ScatterND` (indices as data);
//! - `linalg.rs`: `MatMul`, `Gemm`, `Det`;
//! - `ml.rs`: the `ai.onnx.ml` domain's `Binarizer`, `ArrayFeatureExtractor`,
//!   `TreeEnsemble`;
//! - `loss.rs`: `NegativeLogLikelihoodLoss`, `SoftmaxCrossEntropyLoss`;
//! - `linear_attention.rs`: `LinearAttention` (opset 27: linear, gated and delta-rule
//!   recurrent states);
//! - `window.rs`: the sliding window convolutions and pools share (pads given or
//!   `SAME_*`, `ceil_mode`, any number of spatial axes);
//! - `conv.rs`: `Conv` (1-D and 2-D, grouped), and the internal `anyshape.Im2Col`
//!   before a convolution kernel; `conv_transpose.rs`: `ConvTranspose`, `Col2Im`;
//!   `causal_conv.rs`: `CausalConvWithState` (opset 27); `deform_conv.rs`: `DeformConv`;
//! - `pad.rs`: `Pad`, `CenterCropPad`, `Tile`;
//! - `pool.rs`: `MaxPool` (1-D to 3-D, with indices), `AveragePool`, `LpPool`,
//!   `MaxUnpool`, `GlobalAveragePool`, `GlobalMaxPool`;
//! - `normalize.rs`: `Softmax`, `LogSoftmax`, `Hardmax`, `LpNormalization`,
//!   `LayerNormalization`, `RMSNormalization`, `InstanceNormalization`,
//!   `GroupNormalization`, `BatchNormalization`, `MeanVarianceNormalization`, `LRN`;
//! - `recurrent.rs`: `RNN`, `GRU`, `LSTM`;
//! - `reduce.rs`: `Reduce*` (sum, mean, max, min, product, norms, log-sums), `ArgMax`,
//!   `ArgMin`, `CumSum`;
//! - `select.rs`: `NonZero`, `Compress`, `Unique`, `NonMaxSuppression` (extents
//!   their data selects: run-time dims);
//! - `resize.rs`: `Resize` (every mode, coordinate transformation, axes subset and aspect policy);
//! - `roi_align.rs`: `RoiAlign`;
//! - `grid.rs`: `GridSample`, `AffineGrid`;
//! - `spectral.rs`: `DFT`;
//! - `space.rs`: `DepthToSpace`, `SpaceToDepth`;
//! - `rotary.rs`: `RotaryEmbedding` (opset 23).
mod activation;
mod attention;
mod causal_conv;
mod conv;
mod conv_transpose;
mod deform_conv;
mod elementwise;
mod grid;
mod index;
mod linalg;
mod linear_attention;
mod loss;
mod ml;
mod movement;
mod normalize;
mod pad;
mod pool;
mod recurrent;
mod reduce;
mod resize;
mod roi_align;
mod rotary;
mod select;
mod shape;
mod space;
mod spectral;
mod unary;
mod window;

use crate::node::Node;
use crate::{DType, Data, DataRef, Fact, Result, Tensor, TensorError, TensorRef, Workers};
use anyshape_ir::Expr;
pub use conv::IM2COL;
pub use select::IF_SELECT;
pub use window::Window;

/// What a node's outputs are, from what is known of its inputs (`None`: an optional
/// input left out).
pub type InferFn = fn(&Node, &[Option<&Fact>]) -> Result<Vec<Fact>>;
/// What a node computes on concrete inputs (borrowed: in a tensor, an arena, a mapped
/// file).
pub type EvalFn = fn(&Node, &[Option<TensorRef>]) -> Result<Vec<Tensor>>;

/// What a node computes on concrete inputs into `outs`: tensors of the node's outputs'
/// element types and shapes, allocated by the caller (a run's host steps keep them from
/// run to run, so that a decoder's step allocates nothing). The op checks the shapes
/// against its inputs (a plan's shape rule that disagreed would be an error, not a
/// wrong answer) and writes every element; it allocates no outputs. It may split its
/// work over the [`Workers`] it is given.
pub type EvalIntoFn = fn(&Node, &[Option<TensorRef>], &mut [Tensor], Workers) -> Result<()>;

/// The newest ONNX opset whose operator definitions anyshape was checked against:
/// every version of a registered op from its [`OpSpec::since`] up to this opset means
/// what its `infer` and `eval` compute (the later versions add element types).
pub const NEWEST_OPSET: i64 = 28;

/// The newest opset of the `ai.onnx.ml` domain whose ops anyshape knows.
pub const NEWEST_ML_OPSET: i64 = 5;

/// One operator.
pub struct OpSpec {
    /// The ONNX op type.
    pub name: &'static str,
    /// The oldest version of the op (the opset that introduced it) whose semantics
    /// `infer` and `eval` implement; a model whose opset selects an older version of
    /// the op (where its meaning differed: `Softmax` before 13 flattened to 2-D) is
    /// refused.
    pub since: i64,
    /// Shape propagation.
    pub infer: InferFn,
    /// Evaluation.
    pub eval: EvalFn,
    /// Evaluation into given outputs, for the ops that have it (those on a decoder's
    /// step); their `eval` is this on outputs shaped by `infer` ([`eval_via`]).
    pub eval_into: Option<EvalIntoFn>,
}

/// The registry.
pub fn registry() -> impl Iterator<Item = &'static OpSpec> {
    elementwise::OPS
        .iter()
        .chain(activation::OPS)
        .chain(attention::OPS)
        .chain(movement::OPS)
        .chain(grid::OPS)
        .chain(index::OPS)
        .chain(linalg::OPS)
        .chain(linear_attention::OPS)
        .chain(loss::OPS)
        .chain(ml::OPS)
        .chain(causal_conv::OPS)
        .chain(conv::OPS)
        .chain(conv_transpose::OPS)
        .chain(deform_conv::OPS)
        .chain(normalize::OPS)
        .chain(pad::OPS)
        .chain(pool::OPS)
        .chain(recurrent::OPS)
        .chain(reduce::OPS)
        .chain(resize::OPS)
        .chain(roi_align::OPS)
        .chain(rotary::OPS)
        .chain(select::OPS)
        .chain(shape::OPS)
        .chain(space::OPS)
        .chain(spectral::OPS)
        .chain(unary::OPS)
}

/// The operator named `op`.
pub fn op(name: &str) -> Option<&'static OpSpec> {
    registry().find(|o| o.name == name)
}

/// Check that anyshape knows what every node of a model of default-domain `opset`
/// means: the opset is at most [`NEWEST_OPSET`], for each op the version the opset
/// selects is one whose semantics anyshape implements, and every op is one it imports
/// (those it does not are all named at once, each with a node and its count).
pub fn check_opset<'a>(
    opset: i64,
    ml_opset: Option<i64>,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Result<()> {
    if ml_opset.is_some_and(|v| !(1..=NEWEST_ML_OPSET).contains(&v)) {
        return Err(TensorError::Unsupported(format!(
            "ai.onnx.ml opset {}: anyshape knows the ML ops of opsets 1 to {NEWEST_ML_OPSET}",
            ml_opset.unwrap_or(0)
        )));
    }
    let nodes: Vec<&Node> = nodes.into_iter().collect();
    let ml = |n: &Node| n.op.starts_with("ai.onnx.ml.");
    if opset == 0 && nodes.iter().any(|n| !ml(n)) {
        return Err(TensorError::Unsupported(
            "no opset of the default domain for the model's default-domain ops".into(),
        ));
    }
    if opset > NEWEST_OPSET {
        return Err(TensorError::Unsupported(format!(
            "opset {opset}: anyshape knows the operators of opsets up to {NEWEST_OPSET}, and a newer one may change what an op means; export the model with an opset up to {NEWEST_OPSET} (e.g. torch.onnx.export(..., opset_version=17))"
        )));
    }
    if opset < 1 && nodes.iter().any(|n| !ml(n)) {
        return Err(TensorError::Unsupported(format!(
            "opset {opset} is no ONNX opset"
        )));
    }
    let mut unknown: std::collections::BTreeMap<&str, (&str, usize)> = Default::default();
    for node in nodes {
        // Internal ops (`anyshape.…`) are what compiling makes, never a model's.
        let Some(spec) = op(&node.op).filter(|_| !node.op.starts_with("anyshape.")) else {
            unknown.entry(&node.op).or_insert((&node.name, 0)).1 += 1;
            continue;
        };
        let (opset, domain) = match ml(node) {
            true => (ml_opset.unwrap_or(0), "the ai.onnx.ml domain's opset"),
            false => (opset, "opset"),
        };
        if opset < spec.since {
            if domain != "opset" {
                return Err(TensorError::Unsupported(format!(
                    "node `{}`: {} at {domain} {opset} is an older version of the op than anyshape implements (from {domain} {})",
                    node.name, node.op, spec.since
                )));
            }
            return Err(TensorError::Unsupported(format!(
                "node `{}`: {} at opset {opset} is an older version of the op than anyshape implements (it implements {} from opset {} to {NEWEST_OPSET}); export the model with opset {} or newer",
                node.name, node.op, node.op, spec.since, spec.since.max(13)
            )));
        }
    }
    if !unknown.is_empty() {
        let named: Vec<String> = unknown
            .iter()
            .map(|(op, (first, n))| match n {
                1 => format!("{op} (node `{first}`)"),
                n => format!("{op} ({n} nodes, the first `{first}`)"),
            })
            .collect();
        return Err(TensorError::Unsupported(format!(
            "the model needs ops anyshape does not import yet: {}",
            named.join(", ")
        )));
    }
    Ok(())
}

/// `into` on outputs of the types and shapes `infer` gives for these inputs: the
/// `eval` of an op evaluated into given outputs.
pub(crate) fn eval_via(
    node: &Node,
    ins: &[Option<TensorRef>],
    into: EvalIntoFn,
) -> Result<Vec<Tensor>> {
    let spec = op(&node.op).ok_or_else(|| node.error("not a registered op"))?;
    let facts: Vec<Option<Fact>> = ins
        .iter()
        .map(|t| t.map(|t| Fact::known(t.to_tensor())))
        .collect();
    let refs: Vec<Option<&Fact>> = facts.iter().map(Option::as_ref).collect();
    let mut outs = (spec.infer)(node, &refs)?
        .into_iter()
        .map(|f| {
            let shape = f
                .const_shape()
                .ok_or_else(|| node.error("an output's shape is not known from its inputs"))?;
            Tensor::zeros(f.dtype, shape)
        })
        .collect::<Result<Vec<_>>>()?;
    into(node, ins, &mut outs, Workers::SERIAL)?;
    Ok(outs)
}

/// Whether `out` is exactly the numpy broadcast of `ins` (what an elementwise op over
/// them makes), checked without allocating.
pub(crate) fn broadcasts_to(out: &[usize], ins: &[&[usize]]) -> bool {
    let r = out.len();
    if ins.iter().any(|s| s.len() > r) {
        return false;
    }
    (0..r).all(|d| {
        let dims = ins
            .iter()
            .filter(|s| d + s.len() >= r)
            .map(|s| s[d + s.len() - r]);
        let mut want = 1;
        for x in dims.clone() {
            if x != 1 {
                if want != 1 && want != x {
                    return false;
                }
                want = x;
            }
        }
        out[d] == want
    })
}

/// The output of an op that keeps its first input's type and shape.
pub(crate) fn infer_same(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    Ok(vec![Fact::new(x.dtype, x.shape.to_vec())])
}

/// `(outer, n, inner)` of a tensor seen along axis `a`.
pub(crate) fn split_at(shape: &[usize], a: usize) -> (usize, usize, usize) {
    (
        shape[..a].iter().product(),
        shape[a],
        shape[a + 1..].iter().product(),
    )
}

/// The sum of `f` over `xs` in eight independent partial sums (the loop vectorizes;
/// the partial sums also keep the rounding error of a long row small), accumulated in
/// `f`'s type: `f32` (layer norm's rows) or `f64` (the reductions').
pub(crate) fn lane_sum<T>(xs: &[f32], f: impl Fn(f32) -> T) -> T
where
    T: Copy + Default + std::ops::Add<Output = T> + std::iter::Sum,
{
    let mut acc = [T::default(); 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = *a + f(x);
        }
    }
    acc.iter().copied().sum::<T>() + rest.iter().map(|&x| f(x)).sum::<T>()
}

/// The required input `i`.
pub(crate) fn req<T: Copy>(node: &Node, ins: &[Option<T>], i: usize) -> Result<T> {
    ins.get(i)
        .copied()
        .flatten()
        .ok_or_else(|| node.error(format!("input {i} is missing")))
}

/// Dims, strides or counters of one tensor: on the stack up to rank 8 (so that the
/// walks of a run's host steps allocate nothing).
pub(crate) type Dims = smallvec::SmallVec<[usize; 8]>;

/// The most elements one op may produce (8 GiB of `f32`): a model whose data asks for
/// more (a mutated `ConstantOfShape`, a broadcast of two long vectors) is an error, not
/// an allocation that aborts.
pub const MAX_ELEMENTS: usize = 1 << 31;

/// The number of elements of `shape`, checked against [`MAX_ELEMENTS`].
pub(crate) fn sized(node: &Node, shape: &[usize]) -> Result<usize> {
    match crate::tensor::numel(shape) {
        Ok(n) if n <= MAX_ELEMENTS => Ok(n),
        _ => Err(node.error(format!(
            "an output of shape {shape:?} is larger than anyshape computes ({MAX_ELEMENTS} elements)"
        ))),
    }
}

/// An error unless an op's work — the product of `work`'s extents, not only its
/// output's — is at most [`MAX_ELEMENTS`] (a reference loop that would run for hours).
pub(crate) fn bounded_work(node: &Node, work: &[usize]) -> Result<()> {
    match crate::tensor::numel(work) {
        Ok(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => fail(node, "more work than one op may do"),
    }
}

/// Numpy broadcast of concrete shapes.
pub(crate) fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let y = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            match (x, y) {
                _ if x == y => Some(x),
                (1, _) => Some(y),
                (_, 1) => Some(x),
                _ => None,
            }
        })
        .collect()
}

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
pub(crate) fn walk_into<T: Copy>(v: &[T], out: &[usize], strides: &[usize], dst: &mut [T]) {
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

/// Output `i` of `outs`, an error unless it has `shape` (a plan's shape rule that
/// disagrees with the op's evaluation).
pub(crate) fn shaped<'b>(
    node: &Node,
    outs: &'b mut [Tensor],
    i: usize,
    shape: &[usize],
) -> Result<&'b mut Tensor> {
    match outs.get_mut(i) {
        Some(o) if o.shape == shape && o.len() == shape.iter().product::<usize>() => Ok(o),
        Some(o) => fail(
            node,
            format!(
                "output {i} is given the shape {:?} where its inputs make {shape:?}",
                o.shape
            ),
        ),
        None => fail(node, format!("output {i} is not given")),
    }
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

/// The broadcast of two inputs' shapes, checked against [`MAX_ELEMENTS`].
pub(crate) fn broadcast_out(node: &Node, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let out = broadcast_shape(a, b)
        .ok_or_else(|| node.error(format!("shapes {a:?} and {b:?} do not broadcast")))?;
    sized(node, &out)?;
    Ok(out)
}

/// An axis attribute in `[-rank, rank)` as an index.
pub(crate) fn axis(node: &Node, a: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if rank == 0 || a < -r || a >= r {
        return Err(node.error(format!("axis {a} is out of range for rank {rank}")));
    }
    Ok(if a < 0 { (a + r) as usize } else { a as usize })
}

/// The constant integer elements of input `i` (axes, pads, sizes), which the op needs
/// at compile time.
pub(crate) fn const_ints(node: &Node, ins: &[Option<&Fact>], i: usize) -> Result<Vec<i64>> {
    let f = req(node, ins, i)?;
    match &f.value {
        Some(t) => Ok(t.as_i64().map_err(|e| node.error(e))?.to_vec()),
        None => Err(node.error(format!(
            "input {i} must be a constant (it is computed at run time)"
        ))),
    }
}

/// The constant integer elements of input `i`, or `None` where they are computed at
/// run time (the op's output shape then has run-time dims, [`runtime_shape`]).
pub(crate) fn const_ints_or_late(
    node: &Node,
    ins: &[Option<&Fact>],
    i: usize,
) -> Result<Option<Vec<i64>>> {
    let f = req(node, ins, i)?;
    match &f.value {
        Some(t) => Ok(Some(t.as_i64().map_err(|e| node.error(e))?.to_vec())),
        None if f.dtype != crate::DType::I64 => fail(node, format!("input {i} must be int64")),
        None => Ok(None),
    }
}

/// The length of the 1-D integer input `i` (axes, pads, a shape) as the model fixes
/// it, whose elements are computed at run time.
pub(crate) fn late_len(node: &Node, ins: &[Option<&Fact>], i: usize) -> Result<usize> {
    match req(node, ins, i)?.const_shape().as_deref() {
        Some(&[n]) => Ok(n),
        _ => fail(
            node,
            format!("input {i} must be a 1-D tensor of a length known at compile time"),
        ),
    }
}

/// Whether axis `a` of a tensor of rank `rank` is among `axes` (counted from the end
/// where negative); every axis is where the axes are not known (`None`).
pub(crate) fn among(axes: Option<&[i64]>, a: usize, rank: usize) -> bool {
    axes.is_none_or(|v| {
        v.iter()
            .any(|&b| b == a as i64 || b + rank as i64 == a as i64)
    })
}

/// The shape of output `out` of `node`, of rank `rank`, where only the op's evaluation
/// tells the dims `known` gives none of: those are run-time dims
/// ([`Expr::runtime_dim`]), bound when the step runs.
pub(crate) fn runtime_shape(
    node: &Node,
    out: usize,
    rank: usize,
    known: impl Fn(usize) -> Option<Expr>,
) -> Result<Vec<Expr>> {
    let &value = node.outputs.get(out).ok_or_else(|| {
        node.error(format!(
            "output {out}'s shape is known only at run time, where it must be known"
        ))
    })?;
    Ok((0..rank)
        .map(|a| known(a).unwrap_or_else(|| Expr::runtime_dim(value, a)))
        .collect())
}

/// The facts of `node`'s one output, of `dtype` and `rank`, where every dim of it is
/// known only at run time (bound when the step runs).
pub(crate) fn late_fact(node: &Node, dtype: DType, rank: usize) -> Result<Vec<Fact>> {
    Ok(vec![Fact::new(
        dtype,
        runtime_shape(node, 0, rank, |_| None)?,
    )])
}

/// The symbolic elements of input `i` (a shape vector), or `None` where it is an
/// integer vector computed at run time (the op's output then has run-time dims).
pub(crate) fn sym_input_or_late(
    node: &Node,
    ins: &[Option<&Fact>],
    i: usize,
) -> Result<Option<Vec<Expr>>> {
    let f = req(node, ins, i)?;
    match &f.sym {
        Some(s) => Ok(Some(s.clone())),
        None if f.dtype == crate::DType::I64 && f.rank() <= 1 => Ok(None),
        None => sym_input(node, ins, i).map(Some),
    }
}

/// The symbolic elements of input `i` (a shape vector), which the op needs.
pub(crate) fn sym_input(node: &Node, ins: &[Option<&Fact>], i: usize) -> Result<Vec<Expr>> {
    let f = req(node, ins, i)?;
    f.sym.clone().ok_or_else(|| {
        node.error(format!(
            "input {i} (a shape) could not be computed at compile time from the inputs' dims"
        ))
    })
}

/// The concrete integers of input `i`, borrowed.
pub(crate) fn ints<'a>(node: &Node, ins: &[Option<TensorRef<'a>>], i: usize) -> Result<&'a [i64]> {
    req(node, ins, i)?.as_i64().map_err(|e| node.error(e))
}

/// The concrete integers of optional input `i` (axes, pads), if given, borrowed.
pub(crate) fn optional_ints<'a>(
    node: &Node,
    ins: &[Option<TensorRef<'a>>],
    i: usize,
) -> Result<Option<&'a [i64]>> {
    ins.get(i)
        .copied()
        .flatten()
        .map(|t| t.as_i64())
        .transpose()
        .map_err(|e| node.error(e))
}

/// The `c` values per channel of input `i` (a normalization's scale, bias, statistics).
pub(crate) fn per_channel<'a>(
    node: &Node,
    ins: &[Option<TensorRef<'a>>],
    i: usize,
    c: usize,
) -> Result<&'a [f32]> {
    let v = req(node, ins, i)?.as_f32().map_err(|e| node.error(e))?;
    if v.len() != c {
        return fail(
            node,
            format!("input {i} must have the {c} channels' values"),
        );
    }
    Ok(v)
}

/// A [`TensorError`] from a message about `node`.
pub(crate) fn fail<T>(node: &Node, message: impl std::fmt::Display) -> Result<T> {
    Err(node.error(message))
}

/// The error of an unsupported op.
pub fn unsupported(node: &Node) -> TensorError {
    TensorError::Unsupported(format!(
        "op {} (node `{}`) is not one anyshape imports yet",
        node.op, node.name
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
