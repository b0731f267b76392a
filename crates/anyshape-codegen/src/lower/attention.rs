//! The fused attention sketch's lowering (see `sketch/attention.rs`):
//! ```text
//! parallel for task in batch x (key/value) heads x pieces:
//!   Kt[e, n] = K[b, h, n, e]            (once per task, in panels of a tile row's width
//!                                        along n; zero past N, up to whole panels)
//!   for each (query head g of the group, block of R query rows) of the task's piece:
//!     Qb[r, e] = scale · Q[b, h, g, m, e]  (zero past M)
//!     S[r, n] = Σ_e Qb[r, e] · Kt[e, n]        register tiles: R rows x V vectors of n
//!     each row r of the block: S[r, :] += mask; max; S = exp(S - max), summed;
//!       [nan_to_zero: S = nan_to_zero(S)]; rsum[r] = 1 / Σ
//!     Y[b, h, g, m, d] = rsum[r] · Σ_n S[r, n] · V[b, h, n, d]  register tiles: R rows
//!                                                   x V vectors of d, stored for r < M
//! ```
//! A (batch, key/value head)'s (query head, block) pairs are split into as many pieces
//! as make the tasks divide evenly among the threads (`sketch::attention_pieces`: one
//! where they already do; two for one key/value head on two cores), each piece packing
//! the keys again: multi-query attention (one key/value head) ran on one thread.
//! Every tensor is indexed through its strides along the axes (`AttentionAxes`), so one
//! lowering serves every layout of the operators (projections, a decoder's cache,
//! grouped query heads); the head dim (and the mask's keys) must be contiguous.
//! The scratch holds the packed keys (`D x N` rounded up) and one block of scores (`R x
//! N` rounded up): the scores never reach memory beyond it. The AMX variant's packing and
//! products are `attention_amx.rs`; the query block and the softmax (`attention_softmax.rs`)
//! are shared. The vector variant's register tiles of both products are
//! `attention_tiles.rs`'s. The pairs variant (bf16 on AVX512_BF16) packs the keys and
//! values, and rounds the query block and the probabilities, as the AMX variant does,
//! and runs both products as those register tiles of pair products (`Value::DotBf16`):
//! the sums along the head dim and along the keys a pair of them per product.
use super::attention_tiles::{context, scores, Tile};
use super::{c, renamed, shape_vars, v};
use crate::loop_ir::{
    for_, let_, store, BinaryOp, Cond, Func, LoopKind, Scope, Stmt, Transpose, Value,
};
use crate::sketch::AMX_EDGE;
use crate::{AttentionKernel, CodegenError, CpuTarget, Program, Result};
use anyshape_ir::{AttentionAxes, Expr, OpClass, Workload};

