//! The models in `models/` (tiny BERT, GPT-2 and ViT exported by PyTorch's TorchScript
//! and dynamo exporters, with onnxruntime's outputs): every one imports, its shapes
//! propagate symbolically (the inferred output shapes, evaluated at each case's dims,
//! are the recorded ones), and both the reference executor and the compiled plan (run
//! by the runtime's executor, kernel steps computed by the workloads' own reference,
//! `anyshape_measure::reference_output`) reproduce onnxruntime's outputs.
mod common;
use anyshape_graph::{fact, infer, onnx};
use anyshape_ir::{Bindings, Expr, Precision};
use anyshape_tensor::Tensor;
use std::path::{Path, PathBuf};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn npz(path: &Path) -> Vec<(String, Tensor)> {
    anyshape_tensor::npz::read(path).unwrap()
}

/// The relative error of `got` against `want` (NaN-aware; see `anyshape_tensor::compare`).
fn rel_error(got: &Tensor, want: &Tensor) -> f64 {
    anyshape_tensor::compare(got, want).unwrap().error()
}

fn check(model: &str, cases: &[&str]) {
    let g = onnx::load(&models().join(format!("{model}.onnx"))).unwrap();
    let facts = infer(&g).unwrap_or_else(|e| panic!("{model}: {e}"));
    for case in cases {
        let arrays = npz(&models().join(format!("{model}.{case}.npz")));
        let mut b = Bindings::default();
        for i in &g.inputs {
            let (_, t) = arrays
                .iter()
                .find(|(n, _)| *n == g.values[i.value])
                .unwrap();
            for (d, &v) in i.dims.iter().zip(&t.shape) {
                if let Expr::Var(name) = d {
                    b.set(name.clone(), v as i64);
                }
            }
        }
        let inputs: Vec<(&str, Tensor)> = g
            .inputs
            .iter()
            .map(|i| {
                let name = g.values[i.value].as_str();
                (
                    name,
                    arrays.iter().find(|(n, _)| n == name).unwrap().1.clone(),
                )
            })
            .collect();
        let outs = anyshape_graph::exec::run(&g, &inputs)
            .unwrap_or_else(|e| panic!("{model} {case}: {e}"));
        // The plan in f32, and in bf16 (dense layers' weights as bfloat16 pairs) within
        // that precision's expected error.
        for precision in [Precision::F32, Precision::Bf16] {
            let fused = common::run_plan(&g, &inputs, precision)
                .unwrap_or_else(|e| panic!("{model} {case} {precision} plan: {e}"));
            for (&o, got) in g.outputs.iter().zip(&fused) {
                let name = &g.values[o];
                let (_, want) = arrays.iter().find(|(n, _)| n == name).unwrap();
                assert_eq!(got.shape, want.shape, "{model} {case} {name}: fused shape");
                let e = rel_error(got, want);
                assert!(
                    e <= precision.expected_error(),
                    "{model} {case} {name}: {precision} plan relative error {e:e}"
                );
                eprintln!("{model} {case} {name}: {precision} plan relative error {e:.1e}");
            }
        }
        for (&o, got) in g.outputs.iter().zip(&outs) {
            let name = &g.values[o];
            let (_, want) = arrays.iter().find(|(n, _)| n == name).unwrap();
            let inferred = fact(&facts, o).shape_at(&b).unwrap();
            assert_eq!(
                inferred, want.shape,
                "{model} {case} {name}: inferred shape"
            );
            assert_eq!(got.shape, want.shape, "{model} {case} {name}: shape");
            let e = rel_error(got, want);
            assert!(e <= 1e-4, "{model} {case} {name}: relative error {e:e}");
            eprintln!("{model} {case} {name}: relative error {e:.1e}");
        }
    }
}

const TEXT: [&str; 4] = ["s1", "s37", "s128", "b3s17"];

#[test]
fn bert_torchscript() {
    check("bert_tiny.ts", &TEXT);
}

#[test]
fn bert_dynamo() {
    check("bert_tiny.dynamo", &TEXT);
}

#[test]
fn gpt2_torchscript() {
    check("gpt2_tiny.ts", &TEXT);
}

#[test]
fn gpt2_dynamo() {
    check("gpt2_tiny.dynamo18", &TEXT);
}

#[test]
fn vit_torchscript() {
    check("vit_tiny.ts", &["i224", "b2i224", "i384", "i160x256"]);
}

#[test]
fn vit_dynamo() {
    check("vit_tiny.dynamo", &["i224", "b2i224", "i384", "i160x256"]);
}

const IMAGES: [&str; 4] = ["i64", "i97", "b2i96", "i160x224"];

#[test]
fn resnet_torchscript() {
    check("resnet_tiny.ts", &IMAGES);
}

#[test]
fn resnet_dynamo() {
    check("resnet_tiny.dynamo18", &IMAGES);
}
