//! The compute stage of the CPU contraction sketch: an `mr x nr` register tile
//! accumulated over the packed panels (or A and B read in place), either vectorized
//! and unchecked (the panels are padded, or the tile is whole, or B read in place is
//! loaded masked at its edge) or element by element with a check on each.
use super::contraction::{Nest, Operand};
use super::{c, v};
use crate::loop_ir::{for_, if_, let_, store, Cond, LoopKind, Scope, Stmt, Value};
use anyshape_ir::{Expr, Precision};

/// Floats in a cache line: what one prefetch request brings.
pub(super) const CACHE_LINE_FLOATS: usize = 16;

/// Reduction steps ahead that a weight read in place from panels as A is prefetched: a
/// step is a cache line of a panel of 16 rows, so 8 KB ahead along the panel, across
/// the reduction slices. Cold filters, `conv_packed` at ResNet-50's layer sizes, the
/// default tile (Zen 5): 16 steps ahead left it 1.15-1.4x slower than reading
/// row-major filters, 128 and 256 within 4 % of it either way.
const A_AHEAD: usize = 128;

/// The name of accumulator `(i, j)` of a vector register tile.
pub(super) fn acc(i: usize, j: usize) -> String {
    format!("acc_{i}_{j}")
}

impl Nest<'_> {
    /// Accumulators (`rows` rows: `mr`, or fewer for a tile at the M edge; of `nv`
    /// vectors: `nr / lanes`, or fewer for a tile at the N edge) over the packed panels
    /// (B's read in place where it is in panels of whole vectors, A's where `ia=1`): a
    /// broadcast of A times a vector of B, fused, per reduction step. `masked`: B is
    /// read in place and the tile overhangs its last column: B's vectors are loaded
    /// masked to the columns inside (zero in the others, nothing past the tensor read).
    /// Returns the accumulators' declarations and the statements of one reduction
    /// slice (the current `kt`'s), apart, so that a tile can run its slices itself
    /// ([`Nest::whole_k`]).
    pub(super) fn vector_accumulate(
        &self,
        ops: &[Operand; 3],
        rows: usize,
        nv: usize,
        masked: bool,
    ) -> (Vec<Stmt>, Vec<Stmt>) {
        let (a, b) = (&ops[0], &ops[1]);
        let mk = self.mk;
        let lanes = self.lanes;
        let mut inits = Vec::new();
        for i in 0..rows {
            for j in 0..nv {
                inits.push(Stmt::Reg {
                    name: acc(i, j),
                    lanes,
                    init: Value::Zero { lanes },
                });
            }
        }
        let mut s = Vec::new();
        let mut step = vec![];
        for j in 0..nv {
            let init = match self.b_in_place {
                // Each vector lies in one panel (the tile starts on a whole vector).
                Some(_) => {
                    s.push(let_(
                        &format!("bq_{j}"),
                        v("base1") + b.row(v("nj") + c(j * lanes)) + v("k0") * b.s_col.clone(),
                    ));
                    let index = v(&format!("bq_{j}")) + v("kk") * b.s_col.clone();
                    if masked {
                        let count = format!("bc_{j}");
                        s.push(let_(&count, v("e_n") - v("nj") - c(j * lanes)));
                        Value::vload_first(b.buf, index, lanes, v(&count))
                    } else {
                        Value::vload(b.buf, index, lanes)
                    }
                }
                None => Value::vload(
                    "Bp",
                    v("bofs") + v("jb") * c(mk.kc * mk.nr) + v("kk") * c(mk.nr) + c(j * lanes),
                    lanes,
                ),
            };
            step.push(Stmt::Reg {
                name: format!("b_{j}"),
                lanes,
                init,
            });
        }
        // A narrower tile, or one at the edge, is the last of its row: there is no
        // next panel to fetch. Where A is the weight in panels (a convolution's
        // filters), B's micro-panels are activations packed by the task, in L2: the next
        // one would evict from L1 the one the row blocks still read.
        if mk.pf && nv == mk.nr / lanes && !masked && a.panels.is_none() {
            step.splice(0..0, self.prefetch_next_panel(b, &mut s));
        }
        // A weight in panels read in place (a convolution's filters, `conv_packed`) comes
        // from memory a cache line per reduction step and panel, one stream per panel
        // (row-major rows are a stream each, which the hardware runs in parallel): with
        // `pf`, the first column of register tiles (`Nest::prefetch_a`) prefetches the
        // lines `A_AHEAD` steps on of the tile's first and last rows' panels.
        let a_ahead = self.prefetch_a;
        for i in 0..rows {
            let a = if self.mk.ia {
                // Rows past the tensor's last read that row instead: the tile's rows
                // there are never stored.
                let name = format!("ar_{i}");
                let row = Expr::min(v("mi") + c(i), v("p_m") - c(1));
                s.push(let_(
                    &name,
                    v("base0") + a.row(row) + v("k0") * a.s_col.clone(),
                ));
                if a_ahead && (i == 0 || i + 1 == rows) {
                    step.insert(
                        0,
                        Stmt::Prefetch {
                            buf: a.buf.into(),
                            index: v(&name) + (v("kk") + c(A_AHEAD)) * a.s_col.clone(),
                            l2: true,
                            write: false,
                        },
                    );
                }
                self.a_value(a.buf, v(&name) + v("kk") * a.s_col.clone())
            } else {
                Value::load("Ap", v("ib") * c(mk.kc * mk.mr) + v("kk") * c(mk.mr) + c(i))
            };
            for j in 0..nv {
                let value = self.product(
                    Value::reg(&format!("b_{j}"), lanes),
                    a.clone(),
                    Value::reg(&acc(i, j), lanes),
                );
                step.push(Stmt::Assign {
                    reg: acc(i, j),
                    value,
                });
            }
        }
        // An operand read in place ends at the reduction's end: no padded tail.
        if self.policy.fetch.pads() && self.b_in_place.is_none() && !self.mk.ia {
            // kp is a multiple of uk: an outer loop and a fully unrolled inner one.
            let mut inner = vec![let_("kk", v("kq") * c(mk.uk) + v("u"))];
            inner.extend(step);
            s.push(for_(
                "kq",
                v("kp") / c(mk.uk),
                LoopKind::Serial,
                vec![for_("u", c(mk.uk), LoopKind::Unrolled(mk.uk), inner)],
            ));
        } else {
            s.push(for_("kk", v("klen"), LoopKind::Unrolled(mk.uk), step));
        }
        (inits, s)
    }

    /// Software prefetch of this reduction step's row of the next register-tile
    /// column's B micro-panel (the columns from `nj + nr`), one request per cache line
    /// of the row; where B is read in place, each line's start is named before the
    /// loop (pushed onto `before`), as the loads' are.
    ///
    /// A weight laid out in panels (a model's, which the other layers evict between
    /// its calls, so read from memory) is prefetched into L2 only, since the next
    /// micro-panel would not fit in L1 beside the one the row blocks still read, and
    /// the last column of a reduction slice prefetches the first column of the next
    /// slice (`kc` further along K), which the next `kt` reads first. Cold weights,
    /// Emerald Rapids class: dense 128 x 768 x 3072 1.04-1.09x. Activations (warm, and
    /// small micro-tiles that a division per tile would slow) keep the plain form.
    fn prefetch_next_panel(&self, b: &Operand, before: &mut Vec<Stmt>) -> Vec<Stmt> {
        let mk = self.mk;
        let per_line = (CACHE_LINE_FLOATS / self.lanes).max(1);
        let weight = b.panels.is_some();
        if self.b_in_place.is_some() && weight {
            // 1 at the slice's last column, else 0.
            before.push(let_("wrap", (v("jb") + c(1)) / v("nnb")));
        }
        (0..mk.nr / self.lanes)
            .step_by(per_line)
            .map(|j| {
                let (buf, index) = match self.b_in_place {
                    Some(_) => {
                        let name = format!("bn_{j}");
                        let (col, k) = match weight {
                            true => (
                                v("nj") + c(mk.nr + j * self.lanes)
                                    - v("wrap") * v("nnb") * c(mk.nr),
                                v("k0") + v("wrap") * c(mk.kc),
                            ),
                            false => (v("nj") + c(mk.nr + j * self.lanes), v("k0")),
                        };
                        before.push(let_(&name, v("base1") + b.row(col) + k * b.s_col.clone()));
                        (b.buf, v(&name) + v("kk") * b.s_col.clone())
                    }
                    None => (
                        "Bp",
                        v("bofs")
                            + (v("jb") + c(1)) * c(mk.kc * mk.nr)
                            + v("kk") * c(mk.nr)
                            + c(j * self.lanes),
                    ),
                };
                Stmt::Prefetch {
                    buf: buf.into(),
                    index,
                    l2: weight,
                    write: false,
                }
            })
            .collect()
    }

    /// A's element at `index` of `buf`, read in place: in bf16 the pair from there,
    /// rounded and packed into a word.
    fn a_value(&self, buf: &str, index: Expr) -> Value {
        match self.w.precision {
            // An i8 contraction's A is its quantized rows (never read in place).
            Precision::F32 | Precision::I8 => Value::load(buf, index),
            Precision::Bf16 => Value::PairBf16 {
                buf: buf.into(),
                index,
            },
        }
    }

    /// `acc + b · a`: a fused multiply-add, in bf16 the products of a pair, in i8 of a
    /// quad (B's unsigned bytes times A's signed ones).
    fn product(&self, b: Value, a: Value, acc: Value) -> Value {
        let f = match self.w.precision {
            Precision::F32 => Value::Fma,
            Precision::Bf16 => Value::DotBf16,
            Precision::I8 => Value::DotI8,
        };
        f(Box::new(b), Box::new(a), Box::new(acc))
    }

    /// Whether element `(i, j)` of the register tile at (`mi`, `nj`) is in the output.
    pub(super) fn element_inside(&self) -> Cond {
        Cond::and(
            Cond::Lt(v("mi") + v("i"), v("e_m")),
            Cond::Lt(v("nj") + v("j"), v("e_n")),
        )
    }

    /// A scalar `mr x nr` accumulator array on the stack, each element updated only
    /// where it lies in the output.
    pub(super) fn checked_accumulate(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let (a, b) = (&ops[0], &ops[1]);
        let mk = self.mk;
        let acc_idx = v("i") * c(mk.nr) + v("j");
        let a = if self.mk.ia {
            self.a_value(
                a.buf,
                v("base0") + a.row(v("mi") + v("i")) + (v("k0") + v("kk")) * a.s_col.clone(),
            )
        } else {
            Value::load(
                "Ap",
                v("ib") * c(mk.kc * mk.mr) + v("kk") * c(mk.mr) + v("i"),
            )
        };
        let b = match self.b_in_place {
            Some(_) => Value::load(
                b.buf,
                v("base1") + b.row(v("nj") + v("j")) + (v("k0") + v("kk")) * b.s_col.clone(),
            ),
            None => Value::load(
                "Bp",
                v("bofs") + v("jb") * c(mk.kc * mk.nr) + v("kk") * c(mk.nr) + v("j"),
            ),
        };
        let fma = self.product(b, a, Value::load("acc", acc_idx.clone()));
        vec![
            Stmt::Alloc {
                buf: "acc".into(),
                len: c(mk.mr * mk.nr),
                scope: Scope::Stack,
            },
            self.tile_loop(vec![store(
                "acc",
                acc_idx.clone(),
                Value::Zero { lanes: 1 },
            )]),
            for_(
                "kk",
                v("klen"),
                LoopKind::Serial,
                vec![self.tile_loop(vec![if_(
                    self.element_inside(),
                    vec![store("acc", acc_idx, fma)],
                )])],
            ),
        ]
    }

    /// `for i < mr (unrolled) { for j < nr { body } }`.
    pub(super) fn tile_loop(&self, body: Vec<Stmt>) -> Stmt {
        for_(
            "i",
            c(self.mk.mr),
            LoopKind::Unrolled(self.mk.mr),
            vec![for_("j", c(self.mk.nr), LoopKind::Serial, body)],
        )
    }
}
