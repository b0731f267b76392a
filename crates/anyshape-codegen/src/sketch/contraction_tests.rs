//! Tests of the CPU contraction sketch: seeds, text forms, the limits of each variant
//! and what breaks a target.

use super::contraction::*;
use super::contraction_amx::{amx_runs, AMX_TILES};
use crate::sketch::Sketch;
use crate::Simd;
use crate::{CodegenError, CpuTarget};
use anyshape_ir::Workload;

fn avx512() -> CpuTarget {
    CpuTarget::avx512_for_tests()
}

/// Every seed is valid on AVX2 (16 registers), AVX-512 and this machine, and they
/// differ (each one measurement a search spends).
#[test]
fn seeds_are_valid_and_distinct() {
    let avx2 = CpuTarget {
        simd: Simd::Avx2,
        vector_registers: 16,
        l1d_bytes: 32 << 10,
        ..avx512()
    };
    let dense = Workload::parse("dense(M=T,N=64,K=64)").unwrap();
    let packed = Workload::parse("dense_packed(M=T,N=64,K=64,P=16)").unwrap();
    assert!(ContractionKernel::seeds(&avx2, &dense)
        .iter()
        .any(|mk| mk.dot));
    assert!(!ContractionKernel::seeds(&avx2, &packed)
        .iter()
        .any(|mk| mk.dot));
    // Weights in panels get each seed with and without prefetch; others without.
    let pf = |w: &Workload| {
        ContractionKernel::seeds(&avx2, w)
            .iter()
            .filter(|mk| mk.pf)
            .count()
    };
    assert_eq!(
        2 * pf(&packed),
        ContractionKernel::seeds(&avx2, &packed).len()
    );
    assert_eq!(pf(&dense), 0);
    // The first seed (an untuned module's micro-kernel) of weights in panels prefetches.
    assert!(ContractionKernel::default_for_workload(&avx2, &packed).pf);
    assert!(!ContractionKernel::default_for_workload(&avx2, &dense).pf);
    // Filters in panels (the first operand): prefetched first too, no dot seeds, and
    // the transposed variant reading them in place (prefetched, the patches in place).
    let conv = Workload::parse("conv_packed(B=1,M=256,N=T,K=27,P=16)").unwrap();
    let conv_seeds = ContractionKernel::seeds(&avx2, &conv);
    assert!(ContractionKernel::default_for_workload(&avx2, &conv).pf);
    assert!(!ContractionKernel::default_for_workload(&avx2, &conv).ib);
    // Few output channels: the patches read in place first, and the seeds the same.
    let narrow = Workload::parse("conv_packed(B=1,M=64,N=T,K=27,P=16)").unwrap();
    assert!(ContractionKernel::default_for_workload(&avx2, &narrow).ib);
    let mut narrow_seeds = ContractionKernel::seeds(&avx2, &narrow);
    let mut conv_set = conv_seeds.clone();
    narrow_seeds.sort();
    conv_set.sort();
    assert_eq!(narrow_seeds, conv_set);
    assert!(!conv_seeds.iter().any(|mk| mk.dot));
    assert_eq!(
        conv_seeds
            .iter()
            .filter(|mk| mk.vm && mk.pf && mk.ia)
            .count(),
        2
    );
    // A B with contiguous N (batch_matmul_nn's [K, N]) gets seeds reading it in
    // place (the five usual-variant ones and the six-row wide default); one with
    // contiguous K (dense's [N, K]) none.
    let nn = Workload::parse("batch_matmul_nn(B=2,M=T,N=64,K=T)").unwrap();
    let ib = |w: &Workload| {
        ContractionKernel::seeds(&avx2, w)
            .iter()
            .filter(|mk| mk.ib)
            .count()
    };
    assert_eq!(ib(&nn), 6);
    assert_eq!(ib(&dense) + ib(&packed), 0);
    // A B with contiguous K (dense's) gets the transposed variant; others not.
    let vm = |w: &Workload| {
        ContractionKernel::seeds(&avx2, w)
            .iter()
            .filter(|mk| mk.vm)
            .count()
    };
    assert_eq!(vm(&dense), 2);
    assert_eq!(vm(&nn) + vm(&packed), 0);
    // Outputs whose both axes may be shorter than a vector (batch matmuls at T = 1)
    // get the one-element dot tile; dense's 64 columns not.
    let nt = Workload::parse("batch_matmul_nt(B=2,M=T,N=T,K=64)").unwrap();
    let single = |w: &Workload| {
        ContractionKernel::seeds(&avx2, w)
            .iter()
            .filter(|mk| mk.dot && mk.mr == 1 && mk.nr == 1)
            .count()
    };
    assert_eq!((single(&nt), single(&dense), single(&nn)), (1, 0, 0));
    let narrow_in_place = ContractionKernel {
        ia: true,
        ..ContractionKernel::default_narrow_for(&avx2)
    };
    assert!(ContractionKernel::seeds(&avx2, &nt).contains(&narrow_in_place));
    assert!(!ContractionKernel::seeds(&avx2, &dense).contains(&narrow_in_place));
    for (t, w) in [avx2, avx512(), CpuTarget::detect()]
        .into_iter()
        .flat_map(|t| {
            [
                (t.clone(), &dense),
                (t.clone(), &packed),
                (t.clone(), &nt),
                (t.clone(), &conv),
                (t, &nn),
            ]
        })
    {
        let seeds = ContractionKernel::seeds(&t, w);
        for mk in &seeds {
            mk.validate(&t)
                .unwrap_or_else(|e| panic!("{:?}: {e}", t.simd));
        }
        let distinct: std::collections::BTreeSet<_> = seeds.iter().collect();
        assert_eq!(distinct.len(), seeds.len(), "{seeds:?}");
    }
}

