//! The operator registry: every operator anyshape knows, defined once — its name and
//! arguments, its class, and its builder, which gives its axes, tensors and shapes
//! (the shape rule) as expressions over the arguments. The reference semantics follow
//! from the class (see [`crate::OpClass`]); the text form reads names from here.
//!
//! To add an operator of an existing class: a builder in the class's file and a line
//! in [`OPERATORS`]. A new class also needs its variant in `OpClass`, its reference in
//! `anyshape-measure` and a sketch in `anyshape-codegen`.
mod attention;
pub use attention::AttentionAxes;
mod contraction;
mod normalization;

use crate::{Expr, OpClass, Workload};

/// One operator of the registry.
pub struct OpDef {
    /// Its name in the text form, e.g. `dense`.
    pub name: &'static str,
    /// Its arguments, in order (each an expression over shape vars).
    pub args: &'static [&'static str],
    /// What it computes, in one line.
    pub doc: &'static str,
    /// Its class's name (see [`OpClass::name`]).
    pub class: &'static str,
    /// The builder: axes, tensors and shapes from the argument values.
    pub build: fn(&[Expr]) -> Workload,
}

/// The shape var of the rows a decoder's key/value cache holds past those a run reads
/// (the `R` of the `cache_attention_*` and `grouped_cache_attention_*` ops): 0 in a plain
/// run, where the cache is exactly the `present` tensor; the room left where the
/// runtime keeps the cache across runs and appends to it in place.
pub const CACHE_RESERVE: &str = "cache_reserve";

