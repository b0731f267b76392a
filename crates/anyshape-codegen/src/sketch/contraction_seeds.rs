//! The contraction sketch's defaults, one per regime of shapes (what an untuned module
//! runs, and the micro-kernels a search measures first), which of them a workload gets
//! as seeds, and which an untuned module runs at an instance. Each is derived from the
//! target's registers and caches, never from a shape.
use super::contraction::ContractionKernel;
use super::contraction_amx::amx_runs;
use super::contraction_space::{max_multiple, Limits};
use super::Sketch;
use crate::{CpuTarget, GemmView};
use anyshape_ir::{BoundWorkload, Precision, Workload};

impl ContractionKernel {
    /// A reasonable micro-kernel for `target`, used when none is given: the B
    /// micro-panel fills three quarters of L1 (fewer passes over the output than half
    /// of it: 2-8 % faster on BERT's feed-forward matmul, weights cold, Zen 3), and A
    /// read in place (packing it was a scalar copy per N tile: dense M=1024 reaches
    /// 90-93 % of the FMA peak instead of 86 %, batch matmuls gain 21-32 %, Zen 3).
    pub fn default_for(target: &CpuTarget) -> ContractionKernel {
        let lanes = target.lanes_f32();
        let nv = 2;
        let mr = ((target.vector_registers - nv - 1) / nv).clamp(1, 12);
        let nr = nv * lanes;
        let kc = (target.l1d_bytes * 3 / 4 / (4 * nr)).clamp(4, 512) / 4 * 4;
        let mc = ((target.l2_bytes / 2 / (4 * kc)).clamp(mr, 16 * mr) / mr) * mr;
        ContractionKernel {
            mr,
            nr,
            mc: mc.min(8 * mr),
            nc: (12 * nr).min(384.max(nr)),
            kc,
            uk: 4,
            dot: false,
            pf: false,
            ia: true,
            ib: false,
            vm: false,
            amx: false,
        }
    }

    /// The AMX default (`amx`): one row of three output tiles of 16 x 16 (16 x 48),
    /// cache tiles of 8 x 2 such tiles (128 x 96). Warm, 2 threads, dense_bf16 (Emerald
    /// Rapids class): 1.7 TFLOP/s at 128 x 768 x 768 and 512 x 768 x 3072, where 32 x
    /// 32 tiles in 128 x 256 ran 0.85-0.9; 3.7x and 2.2x those at 8 x 3072 x 768 and 1 x
    /// 768 x 768 (its edge tiles: a row of tiles wastes less of a single row); 5-10x
    /// the usual variant's `vdpbf16ps`.
    pub fn default_amx_for(target: &CpuTarget) -> ContractionKernel {
        ContractionKernel {
            mr: 16,
            nr: 48,
            mc: 128,
            nc: 96,
            amx: true,
            ..ContractionKernel::default_for(target)
        }
        .fit_amx()
    }

    /// The usual default with two thirds of its rows (8 x 32 on 16-float vectors): at
    /// an M that its full height covers with a short edge, two or more tiles of this
    /// one run faster — M = 16 as 12 + 4 rows took 0.39 ms, as 8 + 8 0.35 (f32,
    /// `dense_packed` 3072 x 768, cold, Zen 4); at 32-128 rows 1.01-1.05x.
    pub fn default_short_for(target: &CpuTarget) -> ContractionKernel {
        let usual = ContractionKernel::default_for(target);
        let mr = (usual.mr * 2).div_ceil(3).max(1);
        ContractionKernel {
            mr,
            mc: usual.mc / usual.mr * mr,
            ..usual
        }
    }

    /// The usual variant's wide default: four rows by as many vectors (up to four) as
    /// the registers allow, A read in place. Few rows leave the general registers to
    /// the row streams of A (twelve of them spill pointers), and a wide tile reuses each
    /// broadcast of A over more columns; B's transposing pack is vectorized, so its
    /// 64-row blocks cost no more per element than 16-row ones. Per-shape search found
    /// such tiles best for `batch_matmul_nt` from T = 48 up (4 x 48 and 4 x 64: 1.2x
    /// the 12 x 32 default at T = 64, Emerald Rapids class).
    pub fn default_wide_for(target: &CpuTarget) -> ContractionKernel {
        Self::wide_for(target, 4)
    }

