//! The fused attention's AMX variant (`amx=1`, see `sketch/attention.rs`): both
//! products on AMX-BF16 tiles (`Stmt::TileProduct`), the head dim `D` whole tiles of 32.
//! ```text
//! once per task (a batch item's key/value head):
//!   Kp: the keys as weight panels of 16 keys, words of pairs along the head dim
//!   Vt[d, n] = V[b, h, n, d] (zero past N); Vp: its columns as weight panels of 16
//!     columns, words of pairs along the keys
//! each block of R = 16 or 32 query rows:
//!   Qw: the scaled query block (Qb, shared) as words of pairs
//!   S = Qw · Kp on tiles (R/16 x 2 output tiles per product, the whole head dim)
//!   the softmax of each row (shared), then Pw: S as words of pairs (zero past N)
//!   Ob = Pw · Vp on tiles (R/16 x 2 output tiles per product, all the keys)
//!   Y[b, h, g, m, :] = Ob[r, :] · rsum[r] for the block's rows
//! ```
//! The keys are padded to whole pairs of tiles (`np`, a multiple of 32): the padded
//! keys and values are zero, so are their scores and (unnormalized) probabilities.
use super::attention::transpose_heads;
use super::{c, v};
use crate::loop_ir::{for_, let_, store, Cond, LoopKind, Scope, Stmt, TileProduct, Value};
use crate::sketch::AMX_EDGE;
use anyshape_ir::Expr;

/// `for var in 0..extent` over `body`.
fn each(var: &str, extent: Expr, body: Vec<Stmt>) -> Stmt {
    for_(var, extent, LoopKind::Serial, body)
}

/// A scratch buffer of `len` floats (or words).
fn scratch(buf: &str, len: Expr, slot: u8) -> Stmt {
    Stmt::Alloc {
        buf: buf.into(),
        len,
        scope: Scope::Scratch(slot),
    }
}

/// `dst[g, kk, cc]` (a weight panel per group `g` of 16 columns, row `kk` the words of
/// pair `kk`) for `g < groups`, `kk < pairs`: `value` at those indices.
fn panels(dst: &str, groups: Expr, pairs: Expr, value: Value) -> Stmt {
    let edge = c(AMX_EDGE);
    let at = (v("g") * pairs.clone() + v("kk")) * edge.clone() + v("cc");
    // Each column's pairs in turn: the source is read along its rows.
    each(
        "g",
        groups,
        vec![each(
            "cc",
            edge,
            vec![each("kk", pairs, vec![store(dst, at, value)])],
        )],
    )
}

/// The task's packing: the keys' and values' panels of words (see the module doc).
pub(super) fn pack(lanes: usize) -> Vec<Stmt> {
    let edge = c(AMX_EDGE);
    let key = v("g") * edge.clone() + v("cc");
    let k_pair = Value::Select(
        Cond::Lt(key.clone(), v("e_n")),
        Box::new(Value::PairBf16 {
            buf: "in1".into(),
            index: v("k0") + key * v("sk_n") + c(2) * v("kk"),
        }),
        Box::new(Value::Zero { lanes: 1 }),
    );
    let v_pair = Value::PairBf16 {
        buf: "Vt".into(),
        index: (v("g") * edge.clone() + v("cc")) * v("np") + c(2) * v("kk"),
    };
    vec![
        // Named once: a division inside a loop's indices keeps GCC from vectorizing it.
        let_("half_d", v("e_d") / c(2)),
        let_("half_n", v("np") / c(2)),
        scratch("Kp", v("np") * v("half_d"), 0),
        panels("Kp", v("np") / edge.clone(), v("half_d"), k_pair),
        scratch("Vt", v("e_d") * v("np"), 3),
        transpose_heads(
            ("in2", v("v0"), v("sval_n")),
            "Vt",
            &|d, n| d * v("np") + n,
            v("np"),
            lanes,
        ),
        scratch("Vp", v("e_d") * v("half_n"), 4),
        panels("Vp", v("e_d") / edge, v("half_n"), v_pair),
    ]
}

/// `rows x (2 · 16)` outputs `c[.., index..]` of `a`'s rows of words (`a_stride` apart)
/// times two of `b`'s panels (`panel` and the next, `b_stride` words each), summed over
/// `steps` steps of 16 words.
fn product(
    rows: usize,
    (a, a_stride): (&str, Expr),
    (b, panel, b_stride): (&str, Expr, Expr),
    steps: Expr,
    (out, index, stride): (&str, Expr, Expr),
) -> Stmt {
    Stmt::TileProduct(Box::new(TileProduct {
        a: a.into(),
        a_index: (0..rows / AMX_EDGE)
            .map(|i| c(i * AMX_EDGE) * a_stride.clone())
            .collect(),
        a_stride,
        b: b.into(),
        b_index: (0..2)
            .map(|j| (panel.clone() + c(j)) * b_stride.clone())
            .collect(),
        steps,
        c: out.into(),
        c_index: index,
        c_stride: stride,
    }))
}

/// A block of `rows` query rows (after the scaled block `Qb` is filled): the scores on
/// tiles, `softmax` (the shared rows' pass), the context on tiles and the stores.
pub(super) fn block(rows: usize, lanes: usize, softmax: Stmt) -> Vec<Stmt> {
    let edge = c(AMX_EDGE);
    let (half_d, half_n) = (v("half_d"), v("half_n"));
    let pairs = |dst: &str, src: &str, len: Expr, words: Expr| {
        each(
            "r",
            c(rows),
            vec![each(
                "kk",
                words.clone(),
                vec![store(
                    dst,
                    v("r") * words.clone() + v("kk"),
                    Value::PairBf16 {
                        buf: src.into(),
                        index: v("r") * len.clone() + c(2) * v("kk"),
                    },
                )],
            )],
        )
    };
    let out = v("y0") + v("r") * v("sy_m") + v("q") * c(lanes);
    let y = Value::binary(
        crate::loop_ir::BinaryOp::Mul,
        Value::vload("Ob", v("r") * v("e_d") + v("q") * c(lanes), lanes),
        Value::load("rsum", v("r")),
    );
    vec![
        scratch("Qw", c(rows) * half_d.clone(), 5),
        pairs("Qw", "Qb", v("e_d"), half_d.clone()),
        each(
            "jj",
            v("np") / c(2 * AMX_EDGE),
            vec![product(
                rows,
                ("Qw", half_d.clone()),
                ("Kp", c(2) * v("jj"), half_d.clone() * edge.clone()),
                v("e_d") / c(2 * AMX_EDGE),
                ("S", c(2 * AMX_EDGE) * v("jj"), v("np")),
            )],
        ),
        softmax,
        scratch("Pw", c(rows) * half_n.clone(), 6),
        pairs("Pw", "S", v("np"), half_n.clone()),
        scratch("Ob", c(rows) * v("e_d"), 7),
        each(
            "g2",
            v("e_d") / c(2 * AMX_EDGE),
            vec![product(
                rows,
                ("Pw", half_n.clone()),
                ("Vp", c(2) * v("g2"), half_n * edge),
                v("np") / c(2 * AMX_EDGE),
                ("Ob", c(2 * AMX_EDGE) * v("g2"), v("e_d")),
            )],
        ),
        each(
            "r",
            v("mlen"),
            vec![each("q", v("e_d") / c(lanes), vec![store("out0", out, y)])],
        ),
    ]
}
