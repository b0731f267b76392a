//! The model path never loses a file and never answers wrong: each test is one of the
//! cases of issue "The model path never loses a file and never answers wrong" (tried
//! as a user would: `compile`, `run`, `inspect` of tiny models), which once destroyed a
//! user's file, answered wrong with exit code 0, hung, aborted or misled. Cases 1–6
//! (files kept, inputs read in their order, NaN seen) are here, 7–12 in
//! `model_path_limits.rs`. Run against an older build with
//! `ANYSHAPE_TEST_BIN=path/to/anyshape` to see them fail there.
mod support;

use std::path::Path;
use support::{
    anyshape, bert, command, compile_bert, f32_bytes, failed_with, listing, models, npy, npz, run,
    text,
};

/// Case 1: `--output` naming a file the command reads — the inputs, an `--input`
/// `.npy`, a file of the module, or the inputs through a link — is refused before the
/// run, and the file is intact.
#[test]
fn case01_output_never_replaces_what_the_command_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    bert(d);
    let case = std::fs::read(d.join("case.npz")).unwrap();
    let o = run(d, &["--inputs", "case.npz", "--output", "case.npz"]);
    failed_with(&o, &["--output case.npz", "reads"]);
    assert_eq!(std::fs::read(d.join("case.npz")).unwrap(), case);
    std::os::unix::fs::symlink(d.join("case.npz"), d.join("link.npz")).unwrap();
    let o = run(d, &["--inputs", "case.npz", "--output", "link.npz"]);
    failed_with(&o, &["reads"]);
    assert_eq!(std::fs::read(d.join("case.npz")).unwrap(), case);
    // An --input .npy.
    let ids = anyshape_tensor::npz::read(&d.join("case.npz")).unwrap();
    let ids = &ids.iter().find(|(n, _)| n == "input_ids").unwrap().1;
    let bytes: Vec<u8> = ids
        .as_i64()
        .unwrap()
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let ids_npy = npy("<i8", false, &ids.shape, &bytes);
    std::fs::write(d.join("ids.npy"), &ids_npy).unwrap();
    let o = run(
        d,
        &[
            "--inputs",
            "case.npz",
            "--input",
            "input_ids=ids.npy",
            "--output",
            "ids.npy",
        ],
    );
    failed_with(&o, &["--output ids.npy", "reads"]);
    assert_eq!(std::fs::read(d.join("ids.npy")).unwrap(), ids_npy);
    // Inside the module: neither its files nor a new one.
    for out in ["bert.module/plan.bin", "bert.module/out.npz"] {
        let o = run(d, &["--inputs", "case.npz", "--output", out]);
        failed_with(&o, &["lies inside bert.module"]);
    }
    let o = run(d, &["--inputs", "case.npz", "--output", "out.npz"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        listing(&d.join("bert.module")),
        ["model.json", "plan.bin", "tasks"]
    );
}

