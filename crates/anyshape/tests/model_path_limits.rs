//! The model path's limits, cases 7–12 of issue "The model path never loses a file and
//! never answers wrong" (cases 1–6: `model_path.rs`): opsets honoured, static models,
//! runs too large for the machine, readers that never hang, external data, messages
//! that say what is wrong. Run against an older build with
//! `ANYSHAPE_TEST_BIN=path/to/anyshape` to see them fail there.
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{
    anyshape, bert, command, compile_n, f32_bytes, failed_with, models, npy, npz, run, run_on,
    text, Dim, Onnx,
};

/// `Softmax(axis=1)` on `[n, 3, 4]` at `opset`.
fn softmax(opset: i64) -> Onnx {
    let dims = [Dim::Named("n"), Dim::Fixed(3), Dim::Fixed(4)];
    Onnx::new(opset)
        .input("x", &dims)
        .node("Softmax", &["x"], &["y"], &[("axis", 1)])
        .output("y", &dims)
}

/// Case 7: an op whose meaning changed (`Softmax` before opset 13 flattened to 2-D)
/// is refused at the opsets that select the old version, naming the op and the
/// opsets anyshape implements; an opset newer than anyshape knows is refused; opset 13
/// runs and matches the definition.
#[test]
fn case07_opsets_are_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (opset, words) in [
        (11, vec!["Softmax", "opset 11", "from opset 13"]),
        (12, vec!["Softmax", "opset 12", "from opset 13"]),
        (99, vec!["opset 99", "up to"]),
    ] {
        softmax(opset).write(&d.join("m.onnx"));
        let o = compile_n(d, "m.onnx", "m.module");
        failed_with(&o, &words);
        let o = anyshape(d, &["inspect", "m.onnx"]);
        failed_with(&o, &words);
    }
    softmax(13).write(&d.join("m.onnx"));
    let o = compile_n(d, "m.onnx", "m.module");
    assert!(o.status.success(), "{}", text(&o));
    let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let mut y = vec![0f32; 24];
    for col in 0..4 {
        for b in 0..2 {
            let at = |r: usize| b * 12 + r * 4 + col;
            let m = (0..3).map(|r| x[at(r)]).fold(f32::MIN, f32::max);
            let s: f32 = (0..3).map(|r| (x[at(r)] - m).exp()).sum();
            for r in 0..3 {
                y[at(r)] = (x[at(r)] - m).exp() / s;
            }
        }
    }
    npz(
        &d.join("c.npz"),
        &[
            ("x", npy("<f4", false, &[2, 3, 4], &f32_bytes(&x))),
            ("y", npy("<f4", false, &[2, 3, 4], &f32_bytes(&y))),
        ],
    );
    let o = run_on(d, "m.module", "c.npz");
    assert!(o.status.success(), "{}", text(&o));
}

/// `y = x · w` with `x: [2, 4]` fixed: a model without symbolic dims.
fn static_model(d: &Path) -> Vec<f32> {
    let w: Vec<f32> = (0..20).map(|i| i as f32 * 0.25 - 2.0).collect();
    Onnx::new(17)
        .input("x", &[Dim::Fixed(2), Dim::Fixed(4)])
        .weight("w", &[4, 5], &w)
        .node("MatMul", &["x", "w"], &["y"], &[])
        .output("y", &[Dim::Fixed(2), Dim::Fixed(5)])
        .write(&d.join("static.onnx"));
    w
}

fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    (0..m * n)
        .map(|i| (0..k).map(|p| x[i / n * k + p] * w[p * n + i % n]).sum())
        .collect()
}

/// Case 8: a model whose inputs have fixed shapes compiles without `--dim` (a `--dim`
/// says it has none), runs and matches.
#[test]
fn case08_static_models_compile() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let w = static_model(d);
    let o = anyshape(d, &["compile", "static.onnx", "--out", "s.module"]);
    assert!(o.status.success(), "{}", text(&o));
    let x: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
    let y = matmul(&x, &w, 2, 4, 5);
    npz(
        &d.join("c.npz"),
        &[
            ("x", npy("<f4", false, &[2, 4], &f32_bytes(&x))),
            ("y", npy("<f4", false, &[2, 5], &f32_bytes(&y))),
        ],
    );
    let o = run_on(d, "s.module", "c.npz");
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("check        y"), "{}", text(&o));
    let o = compile_n(d, "static.onnx", "t.module");
    failed_with(&o, &["it has none"]);
}