/// Lower a fused attention program.
pub(crate) fn lower(p: &Program<AttentionKernel>, target: &CpuTarget) -> Result<Func> {
    p.micro_kernel.validate(target)?;
    let w = &p.workload;
    let OpClass::Attention(spec) = w.class else {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: "the attention sketch serves fused attentions".into(),
        });
    };
    let (shape_vars, specialized) = shape_vars(p)?;
    let mk = p.micro_kernel;
    let (rows, vectors, lanes) = (mk.rows, mk.vectors, target.lanes_f32());
    let width = vectors * lanes;
    // The keys are padded to whole tile rows (vectors), or to pairs of AMX tiles.
    let granule = if mk.amx { 2 * AMX_EDGE } else { width };
    if (mk.amx || mk.pairs) && !crate::sketch::packs_pairs(w) {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: "the AMX and pairs variants serve bf16 attentions whose head dim is a \
                     constant multiple of 32"
                .into(),
        });
    }
    let axes = AttentionAxes::of(w).ok_or_else(|| CodegenError::SketchNotApplicable {
        workload: w.to_string(),
        reason: "an attention without the axes b, h, m, d and n".into(),
    })?;
    let extent = |a: usize| renamed(&w.axes[a].extent);
    let mut body = vec![
        let_("e_b", extent(axes.b)),
        let_("e_h", extent(axes.h)),
        let_("e_g", axes.g.map_or(c(1), extent)),
        let_("e_m", extent(axes.m)),
        let_("e_d", extent(axes.d)),
        let_("e_n", extent(axes.n)),
        let_("np", Expr::round_up(v("e_n"), granule as i64)),
        let_("nfull", v("e_n") / c(lanes)),
    ];
    body.extend(strides(w, &axes)?);
    // Whether the head dim is whole tile rows (else its last vectors are partial).
    let whole_d = w.axes[axes.d]
        .extent
        .as_const()
        .is_some_and(|d| d % width as i64 == 0);
    // The task's (query head, block) pairs: `items`, cut into `pieces`.
    body.extend([
        let_("nblk", Expr::ceil_div(v("e_m"), c(rows))),
        let_("items", v("e_g") * v("nblk")),
        let_("heads", v("e_b") * v("e_h")),
        let_("pieces", pieces(v("heads"), v("items"), target.cores)),
    ]);
    let mut task = vec![
        let_("th", v("t") / v("pieces")),
        let_("pc", v("t") - v("th") * v("pieces")),
        let_("bi", v("th") / v("e_h")),
        let_("hi", v("th") - v("bi") * v("e_h")),
        let_("items0", v("pc") * v("items") / v("pieces")),
        let_("items1", (v("pc") + c(1)) * v("items") / v("pieces")),
        // K[b, h, 0, 0] and V's: their heads' first elements.
        let_("k0", v("bi") * v("sk_b") + v("hi") * v("sk_h")),
        let_("v0", v("bi") * v("sval_b") + v("hi") * v("sval_h")),
        Stmt::Alloc {
            buf: "S".into(),
            len: c(rows) * v("np"),
            scope: Scope::Scratch(1),
        },
        Stmt::Alloc {
            buf: "Qb".into(),
            len: c(rows) * v("e_d"),
            scope: Scope::Scratch(2),
        },
        Stmt::Alloc {
            buf: "rsum".into(),
            len: c(rows),
            scope: Scope::Stack,
        },
    ];
    if mk.amx || mk.pairs {
        task.extend(super::attention_amx::pack(lanes));
    } else {
        task.push(Stmt::Alloc {
            buf: "Kt".into(),
            len: v("e_d") * v("np"),
            scope: Scope::Scratch(0),
        });
        task.push(transpose_heads(
            ("in1", v("k0"), v("sk_n")),
            "Kt",
            &|e, n| packed_key(width, e, n),
            c(width),
            lanes,
        ));
    }
    let mut block = vec![
        let_("m0", v("i") * c(rows)),
        let_("mlen", Expr::min(c(rows), v("e_m") - v("m0"))),
        // Q[b, h, g, m0, 0] and Y's.
        let_(
            "q0",
            v("bi") * v("sq_b") + v("hi") * v("sq_h") + v("gi") * v("sq_g") + v("m0") * v("sq_m"),
        ),
        let_(
            "y0",
            v("bi") * v("sy_b") + v("hi") * v("sy_h") + v("gi") * v("sy_g") + v("m0") * v("sy_m"),
        ),
    ];
    // The query block, scaled; zero past the last row.
    let q = Value::binary(
        BinaryOp::Mul,
        Value::load("in0", v("q0") + v("r") * v("sq_m") + v("e")),
        Value::Const {
            value: spec.scale.0,
            lanes: 1,
        },
    );
    block.push(for_(
        "r",
        c(rows),
        LoopKind::Serial,
        vec![for_(
            "e",
            v("e_d"),
            LoopKind::Serial,
            vec![store(
                "Qb",
                v("r") * v("e_d") + v("e"),
                Value::Select(
                    Cond::Lt(v("r"), v("mlen")),
                    Box::new(q),
                    Box::new(Value::Zero { lanes: 1 }),
                ),
            )],
        )],
    ));
    let softmax = for_(
        "r",
        v("mlen"),
        LoopKind::Serial,
        super::attention_softmax::softmax_row(lanes, spec.masked, spec.nan_to_zero),
    );
    if mk.amx {
        block.extend(super::attention_amx::block(rows, lanes, softmax));
    } else if mk.pairs {
        let d = w.axes[axes.d].extent.as_const().unwrap_or(0) as usize;
        let words = super::attention_amx::block_words;
        let [qw_alloc, qw] = words(("Qw", 5), ("Qb", v("e_d")), rows, v("half_d"));
        let [pw_alloc, pw] = words(("Pw", 6), ("S", v("np")), rows, v("half_n"));
        let tile = Tile {
            name: "s",
            loaded: "k",
            rows,
            vectors,
            lanes,
            pairs: true,
        };
        block.extend([qw_alloc, qw, scores(&tile), softmax, pw_alloc, pw]);
        // Tiles along the head dim of whole panels: as many as divide its panels.
        let panels = d / lanes;
        let vectors = (1..=vectors.min(panels))
            .rev()
            .find(|u| panels.is_multiple_of(*u))
            .unwrap_or(1);
        block.push(context(
            &Tile {
                name: "o",
                loaded: "v",
                vectors,
                ..tile
            },
            true,
        ));
    } else {
        let tile = |name, loaded| Tile {
            name,
            loaded,
            rows,
            vectors,
            lanes,
            pairs: false,
        };
        block.push(scores(&tile("s", "k")));
        block.push(softmax);
        block.push(context(&tile("o", "v"), whole_d));
    }
    let mut item = vec![
        let_("it", v("items0") + v("ij")),
        let_("gi", v("it") / v("nblk")),
        let_("i", v("it") - v("gi") * v("nblk")),
    ];
    item.extend(block);
    task.push(for_(
        "ij",
        v("items1") - v("items0"),
        LoopKind::Serial,
        item,
    ));
    body.push(for_(
        "t",
        v("heads") * v("pieces"),
        LoopKind::Parallel,
        task,
    ));
    Ok(Func {
        name: p.symbol(target),
        shape_vars,
        specialized,
        inputs: w.inputs.len(),
        threads: None,
        body,
    })
}

