//! The CPU contraction sketch's loop nest (BLIS-like; see `sketch/contraction.rs` for
//! its parameters):
//! ```text
//! [global padding: copy inputs into zero-padded buffers]             (global_pad.rs)
//! parallel for task in batch x tiles_n x tiles_m (M tiles fastest; tiles balanced):
//!   if this thread does not hold the B panel of (batch, N tile) yet
//!   (and B is not read in place: weights in panels, or `ib=1`):
//!     fetch: pack the K x nc panel of B                                (fetch.rs)
//!   for kt in tiles_k:                                                 (tiles.rs)
//!     fetch:   pack the A block (mc x kc), unless A is read in place   (fetch.rs)
//!     for each register tile:
//!       compute: mr x nr accumulators over the packed panels           (compute.rs)
//!       write-back: store (kt == 0) or accumulate into the output      (writeback.rs)
//!   (or, where `Nest::whole_k`: for each register tile, for kt in tiles_k: compute;
//!   then write-back once)
//!   [epilogue over the task's output tile]                             (epilogue.rs)
//! [global padding: copy the padded output back, with the epilogue]   (global_pad.rs)
//! ```
//! The dot variant replaces the task's body below the cache tile (dot.rs), as the AMX
//! variant does (amx.rs: tiles over the whole reduction; its tasks N tiles fastest). The
//! transposed variant (`vm=1`) is this nest on `Cᵀ = B · Aᵀ`: the view's M and N and
//! the operands' roles swapped ([`Nest::roles`]); everything below reads the operands
//! by role (A: broadcast, B: vectors) and the output through its strides.
//! Where each stage checks for tiles that overhang the tensors comes from the padding
//! strategy's policy.
use super::{c, renamed, shape_vars, v};
use crate::loop_ir::{for_, let_, Func, LoopKind, Stmt};
use crate::padding::{Compute, Policy};
use crate::{CodegenError, ContractionKernel, CpuTarget, GemmView, Program, Result};
use anyshape_ir::{Expr, Precision, Workload};
use std::collections::HashMap;

/// How the main loop nest addresses one operand: buffer, per-batch base offset and the
/// strides of its two GEMM axes (row = M or N, col = K or N); for weights in panels
/// (`dense_packed`) the panel width, the row stride being the one inside a panel and
/// the panels `sb_p` apart.
pub(super) struct Operand {
    pub buf: &'static str,
    pub base: Expr,
    pub s_row: Expr,
    pub s_col: Expr,
    pub panels: Option<i64>,
}

impl Operand {
    /// The offset of row `r` from the base.
    pub fn row(&self, r: Expr) -> Expr {
        match self.panels {
            Some(w) => {
                r.clone() / Expr::Const(w) * v("sb_p") + r % Expr::Const(w) * self.s_row.clone()
            }
            None => r * self.s_row.clone(),
        }
    }
}

/// Everything the stages of the loop nest need to know.
#[derive(Clone)]
pub(super) struct Nest<'a> {
    pub w: &'a Workload,
    pub g: GemmView,
    pub mk: ContractionKernel,
    pub policy: Policy,
    pub lanes: usize,
    /// The packed variant reads B in place, in panels of this width (whole vectors):
    /// weights pre-packed by the model (`dense_packed`); or, with `ib=1`, a B whose N
    /// axis is contiguous (one panel as wide as the tensor: width 1 rounds nothing up).
    pub b_in_place: Option<i64>,
    /// The inputs in the roles of A (broadcast) and B (vectors): `[0, 1]`, or `[1, 0]`
    /// in the transposed variant, whose view `g` has M and N swapped.
    pub roles: [usize; 2],
    /// Each register tile runs over the whole reduction, slice by slice, and is stored
    /// once (instead of the slices outermost, a tile stored or added to per slice):
    /// the transposed variant with A in place (nothing packed per slice) and
    /// unchecked compute, whose stores go lane by lane, so that adding a slice to the
    /// output would cost a scalar load and store per element.
    pub whole_k: bool,
    /// With `pf`, A's lines further along its panels are prefetched (A is a weight in
    /// panels read in place: a convolution's filters). Only the first column of
    /// register tiles of a slice does (`jb = 0`): it brings the task's block of A from
    /// memory, and the others find that block in L2. ResNet-50's untuned module (Zen 3,
    /// per-step minima), its `conv_packed` steps: at 224 x 224 20 % less time than
    /// prefetching on every column (which also prefetched B's next packed micro-panel
    /// into L1) and as much as not prefetching; at 96 x 96, where stage 4's images are
    /// 3 x 3 pixels and the filters stream from memory, 11 % and 9 % less.
    pub prefetch_a: bool,
    /// Which of the M loop's register tiles the tile bodies lowered from this nest
    /// compute (see [`Nest::by_height`]).
    pub rows: Rows,
}

