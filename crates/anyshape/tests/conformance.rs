//! ONNX's operator conformance cases through the path users take: each case's model
//! compiled (untuned, like `anyshape compile --trials 0`) into a model module, loaded,
//! and run on each of its data sets, the outputs compared with the recorded ones under
//! the case's tolerance (`|got - want| <= atol + rtol * |want|`, NaN matching NaN, as
//! `numpy.testing.assert_allclose` and onnxruntime's harness do).
//!
//! The cases are made by `scripts/onnx-node-tests.py DIR` (from the `onnx` package) and
//! found through `ANYSHAPE_CONFORMANCE_DIR` (the test command sets it); without it the
//! test says so and passes. Each case ends as **pass**, **fail** (a wrong answer, an
//! error at run time that is not a refusal, a broken invariant, a panic) or
//! **unsupported** (refused with a message: an op, an attribute value, an element type,
//! an input that must be constant, an IR version).
//! Cases whose values are not f32/i64/bool tensors are out of scope (dtypes the
//! runtime does not have yet), as are models with optional or sequence inputs or
//! outputs and training ops. It prints pass / fail / unsupported per operator and the
//! totals, writes every case's result to `ANYSHAPE_CONFORMANCE_REPORT` (CSV) when set,
//! and fails if a case listed in `tests/conformance-passes.txt` does not pass — growing
//! that list is progress, a case dropping off it a regression.
use anyshape_graph::onnx::proto::{ModelProto, TensorProto};
use anyshape_tensor::{Data, Tensor, TensorRef};
use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How a case ended.
#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Pass,
    Fail(String),
    Unsupported(String),
    OutOfScope(String),
}

/// A recorded tensor as the runtime holds it; `Err`: an element type it does not have.
fn tensor(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let t = TensorProto::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
    let shape: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
    let raw = t.raw_data.clone().unwrap_or_default();
    let data = match t.data_type.unwrap_or(0) {
        1 if !raw.is_empty() || t.float_data.is_empty() => Data::F32(
            raw.chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        ),
        1 => Data::F32(t.float_data.clone()),
        7 if !raw.is_empty() || t.int64_data.is_empty() => Data::I64(
            raw.chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        ),
        7 => Data::I64(t.int64_data.clone()),
        9 if !raw.is_empty() || t.int32_data.is_empty() => {
            Data::Bool(raw.iter().map(|&b| b != 0).collect())
        }
        9 => Data::Bool(t.int32_data.iter().map(|&b| b != 0).collect()),
        code => return Err(format!("element type {code}")),
    };
    Tensor::new(shape, data).map_err(|e| e.to_string())
}