/// [`crate::sketch::attention_pieces`] over symbolic `heads` and `items`: a table over
/// `heads mod threads` (its value's indicator `max(0, 1 - |x - r|)`), clamped to
/// `[1, items]`.
fn pieces(heads: Expr, items: Expr, threads: usize) -> Expr {
    let t = threads.max(1) as i64;
    let x = heads % c(t as usize);
    let table = (0..t)
        .map(|r| {
            let at = Expr::max(
                c(0),
                c(1) - Expr::max(x.clone() - Expr::Const(r), Expr::Const(r) - x.clone()),
            );
            Expr::Const(crate::sketch::attention_pieces(r, i64::MAX, t)) * at
        })
        .fold(Expr::Const(0), |a, b| a + b);
    Expr::max(c(1), Expr::min(items, table))
}

/// Let-statements naming each tensor's strides along the axes the kernel steps (`sq_*`
/// the queries', `sk_*` the keys', `sval_*` the values' (not `sv_*`: the shape vars' names), `smk_*` the mask's, `sy_*` the
/// output's; 0 along an axis a tensor does not have). The head dim of Q, K, V and Y and
/// the mask's keys must be contiguous.
fn strides(w: &Workload, axes: &AttentionAxes) -> Result<Vec<Stmt>> {
    let tensors = w.tensors().collect::<Vec<_>>();
    let along = |t: usize, a: Option<usize>| {
        a.map_or(c(0), |a| renamed(&tensors[t].axis_stride(a)).simplify())
    };
    let out = w.inputs.len();
    let contiguous = [(0, axes.d), (1, axes.d), (2, axes.d), (out, axes.d)]
        .into_iter()
        .chain(w.inputs.get(3).map(|_| (3, axes.n)))
        .all(|(t, a)| along(t, Some(a)).as_const() == Some(1));
    if !contiguous {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: "the fused attention reads the head dim (and the mask's keys) contiguous"
                .into(),
        });
    }
    let (b, h, m, n) = (Some(axes.b), Some(axes.h), Some(axes.m), Some(axes.n));
    let mut s = Vec::new();
    for (t, prefix, which) in [
        (0, "sq", &[("b", b), ("h", h), ("g", axes.g), ("m", m)][..]),
        (1, "sk", &[("b", b), ("h", h), ("n", n)][..]),
        (2, "sval", &[("b", b), ("h", h), ("n", n)][..]),
        (
            out,
            "sy",
            &[("b", b), ("h", h), ("g", axes.g), ("m", m)][..],
        ),
    ] {
        for &(name, a) in which {
            s.push(let_(&format!("{prefix}_{name}"), along(t, a)));
        }
    }
    if w.inputs.len() > 3 {
        s.push(let_("smk_b", along(3, b)));
        s.push(let_("smk_m", along(3, m)));
    }
    Ok(s)
}

