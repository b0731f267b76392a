//! The usual variant's task body (the packed one: vectors along N): B's panel packed
//! once per task (unless read in place), the reduction slices, and each slice's
//! register tiles — as wide and as high as the columns and rows left need (each
//! column's whole tiles in the M loop, its edge tile after it: [`Rows`]), split by
//! the compute policy, with the filters prefetched by the first column only
//! ([`Nest::prefetch_a`]) and, over a short reduction, the next tile's output and
//! residual lines by every tile ([`Nest::prefetch_next_tile`]). The nest around it is
//! `contraction.rs`'s.
use super::compute::CACHE_LINE_FLOATS;
use super::contraction::{Nest, Operand, Rows};
use super::fetch::{Packing, ROUNDED_ROWS, ROUNDED_ROWS_SLOT};
use super::{c, v};
use crate::loop_ir::{for_, if_, let_, Cond, LoopKind, Scope, Stmt};
use crate::padding::Compute;
use anyshape_ir::Expr;

/// The longest constant reduction whose register tiles prefetch the next tile's output
/// ([`Nest::prefetch_next_tile`]).
const SHORT_REDUCTION: i64 = 128;

impl Nest<'_> {
    /// The usual variant: both operands packed, vectors along N.
    pub(super) fn packed_task_body(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let mk = self.mk;
        let mut s = Vec::new();
        if !self.mk.ia {
            s.push(Stmt::Alloc {
                buf: "Ap".into(),
                len: c(mk.mc * mk.kc),
                scope: Scope::Scratch(0),
            });
        }
        let kt_lets = self.slice_lets();
        // The rows rounded into words before they are transposed into a panel, of
        // whichever operand packs so.
        let rounded = (0..2)
            .filter(|&which| match which {
                0 => !mk.ia,
                _ => self.b_in_place.is_none(),
            })
            .filter(|&which| self.packing(which, &ops[which]) == Packing::RoundedRows)
            .map(|which| [mk.mr, mk.nr][which])
            .max();
        if let Some(rows) = rounded {
            s.push(Stmt::Alloc {
                buf: ROUNDED_ROWS.into(),
                len: c(rows * mk.kc),
                scope: Scope::Scratch(ROUNDED_ROWS_SLOT),
            });
        }
        if self.b_in_place.is_none() {
            // The whole K x nc panel of B is packed once per thread and (batch, N tile).
            s.push(Stmt::Alloc {
                buf: "Bp".into(),
                len: v("tiles_k") * c(mk.kc * mk.nc),
                scope: Scope::Scratch(1),
            });
            let pack_b = [kt_lets.clone(), vec![self.pack(1, &ops[1])]].concat();
            let claim = Cond::Claim {
                slot: 1,
                key: v("bt") * v("tiles_n") + v("jt"),
            };
            s.push(if_(
                claim,
                vec![for_("kt", v("tiles_k"), LoopKind::Serial, pack_b)],
            ));
        }
        let mut kt_body = kt_lets;
        if !self.mk.ia {
            kt_body.push(self.pack(0, &ops[0]));
        }
        let tiles = self.packed_tiles(ops);
        if self.whole_k {
            s.push(tiles);
        } else {
            kt_body.push(tiles);
            s.push(for_("kt", v("tiles_k"), LoopKind::Serial, kt_body));
        }
        s
    }

    /// The register tile at (`ib`, `jb`), computing the rows [`Nest::rows`] says.
    fn tile(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let mut tile = vec![
            let_("mi", v("m0") + v("ib") * c(self.mk.mr)),
            let_("nj", v("n0") + v("jb") * c(self.mk.nr)),
        ];
        // The checked tile prefetches nothing: one body serves every column.
        if self.prefetch_a && self.policy.compute != Compute::Checked {
            let later = Nest {
                prefetch_a: false,
                ..self.clone()
            };
            tile.push(Stmt::If {
                cond: Cond::Lt(v("jb"), c(1)),
                then: self.packed_tile(ops),
                otherwise: later.packed_tile(ops),
            });
        } else {
            tile.extend(self.packed_tile(ops));
        }
        tile
    }

    /// The slice's register tiles: where they have several heights, each column's
    /// whole tiles in the M loop and its edge tile after it (see [`Rows`]).
    fn packed_tiles(&self, ops: &[Operand; 3]) -> Stmt {
        let left = Nest {
            rows: Rows::Left,
            ..self.clone()
        };
        if self.policy.compute != Compute::Unchecked || self.mk.heights().len() < 2 {
            return self.register_tiles(left.tile(ops));
        }
        let whole = Nest {
            rows: Rows::Whole,
            ..self.clone()
        };
        let whole_tiles = v("mlen") / c(self.mk.mr);
        let mut edge = vec![let_("ib", whole_tiles.clone())];
        edge.extend(left.tile(ops));
        for_(
            "jb",
            v("nnb"),
            LoopKind::Serial,
            vec![
                for_("ib", whole_tiles.clone(), LoopKind::Serial, whole.tile(ops)),
                if_(Cond::Lt(whole_tiles, v("nmb")), edge),
            ],
        )
    }

    /// `tile` on every register tile of the task's cache tile: N blocks outer, M blocks
    /// inner (a B micro-panel stays in L1 across the M blocks).
    pub(super) fn register_tiles(&self, tile: Vec<Stmt>) -> Stmt {
        for_(
            "jb",
            v("nnb"),
            LoopKind::Serial,
            vec![for_("ib", v("nmb"), LoopKind::Serial, tile)],
        )
    }

    /// The usual variant's register tile at (`mi`, `nj`), by the compute policy.
    fn packed_tile(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let mk = self.mk;
        match self.policy.compute {
            // B read in place: a tile past its last panel loads B masked.
            Compute::Unchecked if self.b_in_place.is_some() => {
                let nv = mk.nr / self.lanes;
                vec![Stmt::If {
                    cond: Cond::Le(v("nj") + c(mk.nr), v("e_np")),
                    then: self.by_height(&|rows| self.fast_tile(ops, rows, nv, false)),
                    otherwise: self.edge_tiles(ops, nv, true),
                }]
            }
            Compute::Unchecked => self.fast_tiles_by_width(ops),
            Compute::Checked => self.checked_tile(ops),
            Compute::Partitioned => vec![Stmt::If {
                cond: self.full_tile(mk.mr, mk.nr),
                then: self.fast_tile(ops, mk.mr, mk.nr / self.lanes, false),
                otherwise: self.checked_tile(ops),
            }],
        }
    }

    /// The names of reduction slice `kt`: its origin `k0`, length `klen`, length padded
    /// to the unroll `kp` (zero-filled blocks are, so the compute has no tail), and
    /// the offset of its part of the packed B panel `bofs`.
    fn slice_lets(&self) -> Vec<Stmt> {
        let mk = self.mk;
        let klen = Expr::max(Expr::Const(0), Expr::min(c(mk.kc), v("p_k") - v("k0")));
        let kp = if self.policy.fetch == crate::padding::Fetch::ZeroFill {
            Expr::round_up(v("klen"), mk.uk as i64)
        } else {
            v("klen")
        };
        vec![
            let_("k0", v("kt") * c(mk.kc)),
            let_("klen", klen),
            let_("kp", kp),
            let_("bofs", v("kt") * c(mk.kc * mk.nc)),
        ]
    }

    /// Whether the register tile at (`mi`, `nj`), `rows` high and `width` columns wide,
    /// lies wholly inside the output.
    pub fn full_tile(&self, rows: usize, width: usize) -> Cond {
        Cond::and(
            Cond::Le(v("mi") + c(rows), v("e_m")),
            Cond::Le(v("nj") + c(width), v("e_n")),
        )
    }

    /// A register tile of `rows` rows of `nv` vectors with unchecked vectorized
    /// compute (B read in place loaded `masked` to the columns inside, at its edge),
    /// stored by the policy.
    fn fast_tile(&self, ops: &[Operand; 3], rows: usize, nv: usize, masked: bool) -> Vec<Stmt> {
        let (mut s, slice) = self.vector_accumulate(ops, rows, nv, masked);
        s.extend(self.prefetch_next_tile(&ops[2]));
        if self.whole_k {
            let body = [self.slice_lets(), slice].concat();
            s.push(for_("kt", v("tiles_k"), LoopKind::Serial, body));
        } else {
            s.extend(slice);
        }
        if self.w.precision == anyshape_ir::Precision::I8 {
            s.extend(self.convert_tile(rows, nv));
        }
        s.extend(self.vector_store(&ops[2], rows, nv));
        s
    }

    /// Software prefetch, into L2, of the output lines of the register tile below this
    /// one (the next the M loop runs: rows `mi + mr ..`, the same columns), ready to be
    /// written, and of the lines the epilogue reads there from inputs laid out like the
    /// output (a residual): one request for each row's first column and one for its
    /// last, the rows' cache-line alignment being unknown.
    ///
    /// Inside a model the output and the residual come from memory or L3, each row of a
    /// cache tile a stream too short for the hardware prefetcher, and where the
    /// reduction is short ([`SHORT_REDUCTION`]) a tile's compute does not hide those
    /// misses. Measured cold in a C harness (Zen 3, ResNet-50's 1 x 1 convolution 64 ->
    /// 256 on 56 x 56 with its residual, the default tile): median 1.29 -> 1.03 ms.
    /// Inside ResNet-50 at 224 x 224 (per-step minima of 8-10 runs, three sittings:
    /// `benchmarks/results/resnet50.ts/zen3/output-prefetch-step-minima.txt`) those
    /// layers' three calls took 3.57 -> 2.52, 2.74 -> 2.49 and 2.83 -> 2.52 ms, the 128
    /// -> 512 ones' 3.25 -> 2.83, 3.19 -> 2.86 and 3.00 -> 2.88 ms; over 256 channels
    /// and more the layers moved either way within the noise (identical kernels
    /// differed by up to 20 % between sittings), and kernels that read B in place (the
    /// stem's patches) were slower in one sitting, so neither prefetches. Nothing
    /// either where the output is strided along N.
    fn prefetch_next_tile(&self, out: &Operand) -> Vec<Stmt> {
        let contiguous = |e: &Expr| e.simplify().as_const() == Some(1);
        let short = self.w.axes[self.g.k]
            .extent
            .as_const()
            .is_some_and(|k| k <= SHORT_REDUCTION);
        if !contiguous(&out.s_col) || !short || self.b_in_place.is_some() {
            return Vec::new();
        }
        let mut cols: Vec<usize> = (0..self.mk.nr).step_by(CACHE_LINE_FLOATS).collect();
        if self.mk.nr > 1 {
            cols.push(self.mk.nr - 1);
        }
        let row = |i: usize| v("mi") + c(self.mk.mr + i);
        let prefetch = |buf: String, index: Expr, write: bool| Stmt::Prefetch {
            buf,
            index,
            l2: true,
            write,
        };
        let mut s = Vec::new();
        for i in 0..self.mk.mr {
            for &j in &cols {
                let at = v("base2") + row(i) * out.s_row.clone() + v("nj") + c(j);
                s.push(prefetch(out.buf.to_string(), at, true));
            }
        }
        // Under global padding the epilogue runs as the output is copied back, apart.
        let epilogue_here = !self.policy.copy;
        for t in self.epilogue_inputs().filter(|_| epilogue_here) {
            let (s_m, s_n) = (
                self.tensor_stride(t, self.g.m),
                self.tensor_stride(t, self.g.n),
            );
            // Laid out like the output: along its rows, each row contiguous.
            if s_m.simplify().as_const() == Some(0) || !contiguous(&s_n) {
                continue;
            }
            for i in 0..self.mk.mr {
                for &j in &cols {
                    let at = v(&format!("ebase{t}")) + row(i) * s_m.clone() + v("nj") + c(j);
                    s.push(prefetch(format!("in{t}"), at, false));
                }
            }
        }
        s
    }

    /// The unchecked register tile, as many vectors wide as the columns left need: a
    /// tile at the N edge computes only the vectors that hold output columns, not the
    /// zeros its packed panel is padded with (`batch_matmul_nt` with N = 65 and a
    /// 16-column tile would compute 80 columns; this computes 72), and as high as
    /// [`Nest::by_height`] says.
    fn fast_tiles_by_width(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let nv = self.mk.nr / self.lanes;
        if nv == 1 {
            return self.by_height(&|rows| self.fast_tile(ops, rows, nv, false));
        }
        // Tiles that need every vector (all but the edge's) first.
        vec![Stmt::If {
            cond: Cond::Lt(c((nv - 1) * self.lanes), v("p_n") - v("nj")),
            then: self.by_height(&|rows| self.fast_tile(ops, rows, nv, false)),
            otherwise: self.edge_tiles(ops, nv - 1, false),
        }]
    }

    /// The register tile at the N edge: the fewest vectors (up to `widest`) that cover
    /// the columns left, B loaded masked where read in place (`masked`).
    fn edge_tiles(&self, ops: &[Operand; 3], widest: usize, masked: bool) -> Vec<Stmt> {
        let mut edge = self.fast_tile(ops, self.mk.mr, widest, masked);
        for q in (1..widest).rev() {
            edge = vec![Stmt::If {
                cond: Cond::Le(v("p_n") - v("nj"), c(q * self.lanes)),
                then: self.fast_tile(ops, self.mk.mr, q, masked),
                otherwise: edge,
            }];
        }
        edge
    }

    /// `tile(rows)` for the register tile at `mi`: `mr` rows in a whole tile
    /// ([`Rows::Whole`]); elsewhere ([`Rows::Left`]) the lowest of the micro-kernel's
    /// heights that covers the rows left (`mr` where that many are left;
    /// [`ContractionKernel::heights`](crate::ContractionKernel::heights)), one tile
    /// body per height: `batch_matmul_nt` with M = 33 and 8-row tiles computes 35 rows,
    /// not 40; a model's dense at sequence 32 with 12-row tiles, 32 rather than 36.
    fn by_height(&self, tile: &dyn Fn(usize) -> Vec<Stmt>) -> Vec<Stmt> {
        let heights = match self.rows {
            Rows::Whole => return tile(self.mk.mr),
            Rows::Left => self.mk.heights(),
        };
        let Some((&lowest, higher)) = heights.split_first() else {
            return tile(self.mk.mr);
        };
        let mut body = tile(lowest);
        let mut below = lowest;
        for &h in higher {
            body = vec![Stmt::If {
                cond: Cond::Lt(c(below), v("p_m") - v("mi")),
                then: tile(h),
                otherwise: body,
            }];
            below = h;
        }
        body
    }

    /// A register tile with a boundary check on every element in the compute stage.
    fn checked_tile(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let mut s = self.checked_accumulate(ops);
        s.push(self.checked_store(&ops[2]));
        s
    }
}