/// Case 9: a run that would need more memory than the machine has is refused before
/// allocating, saying how much it needs and what the machine has (it used to abort).
#[test]
fn case09_a_run_too_large_for_the_machine_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // x: [n, 8] · w: [8, 65536] — n = 131072 makes a 32 GiB output from a 4 MiB input.
    let w = vec![0.5f32; 8 * 65536];
    Onnx::new(17)
        .input("x", &[Dim::Named("n"), Dim::Fixed(8)])
        .weight("w", &[8, 65536], &w)
        .node("MatMul", &["x", "w"], &["y"], &[])
        .node("Relu", &["y"], &["z"], &[])
        .output("z", &[Dim::Named("n"), Dim::Fixed(65536)])
        .write(&d.join("wide.onnx"));
    let o = compile_n(d, "wide.onnx", "w.module");
    assert!(o.status.success(), "{}", text(&o));
    let n = 131072;
    npz(
        &d.join("big.npz"),
        &[(
            "x",
            npy("<f4", false, &[n, 8], &f32_bytes(&vec![1.0; n * 8])),
        )],
    );
    let o = run_on(d, "w.module", "big.npz");
    failed_with(&o, &["need", "GiB", "the machine has"]);
    assert_eq!(o.status.code(), Some(1), "an error, not an abort");
}

/// Run `cmd` for at most `limit`; whether it finished, and its output.
fn within(mut cmd: std::process::Command, limit: Duration) -> (bool, String) {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            let o = child.wait_with_output().unwrap();
            return (true, text(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    (false, String::new())
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// Case 10: no reader hangs or reads forever: a device or a FIFO as the model, a FIFO
/// as a module's plan or kernel library (run and inspect), an endless `--seconds`.
#[test]
fn case10_nothing_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = bert(d);
    let limit = Duration::from_secs(30);
    mkfifo(&d.join("fifo.onnx"));
    for model in ["/dev/zero", "fifo.onnx"] {
        let (done, t) = within(
            command(
                d,
                &["compile", model, "--dim", "batch=1", "--out", "z.module"],
            ),
            limit,
        );
        assert!(done, "compile {model} hangs");
        assert!(t.contains("not a regular file"), "{t}");
    }
    let fifo_module = |file: &str| {
        let copy = d.join("f.module");
        let _ = std::fs::remove_dir_all(&copy);
        copy_dir(&m, &copy);
        std::fs::remove_file(copy.join(file)).unwrap();
        mkfifo(&copy.join(file));
    };
    let library = walk(&m)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "so"))
        .unwrap();
    let library = library
        .strip_prefix(&m)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    for file in ["plan.bin", library.as_str()] {
        fifo_module(file);
        for args in [
            vec!["run", "--module", "f.module", "--inputs", "case.npz"],
            vec!["inspect", "f.module"],
        ] {
            let (done, t) = within(command(d, &args), limit);
            assert!(done, "{args:?} with a FIFO as {file} hangs");
            assert!(t.contains("FIFO"), "{t}");
        }
    }
    let o = anyshape(
        d,
        &[
            "run",
            "--module",
            "bert.module",
            "--inputs",
            "case.npz",
            "--seconds",
            "1e300",
        ],
    );
    failed_with(&o, &["a week"]);
}

/// A copy of the directory `from` at `to`.
fn copy_dir(from: &Path, to: &Path) {
    for e in walk(from) {
        let rel = e.strip_prefix(from).unwrap();
        std::fs::create_dir_all(to.join(rel).parent().unwrap()).unwrap();
        std::fs::copy(&e, to.join(rel)).unwrap();
    }
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Case 11: a model's external data travels with its module (its weights are in the
/// plan: the module runs after the source is gone), and external data reached through a
/// link out of the model's directory is refused.
#[test]
fn case11_external_data_travels_with_the_module() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = d.join("src");
    std::fs::create_dir(&src).unwrap();
    let w: Vec<f32> = (0..20).map(|i| i as f32 * 0.5 - 4.0).collect();
    std::fs::write(src.join("weights.bin"), f32_bytes(&w)).unwrap();
    let model = Onnx::new(17)
        .input("x", &[Dim::Named("n"), Dim::Fixed(4)])
        .external_weight("w", &[4, 5], "weights.bin")
        .node("MatMul", &["x", "w"], &["y"], &[])
        .output("y", &[Dim::Named("n"), Dim::Fixed(5)]);
    model.write(&src.join("ext.onnx"));
    let o = compile_n(d, "src/ext.onnx", "e.module");
    assert!(o.status.success(), "{}", text(&o));
    std::fs::remove_dir_all(&src).unwrap();
    let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.1).collect();
    npz(
        &d.join("c.npz"),
        &[
            ("x", npy("<f4", false, &[3, 4], &f32_bytes(&x))),
            (
                "y",
                npy("<f4", false, &[3, 5], &f32_bytes(&matmul(&x, &w, 3, 4, 5))),
            ),
        ],
    );
    let o = run_on(d, "e.module", "c.npz");
    assert!(o.status.success(), "{}", text(&o));
    // A link out of the model's directory.
    let inner = d.join("inner");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(d.join("outside.bin"), f32_bytes(&w)).unwrap();
    std::os::unix::fs::symlink(d.join("outside.bin"), inner.join("weights.bin")).unwrap();
    model.write(&inner.join("ext.onnx"));
    let o = compile_n(d, "inner/ext.onnx", "l.module");
    failed_with(&o, &["outside the model's directory"]);
}

