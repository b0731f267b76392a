//! Modules: written from votes, loaded by the runtime, correct for every instance in the
//! tuned range and past it; damaged, tampered or foreign modules fail cleanly; bad
//! buffers and shapes are errors.
use anyshape_abi::{read_manifest, write_manifest, ModuleError};
use anyshape_abi::{Manifest, Vote, MANIFEST_FILE};
use anyshape_codegen::{ContractionKernel, CpuTarget, PaddingStrategy};
use anyshape_ir::{Bindings, ShapeVar, Workload};
use anyshape_measure::{check_output, random_inputs, reference_output, Builder};
use anyshape_runtime::{Module, RuntimeError};
use anyshape_tune::{train_tree, write_module, ModuleSpec, Specialize, Votes};
use std::path::{Path, PathBuf};

/// Three micro-kernels voted in bands of T, so the tree has splits; `specialize` instances.
fn build(w: &Workload, dir: &Path, specialize: Specialize) -> Manifest {
    build_voted(w, dir, specialize, &|t| {
        if t < 40 {
            0
        } else if t < 90 {
            1
        } else {
            2
        }
    })
}

/// A module whose instance `T` votes for micro-kernel `vote(T)` (of three).
fn build_voted(
    w: &Workload,
    dir: &Path,
    specialize: Specialize,
    vote: &dyn Fn(i64) -> usize,
) -> Manifest {
    let target = CpuTarget::detect();
    let lanes = target.lanes_f32();
    let mk = |mr, nr: usize, kc| ContractionKernel {
        mr,
        nr: nr * lanes,
        mc: mr * 3,
        nc: nr * lanes * 2,
        kc,
        uk: 2,
        dot: false,
        pf: false,
        ia: false,
        ib: false,
        vm: false,
        amx: false,
    };
    let micro_kernels = vec![mk(2, 1, 8), mk(4, 2, 16), mk(3, 1, 12)];
    let var = ShapeVar::parse("T=1..128").unwrap();
    let bindings: Vec<Bindings> = (1..=128)
        .map(|t| Bindings::from_pairs([("T", t)]))
        .collect();
    let votes = Votes {
        micro_kernels,
        votes: bindings
            .iter()
            .map(|b| Vote {
                bindings: b.clone(),
                micro_kernel: vote(b.get("T").unwrap()),
                latency_seconds: Some(1.0),
                measured: true,
            })
            .collect(),
        latency: Vec::new(),
    };
    let (tree, accuracy) = train_tree(&["T".into()], &votes.votes);
    let weights = vec![1.0; bindings.len()];
    let chosen = specialize.pick(&bindings, &weights);
    write_module(
        &ModuleSpec {
            workload: w,
            shape_vars: &[var],
            target: &target,
            strategy: PaddingStrategy::LocalPad,
            votes: &votes,
            tree: &tree,
            tree_accuracy: accuracy,
            specialize: &chosen,
            tuning: None,
            reads: &Default::default(),
        },
        &Builder::new(dir.parent().unwrap().join("cache")),
        dir,
    )
    .unwrap()
}

fn check_everywhere(w: &Workload, module: &Module) {
    for t in (0..=128).chain([129, 131, 200, 1000]) {
        let b = Bindings::from_pairs([("T", t)]);
        let bound = module.bind(&b).unwrap();
        let inputs = random_inputs(w, &bound, t as u64);
        let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![f32::NAN; bound.lens[w.inputs.len()]];
        module.run(&b, &views, &mut [&mut out]).unwrap();
        let r = check_output(&out, &reference_output(w, &bound, &views));
        assert!(r.passed, "{w} at T={t}: {} mismatches", r.mismatches);
        let d = module.dispatch(&b);
        if !d.specialized {
            assert_eq!(module.select_compiled(&b), d.micro_kernel as i32, "T={t}");
        }
    }
}

