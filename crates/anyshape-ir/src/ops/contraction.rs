//! Contractions: `Y[spatial] = Σ_k X · W` with affine index maps (transposes are
//! strides; batch axes may be any number, shared or broadcast). The attention
//! contractions read and write multi-head tensors in the `[batch, sequence, heads,
//! dim]` layout that the projections produce, and a decoder's keys and values in its
//! cache's `[batch, heads, sequence, dim]`, so no transpose runs between them.
use super::{axis, workload};
use crate::{AxisKind::Reduction, AxisKind::Spatial, Expr, OpClass, TensorRef, Workload};

/// `dense(M, N, K)`: `Y[m,n] = Σ_k X[m,k] · W[n,k]`.
pub fn dense(a: &[Expr]) -> Workload {
    let [m, n, k] = [&a[0], &a[1], &a[2]];
    let axes = vec![
        axis("m", m, Spatial),
        axis("n", n, Spatial),
        axis("k", k, Reduction),
    ];
    contraction(
        "dense",
        &["M", "N", "K"],
        a,
        axes,
        [&[0, 2], &[1, 2], &[0, 1]],
    )
}

/// `dense_packed(M, N, K, P)`: `dense` whose weights are pre-packed in panels of `P`
/// rows (stored `[⌈N/P⌉, K, P]`, see [`TensorRef::panels`]): a model lays out its
/// constant weights so once, at load time, and the kernels read them in place.
pub fn dense_packed(a: &[Expr]) -> Workload {
    let mut w = dense(&a[..3]);
    w.op = "dense_packed".into();
    w.args.push(("P".into(), a[3].clone()));
    // A panel width that is not a positive constant fails validation.
    w.inputs[1].panels = Some(a[3].as_const().unwrap_or(0));
    w
}

/// `dense_bf16(M, N, K, P)`: `dense` in bfloat16 with `f32` sums (see
/// [`Precision::Bf16`](crate::Precision)): `X[m, 2k]` and `X[m, 2k+1]` rounded to
/// bfloat16 times the pair of `W` in word `k` of row `n`, `W` stored in panels of `P`
/// rows of such words (`[⌈N/P⌉, K/2, P]` words: half of `dense_packed`'s bytes). The
/// reduction axis counts the `K/2` pairs; `K` must be an even constant.
pub fn dense_bf16(a: &[Expr]) -> Workload {
    dense_words(a, "dense_bf16", crate::Precision::Bf16)
}

/// `dense_i8(M, N, K, P)`: `dense` on 8-bit integers (see
/// [`Precision::I8`](crate::Precision)): each row of `X` quantized to 8 bits by its
/// largest magnitude, `X[m, 4k..4k+4]` times the four bytes of `W`'s word `k` of row
/// `n` (each its 8-bit weight plus 128), summed, times the row's scale; `W` stored in
/// panels of `P` rows of such words (`[⌈N/P⌉, K/4, P]` words: a quarter of
/// `dense_packed`'s bytes). The reduction axis counts the `K/4` quads; `K` must be a
/// constant multiple of 4. The result is in the units of `W`'s 8-bit values: a model
/// multiplies each column by its weight scale in the epilogue.
pub fn dense_i8(a: &[Expr]) -> Workload {
    dense_words(a, "dense_i8", crate::Precision::I8)
}

/// `dense` over words of `precision`'s groups of elements along K (`dense_bf16`,
/// `dense_i8`): the reduction counts groups, `X` read a group at a time, `W` in panels
/// of `P` rows of words.
fn dense_words(a: &[Expr], op: &str, precision: crate::Precision) -> Workload {
    let [m, n, k, p] = [&a[0], &a[1], &a[2], &a[3]];
    let g = precision.group();
    // A K that is not a constant multiple of the group fails validation (X's last
    // dimension is not the group times the reduction).
    let groups = match k.as_const() {
        Some(k) if k % g == 0 => Expr::Const(k / g),
        _ => Expr::ceil_div(k.clone(), Expr::Const(g)),
    };
    let axes = vec![
        axis("m", m, Spatial),
        axis("n", n, Spatial),
        axis("k", &groups, Reduction),
    ];
    let mut w = contraction(
        op,
        &["M", "N", "K", "P"],
        a,
        axes,
        [&[0, 2], &[1, 2], &[0, 1]],
    );
    w.precision = precision;
    w.inputs[0].shape[1] = k.clone();
    w.inputs[0].index[1] = crate::AffineIndex {
        terms: vec![(2, g)],
        offset: 0,
    };
    w.inputs[1].panels = Some(p.as_const().unwrap_or(0));
    w
}