/// Case 2: `--output` is written beside and renamed into place: a write that fails (a
/// file size limit standing in for a full disk) leaves the old file whole and no
/// temporary file behind.
#[test]
fn case02_output_is_written_atomically() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    bert(d);
    let o = run(d, &["--inputs", "case.npz", "--output", "prev.npz"]);
    assert!(o.status.success(), "{}", text(&o));
    let prev = std::fs::read(d.join("prev.npz")).unwrap();
    let mut cmd = command(
        d,
        &[
            "run",
            "--module",
            "bert.module",
            "--seconds",
            "0",
            "--inputs",
            "case.npz",
            "--output",
            "prev.npz",
        ],
    );
    // SAFETY: between fork and exec, only async-signal-safe calls (setrlimit, signal).
    unsafe {
        cmd.pre_exec(|| {
            // Files may not grow past 4 KiB (the outputs take ~10 KiB): writes fail
            // with EFBIG, as on a full disk; the signal that would kill is ignored.
            let limit = libc::rlimit {
                rlim_cur: 4096,
                rlim_max: 4096,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = cmd.output().unwrap();
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read(d.join("prev.npz")).unwrap(),
        prev,
        "the old file whole"
    );
    let left: Vec<String> = listing(d)
        .into_iter()
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Case 3: `compile --out` over a module refuses when a file the module does not list
/// lies anywhere inside it (also in `tasks/`), and keeps the file.
#[test]
fn case03_compile_out_keeps_unlisted_files_at_any_depth() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = bert(d);
    std::fs::write(m.join("tasks/t00/mynotes.txt"), "mine").unwrap();
    std::fs::write(m.join("tasks/notes.txt"), "mine too").unwrap();
    let o = compile_bert(d);
    failed_with(&o, &["tasks/notes.txt", "tasks/t00/mynotes.txt"]);
    assert_eq!(
        std::fs::read_to_string(m.join("tasks/t00/mynotes.txt")).unwrap(),
        "mine"
    );
    assert_eq!(
        std::fs::read_to_string(m.join("tasks/notes.txt")).unwrap(),
        "mine too"
    );
    std::fs::remove_file(m.join("tasks/t00/mynotes.txt")).unwrap();
    std::fs::remove_file(m.join("tasks/notes.txt")).unwrap();
    let o = compile_bert(d);
    assert!(o.status.success(), "{}", text(&o));
}

/// Case 4: a tuned module (with its tuning log) is recompiled in place: every file
/// anyshape writes into a module is listed in its manifest.
#[test]
fn case04_a_tuned_module_recompiles_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let onnx = models().join("bert_tiny.ts.onnx");
    let compile = |resume: bool| {
        let mut args = vec![
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..8",
            "--trials",
            "1",
            "--records",
            "R",
            "--out",
            "tuned.module",
            "--quiet",
        ];
        if resume {
            args.push("--resume");
        }
        anyshape(d, &args)
    };
    let o = compile(false);
    assert!(o.status.success(), "{}", text(&o));
    assert!(d.join("tuned.module/tuning.json").is_file());
    let o = compile(true);
    assert!(o.status.success(), "{}", text(&o));
    let json = std::fs::read_to_string(d.join("tuned.module/model.json")).unwrap();
    assert!(json.contains("\"tuning.json\""), "{json}");
}

/// The arrays of `case.npz` rewritten as Fortran-ordered arrays (what
/// `np.save(p, np.asfortranarray(a))` writes).
fn fortran_case(d: &Path) {
    let arrays = anyshape_tensor::npz::read(&d.join("case.npz")).unwrap();
    let members: Vec<(&str, Vec<u8>)> = arrays
        .iter()
        .map(|(name, t)| {
            // Element (i0, i1, ...) at i0 + s0·i1 + s0·s1·i2 ...: the C-order data read
            // with the transposed strides.
            let shape = &t.shape;
            let n: usize = shape.iter().product();
            let c_strides = anyshape_tensor::strides(shape);
            let order: Vec<usize> = (0..n)
                .map(|f| {
                    let (mut rest, mut at) = (f, 0);
                    for (k, &s) in shape.iter().enumerate() {
                        at += (rest % s) * c_strides[k];
                        rest /= s;
                    }
                    at
                })
                .collect();
            let (descr, bytes) = match &t.data {
                anyshape_tensor::Data::F32(v) => (
                    "<f4",
                    f32_bytes(&order.iter().map(|&i| v[i]).collect::<Vec<_>>()),
                ),
                anyshape_tensor::Data::I64(v) => (
                    "<i8",
                    order.iter().flat_map(|&i| v[i].to_le_bytes()).collect(),
                ),
                anyshape_tensor::Data::Bool(_) => unreachable!("no bool arrays in the case"),
            };
            (name.as_str(), npy(descr, true, shape, &bytes))
        })
        .collect();
    npz(&d.join("fortran.npz"), &members);
}

/// Case 5: Fortran-ordered arrays are read in their order: the model's outputs match
/// the recorded ones (read in their order too).
#[test]
fn case05_fortran_ordered_arrays_are_read_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    bert(d);
    fortran_case(d);
    let o = run(d, &["--inputs", "fortran.npz"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert_eq!(t.matches("check        ").count(), 2, "{t}");
}

/// Case 6: NaN outputs never pass the check as "error 0": recorded outputs of NaN
/// against finite ones fail, naming the first element.
#[test]
fn case06_the_check_sees_nan() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    bert(d);
    let mut arrays = anyshape_tensor::npz::read(&d.join("case.npz")).unwrap();
    for (name, t) in arrays.iter_mut() {
        if name == "last_hidden_state" {
            t.data = anyshape_tensor::Data::F32(vec![f32::NAN; t.len()]);
        }
    }
    anyshape_tensor::npz::write(
        &d.join("nan.npz"),
        &arrays,
        &anyshape_files::Reads::new(),
        "test",
    )
    .unwrap();
    let o = run(d, &["--inputs", "nan.npz"]);
    failed_with(&o, &["last_hidden_state", "NaN", "[0, 0, 0]"]);
}
