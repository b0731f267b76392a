//! Fuzz targets for everything that reads user input: expressions, workloads, shape
//! vars and bindings, micro-kernels, records files, module manifests, ONNX files (also
//! with external data), NumPy `.npy`/`.npz` files and model modules.
//!
//! Each target mutates a corpus of valid inputs (byte flips, inserted tokens that
//! parsers find interesting, deleted and repeated spans, splices of two inputs) with
//! proptest, and runs the reader on every mutant: a panic fails the test, and proptest
//! shrinks the input to a minimal one. An abort (stack overflow, allocation failure)
//! fails the whole test binary. Each target runs for `ANYSHAPE_FUZZ_SECONDS` (default
//! 8) and prints how many inputs it ran (`cargo test --test fuzz -- --nocapture`).
//!
//! Every file under `tests/fuzz-regressions/<target>/` is run first: an input that once
//! crashed a reader goes there, so it is checked forever.
mod support;

use anyshape_abi::write_manifest;
use anyshape_abi::{Manifest, MANIFEST_FILE};
use anyshape_codegen::{ContractionKernel, CpuTarget};
use anyshape_ir::{parse_expr, Bindings, ShapeVar, Workload};
use anyshape_runtime::Module;
use anyshape_tune::{Record, RecordLog};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Tokens worth inserting: delimiters, numbers at the edges of the integer types,
/// floats parsers choke on, keywords of the formats read here.
const TOKENS: &[&str] = &[
    "(",
    ")",
    ",",
    "=",
    "..",
    "+",
    "-",
    "*",
    "/",
    "%",
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    "0",
    "-1",
    "1e308",
    "NaN",
    "inf",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551616",
    "T",
    "min(",
    "ceildiv(",
    "\n",
    "\\u0000",
    "null",
    "true",
    "{\"split\":{\"var\":\"T\",\"at\":1,\"le\":",
    "\"range\":{\"lo\":0,\"hi\":",
];

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, usize),
    Delete(usize, usize),
    Repeat(usize, usize, usize),
    Splice(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Flip(a, b)),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(a, t)| Mutation::Insert(a, t)),
        (any::<usize>(), 1usize..32).prop_map(|(a, n)| Mutation::Delete(a, n)),
        (any::<usize>(), 1usize..16, 1usize..64).prop_map(|(a, n, k)| Mutation::Repeat(a, n, k)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Splice(a, b)),
    ]
}