/// `op`: the f32 contraction `w` in bfloat16 with `f32` sums (see
/// [`Precision::Bf16`](crate::Precision)), both operands read in pairs along its one
/// reduction, each pair two neighbouring elements (the reduction's coefficient doubled
/// in both index maps; the tensors keep their shapes): the reduction counts the `K/2`
/// pairs; `K` must be an even constant (else validation fails). For the attention
/// scores, whose operands are activations the kernel rounds as it packs them.
fn paired(mut w: Workload, op: &str) -> Workload {
    let reduction = w
        .axes
        .iter()
        .position(|a| a.kind == Reduction)
        .expect("a contraction has a reduction");
    let k = w.axes[reduction].extent.clone();
    w.axes[reduction].extent = match k.as_const() {
        Some(k) if k % 2 == 0 => Expr::Const(k / 2),
        _ => Expr::ceil_div(k, Expr::Const(2)),
    };
    for t in &mut w.inputs {
        for ix in &mut t.index {
            for (axis, coeff) in &mut ix.terms {
                if *axis == reduction {
                    *coeff *= 2;
                }
            }
        }
    }
    w.op = op.into();
    w.precision = crate::Precision::Bf16;
    w
}

fn batch_axes(a: &[Expr]) -> Vec<crate::Axis> {
    let [b, m, n, k] = [&a[0], &a[1], &a[2], &a[3]];
    vec![
        axis("b", b, Spatial),
        axis("m", m, Spatial),
        axis("n", n, Spatial),
        axis("k", k, Reduction),
    ]
}

/// `batch_matmul_nt(B, M, N, K)`: `Y[b,m,n] = Σ_k X[b,m,k] · W[b,n,k]`.
pub fn batch_matmul_nt(a: &[Expr]) -> Workload {
    let axes = batch_axes(a);
    contraction(
        "batch_matmul_nt",
        &["B", "M", "N", "K"],
        a,
        axes,
        [&[0, 1, 3], &[0, 2, 3], &[0, 1, 2]],
    )
}

/// `batch_matmul_nn(B, M, N, K)`: `Y[b,m,n] = Σ_k X[b,m,k] · W[b,k,n]`.
pub fn batch_matmul_nn(a: &[Expr]) -> Workload {
    let axes = batch_axes(a);
    contraction(
        "batch_matmul_nn",
        &["B", "M", "N", "K"],
        a,
        axes,
        [&[0, 1, 3], &[0, 3, 2], &[0, 1, 2]],
    )
}

/// `batch_matmul_packed(B, M, N, K, P)`: `batch_matmul_nn` whose first operand is a
/// constant pre-packed in panels of `P` rows per batch item (stored `[B, ⌈M/P⌉, K, P]`,
/// see [`TensorRef::panels`]): Winograd's transformed filters `[α², co, ci]`, laid out
/// so once when a model is compiled, which the kernels read in place as `conv_packed`
/// reads its filters (one stream per panel, prefetched) instead of one per row.
pub fn batch_matmul_packed(a: &[Expr]) -> Workload {
    let mut w = batch_matmul_nn(&a[..4]);
    w.op = "batch_matmul_packed".into();
    w.args.push(("P".into(), a[4].clone()));
    // A panel width that is not a positive constant fails validation.
    w.inputs[0].panels = Some(a[4].as_const().unwrap_or(0));
    w
}

/// `conv_columns(B, M, N, K)`: `Y[b,m,n] = Σ_k X[m,k] · W[b,k,n]`, a 2-D convolution
/// on its input's columns: `X` the filters `[out channels, in channels·kh·kw]` (shared
/// by the batch), `W` each image's patches as columns `[in channels·kh·kw, out pixels]`
/// (im2col; a 1x1 convolution's input as it is), `Y` the output in NCHW.
pub fn conv_columns(a: &[Expr]) -> Workload {
    let axes = batch_axes(a);
    contraction(
        "conv_columns",
        &["B", "M", "N", "K"],
        a,
        axes,
        [&[1, 3], &[0, 3, 2], &[0, 1, 2]],
    )
}

