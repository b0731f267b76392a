//! The fused attention's register tiles (see `attention.rs`): both products of a block
//! of query rows — the scores against the packed keys and the context over the values —
//! as `rows x vectors` accumulators summed by FMAs (the vector variant) or by pair
//! products of bfloat16 words (the pairs variant, `Value::DotBf16`).
use super::{c, v};
use crate::loop_ir::{for_, let_, store, store_first, BinaryOp, Cond, LoopKind, Stmt, Value};
use anyshape_ir::Expr;

/// A register tile of `rows x vectors` accumulators `{name}_{r}_{u}` of `lanes` each,
/// summed over a loop whose step loads a row of `vectors` vectors and broadcasts one
/// scalar per tile row: both products of the fused attention.
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub(super) name: &'static str,
    /// The prefix of the loaded row's registers.
    pub(super) loaded: &'static str,
    pub(super) rows: usize,
    pub(super) vectors: usize,
    pub(super) lanes: usize,
    /// Pair products of words of bfloat16 pairs (the pairs variant), not FMAs.
    pub(super) pairs: bool,
}

impl Tile {
    fn acc(&self, r: usize, u: usize) -> String {
        format!("{}_{r}_{u}", self.name)
    }

    /// The accumulators, zero.
    fn zero(&self) -> Vec<Stmt> {
        let mut s = Vec::new();
        for r in 0..self.rows {
            for u in 0..self.vectors {
                s.push(Stmt::Reg {
                    name: self.acc(r, u),
                    lanes: self.lanes,
                    init: Value::Zero { lanes: self.lanes },
                });
            }
        }
        s
    }

    /// `for var in 0..extent`: the row's vectors `load(u)` (after `head`) times
    /// `broadcast(r)`, added to the accumulators.
    fn sum(
        &self,
        (var, extent): (&str, Expr),
        head: Vec<Stmt>,
        load: impl Fn(usize) -> Value,
        broadcast: impl Fn(usize) -> Value,
    ) -> Stmt {
        let mut step = head;
        let row = |u: usize| format!("{}_{u}", self.loaded);
        for u in 0..self.vectors {
            step.push(Stmt::Reg {
                name: row(u),
                lanes: self.lanes,
                init: load(u),
            });
        }
        let product = match self.pairs {
            true => Value::DotBf16,
            false => Value::Fma,
        };
        for r in 0..self.rows {
            for u in 0..self.vectors {
                step.push(Stmt::Assign {
                    reg: self.acc(r, u),
                    value: product(
                        Box::new(Value::reg(&row(u), self.lanes)),
                        Box::new(broadcast(r)),
                        Box::new(Value::reg(&self.acc(r, u), self.lanes)),
                    ),
                });
            }
        }
        for_(var, extent, LoopKind::Serial, step)
    }
}

/// `S[r, n] = Σ_e Qb[r, e] · Kt[e, n]` for the block's rows, tiles `t` of `rows x
/// vectors` vectors along `n`; on pairs, `Σ_kk Qw[r, kk] · Kp[n / 16, kk, n % 16]` over
/// the head dim's pairs.
pub(super) fn scores(t: &Tile) -> Stmt {
    let (rows, vectors, lanes) = (t.rows, t.vectors, t.lanes);
    let width = c(vectors * lanes);
    let mut tile = t.zero();
    tile.push(match t.pairs {
        false => {
            let panel = v("j") * v("e_d") * width.clone() + v("e") * width.clone();
            t.sum(
                ("e", v("e_d")),
                Vec::new(),
                |u| Value::vload("Kt", panel.clone() + c(u * lanes), lanes),
                |r| Value::load("Qb", c(r) * v("e_d") + v("e")),
            )
        }
        true => {
            let panel = |u: usize| (v("j") * c(vectors) + c(u)) * v("half_d") + v("kk");
            t.sum(
                ("kk", v("half_d")),
                Vec::new(),
                |u| Value::vload("Kp", panel(u) * c(lanes), lanes),
                |r| Value::load("Qw", c(r) * v("half_d") + v("kk")),
            )
        }
    });
    for r in 0..rows {
        for u in 0..vectors {
            let at = c(r) * v("np") + v("j") * width.clone() + c(u * lanes);
            tile.push(store("S", at, Value::reg(&t.acc(r, u), lanes)));
        }
    }
    for_("j", v("np") / width, LoopKind::Serial, tile)
}

/// `Y[b, h, g, m0 + r, d] = rsum[r] · Σ_n S[r, n] · V[b, h, n, d]`: tiles `t` of `rows x
/// vectors` vectors along `d`, the values read in place (their last vectors partial
/// where the head dim is not whole tile rows), rows past the block's end not stored.
/// On pairs, `Σ_kk Pw[r, kk] · Vp[d / 16, kk, d % 16]` over the keys' pairs (`whole_d`:
/// the head dim is whole tiles).
pub(super) fn context(t: &Tile, whole_d: bool) -> Stmt {
    let (rows, vectors, lanes) = (t.rows, t.vectors, t.lanes);
    let col = |u: usize| v("d0") * c(vectors * lanes) + c(u * lanes);
    let left = |u: usize| v("e_d") - col(u);
    let mut tile = t.zero();
    tile.push(match t.pairs {
        false => t.sum(
            ("n", v("e_n")),
            vec![let_("vb", v("v0") + v("n") * v("sval_n"))],
            |u| match whole_d {
                true => Value::vload("in2", v("vb") + col(u), lanes),
                false => Value::vload_first("in2", v("vb") + col(u), lanes, left(u)),
            },
            |r| Value::load("S", c(r) * v("np") + v("n")),
        ),
        true => {
            let panel = |u: usize| (v("d0") * c(vectors) + c(u)) * v("half_n") + v("kk");
            t.sum(
                ("kk", v("half_n")),
                Vec::new(),
                |u| Value::vload("Vp", panel(u) * c(lanes), lanes),
                |r| Value::load("Pw", c(r) * v("half_n") + v("kk")),
            )
        }
    });
    for r in 0..rows {
        let mut stores = Vec::new();
        for u in 0..vectors {
            let index = v("y0") + c(r) * v("sy_m") + col(u);
            let value = Value::binary(
                BinaryOp::Mul,
                Value::reg(&t.acc(r, u), lanes),
                Value::load("rsum", c(r)),
            );
            stores.push(if whole_d {
                store("out0", index, value)
            } else {
                store_first("out0", index, value, left(u))
            });
        }
        tile.push(crate::loop_ir::if_(Cond::Lt(c(r), v("mlen")), stores));
    }
    for_(
        "d0",
        Expr::ceil_div(v("e_d"), c(vectors * lanes)),
        LoopKind::Serial,
        tile,
    )
}