/// Which rows a register tile body computes: `mr` (a whole tile), or the rows left
/// below `mi` in the lowest of the micro-kernel's heights that covers them (`mr` where
/// that many are left). Where the micro-kernel has several heights, the M loop runs
/// the whole tiles and the edge tile after it, so that no other height's body sits in
/// the loop: with the edge's bodies inside it (a test of the rows left in each tile),
/// one body more (8 rows beside 6 and 12) made the tiles it did not run 3-7 % slower
/// (gcc 12, Zen 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rows {
    /// `mr` rows.
    Whole,
    /// The rows left, in the lowest height that covers them.
    Left,
}

/// The longest reduction slice (`kc`, in quads) of an i8 contraction: its sums of
/// products of bytes (at most 255 · 127 each, four a quad) stay within 32 bits.
const I8_MAX_SLICE: usize = (i32::MAX as usize) / (4 * 255 * 127);

/// The names lowered code gives the two operands' buffers, by input index.
pub(super) const OPERAND_BUFS: [&str; 2] = ["in0", "in1"];

impl Nest<'_> {
    /// Let-statements naming, for the flat batch index held in `bt_var`, each batch
    /// axis's index, and the base offset of every tensor (inputs, then the output).
    pub fn batch_bases(&self, bt_var: &str, stmts: &mut Vec<Stmt>) -> Vec<Expr> {
        let mut inner = Expr::Const(1);
        let mut idx = Vec::new();
        for (j, &axis) in self.g.batch.iter().enumerate().rev() {
            let e = renamed(&self.w.axes[axis].extent);
            let name = format!("bi{j}");
            stmts.push(let_(&name, v(bt_var) / inner.clone() % e.clone()));
            inner = inner * e;
            idx.push((axis, name));
        }
        self.w
            .tensors()
            .map(|t| {
                idx.iter()
                    .fold(renamed(&t.base_offset()), |acc, (axis, name)| {
                        acc + v(name) * renamed(&t.axis_stride(*axis))
                    })
            })
            .collect()
    }
}