#[test]
fn dot_variant_text_form_and_limits() {
    let t = avx512();
    let mk = ContractionKernel::default_dot_for(&t);
    mk.validate(&t).unwrap();
    assert!(mk.to_string().ends_with(",dot=1"), "{mk}");
    assert_eq!(ContractionKernel::parse(&mk.to_string()).unwrap(), mk);
    let json = serde_json::to_string(&ContractionKernel::default_for(&t)).unwrap();
    assert!(!json.contains("dot"), "{json}");
    // Any column count; K tiles of whole unrolled vectors.
    ContractionKernel::parse("mr=3,nr=5,mc=6,nc=10,kc=32,uk=2,dot=1")
        .unwrap()
        .validate(&t)
        .unwrap();
    for bad in [
        "mr=3,nr=5,mc=6,nc=10,kc=24,uk=2,dot=1",
        "mr=3,nr=5,mc=6,nc=10,kc=32,uk=2",
    ] {
        assert!(
            ContractionKernel::parse(bad).unwrap().validate(&t).is_err(),
            "{bad}"
        );
    }
    assert!(ContractionKernel::parse("mr=3,nr=16,mc=6,nc=16,kc=32,uk=2,dot=2").is_err());
    let mut rng = rand::rng();
    let mut dots = 0;
    for _ in 0..300 {
        let mk = ContractionKernel::sample(&t, &mut rng);
        dots += usize::from(mk.dot);
        for m in [mk.neighbour(&t, &mut rng), mk.child(&mk, &t, &mut rng)] {
            if m.validate(&t).is_ok() {
                assert_eq!(ContractionKernel::parse(&m.to_string()).unwrap(), m);
            }
        }
    }
    assert!((50..200).contains(&dots), "{dots} dot kernels of 300");
}

/// The usual variant's flags (`pf`, `ia`, `ib`, `vm`): text and JSON forms (older records
/// without them read as unset), refused with the dot variant, and reached by the
/// search both ways, never with the dot variant.
#[test]
fn flags_text_form_and_limits() {
    type Get = fn(&ContractionKernel) -> bool;
    type Set = fn(ContractionKernel, bool) -> ContractionKernel;
    let flags: [(&str, Get, Set); 4] = [
        ("pf", |m| m.pf, |m, pf| ContractionKernel { pf, ..m }),
        ("ia", |m| m.ia, |m, ia| ContractionKernel { ia, ..m }),
        ("ib", |m| m.ib, |m, ib| ContractionKernel { ib, ..m }),
        ("vm", |m| m.vm, |m, vm| ContractionKernel { vm, ..m }),
    ];
    let t = avx512();
    let mut rng = rand::rng();
    for (name, get, set) in flags {
        let text = format!("mr=6,nr=32,mc=48,nc=192,kc=256,uk=4,{name}=1");
        let mk = ContractionKernel::parse(&text).unwrap();
        assert!(get(&mk) && !mk.dot, "{name}");
        mk.validate(&t).unwrap();
        assert_eq!(mk.to_string(), text);
        let json = serde_json::to_string(&mk).unwrap();
        assert!(json.contains(&format!("\"{name}\":true")), "{json}");
        assert_eq!(ContractionKernel::parse(&json).unwrap(), mk);
        let old =
            ContractionKernel::parse(&json.replace(&format!(",\"{name}\":true"), "")).unwrap();
        assert_eq!(old, set(mk, false), "{name}");
        assert!(
            ContractionKernel::parse(&text.replace("=1", "=2")).is_err(),
            "{name}"
        );
        let dot = format!("mr=3,nr=5,mc=6,nc=10,kc=32,uk=2,dot=1,{name}=1");
        assert!(
            ContractionKernel::parse(&dot)
                .unwrap()
                .validate(&t)
                .is_err(),
            "{name} with the dot variant"
        );
        let mut set_count = 0;
        for _ in 0..300 {
            let mk = ContractionKernel::sample(&t, &mut rng);
            set_count += usize::from(get(&mk));
            for m in [mk.neighbour(&t, &mut rng), mk.child(&mk, &t, &mut rng)] {
                assert!(!(m.dot && get(&m)), "{m}");
            }
        }
        assert!(
            (50..200).contains(&set_count),
            "{set_count} kernels of 300 with {name}"
        );
    }
}