/// Case 12: messages say what is wrong — a module missing a file, a plan of another
/// format (an older compile's), a records path that
/// is a file, an index out of range (as given), a run at a dim of 0 with nothing to pool, arrays the model
/// does not know, trailing bytes after an array, operator options given to a model
/// module, and a changed `model.json` (covered by the checksums `inspect` verifies).
#[test]
fn case12_messages_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = bert(d);
    let copy = |name: &str| {
        let to = d.join(name);
        copy_dir(&m, &to);
        to
    };
    for file in ["model.json", "plan.bin"] {
        let c = copy("c.module");
        std::fs::remove_file(c.join(file)).unwrap();
        let o = anyshape(d, &["run", "--module", "c.module", "--inputs", "case.npz"]);
        failed_with(&o, &["incomplete module", file]);
        std::fs::remove_dir_all(&c).unwrap();
    }
    let c = copy("old.module");
    let mut plan = std::fs::read(c.join("plan.bin")).unwrap();
    let older = anyshape_plan::PLAN_FORMAT - 1;
    plan[8..12].copy_from_slice(&older.to_le_bytes());
    std::fs::write(c.join("plan.bin"), plan).unwrap();
    let o = anyshape(
        d,
        &["run", "--module", "old.module", "--inputs", "case.npz"],
    );
    failed_with(
        &o,
        &[&format!("plan format {older}"), "compile the model again"],
    );
    let onnx = models().join("bert_tiny.ts.onnx");
    let onnx = onnx.to_str().unwrap();
    std::fs::write(d.join("m.onnx"), "mine").unwrap();
    let o = anyshape(
        d,
        &[
            "compile",
            onnx,
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..8",
            "--trials",
            "1",
            "--records",
            "m.onnx",
            "--out",
            "x.module",
        ],
    );
    failed_with(&o, &["--records m.onnx is a file"]);
    assert_eq!(std::fs::read_to_string(d.join("m.onnx")).unwrap(), "mine");
    let o = anyshape(
        d,
        &[
            "compile",
            onnx,
            "--dim",
            "batch=1",
            "--dim",
            "sequence=0..8",
            "--out",
            "z.module",
        ],
    );
    // A dim may be 0 (a decoder's empty past); BERT at sequence 0 has no first token
    // for its pooler to take: a clear error (onnxruntime fails there too).
    assert!(o.status.success(), "{}", text(&o));
    let write = |name: &str, arrays: &[(String, anyshape_tensor::Tensor)]| {
        anyshape_tensor::npz::write(&d.join(name), arrays, &anyshape_files::Reads::new(), "t")
            .unwrap()
    };
    let empty = |name: &str| {
        let t = anyshape_tensor::Tensor::i64(vec![1, 0], vec![]).unwrap();
        (name.to_string(), t)
    };
    let names = ["input_ids", "attention_mask", "token_type_ids"];
    write("s0.npz", &names.map(empty));
    let o = anyshape(d, &["run", "--module", "z.module", "--inputs", "s0.npz"]);
    failed_with(&o, &["Gather", "out of range", "shape [1, 0, 64]"]);
    let mut arrays = anyshape_tensor::npz::read(&d.join("case.npz")).unwrap();
    if let anyshape_tensor::Data::I64(v) = &mut arrays[0].1.data {
        v[3] = -1001;
    }
    assert_eq!(arrays[0].0, "input_ids");
    write("neg.npz", &arrays);
    let o = run(d, &["--inputs", "neg.npz"]);
    failed_with(&o, &["index -1001", "[-1000, 1000)"]);
    let mut arrays = anyshape_tensor::npz::read(&d.join("case.npz")).unwrap();
    arrays.push((
        "input_idz".into(),
        anyshape_tensor::Tensor::i64(vec![1], vec![0]).unwrap(),
    ));
    write("extra.npz", &arrays);
    let o = run(d, &["--inputs", "extra.npz"]);
    failed_with(&o, &["neither takes nor gives: input_idz"]);
    let mut trailing = npy("<i8", false, &[1, 1], &7i64.to_le_bytes());
    trailing.extend(b"xx");
    std::fs::write(d.join("ids.npy"), trailing).unwrap();
    let o = run(d, &["--inputs", "case.npz", "--input", "input_ids=ids.npy"]);
    failed_with(&o, &["trailing bytes"]);
    let o = run(
        d,
        &[
            "--inputs", "case.npz", "--set", "T=1", "--check", "--target", "t.json",
        ],
    );
    failed_with(&o, &["is a model module", "--set", "--check", "--target"]);
    let c = copy("t.module");
    let json = std::fs::read_to_string(c.join("model.json")).unwrap();
    std::fs::write(
        c.join("model.json"),
        json.replacen("\"count\": ", "\"count\": 1", 1),
    )
    .unwrap();
    let o = anyshape(d, &["inspect", "t.module"]);
    failed_with(&o, &["modified", "checksum"]);
}