fn apply(seeds: &[Vec<u8>], seed: usize, muts: &[Mutation]) -> Vec<u8> {
    let mut v = seeds[seed % seeds.len()].clone();
    for m in muts {
        let at = |x: usize, len: usize| if len == 0 { 0 } else { x % (len + 1) };
        match *m {
            Mutation::Flip(a, b) if !v.is_empty() => {
                let i = a % v.len();
                v[i] ^= b;
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(a, t) => {
                let i = at(a, v.len());
                v.splice(i..i, TOKENS[t].bytes());
            }
            Mutation::Delete(a, n) => {
                let i = at(a, v.len());
                let j = (i + n).min(v.len());
                v.drain(i..j);
            }
            Mutation::Repeat(a, n, k) => {
                let i = at(a, v.len());
                let j = (i + n).min(v.len());
                let part = v[i..j].to_vec();
                for _ in 0..k {
                    v.splice(j..j, part.iter().copied());
                }
            }
            Mutation::Splice(a, b) => {
                let other = &seeds[b % seeds.len()];
                let i = at(a, v.len());
                let j = at(b, other.len());
                v.truncate(i);
                v.extend_from_slice(&other[j..]);
            }
        }
    }
    v
}

/// Run `check` on the target's regression inputs, then on mutants of `seeds` until the
/// time is up; returns how many inputs ran.
fn fuzz(target: &str, seeds: Vec<Vec<u8>>, check: impl Fn(&[u8])) -> usize {
    let regressions = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz-regressions")
        .join(target);
    let mut ran = 0;
    if let Ok(entries) = std::fs::read_dir(&regressions) {
        for e in entries.flatten() {
            check(&std::fs::read(e.path()).unwrap());
            ran += 1;
        }
    }
    let seconds: f64 = std::env::var("ANYSHAPE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8.0);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let count = AtomicUsize::new(0);
    let strategy = (any::<usize>(), prop::collection::vec(mutation(), 0..8));
    let mut batch = 0u64;
    while Instant::now() < deadline {
        let config = Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &[batch as u8; 32]);
        batch += 1;
        let mut runner = TestRunner::new_with_rng(config, rng);
        let result = runner.run(&strategy, |(seed, muts)| {
            count.fetch_add(1, Ordering::Relaxed);
            check(&apply(&seeds, seed, &muts));
            Ok(())
        });
        if let Err(e) = result {
            panic!(
                "fuzz target `{target}` crashed; save the minimal input under {} as a regression: {e}",
                regressions.display()
            );
        }
    }
    ran += count.load(Ordering::Relaxed);
    eprintln!("fuzz target {target}: {ran} inputs in {seconds} s, no crash");
    ran
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn seeds(texts: &[&str]) -> Vec<Vec<u8>> {
    texts.iter().map(|t| t.as_bytes().to_vec()).collect()
}

#[test]
fn fuzz_expressions() {
    let n = fuzz(
        "expr",
        seeds(&[
            "16*T",
            "ceildiv(T, 8) * 8 + min(T, 4) % 3",
            "(T+1)*(T-1)/2",
            "-T + max(B, 7)",
        ]),
        |b| {
            if let Ok(e) = parse_expr(&text(b)) {
                let again = parse_expr(&e.to_string()).expect("printed expressions parse");
                let values = Bindings::from_pairs([("T", 7), ("B", 0)]);
                assert_eq!(e.eval(&values).ok(), again.eval(&values).ok(), "{e}");
            }
        },
    );
    assert!(n > 0);
}

#[test]
fn fuzz_workloads_and_shapes() {
    let n = fuzz(
        "workload",
        seeds(&[
            "dense(M=16*T,N=2304,K=768)",
            "batch_matmul_nt(B=192,M=T,N=T,K=64)+relu",
            "batch_matmul_nn(192, T, 64, T)",
            "dense_packed(M=T,N=3*T+1,K=768,P=16)+bias+gelu",
            "T=1..128",
            "T=1,8,16",
            "T=37,B=2",
        ]),
        |b| {
            let t = text(b);
            if let Ok(w) = Workload::parse(&t) {
                assert_eq!(Workload::parse(&w.to_string()).as_ref(), Ok(&w), "{w}");
                let vars = w.shape_vars();
                for v in [0, 1, 7, 1 << 40] {
                    let vals: Vec<(&str, i64)> = vars.iter().map(|s| (s.as_str(), v)).collect();
                    let _ = w.bind(&Bindings::from_pairs(vals));
                }
            }
            if let Ok(v) = ShapeVar::parse(&t) {
                let _ = (
                    v.domain.len(),
                    v.domain.bounds(),
                    v.domain.iter().take(3).count(),
                );
            }
            let _ = Bindings::parse(&t);
        },
    );
    assert!(n > 0);
}

#[test]
fn fuzz_micro_kernels() {
    let target = CpuTarget::detect();
    let mk = ContractionKernel::default_for(&target);
    let json = serde_json::to_string(&mk).unwrap();
    let n = fuzz("micro-kernel", seeds(&[&mk.to_string(), &json]), |b| {
        if let Ok(m) = ContractionKernel::parse(&text(b)) {
            let _ = m.validate(&target);
        }
    });
    assert!(n > 0);
}

/// A records file as a real run wrote it: the seed of the records and manifest targets.
fn real_run(dir: &Path) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_anyshape"))
        .args([
            "tune",
            "-w",
            "dense(M=T,N=16,K=16)",
            "--range",
            "T=1..4",
            "--trials",
            "4",
            "--batch",
            "2",
            "--quiet",
            "--records",
            "r.jsonl",
            "--out",
            "m",
        ])
        .current_dir(dir)
        .env("ANYSHAPE_CACHE", dir.join("cache"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn fuzz_records_files() {
    let dir = tempfile::tempdir().unwrap();
    real_run(dir.path());
    let real = std::fs::read(dir.path().join("r.jsonl")).unwrap();
    let path = dir.path().join("fuzzed.jsonl");
    let n = fuzz("records", vec![real], |b| {
        std::fs::write(&path, b).unwrap();
        if let Ok((log, records)) = RecordLog::open::<ContractionKernel, CpuTarget>(&path, true) {
            let _ = log.invalid();
            for r in &records {
                let _: &Record = r;
                assert!(
                    r.invalid().is_none(),
                    "an impossible record was let through"
                );
                let _ = r.latency();
            }
        }
    });
    assert!(n > 0);
}

#[test]
fn fuzz_manifests() {
    let dir = tempfile::tempdir().unwrap();
    real_run(dir.path());
    let module = dir.path().join("m");
    let real = std::fs::read(module.join(MANIFEST_FILE)).unwrap();
    let copy = dir.path().join("fuzzed.module");
    std::fs::create_dir(&copy).unwrap();
    for e in std::fs::read_dir(&module).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    let n = fuzz("manifest", vec![real], |b| {
        // As written (the checksum rejects nearly every mutant) and resealed (so the
        // loader's structural checks see it: a checksum is no signature).
        std::fs::write(copy.join(MANIFEST_FILE), b).unwrap();
        let _ = Module::load(&copy);
        if let Ok(mut m) = serde_json::from_slice::<Manifest>(b) {
            m.seal();
            write_manifest(&m, &copy).unwrap();
            if let Ok(module) = Module::load(&copy) {
                let _ = module.dispatch(&Bindings::from_pairs([("T", 3)]));
            }
        }
    });
    assert!(n > 0);
}

/// ONNX files: mutants of the tiny models in `models/` through the loader, shape
/// propagation and (for graphs that still propagate) the reference executor on small
/// inputs.
#[test]
fn fuzz_onnx_models() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let seeds: Vec<Vec<u8>> = [
        "bert_tiny.ts.onnx",
        "bert_tiny.dynamo.onnx",
        "vit_tiny.dynamo.onnx",
    ]
    .iter()
    .map(|f| std::fs::read(dir.join(f)).unwrap())
    .collect();
    let n = fuzz("onnx", seeds, |b| {
        let Ok(g) = anyshape_graph::onnx::decode(b, None) else {
            return;
        };
        if anyshape_graph::infer(&g).is_err() {
            return;
        }
        let inputs: Vec<(&str, anyshape_tensor::Tensor)> = g
            .inputs
            .iter()
            .filter_map(|i| {
                let shape: Vec<usize> = i
                    .dims
                    .iter()
                    .map(|d| d.as_const().map_or(2, |c| c.clamp(0, 64) as usize))
                    .collect();
                let n: usize = shape.iter().product();
                let t = match i.dtype {
                    anyshape_tensor::DType::F32 => {
                        anyshape_tensor::Tensor::f32(shape, vec![0.5; n])
                    }
                    anyshape_tensor::DType::I64 => anyshape_tensor::Tensor::i64(shape, vec![1; n]),
                    anyshape_tensor::DType::Bool => {
                        anyshape_tensor::Tensor::bool(shape, vec![true; n])
                    }
                }
                .ok()?;
                Some((g.values[i.value].as_str(), t))
            })
            .collect();
        let _ = anyshape_graph::exec::run(&g, &inputs);
    });
    assert!(n > 0);
}

/// NumPy files: mutants of a recorded case (`.npz`) and of `.npy` arrays of every
/// element type and both orders through the strict readers.
#[test]
fn fuzz_npz_and_npy_files() {
    use support::{f32_bytes, npy};
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let seeds = vec![
        std::fs::read(models.join("bert_tiny.ts.s1.npz")).unwrap(),
        npy(
            "<f4",
            false,
            &[2, 3],
            &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ),
        npy(
            "<f4",
            true,
            &[3, 2],
            &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        ),
        npy(
            "<i8",
            false,
            &[2],
            &[1u8, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
        ),
        npy("|b1", false, &[3], &[0, 1, 1]),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.npz");
    let n = fuzz("npz", seeds, |b| {
        std::fs::write(&path, b).unwrap();
        for t in anyshape_tensor::npz::read(&path).into_iter().flatten() {
            assert_eq!(t.1.len(), t.1.shape.iter().product::<usize>());
        }
        if let Ok(t) = anyshape_tensor::npz::read_npy(&path) {
            assert_eq!(t.len(), t.shape.iter().product::<usize>());
        }
    });
    assert!(n > 0);
}

/// Model modules: mutants of a real module's `model.json` (as written, and resealed so
/// the loader's structural checks see them: task paths, files, dims) loaded, and run on
/// the recorded case where they load.
#[test]
fn fuzz_model_modules() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let onnx = models.join("bert_tiny.ts.onnx");
    let o = support::anyshape(
        d,
        &[
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1..2",
            "--dim",
            "sequence=1..16",
            "--out",
            "m",
            "--quiet",
        ],
    );
    assert!(o.status.success(), "{}", support::text(&o));
    let module = d.join("m");
    let real = std::fs::read(module.join(anyshape_abi::MODEL_FILE)).unwrap();
    let case = anyshape_tensor::npz::read(&models.join("bert_tiny.ts.s1.npz")).unwrap();
    let n = fuzz("model-module", vec![real], |b| {
        let json = module.join(anyshape_abi::MODEL_FILE);
        std::fs::write(&json, b).unwrap();
        let _ = anyshape_runtime::Model::load(&module);
        if let Ok(mut m) = serde_json::from_slice::<anyshape_abi::ModelManifest>(b) {
            m.seal();
            std::fs::write(&json, m.to_json()).unwrap();
            if let Ok(model) = anyshape_runtime::Model::load(&module) {
                let inputs: Vec<(&str, anyshape_tensor::TensorRef)> = case
                    .iter()
                    .filter(|(n, _)| n != "last_hidden_state" && n != "pooler_output")
                    .map(|(n, t)| (n.as_str(), t.view()))
                    .collect();
                let _ = model.run(&inputs);
            }
        }
    });
    assert!(n > 0);
}

/// ONNX files with external data: mutants of a model whose weight lives in a file
/// beside it (location, offset and length fields included); a mutant never reads
/// outside the model's directory and never panics.
#[test]
fn fuzz_onnx_with_external_data() {
    use support::{f32_bytes, Dim, Onnx};
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("model");
    std::fs::create_dir(&inner).unwrap();
    std::fs::write(inner.join("weights.bin"), f32_bytes(&[0.5; 20])).unwrap();
    std::fs::write(dir.path().join("secret.bin"), f32_bytes(&[9.0; 20])).unwrap();
    let seed = Onnx::new(17)
        .input("x", &[Dim::Named("n"), Dim::Fixed(4)])
        .external_weight("w", &[4, 5], "weights.bin")
        .node("MatMul", &["x", "w"], &["y"], &[])
        .output("y", &[Dim::Named("n"), Dim::Fixed(5)])
        .bytes();
    let n = fuzz("onnx-external", vec![seed], |b| {
        if let Ok(g) = anyshape_graph::onnx::decode(b, Some(&inner)) {
            for f in &g.external {
                let real = std::fs::canonicalize(inner.join(f)).unwrap();
                assert!(
                    real.starts_with(std::fs::canonicalize(&inner).unwrap()),
                    "{f} read from outside the model's directory"
                );
            }
            let _ = anyshape_graph::infer(&g);
        }
    });
    assert!(n > 0);
}