#[cfg(test)]
mod tests {
    use crate::{ContractionKernel, CpuTarget, KernelMode, PaddingStrategy, Program, Simd};
    use anyshape_ir::{Bindings, Workload};

    /// The prefetches of a kernel's C source: `(buffer, write)` of each.
    fn prefetches(w: &str, mk: &str) -> Vec<(String, bool)> {
        let target = CpuTarget {
            name: "test".into(),
            cores: 2,
            simd: Simd::Avx2,
            vector_registers: 16,
            l1d_bytes: 32 << 10,
            l2_bytes: 1 << 20,
            l3_bytes: 32 << 20,
            amx: false,
            avx512_bf16: false,
            avx512_vnni: false,
        };
        let source = Program {
            workload: Workload::parse(w).unwrap(),
            micro_kernel: ContractionKernel::parse(mk).unwrap(),
            strategy: PaddingStrategy::LocalPad,
            mode: KernelMode::Symbolic,
            bindings: Bindings::default(),
        }
        .source(&target)
        .unwrap();
        source
            .lines()
            .filter_map(|l| {
                let rest = l
                    .trim()
                    .strip_prefix("__builtin_prefetch((const void *)((uintptr_t)")?;
                let buf = rest.split(' ').next()?.to_string();
                Some((buf, l.trim_end().ends_with(", 1, 2);")))
            })
            .collect()
    }