#[test]
fn default_is_valid_on_several_targets() {
    for simd in [Simd::None, Simd::Sse, Simd::Avx2, Simd::Avx512] {
        let t = CpuTarget {
            simd,
            vector_registers: if simd == Simd::Avx512 { 32 } else { 16 },
            ..avx512()
        };
        let mk = ContractionKernel::default_for(&t);
        mk.validate(&t).unwrap_or_else(|e| panic!("{simd:?}: {e}"));
        assert_eq!(ContractionKernel::parse(&mk.to_string()).unwrap(), mk);
    }
}

#[test]
fn rejects_what_breaks_the_target() {
    let t = avx512();
    for text in [
        "mr=16,nr=32,mc=96,nc=384,kc=256,uk=4",
        "mr=12,nr=24,mc=96,nc=384,kc=256,uk=4",
        "mr=12,nr=32,mc=100,nc=384,kc=256,uk=4",
        "mr=12,nr=32,mc=96,nc=384,kc=8192,uk=4",
        "mr=0,nr=32,mc=96,nc=384,kc=256,uk=4",
    ] {
        let err = ContractionKernel::parse(text)
            .unwrap()
            .validate(&t)
            .unwrap_err();
        assert!(
            matches!(err, CodegenError::InvalidMicroKernel { .. }),
            "{text}"
        );
    }
    for text in [
        "mr=12",
        "mr=x,nr=1,mc=1,nc=1,kc=1,uk=1",
        "zz=1",
        "{\"mr\":1}",
        "mr=1,mr=2,nr=16,mc=1,nc=16,kc=4,uk=4",
        "{\"mr\":1,\"nr\":16,\"mc\":1,\"nc\":16,\"kc\":4,\"uk\":4,\"zz\":1}",
        "{\"mr\":1,\"mr\":2,\"nr\":16,\"mc\":1,\"nc\":16,\"kc\":4,\"uk\":4}",
    ] {
        assert!(ContractionKernel::parse(text).is_err(), "{text}");
    }
}

