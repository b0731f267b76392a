//! Imported models compiled into model modules (`anyshape_tune::compile_model`, every
//! task with its sketch's default micro-kernel, what `--trials 0` gives), loaded by the
//! runtime from their plans and run on every recorded case — in the compiled range and
//! past it — against onnxruntime's outputs.
use anyshape_codegen::CpuTarget;
use anyshape_ir::ShapeVar;
use anyshape_measure::{Builder, MeasureOptions, Measurer, Runner, WorkerCommand};
use anyshape_runtime::Model;
use anyshape_tensor::TensorRef;
use anyshape_tune::{compile_model, ModelOptions, Observer, Stage};
use std::path::{Path, PathBuf};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// Hears nothing.
struct Quiet;

impl Observer for Quiet {
    fn stage(&mut self, _: &Stage) {}
    fn round(&mut self, _: &anyshape_tune::RoundSummary) {}
    fn trials(&mut self, _: usize) {}
}

/// Compile `model` for `dims`, then run every case and compare every output.
fn check(model: &str, dims: &[&str], cases: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m");
    let measurer = Measurer {
        builder: Builder::new(Path::new(env!("CARGO_TARGET_TMPDIR")).join("anyshape-test-cache")),
        runner: Runner {
            worker: WorkerCommand {
                program: env!("CARGO_BIN_EXE_anyshape").into(),
                args: vec!["__worker".into()],
            },
            options: MeasureOptions::default(),
        },
    };
    let options = ModelOptions::default();
    let dims: Vec<ShapeVar> = dims.iter().map(|d| ShapeVar::parse(d).unwrap()).collect();
    compile_model(
        &models().join(format!("{model}.onnx")),
        &dims,
        &CpuTarget::detect(),
        &measurer,
        &options,
        &out,
        &mut Quiet,
    )
    .unwrap_or_else(|e| panic!("{model}: {e}"));
    let m = Model::load(&out).unwrap();
    for case in cases {
        let arrays =
            anyshape_tensor::npz::read(&models().join(format!("{model}.{case}.npz"))).unwrap();
        let inputs: Vec<(&str, TensorRef)> = m
            .inputs()
            .iter()
            .map(|s| {
                let t = &arrays.iter().find(|(n, _)| *n == s.name).unwrap().1;
                (s.name.as_str(), t.view())
            })
            .collect();
        let outs = m
            .run(&inputs)
            .unwrap_or_else(|e| panic!("{model} {case}: {e}"));
        for (spec, got) in m.outputs().iter().zip(&outs) {
            let want = &arrays.iter().find(|(n, _)| *n == spec.name).unwrap().1;
            let c = anyshape_tensor::compare(got, want).unwrap();
            eprintln!("{model} {case} {}: compiled, {c}", spec.name);
            assert!(c.passes(1e-4), "{model} {case} {}: {c}", spec.name);
        }
    }
}

const TEXT: [&str; 2] = ["batch=1..2", "sequence=1..64"];

/// Sequence 128 and batch 3 are past the compiled range.
#[test]
fn bert_runs_compiled() {
    check("bert_tiny.ts", &TEXT, &["s1", "s37", "s128", "b3s17"]);
    check("bert_tiny.dynamo", &TEXT, &["s37", "b3s17"]);
}

#[test]
fn gpt2_runs_compiled() {
    check("gpt2_tiny.dynamo18", &TEXT, &["s1", "s37", "s128", "b3s17"]);
    check("gpt2_tiny.ts", &TEXT, &["s37", "b3s17"]);
}

#[test]
fn vit_runs_compiled() {
    let dims = ["batch=1", "height=160..224", "width=160..224"];
    check(
        "vit_tiny.dynamo",
        &dims,
        &["i224", "i160x256", "i384", "b2i224"],
    );
    check("vit_tiny.ts", &dims, &["i224", "b2i224"]);
}
