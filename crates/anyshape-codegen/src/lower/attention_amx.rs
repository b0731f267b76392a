//! The fused attention's AMX variant (`amx=1`, see `sketch/attention.rs`): both
//! products on AMX-BF16 tiles (`Stmt::TileProduct`), the head dim `D` whole tiles of 32.
//! ```text
//! once per task (a batch item's key/value head):
//!   Kw[n, kk] = the pair (K[b, h, n, 2kk], K[b, h, n, 2kk + 1]) as one word (n < N)
//!   Kp: Kw's rows as weight panels of 16 keys (16 x 16 register transposes of words,
//!     zero past N), words of pairs along the head dim
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
//! The pairs variant (`pairs=1`) packs the keys and values (`pack`) and rounds `Qw` and
//! `Pw` (`block_words`) as here, its keys padded to whole tile rows instead; its
//! products are register tiles of `vdpbf16ps` (`attention_tiles.rs`).
use super::attention::transpose_heads;
use super::{c, v};
use crate::loop_ir::{
    for_, let_, store, LoopKind, RoundPairs, Scope, Stmt, TileProduct, Transpose, Value,
};
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

/// Weight panels of words from rows of words: `dst[g, kk, cc] = src[g · 16 + cc, kk]`
/// for `g < groups`, `kk < words` (a multiple of 16), zero for rows past `rows` (which
/// `src` need not hold). Blocks of 16 rows x 16 words are transposed in registers.
fn panels(dst: &str, src: &str, groups: Expr, rows: Expr, words: Expr) -> Stmt {
    let edge = c(AMX_EDGE);
    let block = Stmt::Transpose(Box::new(Transpose {
        dst: dst.into(),
        dst_index: (v("g") * words.clone() + v("w0") * edge.clone()) * edge.clone(),
        dst_stride: edge.clone(),
        src: src.into(),
        src_index: (v("g") * words.clone() + v("w0")) * edge.clone(),
        src_stride: words.clone(),
        rows: rows - v("g") * edge.clone(),
        cols: edge.clone(),
        outs: edge.clone(),
        width: AMX_EDGE,
    }));
    each("g", groups, vec![each("w0", words / edge, vec![block])])
}

/// `dst[r, kk]`, the pair `(src[base + r · stride + 2kk], .. + 1)` rounded into one word,
/// for `r < rows`, `kk < words`: a run of pairs a row.
fn words(dst: &str, (src, base, stride): (&str, Expr, Expr), rows: Expr, words: Expr) -> Stmt {
    let run = Stmt::RoundPairs(Box::new(RoundPairs {
        dst: dst.into(),
        dst_index: v("r") * words.clone(),
        src: src.into(),
        src_index: base + v("r") * stride,
        words,
    }));
    each("r", rows, vec![run])
}

/// The task's packing (see the module doc). Rounding each key's pair straight into its
/// panel read the keys a pair at a time across 16 rows, in scalar code (15 % of an
/// attention's time at sequence 512); rows of words first, transposed into the panels
/// after, run vectorized.
pub(super) fn pack(lanes: usize) -> Vec<Stmt> {
    let edge = c(AMX_EDGE);
    vec![
        // Named once: a division inside a loop's indices keeps GCC from vectorizing it.
        let_("half_d", v("e_d") / c(2)),
        let_("half_n", v("np") / c(2)),
        scratch("Kw", v("e_n") * v("half_d"), 8),
        words("Kw", ("in1", v("k0"), v("sk_n")), v("e_n"), v("half_d")),
        scratch("Kp", v("np") * v("half_d"), 0),
        panels("Kp", "Kw", v("np") / edge.clone(), v("e_n"), v("half_d")),
        scratch("Vt", v("e_d") * v("np"), 3),
        transpose_heads(
            ("in2", v("v0"), v("sval_n")),
            "Vt",
            &|d, n| d * v("np") + n,
            v("np"),
            lanes,
        ),
        scratch("Vp", v("e_d") * v("half_n"), 4),
        value_panels(),
    ]
}

/// `Vp[g, kk, cc]`, the pair `(Vt[g · 16 + cc, 2kk], .. + 1)` rounded into one word:
/// each column's pairs in turn, along `Vt`'s rows. (Rounded into rows of words and
/// transposed into the panels as the keys are, the values made GPT-2's whole decode
/// step 1.2-1.3x slower, its dense layers included, for a reason not found.)
fn value_panels() -> Stmt {
    let edge = c(AMX_EDGE);
    let half_n = v("half_n");
    let pair = Value::PairBf16 {
        buf: "Vt".into(),
        index: (v("g") * edge.clone() + v("cc")) * v("np") + c(2) * v("kk"),
    };
    let at = (v("g") * half_n.clone() + v("kk")) * edge.clone() + v("cc");
    each(
        "g",
        v("e_d") / edge.clone(),
        vec![each(
            "cc",
            edge,
            vec![each("kk", half_n, vec![store("Vp", at, pair)])],
        )],
    )
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

/// The block's query rows (`Qw` from `Qb`) or probabilities (`Pw` from `S`) rounded
/// into words of pairs: `rows` rows of `words` words in scratch `slot`, from rows `len`
/// floats apart (the AMX and pairs variants' left operands).
pub(super) fn block_words(
    (dst, slot): (&str, u8),
    (src, len): (&str, Expr),
    rows: usize,
    words_a_row: Expr,
) -> [Stmt; 2] {
    [
        scratch(dst, c(rows) * words_a_row.clone(), slot),
        words(dst, (src, c(0), len), c(rows), words_a_row),
    ]
}

/// A block of `rows` query rows (after the scaled block `Qb` is filled): the scores on
/// tiles, `softmax` (the shared rows' pass), the context on tiles and the stores.
pub(super) fn block(rows: usize, lanes: usize, softmax: Stmt) -> Vec<Stmt> {
    let edge = c(AMX_EDGE);
    let (half_d, half_n) = (v("half_d"), v("half_n"));
    let out = v("y0") + v("r") * v("sy_m") + v("q") * c(lanes);
    let y = Value::binary(
        crate::loop_ir::BinaryOp::Mul,
        Value::vload("Ob", v("r") * v("e_d") + v("q") * c(lanes), lanes),
        Value::load("rsum", v("r")),
    );
    let [qw_alloc, qw] = block_words(("Qw", 5), ("Qb", v("e_d")), rows, half_d.clone());
    let [pw_alloc, pw] = block_words(("Pw", 6), ("S", v("np")), rows, half_n.clone());
    vec![
        qw_alloc,
        qw,
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
        pw_alloc,
        pw,
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