/// An untuned module's micro-kernel at an instance: the workload's default, except
/// over a first operand in panels (filters, Winograd's transformed ones) where N is
/// narrower than that default's tile: there the transposed one reading the panels in
/// place; on 16-float vectors, also at any N where the filters are deep. Not for weights
/// in panels as B (dense layers; see the next test), nor at a wide N over shallow
/// filters or on 8-float vectors.
#[test]
fn narrow_outputs_and_deep_filters_in_panels_run_transposed_by_default() {
    let avx2 = CpuTarget {
        simd: Simd::Avx2,
        vector_registers: 16,
        l1d_bytes: 32 << 10,
        ..avx512()
    };
    for target in [avx2, avx512()] {
        let wide_vectors = target.lanes_f32() >= 16;
        for (text, deep) in [
            ("batch_matmul_packed(B=16,M=512,N=T,K=512,P=16)", true),
            ("conv_packed(B=1,M=2048,N=T,K=512,P=16)+add(m)+relu", true),
            ("conv_packed(B=1,M=256,N=T,K=1152,P=16)+add(m)+relu", true),
            ("conv_packed(B=1,M=1024,N=T,K=256,P=16)+add(m)", false),
            ("conv_packed(B=1,M=256,N=T,K=512,P=16)+add(m)+relu", false),
        ] {
            let w = Workload::parse(text).unwrap();
            let default = ContractionKernel::default_for_workload(&target, &w);
            assert!(!default.vm, "{text}");
            let at = |t: i64| {
                let b = w
                    .bind(&anyshape_ir::Bindings::from_pairs([("T", t)]))
                    .unwrap();
                ContractionKernel::default_for_instance(&target, &w, &b)
            };
            let narrow = at(default.nr as i64 - 1);
            assert!(narrow.vm && narrow.ia && narrow.pf, "{text}: {narrow}");
            narrow.validate(&target).unwrap();
            assert_eq!(at(1), narrow, "{text}");
            // Deep filters run transposed at any N on 16-float vectors.
            let wide = if deep && wide_vectors {
                narrow
            } else {
                default
            };
            assert_eq!(at(default.nr as i64), wide, "{text}");
            assert_eq!(at(100), wide, "{text}");
            assert_eq!(at(6400), wide, "{text}");
        }
        // Weights in panels as the second operand keep the default at any N.
        let dense = Workload::parse("dense_packed(M=T,N=4,K=64,P=16)").unwrap();
        let b = dense
            .bind(&anyshape_ir::Bindings::from_pairs([("T", 3)]))
            .unwrap();
        assert_eq!(
            ContractionKernel::default_for_instance(&target, &dense, &b),
            ContractionKernel::default_for_workload(&target, &dense)
        );
    }
}

/// An untuned module's micro-kernel over weights in panels as the second operand (f32
/// dense layers) at one or two rows: the one-row default, prefetching the panels; at
/// three rows and more, in bf16, and over filters (the first operand) the default.
#[test]
fn few_rows_over_weights_in_panels_run_the_row_default() {
    let target = avx512();
    let at = |text: &str, t: i64| {
        let w = Workload::parse(text).unwrap();
        let b = w
            .bind(&anyshape_ir::Bindings::from_pairs([("T", t)]))
            .unwrap();
        let mk = ContractionKernel::default_for_instance(&target, &w, &b);
        mk.validate(&target).unwrap();
        (mk, ContractionKernel::default_for_workload(&target, &w))
    };
    let row = ContractionKernel {
        pf: true,
        ..ContractionKernel::default_row_for(&target)
    };
    for t in [1, 2] {
        let (mk, _) = at("dense_packed(M=T,N=3072,K=768,P=16)+add(n)+gelu", t);
        assert_eq!(mk, row, "T={t}");
    }
    for (text, t) in [
        ("dense_packed(M=T,N=3072,K=768,P=16)+add(n)+gelu", 3),
        ("dense_packed(M=T,N=768,K=768,P=16)", 64),
        ("dense_bf16(M=T,N=768,K=768,P=16)", 1),
        ("conv_packed(B=1,M=T,N=196,K=256,P=16)", 1),
        ("dense(M=T,N=768,K=768)", 1),
    ] {
        let (mk, default) = at(text, t);
        assert_eq!(mk, default, "{text} at T={t}");
    }
}

/// An untuned module's micro-kernel over weights in panels (f32, 16-float vectors) at
/// one 12-row tile and an edge of at most 4 rows: the default with 8 rows; the default
/// below and above, in bf16, and on 8-float vectors.
#[test]
fn a_short_edge_over_weights_in_panels_runs_two_thirds_of_the_rows() {
    let avx2 = CpuTarget {
        simd: Simd::Avx2,
        vector_registers: 16,
        ..avx512()
    };
    let at = |target: &CpuTarget, text: &str, t: i64| {
        let w = Workload::parse(text).unwrap();
        let b = w
            .bind(&anyshape_ir::Bindings::from_pairs([("T", t)]))
            .unwrap();
        let mk = ContractionKernel::default_for_instance(target, &w, &b);
        mk.validate(target).unwrap();
        (mk, ContractionKernel::default_for_workload(target, &w))
    };
    let f32 = "dense_packed(M=T,N=3072,K=768,P=16)+add(n)+gelu";
    let (_, default) = at(&avx512(), f32, 1);
    assert_eq!(default.mr, 12);
    let short = ContractionKernel::default_short_for(&avx512());
    for t in 13..=16 {
        let (mk, default) = at(&avx512(), f32, t);
        assert_eq!(
            mk,
            ContractionKernel {
                mr: short.mr,
                mc: short.mc,
                ..default
            },
            "T={t}"
        );
        assert_eq!(mk.mr, 8, "T={t}");
        assert!(mk.rows_computed(t as u64) <= default.rows_computed(t as u64));
    }
    for t in [3, 8, 12, 17, 20, 28, 64] {
        let (mk, default) = at(&avx512(), f32, t);
        assert_eq!(mk, default, "T={t}");
    }
    for (target, text) in [
        (avx512(), "dense_bf16(M=T,N=3072,K=768,P=16)+add(n)+gelu"),
        (avx2, f32),
        (avx512(), "dense(M=T,N=768,K=768)"),
    ] {
        let (mk, default) = at(&target, text, 14);
        assert_eq!(mk, default, "{text} on {:?}", target.simd);
    }
}