    /// Over a short reduction the register tile prefetches the next tile's output (to
    /// be written) and its residual's lines (to be read), not the bias's; over a long
    /// one, or with B read in place, nothing of the output.
    #[test]
    fn short_reductions_prefetch_the_next_tiles_output_and_residual() {
        let conv =
            |k: usize| format!("conv_packed(B=1,M=256,N=H,K={k},P=16)+add(m)+add(b,m,n)+relu");
        let mk = "mr=6,nr=16,mc=48,nc=192,kc=384,uk=4,ia=1";
        let short = prefetches(&conv(64), mk);
        let (out, residual) = (("out0".to_string(), true), ("in3".to_string(), false));
        // Each of the 6 rows, its first and its last column, in every tile body.
        let count = |p: &[(String, bool)], x: &(String, bool)| p.iter().filter(|q| *q == x).count();
        assert!(count(&short, &out) >= 12, "{short:?}");
        assert_eq!(count(&short, &out), count(&short, &residual), "{short:?}");
        assert!(
            short.iter().all(|p| *p == out || *p == residual),
            "{short:?}"
        );
        assert!(prefetches(&conv(1024), mk).is_empty());
        let in_place = prefetches(&conv(64), "mr=6,nr=16,mc=48,nc=192,kc=384,uk=4,ia=1,ib=1");
        assert!(in_place.is_empty(), "{in_place:?}");
        // With the filters' prefetch (pf=1: the first column of tiles has a body of
        // its own) both.
        let both = prefetches(&conv(64), "mr=6,nr=16,mc=48,nc=192,kc=384,uk=4,pf=1,ia=1");
        assert!(both.iter().any(|p| p.0 == "in0" && !p.1), "{both:?}");
        assert_eq!(count(&both, &out), 2 * count(&short, &out));
    }
}