/// Lower a contraction program.
pub(crate) fn lower(p: &Program, target: &CpuTarget) -> Result<Func> {
    p.micro_kernel.validate(target)?;
    let w = &p.workload;
    let mk = p.micro_kernel;
    let (g, roles) = mk.oriented(GemmView::of(w)?);
    let (shape_vars, specialized) = shape_vars(p)?;
    let policy = p.strategy.policy();
    let lanes = target.lanes_f32();
    let bf16 = w.precision == Precision::Bf16;
    let b_panels = w.inputs[roles[1]].panels;
    let b_in_place = if mk.dot || policy.copy {
        None
    } else if let Some(pw) = b_panels {
        (pw % lanes as i64 == 0).then_some(pw)
    } else {
        // `ib=1`: B's vectors straight from the tensor, where its N axis is contiguous
        // (in f32: a bf16 B read in pairs is packed, its pairs rounded into words).
        (mk.ib && !bf16 && g.n_contiguous(w, roles[1])).then_some(1)
    };
    if bf16 && (mk.dot || mk.vm || policy.copy || (b_panels.is_some() && b_in_place.is_none())) {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: format!(
                "a bf16 contraction runs the usual variant reading B in its panels of \
                 whole vectors (or packing B's pairs), with no global padding; not {mk} \
                 under {}",
                p.strategy
            ),
        });
    }
    let i8 = w.precision == Precision::I8;
    let usual = !(mk.dot || mk.vm || mk.ia || mk.amx || policy.copy);
    if i8 && !(usual && b_in_place.is_some() && g.batch.is_empty()) {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: format!(
                "an i8 contraction runs the usual variant over weights in panels of whole \
                 vectors, its rows quantized and packed (no `ia`), with no batch axes and no \
                 global padding; not {mk} under {}",
                p.strategy
            ),
        });
    }
    if let Some(kc) = (i8 && mk.kc > I8_MAX_SLICE).then_some(mk.kc) {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: format!(
                "kc={kc}: an i8 contraction sums a reduction slice in 32-bit integers, at \
                 most {I8_MAX_SLICE} quads"
            ),
        });
    }
    if mk.amx && !crate::sketch::amx_runs(w) {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason: format!(
                "AMX tiles run a bf16 contraction over weights in panels of 16 or a second \
                 operand read in pairs, its first operand's pairs contiguous, its output \
                 contiguous along N and its reduction whole tiles of 16 pairs; not this \
                 one ({mk})"
            ),
        });
    }
    let nest = Nest {
        w,
        g: g.clone(),
        mk,
        policy,
        lanes,
        b_in_place,
        roles,
        whole_k: mk.vm && mk.ia && policy.compute == Compute::Unchecked,
        prefetch_a: mk.pf && mk.ia && w.inputs[roles[0]].panels.is_some(),
        rows: Rows::Left,
    };
    let mut body = Vec::new();

    // Extents and strides, named once.
    let e_b = g
        .batch
        .iter()
        .fold(Expr::Const(1), |acc, &a| acc * renamed(&w.axes[a].extent));
    for (name, e) in [
        ("e_b", e_b),
        ("e_m", renamed(&w.axes[g.m].extent)),
        ("e_n", renamed(&w.axes[g.n].extent)),
        ("e_k", renamed(&w.axes[g.k].extent)),
    ] {
        body.push(let_(name, e));
    }
    let (a, b, out) = (&w.inputs[roles[0]], &w.inputs[roles[1]], &w.output);
    let mut strides = HashMap::new();
    for (name, t, axis) in [
        ("sa_m", a, g.m),
        ("sa_k", a, g.k),
        ("sb_n", b, g.n),
        ("sb_k", b, g.k),
        ("sc_m", out, g.m),
        ("sc_n", out, g.n),
    ] {
        let e = renamed(&t.axis_stride(axis));
        // Constant strides stay visible to the code below (contiguity decides vector
        // stores and the packing loop order); others are read through their name.
        strides.insert(
            name,
            if e.as_const().is_some() {
                e.clone()
            } else {
                v(name)
            },
        );
        body.push(let_(name, e));
    }
    // The weight in panels (B's role, or A's in the transposed variant).
    if let Some(ps) = b.panel_stride().or_else(|| a.panel_stride()) {
        body.push(let_("sb_p", renamed(&ps)));
    }
    if let Some(pw) = nest.b_in_place {
        // Columns up to here lie in B's panels (the last one padded).
        body.push(let_("e_np", Expr::round_up(v("e_n"), pw)));
    }
    body.extend(nest.epilogue_strides());

    if nest.policy.copy {
        body.extend(nest.copy_in());
    } else {
        for (p_name, e_name) in [("p_m", "e_m"), ("p_n", "e_n"), ("p_k", "e_k")] {
            body.push(let_(p_name, v(e_name)));
        }
    }

    if i8 {
        body.extend(nest.quantize_rows(a));
    }

    // Cache tiles, balanced (`ContractionKernel::tiles`): each axis's register-tile
    // blocks spread evenly over its tiles, and M's tiles rounded up to a multiple of
    // the threads where the tasks would not divide evenly among them — then N's, where
    // M has too few register tiles for that (a decoder's step).
    body.push(let_("nb_m", Expr::ceil_div(v("p_m"), c(mk.mr))));
    body.push(let_("nb_n", Expr::ceil_div(v("p_n"), c(mk.nr))));
    let tiles_n = Expr::ceil_div(v("p_n"), c(mk.nc));
    let tiles_m = Expr::ceil_div(v("p_m"), c(mk.mc));
    let threads = target.cores.max(1) as i64;
    let uneven =
        |m: Expr, n: Expr| Expr::min(Expr::Const(1), v("e_b") * m * n % Expr::Const(threads));
    let rounded = Expr::min(v("nb_m"), Expr::round_up(tiles_m.clone(), threads));
    body.push(let_(
        "tiles_m",
        tiles_m.clone() + uneven(tiles_m.clone(), tiles_n.clone()) * (rounded - tiles_m),
    ));
    let rounded = Expr::min(v("nb_n"), Expr::round_up(tiles_n.clone(), threads));
    body.push(let_(
        "tiles_n",
        tiles_n.clone() + uneven(v("tiles_m"), tiles_n.clone()) * (rounded - tiles_n),
    ));
    body.push(let_(
        "tiles_k",
        Expr::max(Expr::Const(1), Expr::ceil_div(v("p_k"), c(mk.kc))),
    ));
    let mut task = if mk.amx {
        // N tiles vary fastest, so consecutive tasks of a thread share the packed A rows.
        vec![
            let_("jt", v("t") % v("tiles_n")),
            let_("it", v("t") / v("tiles_n") % v("tiles_m")),
        ]
    } else {
        // M tiles vary fastest, so consecutive tasks of a thread share the packed B panel.
        vec![
            let_("it", v("t") % v("tiles_m")),
            let_("jt", v("t") / v("tiles_m") % v("tiles_n")),
        ]
    };
    task.push(let_("bt", v("t") / (v("tiles_n") * v("tiles_m"))));
    let mut epilogue_bases = Vec::new();
    let operands = if nest.policy.copy {
        nest.padded_operands()
    } else {
        let bases = nest.batch_bases("bt", &mut task);
        epilogue_bases = nest.epilogue_bases(&bases);
        [
            match i8 {
                true => Nest::quantized_operand(),
                false => Operand {
                    buf: OPERAND_BUFS[roles[0]],
                    base: bases[roles[0]].clone(),
                    s_row: strides["sa_m"].clone(),
                    s_col: strides["sa_k"].clone(),
                    panels: a.panels,
                },
            },
            Operand {
                buf: OPERAND_BUFS[roles[1]],
                base: bases[roles[1]].clone(),
                s_row: strides["sb_n"].clone(),
                s_col: strides["sb_k"].clone(),
                panels: b.panels,
            },
            Operand {
                buf: "out0",
                base: bases[w.inputs.len()].clone(),
                s_row: strides["sc_m"].clone(),
                s_col: strides["sc_n"].clone(),
                panels: None,
            },
        ]
    };
    for (i, op) in operands.iter().enumerate() {
        task.push(let_(&format!("base{i}"), op.base.clone()));
    }
    task.extend(epilogue_bases);
    task.extend(nest.task_body(&operands));
    if !nest.policy.copy && !w.epilogue.is_empty() {
        task.push(nest.epilogue_tile());
    }
    body.push(for_(
        "t",
        v("e_b") * v("tiles_m") * v("tiles_n"),
        LoopKind::Parallel,
        task,
    ));
    if nest.policy.copy {
        body.push(nest.copy_out());
    }

    Ok(Func {
        name: p.symbol(target),
        shape_vars,
        specialized,
        inputs: w.inputs.len(),
        threads: None,
        body,
    })
}