/// Where key `n`'s element `e` lies in the packed keys: panels of `width` keys (a tile
/// row), each `D x width`, `n` contiguous inside.
fn packed_key(width: usize, e: Expr, n: Expr) -> Expr {
    let panel = n.clone() / c(width);
    panel.clone() * v("e_d") * c(width) + e * c(width) + (n - panel * c(width))
}

/// `dst[at(e, n)] = src[base + n · row + e]` (the task's head of the keys or the values,
/// transposed), zero for `N <= n < np`; `at(e + 1, n)` is `stride` past `at(e, n)`: tiles
/// of `lanes x lanes` transposed in registers (elements one by one on a scalar target).
pub(super) fn transpose_heads(
    (src, base, row): (&str, Expr, Expr),
    dst: &str,
    at: &dyn Fn(Expr, Expr) -> Expr,
    stride: Expr,
    lanes: usize,
) -> Stmt {
    if lanes == 1 {
        let k = Value::load(src, base + v("n") * row + v("e"));
        return for_(
            "n",
            v("np"),
            LoopKind::Serial,
            vec![for_(
                "e",
                v("e_d"),
                LoopKind::Serial,
                vec![store(
                    dst,
                    at(v("e"), v("n")),
                    Value::Select(
                        Cond::Lt(v("n"), v("e_n")),
                        Box::new(k),
                        Box::new(Value::Zero { lanes: 1 }),
                    ),
                )],
            )],
        );
    }
    let tile = Stmt::Transpose(Box::new(Transpose {
        dst: dst.into(),
        dst_index: at(v("e0") * c(lanes), v("n0") * c(lanes)),
        dst_stride: stride,
        src: src.into(),
        src_index: base + v("n0") * c(lanes) * row.clone() + v("e0") * c(lanes),
        src_stride: row,
        rows: v("e_n") - v("n0") * c(lanes),
        cols: v("e_d") - v("e0") * c(lanes),
        outs: v("e_d") - v("e0") * c(lanes),
        width: lanes,
    }));
    for_(
        "n0",
        v("np") / c(lanes),
        LoopKind::Serial,
        vec![for_(
            "e0",
            Expr::ceil_div(v("e_d"), c(lanes)),
            LoopKind::Serial,
            vec![tile],
        )],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CpuTarget, PaddingStrategy};
    use anyshape_ir::Bindings;

    /// The symbolic piece count is [`crate::sketch::attention_pieces`] at every head
    /// count, item count and thread count: one where the heads divide among the threads.
    #[test]
    fn pieces_by_table_are_the_gcd_rule() {
        for threads in [1, 2, 3, 4, 16] {
            let e = pieces(Expr::var("h"), Expr::var("i"), threads);
            for h in 0..40 {
                for i in [0, 1, 2, 3, 5, 8, 100] {
                    let b = Bindings::from_pairs([("h", h), ("i", i)]);
                    let want = crate::sketch::attention_pieces(h, i, threads as i64);
                    assert_eq!(
                        e.eval(&b).unwrap(),
                        want,
                        "{threads} threads, {h} heads, {i}"
                    );
                }
            }
        }
        assert_eq!(crate::sketch::attention_pieces(12, 100, 2), 1);
        assert_eq!(crate::sketch::attention_pieces(1, 100, 2), 2);
        assert_eq!(crate::sketch::attention_pieces(12, 100, 16), 4);
    }

    /// Shape vars named as the attention's axes (`b`, `h`, `n`, …) take no name the
    /// kernel binds itself: the values' strides once clashed with the shape var `n`
    /// (`sv_n`), and the symbolic kernel did not compile.
    #[test]
    fn shape_vars_named_as_the_axes_clash_with_nothing() {
        let target = CpuTarget::avx512_for_tests();
        let w = Workload::parse(
            "masked_grouped_cache_attention(B=b,H=h,G=g,M=m,N=n,D=32,R=r,scale=0.2)",
        )
        .unwrap();
        let mk = AttentionKernel::default_for(&target);
        let p = Program::symbolic(&w, mk, PaddingStrategy::LocalPad);
        let f = lower(&p, &target).unwrap();
        crate::verify::verify(&f).unwrap();
    }
}