/// Every operator, in the order help texts list them.
pub static OPERATORS: &[OpDef] = &[
    OpDef {
        name: "dense",
        args: &["M", "N", "K"],
        doc: "Y[m,n] = sum_k X[m,k] * W[n,k]",
        class: "contraction",
        build: contraction::dense,
    },
    OpDef {
        name: "dense_packed",
        args: &["M", "N", "K", "P"],
        doc: "dense with W pre-packed in panels of P rows: stored [ceil(N/P), K, P]",
        class: "contraction",
        build: contraction::dense_packed,
    },
    OpDef {
        name: "dense_bf16",
        args: &["M", "N", "K", "P"],
        doc: "dense in bf16 (f32 sums), W in panels of P rows of bf16 pairs along K: stored [ceil(N/P), K/2, P] words; K even",
        class: "contraction",
        build: contraction::dense_bf16,
    },
    OpDef {
        name: "dense_i8",
        args: &["M", "N", "K", "P"],
        doc: "dense on 8-bit integers (X quantized per row, i32 sums, times the row's scale), W in panels of P rows of words of four bytes along K (each weight + 128): stored [ceil(N/P), K/4, P] words; K a multiple of 4",
        class: "contraction",
        build: contraction::dense_i8,
    },
    OpDef {
        name: "batch_matmul_nt",
        args: &["B", "M", "N", "K"],
        doc: "Y[b,m,n] = sum_k X[b,m,k] * W[b,n,k]",
        class: "contraction",
        build: contraction::batch_matmul_nt,
    },
    OpDef {
        name: "batch_matmul_nn",
        args: &["B", "M", "N", "K"],
        doc: "Y[b,m,n] = sum_k X[b,m,k] * W[b,k,n]",
        class: "contraction",
        build: contraction::batch_matmul_nn,
    },
    OpDef {
        name: "batch_matmul_packed",
        args: &["B", "M", "N", "K", "P"],
        doc: "batch_matmul_nn with X pre-packed in panels of P rows per batch item: stored [B, ceil(M/P), K, P]",
        class: "contraction",
        build: contraction::batch_matmul_packed,
    },
    OpDef {
        name: "conv_columns",
        args: &["B", "M", "N", "K"],
        doc: "Y[b,m,n] = sum_k X[m,k] * W[b,k,n] (a 2-D convolution: X the filters [out channels, in channels*kh*kw], W each image's columns [in channels*kh*kw, out pixels] (im2col), Y in NCHW)",
        class: "contraction",
        build: contraction::conv_columns,
    },
    OpDef {
        name: "conv_packed",
        args: &["B", "M", "N", "K", "P"],
        doc: "conv_columns with X (the filters) pre-packed in panels of P rows: stored [ceil(M/P), K, P]",
        class: "contraction",
        build: contraction::conv_packed,
    },
    OpDef {
        name: "attention_scores",
        args: &["B", "H", "M", "N", "K"],
        doc: "Y[b,h,m,n] = sum_k X[b,m,h,k] * W[b,n,h,k] (queries and keys in [batch, sequence, heads, dim])",
        class: "contraction",
        build: contraction::attention_scores,
    },
    OpDef {
        name: "attention_scores_bf16",
        args: &["B", "H", "M", "N", "K"],
        doc: "attention_scores in bf16 (f32 sums): queries and keys rounded in pairs along K, which must be even",
        class: "contraction",
        build: contraction::attention_scores_bf16,
    },
    OpDef {
        name: "attention_context",
        args: &["B", "H", "M", "N", "K"],
        doc: "Y[b,m,h,n] = sum_k X[b,h,m,k] * W[b,k,h,n] (values and output in [batch, sequence, heads, dim])",
        class: "contraction",
        build: contraction::attention_context,
    },
    OpDef {
        name: "cache_attention_scores",
        args: &["B", "H", "M", "N", "K", "R"],
        doc: "Y[b,h,m,n] = sum_k X[b,m,h,k] * W[b,h,n,k] (queries in [batch, sequence, heads, dim], keys in a cache's [batch, heads, N+R, dim]: R rows to spare)",
        class: "contraction",
        build: contraction::cache_attention_scores,
    },
    OpDef {
        name: "cache_attention_scores_bf16",
        args: &["B", "H", "M", "N", "K", "R"],
        doc: "cache_attention_scores in bf16 (f32 sums): queries and keys rounded in pairs along K, which must be even",
        class: "contraction",
        build: contraction::cache_attention_scores_bf16,
    },
    OpDef {
        name: "cache_attention_context",
        args: &["B", "H", "M", "N", "K", "R"],
        doc: "Y[b,m,h,n] = sum_k X[b,h,m,k] * W[b,h,k,n] (values in a cache's [batch, heads, K+R, dim]: R rows to spare; output in [batch, sequence, heads, dim])",
        class: "contraction",
        build: contraction::cache_attention_context,
    },
    OpDef {
        name: "grouped_cache_attention_scores",
        args: &["B", "H", "G", "M", "N", "K", "R"],
        doc: "Y[b,h,g,m,n] = sum_k X[b,h,g,m,k] * W[b,h,n,k] (grouped-query: H*G query heads in [batch, heads, sequence, dim], G per key head of a cache's [batch, H, N+R, dim])",
        class: "contraction",
        build: contraction::grouped_cache_attention_scores,
    },
    OpDef {
        name: "grouped_cache_attention_scores_bf16",
        args: &["B", "H", "G", "M", "N", "K", "R"],
        doc: "grouped_cache_attention_scores in bf16 (f32 sums): queries and keys rounded in pairs along K, which must be even",
        class: "contraction",
        build: contraction::grouped_cache_attention_scores_bf16,
    },
    OpDef {
        name: "grouped_cache_attention_context",
        args: &["B", "H", "G", "M", "N", "K", "R"],
        doc: "Y[b,h,g,m,n] = sum_k X[b,h,g,m,k] * W[b,h,k,n] (grouped-query: H*G heads' probabilities, G per value head of a cache's [batch, H, K+R, dim]; output in [batch, heads, sequence, dim])",
        class: "contraction",
        build: contraction::grouped_cache_attention_context,
    },
    OpDef {
        name: "softmax",
        args: &["M", "N"],
        doc: "Y[m,n] = exp(X[m,n] - max_n X[m,:]) / sum_n exp(X[m,n] - max_n X[m,:])",
        class: "normalization",
        build: normalization::softmax,
    },
    OpDef {
        name: "layer_norm",
        args: &["M", "N"],
        doc: "Y[m,n] = (X[m,n] - mean_n X[m,:]) / sqrt(var_n X[m,:] + eps) (eps=C after the arguments; 1e-5 if absent); its scale and bias are epilogue ops mul(n), add(n)",
        class: "normalization",
        build: normalization::layer_norm,
    },
    OpDef {
        name: "rms_norm",
        args: &["M", "N"],
        doc: "Y[m,n] = X[m,n] / sqrt(mean_n X[m,:]^2 + eps) (eps=C after the arguments; 1e-5 if absent); its scale is an epilogue op mul(n)",
        class: "normalization",
        build: normalization::rms_norm,
    },
    OpDef {
        name: "attention",
        args: &["B", "H", "M", "N", "D"],
        doc: "Y[b,m,h,d] = sum_n softmax_n(scale * sum_e Q[b,m,h,e] * K[b,n,h,e]) * V[b,n,h,d], all four in [batch, sequence, heads, dim], the scores never stored (scale=C after the arguments, 1 if absent; nan_to_zero: probabilities that are not numbers count as 0)",
        class: "attention",
        build: attention::attention,
    },
    OpDef {
        name: "masked_attention",
        args: &["B", "H", "M", "N", "D"],
        doc: "attention with mask[b,m,n] added to the scaled scores before the softmax",
        class: "attention",
        build: attention::masked_attention,
    },
    OpDef {
        name: "attention_bf16",
        args: &["B", "H", "M", "N", "D"],
        doc: "attention whose products may multiply in bf16 (f32 sums): on AMX tiles where the CPU has them and D is a multiple of 32, in f32 elsewhere",
        class: "attention",
        build: attention::attention_bf16,
    },
    OpDef {
        name: "masked_attention_bf16",
        args: &["B", "H", "M", "N", "D"],
        doc: "masked_attention as attention_bf16",
        class: "attention",
        build: attention::masked_attention_bf16,
    },
    OpDef {
        name: "cache_attention",
        args: &["B", "H", "M", "N", "D", "R"],
        doc: "attention with K and V in a decoder's cache [batch, heads, N+R, dim] read in place: Y[b,m,h,d] = sum_n softmax_n(scale * sum_e Q[b,m,h,e] * K[b,h,n,e]) * V[b,h,n,d]",
        class: "attention",
        build: attention::cache_attention,
    },
    OpDef {
        name: "masked_cache_attention",
        args: &["B", "H", "M", "N", "D", "R"],
        doc: "cache_attention with mask[b,m,n] added to the scaled scores before the softmax",
        class: "attention",
        build: attention::masked_cache_attention,
    },
    OpDef {
        name: "cache_attention_bf16",
        args: &["B", "H", "M", "N", "D", "R"],
        doc: "cache_attention as attention_bf16",
        class: "attention",
        build: attention::cache_attention_bf16,
    },
    OpDef {
        name: "masked_cache_attention_bf16",
        args: &["B", "H", "M", "N", "D", "R"],
        doc: "masked_cache_attention as attention_bf16",
        class: "attention",
        build: attention::masked_cache_attention_bf16,
    },
    OpDef {
        name: "grouped_cache_attention",
        args: &["B", "H", "G", "M", "N", "D", "R"],
        doc: "grouped-query attention: Q and Y in [batch, H*G heads, M, dim], each G query heads sharing a K/V head of a cache [batch, H, N+R, dim]: Y[b,h,g,m,d] = sum_n softmax_n(scale * sum_e Q[b,h,g,m,e] * K[b,h,n,e]) * V[b,h,n,d]",
        class: "attention",
        build: attention::grouped_cache_attention,
    },
    OpDef {
        name: "masked_grouped_cache_attention",
        args: &["B", "H", "G", "M", "N", "D", "R"],
        doc: "grouped_cache_attention with mask[b,m,n] added to the scaled scores before the softmax",
        class: "attention",
        build: attention::masked_grouped_cache_attention,
    },
    OpDef {
        name: "grouped_cache_attention_bf16",
        args: &["B", "H", "G", "M", "N", "D", "R"],
        doc: "grouped_cache_attention as attention_bf16",
        class: "attention",
        build: attention::grouped_cache_attention_bf16,
    },
    OpDef {
        name: "masked_grouped_cache_attention_bf16",
        args: &["B", "H", "G", "M", "N", "D", "R"],
        doc: "masked_grouped_cache_attention as attention_bf16",
        class: "attention",
        build: attention::masked_grouped_cache_attention_bf16,
    },
];