/// AMX tiles: the text form, the shapes a target with AMX-BF16 takes (none on one
/// without), what `fit` makes of them on each workload, the seeds, and the space.
#[test]
fn amx_tiles_text_form_fit_and_seeds() {
    let amx = CpuTarget {
        amx: true,
        ..avx512()
    };
    let text = "mr=16,nr=48,mc=128,nc=96,kc=16,uk=1,amx=1";
    let mk = ContractionKernel::parse(text).unwrap();
    assert!(mk.amx);
    assert_eq!(mk.to_string(), text);
    let json = serde_json::to_string(&mk).unwrap();
    assert_eq!(ContractionKernel::parse(&json).unwrap(), mk);
    assert!(ContractionKernel::parse(&text.replace("amx=1", "amx=2")).is_err());
    mk.validate(&amx).unwrap();
    let err = mk.validate(&avx512()).unwrap_err().to_string();
    assert!(err.contains("AMX-BF16"), "{err}");
    // Only whole tiles within the eight tile registers, kc 16, uk 1, no other flag.
    for bad in [
        "mr=32,nr=48,mc=128,nc=96,kc=16,uk=1,amx=1",
        "mr=20,nr=48,mc=120,nc=96,kc=16,uk=1,amx=1",
        "mr=16,nr=48,mc=128,nc=96,kc=32,uk=1,amx=1",
        "mr=16,nr=48,mc=128,nc=96,kc=16,uk=1,pf=1,amx=1",
    ] {
        let e = ContractionKernel::parse(bad).unwrap().validate(&amx);
        assert!(e.is_err(), "{bad}");
    }
    for (r, c) in AMX_TILES {
        assert!(r * c + r + c <= 8);
        let mk = ContractionKernel {
            mr: 16 * r,
            nr: 16 * c,
            mc: 32 * r,
            nc: 32 * c,
            ..mk
        };
        mk.validate(&amx).unwrap();
    }
    // Fit: tiles where the workload can run them (bf16 over panels of 16, whole tiles
    // of reduction); elsewhere the register tile in vectors, valid.
    let runs = Workload::parse("dense_bf16(M=T,N=80,K=64,P=16)+bias").unwrap();
    let odd_k = Workload::parse("dense_bf16(M=T,N=80,K=42,P=16)").unwrap();
    let f32 = Workload::parse("dense_packed(M=T,N=80,K=64,P=16)").unwrap();
    assert!(amx_runs(&runs) && !amx_runs(&odd_k) && !amx_runs(&f32));
    let wide = ContractionKernel {
        mr: 32,
        nr: 32,
        mc: 64,
        nc: 64,
        ..mk
    };
    assert_eq!(wide.fit(&amx, &runs), wide);
    for (target, w) in [(&amx, &odd_k), (&amx, &f32), (&avx512(), &runs)] {
        let m = wide.fit(target, w);
        assert!(!m.amx, "{w}: {m}");
        m.validate(target).unwrap();
    }
    // Seeds: the AMX default first where tiles run, none elsewhere or without AMX.
    let seeds = ContractionKernel::seeds(&amx, &runs);
    assert_eq!(seeds[0], ContractionKernel::default_amx_for(&amx));
    assert_eq!(
        ContractionKernel::default_for_workload(&amx, &runs),
        seeds[0].fit(&amx, &runs)
    );
    assert!(!ContractionKernel::seeds(&amx, &odd_k).iter().any(|m| m.amx));
    assert!(!ContractionKernel::seeds(&avx512(), &runs)
        .iter()
        .any(|m| m.amx));
    // The space: about half the samples on a target with AMX are tiles, every one valid;
    // none without.
    let mut rng = rand::rng();
    let mut tiles = 0;
    for _ in 0..300 {
        let m = ContractionKernel::sample(&amx, &mut rng);
        m.validate(&amx).unwrap();
        tiles += usize::from(m.amx);
        let n = m.neighbour(&amx, &mut rng).fit(&amx, &runs);
        assert!(!n.amx || n.validate(&amx).is_ok(), "{n}");
        assert!(!ContractionKernel::sample(&avx512(), &mut rng).amx);
    }
    assert!(
        (75..225).contains(&tiles),
        "{tiles} of 300 samples are tiles"
    );
}

