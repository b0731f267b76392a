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
//! - `walk.rs`: the strided walks and copies the data-movement ops share (a transpose,
//!   a broadcast, rows of a `Split` or `Concat`), split over the workers;
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
//! - `rotary.rs`: `RotaryEmbedding` (opset 23), and the internal `anyshape.RotateHalf`
//!   that the exporters' rotary embeddings are rewritten into;
//! - `winograd.rs`: the internal `anyshape.WinogradInput` and
//!   `anyshape.WinogradOutput` around the batched matmul a 3 x 3 convolution of
//!   stride 1 becomes (Winograd's F(2x2, 3x3) or F(4x4, 3x3)), and its filters'
//!   transform.
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
mod walk;
mod window;
mod winograd;

use crate::node::Node;
use crate::{DType, Fact, Result, Tensor, TensorError, TensorRef, Workers};
use anyshape_ir::Expr;
pub use conv::IM2COL;
pub use rotary::ROTATE_HALF;
pub use select::IF_SELECT;
pub(crate) use walk::{
    broadcast_indices, broadcast_strides, for_each_row, for_rows, out_of, row_strides, strided,
    strided_walk, Pair,
};
pub use window::Window;
pub use winograd::{winograd_filters, WinogradTile, WINOGRAD_INPUT, WINOGRAD_OUTPUT};

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
    /// step); their `eval` is this on outputs shaped by `infer` (`eval_via`).
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
        .chain(winograd::OPS)
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
