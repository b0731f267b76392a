//! Fused attention: scores, scaling, mask, softmax and context in one operator (see
//! [`OpClass::Attention`]). Queries, keys, values and output lie in the projections'
//! `[batch, sequence, heads, dim]` layout (`attention`), or the keys and values in a
//! decoder's cache `[batch, heads, sequence, dim]` (`cache_attention`), or besides the
//! queries and output in `[batch, heads, sequence, dim]` with each key head shared by a
//! group of query heads (`grouped_cache_attention`, Llama's grouped-query attention).
use super::{axis, workload};
use crate::{
    AttentionSpec, AxisKind::Reduction, AxisKind::Spatial, Expr, OpClass, Scalar, TensorRef,
    Workload,
};

/// Where an attention's tensors lie (see the module doc).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// All four in `[batch, sequence, heads, dim]`; arguments `B, H, M, N, D`.
    Projections,
    /// Keys and values in a cache `[B, H, N + R, D]`; arguments `B, H, M, N, D, R`.
    Cache,
    /// Queries and output in `[B, H·G, M, D]`, keys and values in a cache
    /// `[B, H, N + R, D]`; arguments `B, H, G, M, N, D, R`.
    GroupedCache,
}

/// The axes of a fused attention ([`OpClass::Attention`]) by role: indices into its
/// `axes`. Every sketch and the reference find them so, whatever the layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionAxes {
    /// The batch.
    pub b: usize,
    /// The key/value heads (the query heads where there is no group).
    pub h: usize,
    /// The query heads of each key/value head (grouped-query attention), if any.
    pub g: Option<usize>,
    /// The query rows.
    pub m: usize,
    /// The head dim.
    pub d: usize,
    /// The keys (summed over).
    pub n: usize,
}

impl AttentionAxes {
    /// The axes of `w`, if it is a fused attention.
    pub fn of(w: &Workload) -> Option<AttentionAxes> {
        if !matches!(w.class, OpClass::Attention(_)) {
            return None;
        }
        let at = |name: &str| w.axes.iter().position(|a| a.name == name);
        Some(AttentionAxes {
            b: at("b")?,
            h: at("h")?,
            g: at("g"),
            m: at("m")?,
            d: at("d")?,
            n: at("n")?,
        })
    }
}

/// `op` in `layout` over the arguments (see [`Layout`]), its axes `b, h, [g,] m, d`
/// (spatial) and `n` (the keys, summed over), with the mask `[B, M, N]` as a fourth
/// operand where `masked`; scale 1 until [`Workload::with_attention`] sets it.
fn attention_of(op: &str, layout: Layout, a: &[Expr], masked: bool) -> Workload {
    let (names, grouped): (&[&str], bool) = match layout {
        Layout::Projections => (&["B", "H", "M", "N", "D"], false),
        Layout::Cache => (&["B", "H", "M", "N", "D", "R"], false),
        Layout::GroupedCache => (&["B", "H", "G", "M", "N", "D", "R"], true),
    };
    let g = usize::from(grouped);
    let [m, n, d] = [&a[2 + g], &a[3 + g], &a[4 + g]];
    let mut axes = vec![axis("b", &a[0], Spatial), axis("h", &a[1], Spatial)];
    if grouped {
        axes.push(axis("g", &a[2], Spatial));
    }
    axes.extend([
        axis("m", m, Spatial),
        axis("d", d, Spatial),
        axis("n", n, Reduction),
    ]);
    // Axis indices (the group, where there is one, is axis 2).
    let (b, h, group, m, d, n) = (0, 1, 2, 2 + g, 3 + g, 4 + g);
    // The queries' (and output's) dims, and the keys' (and values').
    let q: Vec<usize> = match layout {
        Layout::Projections | Layout::Cache => vec![b, m, h, d],
        Layout::GroupedCache => vec![b, h, group, m, d],
    };
    let kv: &[usize] = match layout {
        Layout::Projections => &[b, n, h, d],
        Layout::Cache | Layout::GroupedCache => &[b, h, n, d],
    };
    let mut inputs = vec![
        TensorRef::over("Q", &axes, &q),
        TensorRef::over("K", &axes, kv),
        TensorRef::over("V", &axes, kv),
    ];
    if layout != Layout::Projections {
        // The cache holds `R` rows past the `N` read.
        let rows = (&a[3 + g] + &a[5 + g]).simplify();
        inputs[1].shape[2] = rows.clone();
        inputs[2].shape[2] = rows;
    }
    if masked {
        inputs.push(TensorRef::over("mask", &axes, &[b, m, n]));
    }
    let y = TensorRef::over("Y", &axes, &q);
    let class = OpClass::Attention(AttentionSpec {
        scale: Scalar(1.0),
        masked,
        nan_to_zero: false,
    });
    workload(op, names, a, class, axes, inputs, y)
}