/// Whether `got` matches `want` within the tolerance.
fn close(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.shape != want.shape {
        return Err(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    match (&got.data, &want.data) {
        (Data::F32(g), Data::F32(w)) => {
            for (i, (&a, &b)) in g.iter().zip(w).enumerate() {
                let (a, b) = (a as f64, b as f64);
                let ok =
                    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs();
                if !ok {
                    return Err(format!("element {i}: {a}, expected {b}"));
                }
            }
            Ok(())
        }
        (Data::I64(g), Data::I64(w)) if g == w => Ok(()),
        (Data::Bool(g), Data::Bool(w)) if g == w => Ok(()),
        (Data::I64(_), Data::I64(_)) | (Data::Bool(_), Data::Bool(_)) => {
            Err("integer or boolean values differ".into())
        }
        _ => Err(format!(
            "element type {:?}, expected {:?}",
            got.dtype(),
            want.dtype()
        )),
    }
}

/// A refusal that names what anyshape does not support, rather than a failure.
fn is_refusal(message: &str) -> bool {
    let m = message.to_lowercase();
    [
        "unsupported",
        "not supported",
        "does not import",
        "ir version",
        "older version",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// The data sets of a case: (inputs, outputs) file lists.
fn data_sets(case: &Path) -> Vec<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(case)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    sets.sort();
    sets.iter()
        .map(|s| {
            let files = |kind: &str| {
                (0..)
                    .map(|i| s.join(format!("{kind}_{i}.pb")))
                    .take_while(|p| p.exists())
                    .collect::<Vec<_>>()
            };
            (files("input"), files("output"))
        })
        .collect()
}

/// Why a case's model is out of scope by what it is, not by its data: inputs or
/// outputs of optional or sequence types, or training ops (the exclusions).
fn model_out_of_scope(case: &Path) -> Option<String> {
    use anyshape_graph::onnx::proto::type_proto::Value;
    let bytes = std::fs::read(case.join("model.onnx")).ok()?;
    let m = ModelProto::decode(bytes.as_slice()).ok()?;
    if m.opset_import
        .iter()
        .any(|o| o.domain() == "ai.onnx.preview.training")
    {
        return Some("training ops".into());
    }
    let g = m.graph?;
    g.input.iter().chain(&g.output).find_map(|v| {
        match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(Value::TensorType(_)) | None => None,
            Some(_) => Some(format!(
                "`{}` is not a tensor (optional or sequence types)",
                v.name()
            )),
        }
    })
}

/// One case, end to end; `cache` is the kernel build cache shared by all cases.
fn run_case(case: &Path, cache: &Path) -> Outcome {
    let tol: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(case.join("tolerance.json")).unwrap())
            .unwrap();
    let (rtol, atol) = (
        tol["rtol"].as_f64().unwrap_or(1e-3),
        tol["atol"].as_f64().unwrap_or(1e-7),
    );
    if let Some(why) = model_out_of_scope(case) {
        return Outcome::OutOfScope(why);
    }
    let mut sets = Vec::new();
    for (ins, outs) in data_sets(case) {
        let read = |files: &[PathBuf]| {
            files
                .iter()
                .map(|f| tensor(f))
                .collect::<Result<Vec<_>, _>>()
        };
        match (read(&ins), read(&outs)) {
            (Ok(i), Ok(o)) => sets.push((i, o)),
            (Err(e), _) | (_, Err(e)) => return Outcome::OutOfScope(e),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("m");
    let measurer = anyshape_measure::Measurer {
        builder: anyshape_measure::Builder::new(cache),
        runner: anyshape_measure::Runner {
            // Untuned: nothing is measured.
            worker: anyshape_measure::WorkerCommand {
                program: "/nonexistent".into(),
                args: vec![],
            },
            options: Default::default(),
        },
        queue: None,
    };
    if let Err(e) = anyshape_tune::compile_model(
        &case.join("model.onnx"),
        &[],
        &anyshape_codegen::CpuTarget::detect(),
        &measurer,
        &anyshape_tune::ModelOptions::default(),
        &module,
        &mut Quiet,
    ) {
        // A model anyshape cannot compile is refused with a message (the op, the
        // attribute value, the element type, the input that must be constant); only a
        // broken invariant is a failure.
        let e = e.to_string();
        return if e.contains("the plan is invalid") || e.contains("internal") {
            Outcome::Fail(format!("compile: {e}"))
        } else {
            Outcome::Unsupported(e)
        };
    }
    let model = match anyshape_runtime::Model::load(&module) {
        Ok(m) => m,
        Err(e) => return Outcome::Fail(format!("load: {e}")),
    };
    let names: Vec<String> = model.inputs().iter().map(|s| s.name.clone()).collect();
    for (k, (ins, outs)) in sets.iter().enumerate() {
        if ins.len() != names.len() {
            return Outcome::Fail(format!(
                "{} inputs recorded, the module takes {}",
                ins.len(),
                names.len()
            ));
        }
        let given: Vec<(&str, TensorRef)> = names
            .iter()
            .zip(ins)
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect();
        let got = match model.run(&given) {
            Ok(g) => g,
            Err(e) if is_refusal(&e.to_string()) => return Outcome::Unsupported(e.to_string()),
            Err(e) => return Outcome::Fail(format!("run: {e}")),
        };
        if got.len() != outs.len() {
            return Outcome::Fail(format!("{} outputs, {} recorded", got.len(), outs.len()));
        }
        for (i, (g, w)) in got.iter().zip(outs).enumerate() {
            if let Err(e) = close(g, w, rtol, atol) {
                return Outcome::Fail(format!("data set {k}, output {i}: {e}"));
            }
        }
    }
    Outcome::Pass
}

struct Quiet;
impl anyshape_tune::Observer for Quiet {
    fn stage(&mut self, _: &anyshape_tune::Stage) {}
    fn round(&mut self, _: &anyshape_tune::RoundSummary) {}
    fn trials(&mut self, _: usize) {}
}

/// The operator a case tests: its graph's one op, or the op its name names.
fn operator(case: &Path) -> String {
    let bytes = std::fs::read(case.join("model.onnx")).unwrap_or_default();
    let ops: Vec<String> = ModelProto::decode(bytes.as_slice())
        .ok()
        .and_then(|m| m.graph)
        .map(|g| g.node.iter().filter_map(|n| n.op_type.clone()).collect())
        .unwrap_or_default();
    let name = case.file_name().unwrap().to_string_lossy().to_lowercase();
    ops.iter()
        .filter(|o| name.starts_with(&format!("test_{}", o.to_lowercase())))
        .max_by_key(|o| o.len())
        .or(ops.first())
        .cloned()
        .unwrap_or_else(|| "?".into())
}

#[test]
fn onnx_conformance_cases() {
    let Some(root) = std::env::var_os("ANYSHAPE_CONFORMANCE_DIR").map(PathBuf::from) else {
        println!("skipped: ANYSHAPE_CONFORMANCE_DIR is not set (scripts/onnx-node-tests.py DIR makes the cases; scripts/test.sh does both)");
        return;
    };
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("anyshape-test-cache");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no cases in {}", root.display());
    let mut results = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        let outcome = std::panic::catch_unwind(|| run_case(case, &cache))
            .unwrap_or_else(|_| Outcome::Fail("panicked".into()));
        results.push((name, operator(case), outcome));
    }
    // Per operator: pass, fail, unsupported, out of scope.
    let mut per_op: BTreeMap<&str, [usize; 4]> = BTreeMap::new();
    for (_, op, o) in &results {
        let at = match o {
            Outcome::Pass => 0,
            Outcome::Fail(_) => 1,
            Outcome::Unsupported(_) => 2,
            Outcome::OutOfScope(_) => 3,
        };
        per_op.entry(op).or_default()[at] += 1;
    }
    println!(
        "{:<32} {:>5} {:>5} {:>12} {:>13}",
        "operator", "pass", "fail", "unsupported", "out of scope"
    );
    for (op, c) in &per_op {
        println!("{op:<32} {:>5} {:>5} {:>12} {:>13}", c[0], c[1], c[2], c[3]);
    }
    let total = per_op.values().fold([0; 4], |a, c| {
        [a[0] + c[0], a[1] + c[1], a[2] + c[2], a[3] + c[3]]
    });
    println!(
        "total: {} cases, {} pass, {} fail, {} unsupported, {} out of scope (dtypes the runtime does not have, optional and sequence types, training ops)",
        results.len(), total[0], total[1], total[2], total[3]
    );
    if let Some(report) = std::env::var_os("ANYSHAPE_CONFORMANCE_REPORT") {
        let mut csv = String::from("case,operator,outcome,reason\n");
        for (name, op, o) in &results {
            let (kind, why) = match o {
                Outcome::Pass => ("pass", ""),
                Outcome::Fail(w) => ("fail", w.as_str()),
                Outcome::Unsupported(w) => ("unsupported", w.as_str()),
                Outcome::OutOfScope(w) => ("out of scope", w.as_str()),
            };
            let why = why.replace('"', "'").replace('\n', " ");
            csv.push_str(&format!("{name},{op},{kind},\"{why}\"\n"));
        }
        std::fs::write(&report, csv).unwrap();
    }
    let listed = include_str!("conformance-passes.txt");
    let expected: Vec<&str> = listed
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let passed: Vec<&str> = results
        .iter()
        .filter(|r| r.2 == Outcome::Pass)
        .map(|r| r.0.as_str())
        .collect();
    let new: Vec<&&str> = passed.iter().filter(|p| !expected.contains(p)).collect();
    if !new.is_empty() {
        println!(
            "{} passes not yet in tests/conformance-passes.txt: {new:?}",
            new.len()
        );
    }
    let lost: Vec<String> = expected
        .iter()
        .filter(|e| !passed.contains(e))
        .map(|e| {
            let why = results
                .iter()
                .find(|r| r.0 == **e)
                .map_or("no such case".to_string(), |r| format!("{:?}", r.2));
            format!("{e}: {why}")
        })
        .collect();
    assert!(
        lost.is_empty(),
        "listed passes that no longer pass:\n{}",
        lost.join("\n")
    );
}