    /// The wide default with six rows, for a B read in place (`batch_matmul_nn`'s
    /// `[K, N]`): no pack of B to amortize, so more rows per broadcast of B's vectors
    /// pay (6 x 64 against 4 x 64 at T = 17-64 of `batch_matmul_nn(192, T, 64, T)`:
    /// 1.04-1.26x, equal from T = 90 up, Emerald Rapids class).
    pub fn default_tall_wide_for(target: &CpuTarget) -> ContractionKernel {
        Self::wide_for(target, 6)
    }

    /// `mr` rows by as many vectors (up to four) as the registers allow, A in place.
    fn wide_for(target: &CpuTarget, mr: usize) -> ContractionKernel {
        let lanes = target.lanes_f32();
        let limits = Limits(target);
        let nv = (1..=4)
            .rev()
            .find(|&nv| limits.registers(mr, nv))
            .unwrap_or(1);
        let nr = nv * lanes;
        let uk = 4;
        let kc = (target.l1d_bytes * 3 / 4 / (4 * nr)).clamp(uk, 512) / uk * uk;
        ContractionKernel {
            mr,
            nr,
            mc: 16 * mr,
            nc: (12 * nr).min(384.max(nr)),
            kc,
            uk,
            dot: false,
            pf: false,
            ia: true,
            ib: false,
            vm: false,
            amx: false,
        }
    }

    /// The dot variant's default, for the smallest M: one row by as many columns as
    /// the registers allow (each vector of A reused across the columns), the reduction
    /// in tiles whose rows fit L1 together.
    pub fn default_dot_for(target: &CpuTarget) -> ContractionKernel {
        let nr = max_multiple(1, |nr| Limits(target).registers(1, nr)).clamp(1, 8);
        Self::dot_row_for(target, nr, 2)
    }

    /// The dot variant's one-element tile, for outputs of a few elements per batch
    /// item (batch matmuls at T = 1-4): the other tiles pad such an output to several
    /// rows or columns; this one computes one dot product at a time, the reduction in
    /// tiles as long as L1 holds (`batch_matmul_nt` at T = 1-2: 2.4 and 3.7 µs against
    /// 4.4 and 7.5 µs for the kernels the votes chose without it, Emerald Rapids class).
    pub fn default_dot_single_for(target: &CpuTarget) -> ContractionKernel {
        Self::dot_row_for(target, 1, 4)
    }

    /// The dot variant with one row by `nr` columns, `uk` vectors per reduction step,
    /// the reduction in tiles whose rows fit L1 together; 16 register tiles per task.
    fn dot_row_for(target: &CpuTarget, nr: usize, uk: usize) -> ContractionKernel {
        let lanes = target.lanes_f32();
        let mr = 1;
        let k_unit = uk * lanes;
        let kc = k_unit * max_multiple(k_unit, |kc| Limits(target).l1(kc, nr + mr));
        ContractionKernel {
            mr,
            nr,
            mc: 16 * mr,
            nc: 16 * nr,
            kc,
            uk,
            dot: true,
            pf: false,
            ia: false,
            ib: false,
            vm: false,
            amx: false,
        }
    }

    /// The usual variant's default for one row (GEMV-like shapes, and the weights a
    /// model packs in panels, which it reads in place): four vectors of columns, the
    /// reduction in tiles whose micro-panel fits L1, the columns in tiles of 24
    /// vectors (several tasks per core even for a 768-wide output).
    pub fn default_row_for(target: &CpuTarget) -> ContractionKernel {
        let lanes = target.lanes_f32();
        let limits = Limits(target);
        let mr = 1;
        let nv = (1..=4)
            .rev()
            .find(|&nv| limits.registers(mr, nv))
            .unwrap_or(1);
        let nr = nv * lanes;
        let uk = 4;
        let kc = uk * max_multiple(uk, |kc| limits.l1(kc, nr)).min(512 / uk);
        ContractionKernel {
            mr,
            nr,
            mc: 16 * mr,
            nc: 24 * lanes / nr * nr,
            kc,
            uk,
            dot: false,
            pf: false,
            ia: false,
            ib: false,
            vm: false,
            amx: false,
        }
    }