/// `conv_packed(B, M, N, K, P)`: `conv_columns` whose filters are pre-packed in panels
/// of `P` rows (stored `[⌈M/P⌉, K, P]`, see [`TensorRef::panels`]), laid out so once
/// when a model is compiled: the transposed variant (output channels on the vectors,
/// for images of few pixels) reads them in place instead of transposing them per call,
/// and the usual one broadcasts from them as from packed rows.
pub fn conv_packed(a: &[Expr]) -> Workload {
    let mut w = conv_columns(&a[..4]);
    w.op = "conv_packed".into();
    w.args.push(("P".into(), a[4].clone()));
    // A panel width that is not a positive constant fails validation.
    w.inputs[0].panels = Some(a[4].as_const().unwrap_or(0));
    w
}

fn attention_axes(a: &[Expr]) -> Vec<crate::Axis> {
    let [b, h, m, n, k] = [&a[0], &a[1], &a[2], &a[3], &a[4]];
    vec![
        axis("b", b, Spatial),
        axis("h", h, Spatial),
        axis("m", m, Spatial),
        axis("n", n, Spatial),
        axis("k", k, Reduction),
    ]
}

/// `attention_scores(B, H, M, N, K)`: `Y[b,h,m,n] = Σ_k X[b,m,h,k] · W[b,n,h,k]`, the
/// scores of multi-head attention from queries and keys as the projections lay them out
/// (`[batch, sequence, heads, dim]`; what `Q·Kᵀ` computes after transposing both).
pub fn attention_scores(a: &[Expr]) -> Workload {
    let axes = attention_axes(a);
    contraction(
        "attention_scores",
        &["B", "H", "M", "N", "K"],
        a,
        axes,
        [&[0, 2, 1, 4], &[0, 3, 1, 4], &[0, 1, 2, 3]],
    )
}

/// `attention_scores_bf16(B, H, M, N, K)`: [`attention_scores`] in bfloat16 with `f32`
/// sums, queries and keys rounded in pairs along `K` (even, constant): a bf16 model's
/// scores.
pub fn attention_scores_bf16(a: &[Expr]) -> Workload {
    paired(attention_scores(a), "attention_scores_bf16")
}

/// `attention_context(B, H, M, N, K)`: `Y[b,m,h,n] = Σ_k X[b,h,m,k] · W[b,k,h,n]`, the
/// context of multi-head attention from the probabilities (`[batch, heads, M, K]`) and
/// the values as the projection lays them out (`[batch, sequence, heads, dim]`), written
/// in that layout too (what `P·V` and the transpose back compute).
pub fn attention_context(a: &[Expr]) -> Workload {
    let axes = attention_axes(a);
    contraction(
        "attention_context",
        &["B", "H", "M", "N", "K"],
        a,
        axes,
        [&[0, 1, 2, 4], &[0, 4, 1, 3], &[0, 2, 1, 3]],
    )
}

/// `cache_attention_scores(B, H, M, N, K, R)`: `Y[b,h,m,n] = Σ_k X[b,m,h,k] ·
/// W[b,h,n,k]`, the scores of queries as the projection lays them out against keys in
/// a key/value cache's layout (`[batch, heads, sequence, dim]`: a decoder's `present`
/// keys, read in place instead of transposed). The cache holds `R` rows more than the
/// `N` it is read to (`W` is `[B, H, N + R, K]`): 0 where it is exactly the keys, the
/// room left where a decoder appends to it in place.
pub fn cache_attention_scores(a: &[Expr]) -> Workload {
    let axes = attention_axes(a);
    let mut w = contraction(
        "cache_attention_scores",
        &["B", "H", "M", "N", "K", "R"],
        a,
        axes,
        [&[0, 2, 1, 4], &[0, 1, 3, 4], &[0, 1, 2, 3]],
    );
    w.inputs[1].shape[2] = (&a[3] + &a[5]).simplify();
    w
}

/// `cache_attention_scores_bf16(B, H, M, N, K, R)`: [`cache_attention_scores`] in
/// bfloat16 with `f32` sums, as [`attention_scores_bf16`].
pub fn cache_attention_scores_bf16(a: &[Expr]) -> Workload {
    paired(cache_attention_scores(a), "cache_attention_scores_bf16")
}