#[test]
fn modules_are_correct_in_and_past_the_tuned_range() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, text) in [
        "dense(M=16*T,N=40,K=24)",
        "batch_matmul_nt(B=3,M=T,N=T,K=16)",
        "batch_matmul_nn(B=3,M=T,N=16,K=T)",
    ]
    .iter()
    .enumerate()
    {
        let w = Workload::parse(text).unwrap();
        let dir = tmp.path().join(format!("m{i}.module"));
        let m = build(&w, &dir, Specialize::Count(5));
        assert_eq!(m.specialized.len(), 5);
        assert_eq!((m.tree_accuracy, m.dispatch.leaves()), (1.0, 3));
        let module = Module::load(&dir).unwrap();
        check_everywhere(&w, &module);
        // Specialized instances go to their own kernel; the ends are among them.
        assert!(
            module
                .dispatch(&Bindings::from_pairs([("T", 1)]))
                .specialized
        );
        assert!(
            module
                .dispatch(&Bindings::from_pairs([("T", 128)]))
                .specialized
        );
        assert!(
            !module
                .dispatch(&Bindings::from_pairs([("T", 129)]))
                .specialized
        );
        let header = std::fs::read_to_string(dir.join("module.h")).unwrap();
        assert!(header.contains("anyshape_module_run") && header.contains(&m.symbolic[2]));
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn damaged_tampered_and_foreign_modules_fail_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Workload::parse("dense(M=T,N=16,K=8)").unwrap();
    let good = tmp.path().join("good.module");
    let m = build(&w, &good, Specialize::None);
    let variant = |name: &str, edit: &dyn Fn(&Path)| -> RuntimeError {
        let dir: PathBuf = tmp.path().join(name);
        copy_dir(&good, &dir);
        edit(&dir);
        Module::load(&dir).expect_err(name)
    };
    let lib = m.library.clone();
    let e = variant("truncated", &|d| {
        let p = d.join(&lib);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    });
    assert!(
        matches!(e, RuntimeError::Module(ModuleError::CorruptFile { .. })),
        "{e}"
    );
    let e = variant("flipped", &|d| {
        let p = d.join(&lib);
        let mut bytes = std::fs::read(&p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&p, &bytes).unwrap();
    });
    assert!(
        matches!(e, RuntimeError::Module(ModuleError::CorruptFile { .. })),
        "{e}"
    );
    let e = variant("missing-lib", &|d| {
        std::fs::remove_file(d.join(&lib)).unwrap()
    });
    assert!(
        matches!(e, RuntimeError::Module(ModuleError::Missing { .. })),
        "{e}"
    );
    let e = variant("bad-json", &|d| {
        std::fs::write(d.join(MANIFEST_FILE), "{\"format\": 1, \"anysh").unwrap()
    });
    assert!(
        matches!(e, RuntimeError::Module(ModuleError::BadManifest { .. })),
        "{e}"
    );
    let e = variant("tampered", &|d| {
        let p = d.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text.replacen("\"at\": 39", "\"at\": 60", 1)).unwrap();
    });
    assert!(
        matches!(e, RuntimeError::Module(ModuleError::Tampered { .. })),
        "{e}"
    );
    fn resealed(d: &Path, edit: &dyn Fn(&mut Manifest)) {
        let mut m = read_manifest(d).unwrap();
        edit(&mut m);
        m.seal();
        write_manifest(&m, d).unwrap();
    }
    let e = variant("old-version", &|d| {
        resealed(d, &|m| m.anyshape = "0.0.1".into())
    });
    assert!(
        matches!(e, RuntimeError::Module(ModuleError::Version { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("0.0.1"));
    let e = variant("other-cpu", &|d| {
        resealed(d, &|m| m.cpu_features.push("avx9000".into()))
    });
    assert!(e.to_string().contains("avx9000"), "{e}");
    let e = variant("bad-index", &|d| {
        resealed(d, &|m| {
            m.symbolic.pop();
        })
    });
    assert!(
        matches!(e, RuntimeError::Module(ModuleError::BadManifest { .. })),
        "{e}"
    );
    let e = Module::load(tmp.path().join("nothing-here")).unwrap_err();
    assert!(
        matches!(e, RuntimeError::Module(ModuleError::NotAModule { .. })),
        "{e}"
    );

    // Bad calls on a good module.
    let module = Module::load(&good).unwrap();
    let b = Bindings::from_pairs([("T", 5)]);
    let (x, wt) = (vec![1.0; 5 * 8], vec![1.0; 16 * 8]);
    let mut out = vec![0.0; 5 * 16];
    assert!(module.run(&b, &[&x, &wt], &mut [&mut out]).is_ok());
    let e = module
        .run(&b, &[&x[..39], &wt], &mut [&mut out])
        .unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::BufferLen {
                expected: 40,
                got: 39,
                ..
            }
        ),
        "{e}"
    );
    let e = module.run(&b, &[&x], &mut [&mut out]).unwrap_err();
    assert!(matches!(e, RuntimeError::BufferCount { .. }), "{e}");
    let e = module
        .run(&b, &[&x, &wt], &mut [&mut out[..3]])
        .unwrap_err();
    assert!(matches!(e, RuntimeError::BufferLen { .. }), "{e}");
    let e = module
        .run(&Bindings::default(), &[&x, &wt], &mut [&mut out])
        .unwrap_err();
    assert!(matches!(e, RuntimeError::Shape(_)), "{e}");
    let e = module
        .run(
            &Bindings::from_pairs([("T", 5), ("U", 1)]),
            &[&x, &wt],
            &mut [&mut out],
        )
        .unwrap_err();
    assert!(matches!(e, RuntimeError::UnknownVar { .. }), "{e}");
    // Overwriting a directory that is not a module is refused.
    let other = tmp.path().join("precious");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "keep").unwrap();
    let e = std::panic::catch_unwind(|| build(&w, &other, Specialize::None));
    assert!(e.is_err());
    assert!(other.join("notes.txt").exists());
}

/// Votes that change from one T to the next need the deepest tree: the module's writer
/// bounds it, so its loader reads it back (it used to write trees its loader refused).
#[test]
fn a_module_with_the_deepest_tree_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Workload::parse("dense(M=T,N=16,K=8)").unwrap();
    let dir = tmp.path().join("deep.module");
    let m = build_voted(&w, &dir, Specialize::None, &|t| (t % 3) as usize);
    assert!(m.dispatch.depth() >= 20, "{}", m.dispatch.depth());
    let module = Module::load(&dir).unwrap();
    check_everywhere(&w, &module);
}