    /// The usual variant's default for a few rows (M of about 8 to 32): eight rows by
    /// one vector (as many rows as the reduction's broadcasts can keep the FMA units
    /// busy with, and no columns wasted on a narrow output), the reduction in tiles
    /// whose micro-panel fits L1 several times over, 24 vectors of columns per task.
    pub fn default_narrow_for(target: &CpuTarget) -> ContractionKernel {
        let lanes = target.lanes_f32();
        let limits = Limits(target);
        let mr = (1..=8)
            .rev()
            .find(|&mr| limits.registers(mr, 1))
            .unwrap_or(1);
        let uk = 4;
        let kc = uk * max_multiple(uk, |kc| limits.l1(2 * kc, 2 * lanes)).min(384 / uk);
        ContractionKernel {
            mr,
            nr: lanes,
            mc: 2 * mr,
            nc: 24 * lanes,
            kc,
            uk,
            dot: false,
            pf: false,
            ia: false,
            ib: false,
            vm: false,
            amx: false,
        }
    }
}

/// Output channels up to which a convolution's first seed reads its patches (B) in
/// place rather than packing them: each packed element would serve only as many rows.
/// ResNet-50's untuned module (Zen 3, per-step minima in alternating order): the 7 x 7
/// stem (64 channels, 147 taps) 0.78x the time at 224 x 224 and 0.84x at 96 x 96, the
/// other 64-channel layers 0.91-0.96x; the 128-channel ones 0.80-1.0x at 96 x 96 and
/// 1.00-1.03x at 224 x 224.
const FEW_CHANNELS: i64 = 128;

