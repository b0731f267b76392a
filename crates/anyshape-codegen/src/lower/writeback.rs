//! The write-back stage of the CPU contraction sketch: a register tile stored into the
//! output (the first reduction tile) or added to it (the others), or stored once where
//! it ran over the whole reduction (`Nest::whole_k`); whole vectors with
//! vector stores where the output is contiguous, element by element where it is
//! strided. Where the padding strategy's policy checks stores, a tile at the output's
//! edge is spilled to the stack and stored from there in a loop over its rows, a
//! vector that overhangs the edge with a partial (masked) store of the columns inside.
use super::compute::acc;
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{for_, if_, store, store_first, Cond, LoopKind, Scope, Stmt, Value};
use crate::padding::Compute;
use anyshape_ir::Expr;

impl Nest<'_> {
    /// Store a vector register tile of `rows` rows of `nv` vectors: checked where it
    /// may overhang the output (a policy with checked stores whose compute does not
    /// stay inside the output). A tile wholly inside (its `rows` rows and its columns)
    /// stores each register; one at the edge is spilled to the stack and stored from
    /// there, row by row in a loop, each row inside the output, each of its vectors
    /// inside the output whole, the others by their columns inside (a masked store;
    /// lane by lane into a strided output). The loop writes the edge's stores once
    /// rather than once per register: they were most of a tile body's C (for 12 x 32,
    /// 96 store statements beside 24 products), and every tile height and width has a
    /// body.
    pub(super) fn vector_store(&self, out: &Operand, rows: usize, nv: usize) -> Vec<Stmt> {
        let lanes = self.lanes;
        let out_idx = |row: Expr, col: Expr| {
            v("base2") + (v("mi") + row) * out.s_row.clone() + (v("nj") + col) * out.s_col.clone()
        };
        let contiguous = out.s_col.simplify().as_const() == Some(1);
        // Vector `j` of row `row` stored into the output whole: `tile` is the vector
        // and, as a function of the lane `l`, each of its lanes.
        let vector_store = |row: Expr, j: usize, tile: &TileVector, accumulate: bool| -> Stmt {
            if contiguous {
                let idx = out_idx(row, c(j * lanes));
                let value = if accumulate {
                    Value::sum(
                        Value::vload(out.buf, idx.clone(), lanes),
                        tile.vector.clone(),
                    )
                } else {
                    tile.vector.clone()
                };
                store(out.buf, idx, value)
            } else {
                lane_store(
                    out,
                    out_idx(row, c(j * lanes) + v("l")),
                    tile.lane.clone(),
                    accumulate,
                    lanes,
                    None,
                )
            }
        };
        let full_store = |accumulate: bool| -> Vec<Stmt> {
            (0..rows)
                .flat_map(|i| (0..nv).map(move |j| (i, j)))
                .map(|(i, j)| vector_store(c(i), j, &TileVector::register(i, j, lanes), accumulate))
                .collect()
        };
        // A tile over the whole reduction is stored once.
        let by_kt = |f: &dyn Fn(bool) -> Vec<Stmt>| match self.whole_k {
            true => f(false),
            false => vec![Stmt::If {
                cond: Cond::Eq(v("kt"), c(0)),
                then: f(false),
                otherwise: f(true),
            }],
        };
        let full = by_kt(&full_store);
        let checked = self.policy.checked_store && self.policy.compute == Compute::Unchecked;
        if !checked {
            return full;
        }
        // The spilled tile: row `i`'s vector `j` at `(i * nv + j) * lanes`.
        let spilled = |j: usize| {
            let at = (v("i") * c(nv) + c(j)) * c(lanes);
            TileVector {
                vector: Value::vload(SPILL, at.clone(), lanes),
                lane: Value::load(SPILL, at + v("l")),
            }
        };
        let mut spill = vec![Stmt::Alloc {
            buf: SPILL.into(),
            len: c(rows * nv * lanes),
            scope: Scope::Stack,
        }];
        for i in 0..rows {
            for j in 0..nv {
                let at = c((i * nv + j) * lanes);
                spill.push(store(SPILL, at, Value::reg(&acc(i, j), lanes)));
            }
        }
        // The columns of vector `j` inside the output (clamped by the store).
        let inside = |j: usize| v("e_n") - v("nj") - c(j * lanes);
        let partial_store = |accumulate: bool| -> Vec<Stmt> {
            let mut row = Vec::new();
            for j in 0..nv {
                let tile = spilled(j);
                let otherwise = if contiguous {
                    let idx = out_idx(v("i"), c(j * lanes));
                    let value = if accumulate {
                        let old = Value::vload_first(out.buf, idx.clone(), lanes, inside(j));
                        Value::sum(old, tile.vector.clone())
                    } else {
                        tile.vector.clone()
                    };
                    store_first(out.buf, idx, value, inside(j))
                } else {
                    let col_ok = Cond::Lt(v("nj") + c(j * lanes) + v("l"), v("e_n"));
                    lane_store(
                        out,
                        out_idx(v("i"), c(j * lanes) + v("l")),
                        tile.lane.clone(),
                        accumulate,
                        lanes,
                        Some(col_ok),
                    )
                };
                row.push(Stmt::If {
                    cond: Cond::Le(v("nj") + c((j + 1) * lanes), v("e_n")),
                    then: vec![vector_store(v("i"), j, &tile, accumulate)],
                    otherwise: vec![otherwise],
                });
            }
            // Kept a loop: GCC would otherwise unroll it whole, and build as long as
            // before.
            vec![for_(
                "i",
                c(rows),
                LoopKind::Unrolled(1),
                vec![if_(Cond::Lt(v("mi") + v("i"), v("e_m")), row)],
            )]
        };
        spill.extend(by_kt(&partial_store));
        vec![Stmt::If {
            cond: self.full_tile(rows, nv * lanes),
            then: full,
            otherwise: spill,
        }]
    }

    /// Store the scalar accumulator array of a checked tile, element by element where
    /// it lies in the output.
    pub(super) fn checked_store(&self, out: &Operand) -> Stmt {
        let acc_idx = v("i") * c(self.mk.nr) + v("j");
        let out_idx = v("base2")
            + (v("mi") + v("i")) * out.s_row.clone()
            + (v("nj") + v("j")) * out.s_col.clone();
        let mut acc = Value::load("acc", acc_idx);
        if self.w.precision == anyshape_ir::Precision::I8 {
            acc = self.converted_element(acc);
        }
        let write = Value::Select(
            Cond::Eq(v("kt"), c(0)),
            Box::new(acc.clone()),
            Box::new(Value::sum(Value::load(out.buf, out_idx.clone()), acc)),
        );
        self.tile_loop(vec![if_(
            self.element_inside(),
            vec![store(out.buf, out_idx, write)],
        )])
    }
}

/// One vector of a register tile where the write-back reads it: the vector, and its
/// lane `l` (for lane-by-lane stores into a strided output).
struct TileVector {
    vector: Value,
    lane: Value,
}

impl TileVector {
    /// Vector `j` of row `i` in its register.
    fn register(i: usize, j: usize, lanes: usize) -> TileVector {
        TileVector {
            vector: Value::reg(&acc(i, j), lanes),
            lane: Value::Lane(acc(i, j), v("l")),
        }
    }
}

/// Store each lane of a vector (`lane`: its lane `l`) at `idx` (which uses loop var
/// `l`), optionally checked.
fn lane_store(
    out: &Operand,
    idx: Expr,
    lane: Value,
    accumulate: bool,
    lanes: usize,
    check: Option<Cond>,
) -> Stmt {
    let value = if accumulate {
        Value::sum(Value::load(out.buf, idx.clone()), lane)
    } else {
        lane
    };
    let st = store(out.buf, idx, value);
    let body = match check {
        Some(cond) => vec![if_(cond, vec![st])],
        None => vec![st],
    };
    for_("l", c(lanes), LoopKind::Serial, body)
}

/// The stack buffer a register tile at the output's edge is spilled to.
const SPILL: &str = "spill";