/// `cache_attention_context(B, H, M, N, K, R)`: `Y[b,m,h,n] = Σ_k X[b,h,m,k] ·
/// W[b,h,k,n]`, the context from the probabilities and values in a key/value cache's
/// layout (`[batch, heads, sequence, dim]`), written in the projections' layout
/// (`[batch, sequence, heads, dim]`, what the transpose back computes). The cache holds
/// `R` rows more than the `K` it is read to (`W` is `[B, H, K + R, N]`), as in
/// [`cache_attention_scores`].
pub fn cache_attention_context(a: &[Expr]) -> Workload {
    let axes = attention_axes(a);
    let mut w = contraction(
        "cache_attention_context",
        &["B", "H", "M", "N", "K", "R"],
        a,
        axes,
        [&[0, 1, 2, 4], &[0, 1, 4, 3], &[0, 2, 1, 3]],
    );
    w.inputs[1].shape[2] = (&a[4] + &a[5]).simplify();
    w
}

fn grouped_axes(a: &[Expr]) -> Vec<crate::Axis> {
    let [b, h, g, m, n, k] = [&a[0], &a[1], &a[2], &a[3], &a[4], &a[5]];
    vec![
        axis("b", b, Spatial),
        axis("h", h, Spatial),
        axis("g", g, Spatial),
        axis("m", m, Spatial),
        axis("n", n, Spatial),
        axis("k", k, Reduction),
    ]
}

/// `grouped_cache_attention_scores(B, H, G, M, N, K, R)`: `Y[b,h,g,m,n] = Σ_k
/// X[b,h,g,m,k] · W[b,h,n,k]`, grouped-query attention's scores (Llama's): `H·G` query
/// heads in `[batch, heads, sequence, dim]` (`[B, H·G, M, K]`, each group of `G`
/// consecutive heads sharing one key head), keys in a cache's `[B, H, N + R, K]` read
/// in place by every head of their group — instead of the cache repeated `G` times.
/// `R` as in [`cache_attention_scores`].
pub fn grouped_cache_attention_scores(a: &[Expr]) -> Workload {
    let axes = grouped_axes(a);
    let mut w = contraction(
        "grouped_cache_attention_scores",
        &["B", "H", "G", "M", "N", "K", "R"],
        a,
        axes,
        [&[0, 1, 2, 3, 5], &[0, 1, 4, 5], &[0, 1, 2, 3, 4]],
    );
    w.inputs[1].shape[2] = (&a[4] + &a[6]).simplify();
    w
}

/// `grouped_cache_attention_scores_bf16(B, H, G, M, N, K, R)`:
/// [`grouped_cache_attention_scores`] in bfloat16 with `f32` sums, as
/// [`attention_scores_bf16`].
pub fn grouped_cache_attention_scores_bf16(a: &[Expr]) -> Workload {
    paired(
        grouped_cache_attention_scores(a),
        "grouped_cache_attention_scores_bf16",
    )
}

/// `grouped_cache_attention_context(B, H, G, M, N, K, R)`: `Y[b,h,g,m,n] = Σ_k
/// X[b,h,g,m,k] · W[b,h,k,n]`, grouped-query attention's context: the probabilities of
/// `H·G` query heads (`[B, H·G, M, K]`) against values in a cache's `[B, H, K + R, N]`,
/// each group of `G` heads reading its value head in place; the output in
/// `[batch, heads, sequence, dim]`.
pub fn grouped_cache_attention_context(a: &[Expr]) -> Workload {
    let axes = grouped_axes(a);
    let mut w = contraction(
        "grouped_cache_attention_context",
        &["B", "H", "G", "M", "N", "K", "R"],
        a,
        axes,
        [&[0, 1, 2, 3, 5], &[0, 1, 5, 4], &[0, 1, 2, 3, 4]],
    );
    w.inputs[1].shape[2] = (&a[5] + &a[6]).simplify();
    w
}

/// The contraction `op` over `axes`: operands `X` and `W` and output `Y` indexed by the
/// given axes (in their dimension order).
fn contraction(
    op: &str,
    names: &[&str],
    a: &[Expr],
    axes: Vec<crate::Axis>,
    [x, w, y]: [&[usize]; 3],
) -> Workload {
    let (x, w, y) = (
        TensorRef::over("X", &axes, x),
        TensorRef::over("W", &axes, w),
        TensorRef::over("Y", &axes, y),
    );
    workload(op, names, a, OpClass::Contraction, axes, vec![x, w], y)
}