/// The usual default (A read in place, but packed over weights in panels and in bf16),
/// the same with two thirds of its rows (`default_short_for`: BERT-base f32 tuned 16
/// trials a task, 1.01-1.09x the module tuned without it, Zen 4) and the wide one, then
/// those for small M, which
/// pack A (reading it in place measured 0.95-1.0x there): the dot variant's (not for
/// weights in panels, which it packs element by element: 20x slower there), one row's
/// and a few rows'.
/// Weights in panels are read in place, and in a model they come from memory: each of
/// their seeds also comes prefetching (`pf`), and those come first — the first seed is
/// what an untuned module runs. Prefetching the weights, cold, measured 1.03-1.19x at
/// one to four rows, 1.34-1.66x at 8-32, 1.05-1.19x at 128 and 0.95-1.02x at 512 (six
/// dense layers of BERT, GPT-2 and a Llama-style decoder, the default tile, Zen 5); an
/// earlier machine lost 8 % at one row, so the search measures both. A B whose N axis
/// is contiguous (batch matmuls' `[K, N]`) gets each usual-variant seed also reading it in place
/// (`ib`), which saves packing B per batch item where its items are small, and the
/// six-row wide default reading it in place. A B whose K
/// axis is contiguous (dense's `[N, K]` weights, `batch_matmul_nt`) also gets the
/// usual and the wide default transposed (`vm`), B broadcast in place: the usual
/// variant transposes all of such a B on every call, which at small M costs as much as
/// the products (dense 16..128 x 2304 x 768: 1.2-1.6x faster transposed, Emerald
/// Rapids class). An output whose both axes may be shorter than a vector also gets
/// the dot variant's one-element tile and the few-rows default reading A in place.
/// A bf16 contraction's usual default packs A (see `packed_a`). A convolution's filters
/// in panels (`conv_packed`, A's role) are prefetched like B's weights (the prefetching
/// seeds first: cold, the default tile reading them from panels without prefetch was
/// 1.5x slower than from row-major filters at 49 pixels, with it level), and also get
/// the usual and the wide default transposed, reading them in place and prefetching
/// them, the patches broadcast in place: output channels on the vectors, for images of
/// few pixels (where the pixels fill 9 or 49 of a vector's lanes); no dot seeds (they
/// would pack the panels element by element). Where it has at most [`FEW_CHANNELS`]
/// output channels, the usual default reading the patches in place comes first.
pub(super) fn seeds(target: &CpuTarget, w: &Workload) -> Vec<ContractionKernel> {
    let panels = weights_in_panels(w);
    // A convolution's filters in panels (`conv_packed`): the transposed variant reads
    // them in place, as the usual one reads B's.
    let a_panels = filters_in_panels(w);
    let view = GemmView::of(w);
    let n_contiguous = !panels && view.as_ref().is_ok_and(|g| g.n_contiguous(w, 1));
    let k_contiguous = !panels && view.as_ref().is_ok_and(|g| g.k_contiguous(w, 1));
    // A convolution of few output channels: its first seed reads the patches in place.
    let few_channels = a_panels
        && n_contiguous
        && view.as_ref().is_ok_and(|g| {
            w.axes[g.m]
                .extent
                .as_const()
                .is_some_and(|m| m <= FEW_CHANNELS)
        });
    // Both output axes may be shorter than a vector (symbolic, or constant and short).
    let tiny_output = view.is_ok_and(|g| {
        [g.m, g.n].iter().all(|&a| {
            w.axes[a]
                .extent
                .as_const()
                .is_none_or(|c| c < target.lanes_f32() as i64)
        })
    });
    // A bf16 contraction reading A in place rounds each of its pairs in every
    // register tile: its seeds pack A (rounded once per block) instead — 2.9x (M = 32)
    // and 3.3x (M = 512) faster for the default tile of BERT's dense_bf16 (Zen 5) —
    // except the wide default, which reading in place wins at M = 3-4 (7 %). So does
    // an f32 one over weights in panels (`dense_packed`), now that its A blocks are
    // transposed in registers as they are packed: the default tile cold, Zen 4, BERT's
    // layers at M = 64-255 1.05-1.10x (K = 768) and 1.10-1.35x (K = 3072, whose A rows,
    // 12 KB apart, all fall in one L1 set when read in place); BERT-base f32 1.02-1.09x
    // from sequence 32 on, level below.
    let packed_a = |mk: ContractionKernel| match w.precision {
        Precision::Bf16 | Precision::I8 => ContractionKernel { ia: false, ..mk },
        Precision::F32 if panels => ContractionKernel { ia: false, ..mk },
        Precision::F32 => mk,
    };
    let plain = [
        Some(packed_a(ContractionKernel::default_for(target))),
        Some(packed_a(ContractionKernel::default_short_for(target))),
        Some(ContractionKernel::default_wide_for(target)),
        (!panels && !a_panels).then(|| ContractionKernel::default_dot_for(target)),
        (!panels && !a_panels && tiny_output)
            .then(|| ContractionKernel::default_dot_single_for(target)),
        // A few rows read in place: batch_matmul_nt at T = 13-15 1.24-1.30x the narrow
        // seed packing A (Emerald Rapids class).
        (!panels && !a_panels && tiny_output).then(|| ContractionKernel {
            ia: true,
            ..ContractionKernel::default_narrow_for(target)
        }),
        Some(ContractionKernel::default_row_for(target)),
        Some(ContractionKernel::default_narrow_for(target)),
    ];
    let prefetching = plain.map(|mk| {
        mk.filter(|_| panels || a_panels)
            .map(|mk| ContractionKernel { pf: true, ..mk })
    });
    let b_in_place = plain.map(|mk| {
        mk.filter(|mk| n_contiguous && !mk.dot)
            .map(|mk| ContractionKernel { ib: true, ..mk })
    });
    let transposed = [
        ContractionKernel::default_for(target),
        ContractionKernel::default_wide_for(target),
    ]
    .map(|mk| k_contiguous.then_some(ContractionKernel { vm: true, ..mk }));
    // Filters in panels, transposed: read in place and prefetched (they come from
    // memory), the patches broadcast in place.
    let filters = [
        ContractionKernel::default_for(target),
        ContractionKernel::default_wide_for(target),
    ]
    .map(|mk| a_panels.then_some(transposed_filters(mk)));
    let tall = n_contiguous.then(|| ContractionKernel {
        ib: true,
        ..ContractionKernel::default_tall_wide_for(target)
    });
    let (first, second) = if panels || a_panels {
        (prefetching, plain)
    } else {
        (plain, prefetching)
    };
    let mut seeds: Vec<_> = first
        .into_iter()
        .chain(second)
        .chain(b_in_place)
        .chain([tall])
        .chain(transposed)
        .chain(filters)
        .flatten()
        .collect();
    if few_channels {
        if let Some(i) = seeds.iter().position(|mk| mk.ib) {
            let mk = seeds.remove(i);
            seeds.insert(0, mk);
        }
    }
    if target.amx && amx_runs(w) {
        seeds.insert(0, ContractionKernel::default_amx_for(target));
    }
    seeds
}