/// `w` whose products may multiply in bfloat16 (see [`attention_bf16`]).
fn bf16(mut w: Workload) -> Workload {
    w.precision = crate::Precision::Bf16;
    w
}

/// `attention(B, H, M, N, D)`: `Y[b,m,h,d] = Σ_n softmax_n(scale · Σ_e Q[b,m,h,e] ·
/// K[b,n,h,e]) · V[b,n,h,d]`.
pub fn attention(a: &[Expr]) -> Workload {
    attention_of("attention", Layout::Projections, a, false)
}

/// `masked_attention(B, H, M, N, D)`: [`attention`] with `mask[b,m,n]` added to the
/// scaled scores before the softmax.
pub fn masked_attention(a: &[Expr]) -> Workload {
    attention_of("masked_attention", Layout::Projections, a, true)
}

/// `attention_bf16(B, H, M, N, D)`: [`attention`] whose two products may multiply in
/// bfloat16 with `f32` sums (the queries, keys, probabilities and values rounded; see
/// [`Precision::Bf16`](crate::Precision)): on AMX tiles where the CPU has them and the
/// head dim is a whole number of 32-element tiles, in `f32` elsewhere.
pub fn attention_bf16(a: &[Expr]) -> Workload {
    bf16(attention_of(
        "attention_bf16",
        Layout::Projections,
        a,
        false,
    ))
}

/// `masked_attention_bf16(B, H, M, N, D)`: [`masked_attention`] as [`attention_bf16`].
pub fn masked_attention_bf16(a: &[Expr]) -> Workload {
    bf16(attention_of(
        "masked_attention_bf16",
        Layout::Projections,
        a,
        true,
    ))
}

/// `cache_attention(B, H, M, N, D, R)`: [`attention`] with the keys and values in a
/// decoder's cache `[B, H, N + R, D]` (read in place; `R` rows past the `N` read, as in
/// `cache_attention_scores`): `Y[b,m,h,d] = Σ_n softmax_n(scale · Σ_e Q[b,m,h,e] ·
/// K[b,h,n,e]) · V[b,h,n,d]`.
pub fn cache_attention(a: &[Expr]) -> Workload {
    attention_of("cache_attention", Layout::Cache, a, false)
}

/// `masked_cache_attention(B, H, M, N, D, R)`: [`cache_attention`] with `mask[b,m,n]`.
pub fn masked_cache_attention(a: &[Expr]) -> Workload {
    attention_of("masked_cache_attention", Layout::Cache, a, true)
}

/// `cache_attention_bf16(B, H, M, N, D, R)`: [`cache_attention`] as [`attention_bf16`].
pub fn cache_attention_bf16(a: &[Expr]) -> Workload {
    bf16(attention_of(
        "cache_attention_bf16",
        Layout::Cache,
        a,
        false,
    ))
}

/// `masked_cache_attention_bf16(B, H, M, N, D, R)`: [`masked_cache_attention`] as
/// [`attention_bf16`].
pub fn masked_cache_attention_bf16(a: &[Expr]) -> Workload {
    bf16(attention_of(
        "masked_cache_attention_bf16",
        Layout::Cache,
        a,
        true,
    ))
}

/// `grouped_cache_attention(B, H, G, M, N, D, R)`: grouped-query attention, `H·G` query
/// heads in `[B, H·G, M, D]`, each group of `G` consecutive ones sharing a key/value
/// head of a cache `[B, H, N + R, D]`; the output in the queries' layout:
/// `Y[b,h,g,m,d] = Σ_n softmax_n(scale · Σ_e Q[b,h,g,m,e] · K[b,h,n,e]) · V[b,h,n,d]`.
pub fn grouped_cache_attention(a: &[Expr]) -> Workload {
    attention_of("grouped_cache_attention", Layout::GroupedCache, a, false)
}

/// `masked_grouped_cache_attention(B, H, G, M, N, D, R)`: [`grouped_cache_attention`]
/// with `mask[b,m,n]`.
pub fn masked_grouped_cache_attention(a: &[Expr]) -> Workload {
    attention_of(
        "masked_grouped_cache_attention",
        Layout::GroupedCache,
        a,
        true,
    )
}

/// `grouped_cache_attention_bf16(B, H, G, M, N, D, R)`: [`grouped_cache_attention`] as
/// [`attention_bf16`].
pub fn grouped_cache_attention_bf16(a: &[Expr]) -> Workload {
    bf16(attention_of(
        "grouped_cache_attention_bf16",
        Layout::GroupedCache,
        a,
        false,
    ))
}

/// `masked_grouped_cache_attention_bf16(B, H, G, M, N, D, R)`:
/// [`masked_grouped_cache_attention`] as [`attention_bf16`].
pub fn masked_grouped_cache_attention_bf16(a: &[Expr]) -> Workload {
    bf16(attention_of(
        "masked_grouped_cache_attention_bf16",
        Layout::GroupedCache,
        a,
        true,
    ))
}