/// The operator named `name`.
pub fn operator(name: &str) -> Option<&'static OpDef> {
    OPERATORS.iter().find(|o| o.name == name)
}

/// The operator `name`, or the error that lists the ones the registry knows.
pub(crate) fn known_operator(name: &str) -> crate::Result<&'static OpDef> {
    operator(name).ok_or_else(|| crate::IrError::UnknownWorkload {
        name: name.to_string(),
        known: OPERATORS
            .iter()
            .map(|o| o.name)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// A workload of `class` with the common fields filled in.
pub(crate) fn workload(
    op: &str,
    arg_names: &[&str],
    args: &[Expr],
    class: OpClass,
    axes: Vec<crate::Axis>,
    inputs: Vec<crate::TensorRef>,
    output: crate::TensorRef,
) -> Workload {
    Workload {
        op: op.to_string(),
        args: arg_names
            .iter()
            .map(|n| n.to_string())
            .zip(args.iter().cloned())
            .collect(),
        dtype: crate::DType::F32,
        precision: crate::Precision::F32,
        class,
        axes,
        inputs,
        output,
        epilogue: crate::Epilogue::none(),
    }
}

/// An axis.
pub(crate) fn axis(name: &str, extent: &Expr, kind: crate::AxisKind) -> crate::Axis {
    crate::Axis {
        name: name.into(),
        extent: extent.clone(),
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operator_builds_a_valid_workload_of_its_class() {
        for op in OPERATORS {
            // Panel widths are constants; every other argument an expression.
            let args: Vec<Expr> = (0..op.args.len())
                .map(|i| match op.args[i] {
                    "P" => Expr::Const(16),
                    // bf16 (i8) reduces over pairs (quads): a constant multiple.
                    "K" if op.name.ends_with("bf16") || op.name.ends_with("i8") => Expr::Const(64),
                    _ => Expr::var("T") + i as i64,
                })
                .collect();
            let w = (op.build)(&args);
            w.validate().unwrap_or_else(|e| panic!("{}: {e}", op.name));
            assert_eq!((w.op.as_str(), w.class.name()), (op.name, op.class));
            assert_eq!(operator(op.name).map(|o| o.name), Some(op.name));
        }
        assert!(operator("conv9d").is_none());
    }

    /// bf16 weights: words of two bfloat16 along K in panels, half of `dense_packed`'s
    /// words; the reduction counts pairs, so K must be an even constant.
    #[test]
    fn bf16_weights_are_pairs_in_panels() {
        let w = crate::Workload::parse("dense_bf16(M=2,N=5,K=6,P=4)").unwrap();
        assert_eq!(w.precision, crate::Precision::Bf16);
        let b = w.bind(&crate::Bindings::default()).unwrap();
        // X is 2 x 6 floats, W two panels of 4 rows by 3 words, Y 2 x 5.
        assert_eq!(b.lens, vec![12, 24, 10]);
        assert_eq!(b.axis_strides[0], vec![6, 0, 2]);
        let packed = crate::Workload::parse("dense_packed(M=2,N=5,K=6,P=4)").unwrap();
        let p = packed.bind(&crate::Bindings::default()).unwrap();
        assert_eq!(w.flops(&b), packed.flops(&p));
        for bad in [
            "dense_bf16(M=2,N=5,K=7,P=4)",
            "dense_bf16(M=2,N=5,K=2*T,P=4)",
        ] {
            let e = crate::Workload::parse(bad).unwrap_err().to_string();
            assert!(e.contains("even constant"), "{bad}: {e}");
        }
    }

    /// i8 weights: words of four bytes along K in panels, a quarter of `dense_packed`'s
    /// words; the reduction counts quads, so K must be a constant multiple of 4.
    #[test]
    fn i8_weights_are_quads_in_panels() {
        let w = crate::Workload::parse("dense_i8(M=2,N=5,K=8,P=4)").unwrap();
        assert_eq!(w.precision, crate::Precision::I8);
        let b = w.bind(&crate::Bindings::default()).unwrap();
        // X is 2 x 8 floats, W two panels of 4 rows by 2 words, Y 2 x 5.
        assert_eq!(b.lens, vec![16, 16, 10]);
        assert_eq!(b.axis_strides[0], vec![8, 0, 4]);
        let packed = crate::Workload::parse("dense_packed(M=2,N=5,K=8,P=4)").unwrap();
        let p = packed.bind(&crate::Bindings::default()).unwrap();
        assert_eq!(w.flops(&b), packed.flops(&p));
        for bad in ["dense_i8(M=2,N=5,K=6,P=4)", "dense_i8(M=2,N=5,K=4*T,P=4)"] {
            let e = crate::Workload::parse(bad).unwrap_err().to_string();
            assert!(e.contains("multiple of 4"), "{bad}: {e}");
        }
    }

    #[test]
    fn packed_weights_lie_in_panels() {
        let w = crate::Workload::parse("dense_packed(M=2,N=5,K=3,P=4)").unwrap();
        assert_eq!(w.to_string(), "dense_packed(M=2,N=5,K=3,P=4)");
        let b = w.bind(&crate::Bindings::default()).unwrap();
        // Two panels of 4 rows (the 5 rows padded to 8) by 3 columns.
        assert_eq!(b.lens, vec![6, 24, 10]);
        // (r, c) at (r / 4)·12 + c·4 + r % 4; axes are m, n, k.
        for (n, k, at) in [(0, 0, 0), (3, 0, 3), (0, 2, 8), (4, 0, 12), (4, 2, 20)] {
            assert_eq!(b.offset(1, &[0, n, k]), at, "W[{n},{k}]");
        }
        for bad in [
            "dense_packed(M=2,N=5,K=3,P=0)",
            "dense_packed(M=2,N=5,K=3,P=T)",
        ] {
            assert!(crate::Workload::parse(bad).is_err(), "{bad}");
        }
    }

    /// A batch of matrices in panels: each item's rows padded to whole panels, the
    /// items one after another, symbolically as when bound.
    #[test]
    fn batched_weights_lie_in_panels_item_after_item() {
        let w = crate::Workload::parse("batch_matmul_packed(B=2,M=5,N=2,K=3,P=4)").unwrap();
        assert_eq!(w.to_string(), "batch_matmul_packed(B=2,M=5,N=2,K=3,P=4)");
        let b = w.bind(&crate::Bindings::default()).unwrap();
        // Per item two panels of 4 rows (the 5 padded to 8) by 3 columns: 24 elements.
        assert_eq!(b.lens, vec![48, 12, 20]);
        // X[b, m, k] at b·24 + (m / 4)·12 + k·4 + m % 4; axes are b, m, n, k.
        for (i, m, k, at) in [
            (0, 0, 0, 0),
            (0, 4, 2, 20),
            (1, 0, 0, 24),
            (1, 3, 1, 31),
            (1, 4, 2, 44),
        ] {
            assert_eq!(b.offset(0, &[i, m, 0, k]), at, "X[{i},{m},{k}]");
        }
        let x = &w.inputs[0];
        let strides: Vec<i64> = x
            .strides()
            .iter()
            .map(|s| s.simplify().as_const().unwrap())
            .collect();
        assert_eq!(strides, vec![24, 1, 4]);
        assert_eq!(x.panel_stride().unwrap().simplify().as_const(), Some(12));
        assert!(crate::Workload::parse("batch_matmul_packed(B=2,M=5,N=2,K=3,P=0)").is_err());
    }
}