/// Cache tiles as the lowered nest makes them: M's rounded up to the threads where the
/// tasks would not divide, N's too where M has too few register tiles (a decoder's
/// one-row projections); nothing rounded where they divide already.
#[test]
fn tiles_share_the_threads() {
    let mk = ContractionKernel::parse("mr=12,nr=32,mc=96,nc=384,kc=256,uk=4").unwrap();
    for (batch, m, n, threads, want) in [
        (1.0, 512.0, 768.0, 2, (6.0, 2.0)), // divides as it is
        (1.0, 200.0, 768.0, 2, (3.0, 2.0)), // divides as it is
        (1.0, 200.0, 384.0, 2, (4.0, 1.0)), // M rounded up
        (1.0, 1.0, 256.0, 2, (1.0, 2.0)),   // M of one row: N rounded up
        (1.0, 1.0, 768.0, 16, (1.0, 16.0)), // 24 register tiles of N over 16
        (1.0, 1.0, 32.0, 2, (1.0, 1.0)),    // one register tile: nothing to share
        (3.0, 20.0, 1000.0, 2, (2.0, 3.0)), // M rounded up to its 2 register tiles
        (1.0, 13.0, 1000.0, 4, (2.0, 4.0)), // both
    ] {
        assert_eq!(
            mk.tiles(batch, m, n, threads),
            want,
            "{batch} x {m} x {n} on {threads}"
        );
    }
}

/// The usual variant's edge tiles are `mr`'s thirds: the rows computed for M waste at
/// most a third of `mr`, none where M is a multiple of one; the dot variant and a
/// one-row tile compute whole tiles; the cost model's padding counts the same rows.
#[test]
fn edge_tiles_cover_the_rows_left_in_thirds() {
    let mk = |text: &str| ContractionKernel::parse(text).unwrap();
    let usual = mk("mr=12,nr=32,mc=96,nc=384,kc=192,uk=4");
    assert_eq!(usual.heights(), [4, 8, 12]);
    for (m, rows) in [
        (0, 0),
        (1, 4),
        (4, 4),
        (5, 8),
        (8, 8),
        (9, 12),
        (12, 12),
        (13, 16),
    ] {
        assert_eq!(usual.rows_computed(m), rows, "M = {m}");
    }
    for m in 1..=100u64 {
        let rows = usual.rows_computed(m);
        assert!(rows >= m && rows - m < 4, "M = {m}: {rows} rows");
        assert_eq!(rows == m, m % 4 == 0, "M = {m}: {rows} rows");
    }
    assert_eq!(
        mk("mr=8,nr=32,mc=32,nc=384,kc=192,uk=4").heights(),
        [3, 6, 8]
    );
    assert_eq!(mk("mr=2,nr=32,mc=32,nc=384,kc=192,uk=4").heights(), [1, 2]);
    assert_eq!(mk("mr=1,nr=64,mc=16,nc=384,kc=128,uk=4").heights(), [1]);
    let dot = mk("mr=1,nr=4,mc=16,nc=64,kc=256,uk=2,dot=1");
    assert_eq!(dot.heights(), [1]);
    let dot = ContractionKernel { mr: 3, ..dot };
    assert_eq!((dot.heights(), dot.rows_computed(7)), (vec![3], 9));

    let target = avx512();
    let w = anyshape_ir::Workload::parse("dense(M=T,N=64,K=64)").unwrap();
    let at = |m: i64| {
        let bound = w
            .bind(&anyshape_ir::Bindings::from_pairs([("T", m)]))
            .unwrap();
        usual.adaptation(&target, &w, &bound).pad
    };
    assert_eq!(at(32), 1.0);
    assert!((at(13) - 13.0 / 16.0).abs() < 1e-12, "{}", at(13));
}