/// Whether the second operand is a weight in panels (`dense_packed`'s, `dense_bf16`'s).
fn weights_in_panels(w: &Workload) -> bool {
    w.inputs.get(1).is_some_and(|b| b.panels.is_some())
}

/// Whether the first operand is a weight in panels (`conv_packed`'s filters,
/// `batch_matmul_packed`'s transformed ones).
fn filters_in_panels(w: &Workload) -> bool {
    w.inputs.first().is_some_and(|a| a.panels.is_some())
}

/// `mk` transposed, reading a first operand in panels (filters) in place and
/// prefetching it, the second (patches, tiles) broadcast in place.
fn transposed_filters(mk: ContractionKernel) -> ContractionKernel {
    ContractionKernel {
        vm: true,
        pf: true,
        ia: true,
        ..mk
    }
}

/// The default at one instance (what an untuned module dispatches to): the workload's,
/// except where its first operand is a weight in panels (a convolution's filters,
/// Winograd's transformed ones) and the output's N (pixels, tiles) is narrower than
/// that default's `nr`: there the transposed default, which reads each panel once,
/// whole, for all of N (output channels on the vectors), where the usual tile reads it
/// once per `mr` rows with N on vectors it does not fill. ResNet-50's layers at 96 x 96,
/// cold (Zen 3, AVX2, `nr` = 16): Winograd's products of stage 4 (N = 4 tiles) 1.30 ->
/// 0.73 ms, its 1 x 1 convolutions (N = 9 pixels) 0.33 -> 0.27 ms; at N = 16 and 49 the
/// transposed tile was the slower (0.68x and 0.81x).
///
/// On a target with 16-float vectors the transposed default also runs filters in panels
/// that are deep ([`deep_filters`]), at any N: ResNet-50 tuned on Zen 4 (16 trials a
/// task, images 96..320) voted for it at 37 of the 40 instances of its ten such
/// layers, and alone, cold, it was 1.0-1.2x the usual default from 144 to 6400
/// columns; the untuned module with this rule ran 1.04x the one without (paired, 9
/// image sizes).
///
/// And where the second operand is a weight in panels (`dense_packed`, f32) and the
/// instance has at most [`ROW_DEFAULT_ROWS`] rows (a decoder's step, an encoder at
/// sequence 1): the one-row default prefetching the panels, which streams them at
/// memory's pace where the usual tile's 12 rows compute one. Cold, Emerald Rapids
/// class, alternated twice: 1 x 3072 x 768 0.35-0.40 -> 0.31-0.34 ms, 1 x 768 x 3072
/// 0.38-0.39 -> 0.31-0.32, 1 x 2304 x 768 0.29-0.30 -> 0.22-0.27, 1 x 768 x 768 0.086
/// -> 0.073, 2 x 3072 x 768 0.42 -> 0.36; at 4 rows it was the slower (0.37-0.42 ->
/// 0.45-0.46).
///
/// And, again over weights in panels in f32 on 16-float vectors, where the instance's
/// M is one whole tile of that default and an edge of at most its lowest height
/// ([`short_edge`]: 13-16 rows for 12-row tiles): the default with two thirds of its
/// rows ([`ContractionKernel::default_short_for`]), two tiles of 8 rows for 12 + 4.
/// Cold, Zen 4, BERT-base's three shapes (3072 x 768, 768 x 3072, 768 x 768) at 13, 14
/// and 16 rows, alternated twice: 1.11-1.21x (0.392 -> 0.329 ms at 13 x 3072 x 768,
/// 0.399 -> 0.347 at 16 x 768 x 3072). Not in bf16, where it measured 0.97-1.10x, nor
/// from 17 rows, where the short tile lost (0.89-0.98x at 17 and 20, f32 and bf16).
/// Measured on Zen 4 only, hence 16-float vectors only.
pub(super) fn default_for_instance(
    target: &CpuTarget,
    w: &Workload,
    bound: &BoundWorkload,
) -> ContractionKernel {
    let default = ContractionKernel::default_for_workload(target, w);
    let extent = |axis: fn(&GemmView) -> usize| {
        GemmView::of(w)
            .ok()
            .and_then(|g| bound.extents.get(axis(&g)).copied())
    };
    let narrow = extent(|g| g.n).is_some_and(|n| n < default.nr as i64);
    let deep = target.lanes_f32() >= 16 && deep_filters(extent(|g| g.m), extent(|g| g.k));
    let few_rows = extent(|g| g.m).is_some_and(|m| m <= ROW_DEFAULT_ROWS);
    let short =
        target.lanes_f32() >= 16 && extent(|g| g.m).is_some_and(|m| short_edge(&default, m));
    let f32_default = !default.vm && w.precision == Precision::F32;
    if filters_in_panels(w) && (narrow || deep) && f32_default {
        transposed_filters(ContractionKernel::default_for(target)).fit(target, w)
    } else if weights_in_panels(w) && few_rows && f32_default {
        ContractionKernel {
            pf: true,
            ..ContractionKernel::default_row_for(target)
        }
        .fit(target, w)
    } else if weights_in_panels(w) && short && f32_default {
        let rows = ContractionKernel::default_short_for(target);
        ContractionKernel {
            mr: rows.mr,
            mc: rows.mc,
            ..default
        }
        .fit(target, w)
    } else {
        default
    }
}