impl Nest<'_> {
    /// The task's cache tile (origin, extent, register tiles) and its body by variant.
    fn task_body(&self, ops: &[Operand; 3]) -> Vec<Stmt> {
        let mk = self.mk;
        let mut s = vec![
            // Tile `i` of `tiles` starts at block `i·blocks / tiles`: none is longer
            // than `mc` (`nc`) or empty, all but the last whole register tiles.
            let_("m0", v("it") * v("nb_m") / v("tiles_m") * c(mk.mr)),
            let_("n0", v("jt") * v("nb_n") / v("tiles_n") * c(mk.nr)),
            let_(
                "mlen",
                Expr::min(
                    v("p_m"),
                    (v("it") + Expr::Const(1)) * v("nb_m") / v("tiles_m") * c(mk.mr),
                ) - v("m0"),
            ),
            let_(
                "nlen",
                Expr::min(
                    v("p_n"),
                    (v("jt") + Expr::Const(1)) * v("nb_n") / v("tiles_n") * c(mk.nr),
                ) - v("n0"),
            ),
            let_("nmb", Expr::ceil_div(v("mlen"), c(mk.mr))),
            let_("nnb", Expr::ceil_div(v("nlen"), c(mk.nr))),
        ];
        if mk.amx {
            s.extend(self.amx_task_body(ops));
        } else if mk.dot {
            s.extend(self.dot_task_body(ops));
        } else {
            s.extend(self.packed_task_body(ops));
        }
        s
    }
}