/// Whether `m` rows are one whole tile of `mk` and an edge of at most its lowest
/// height (see [`default_for_instance`]).
fn short_edge(mk: &ContractionKernel, m: i64) -> bool {
    let (mr, lowest) = (mk.mr as i64, mk.heights()[0] as i64);
    lowest < mr && m > mr && m <= mr + lowest
}

/// Rows up to which an untuned module runs a contraction over weights in panels on
/// the one-row default (see [`default_for_instance`]).
const ROW_DEFAULT_ROWS: i64 = 2;

/// Whether filters in panels of `m` output channels over a reduction of `k` are deep
/// enough for the transposed default on 16-float vectors (see
/// [`default_for_instance`]): a reduction of 1024 or more, or of 512 or more into 512
/// channels or more. Where the tuner's votes went on Zen 4 (ResNet-50's third and
/// fourth stages: 1 x 1 convolutions of 1024 -> 256, 2048 -> 512, 512 -> 2048, 512 ->
/// 1024, 1024 -> 512 and 1024 -> 2048 channels, the strided 3 x 3 ones of 128 to 512
/// channels, Winograd's products of 512 channels); shallower ones (256 -> 1024, 512 ->
/// 256, 128 -> 512) kept N on the vectors. On Zen 3 (AVX2, 8-float vectors) the transposed tile
/// was the slower at 16 and 49 columns, hence the vectors' condition.
fn deep_filters(m: Option<i64>, k: Option<i64>) -> bool {
    match (m, k) {
        (Some(m), Some(k)) => k >= 1024 || (k >= 512 && m >= 512),
        _ => false,
    }
}
