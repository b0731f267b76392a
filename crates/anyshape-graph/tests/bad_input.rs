//! Bad models are clear errors, never panics: damaged and truncated files, an
//! unsupported op (named with its node), an input of the wrong type or rank; and the
//! symbolic shapes of the outputs are the expressions a reader expects.
use anyshape_graph::{fact, infer, onnx, GraphError};
use anyshape_tensor::{shape_text, Tensor};
use std::path::{Path, PathBuf};

fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

#[test]
fn outputs_have_symbolic_shapes() {
    let cases = [
        (
            "bert_tiny.ts.onnx",
            vec!["[batch, sequence, 64]", "[batch, 64]"],
        ),
        (
            "bert_tiny.dynamo.onnx",
            vec!["[batch, sequence, 64]", "[batch, 64]"],
        ),
        ("gpt2_tiny.ts.onnx", vec!["[batch, sequence, 1000]"]),
        ("gpt2_tiny.dynamo18.onnx", vec!["[batch, sequence, 1000]"]),
    ];
    for (file, want) in cases {
        let g = onnx::load(&model(file)).unwrap();
        let facts = infer(&g).unwrap();
        let got: Vec<String> = g
            .outputs
            .iter()
            .map(|&o| shape_text(&fact(&facts, o).shape))
            .collect();
        assert_eq!(got, want, "{file}");
    }
    // ViT: the token count is the patch grid plus the class token.
    let g = onnx::load(&model("vit_tiny.ts.onnx")).unwrap();
    let facts = infer(&g).unwrap();
    let tokens = &fact(&facts, g.outputs[0]).shape[1];
    let b = anyshape_ir::Bindings::from_pairs([("batch", 1), ("height", 160), ("width", 256)]);
    assert_eq!(tokens.eval(&b).unwrap(), 10 * 16 + 1, "{tokens}");
}

#[test]
fn damaged_files_are_format_errors() {
    let bytes = std::fs::read(model("bert_tiny.ts.onnx")).unwrap();
    for cut in [0, 1, 10, 1000, bytes.len() / 2, bytes.len() - 1] {
        match onnx::decode(&bytes[..cut], None) {
            Err(GraphError::Format(_)) | Err(GraphError::Unsupported(_)) => {}
            other => panic!("cut at {cut}: {:?}", other.map(|g| g.nodes.len())),
        }
    }
    let mut flipped = bytes.clone();
    for i in (100..flipped.len()).step_by(9973) {
        flipped[i] ^= 0x5a;
    }
    // Damage anywhere is an error or a graph that still reads; never a panic.
    let _ = onnx::decode(&flipped, None).and_then(|g| infer(&g).map(|_| ()));
    let missing = onnx::load(Path::new("/nonexistent/model.onnx"));
    assert!(matches!(missing, Err(GraphError::File(_))));
}

#[test]
fn unsupported_ops_and_bad_inputs_are_named() {
    let mut g = onnx::load(&model("bert_tiny.ts.onnx")).unwrap();
    let i = g.nodes.iter().position(|n| n.op == "Softmax").unwrap();
    g.nodes[i].op = "FancySoftmax".into();
    let name = g.nodes[i].name.clone();
    let e = infer(&g).unwrap_err().to_string();
    assert!(e.contains("FancySoftmax") && e.contains(&name), "{e}");

    let g = onnx::load(&model("bert_tiny.ts.onnx")).unwrap();
    let ids = Tensor::f32(vec![1, 3], vec![0.0; 3]).unwrap();
    let e = anyshape_graph::exec::run(&g, &[("input_ids", ids)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("input_ids") && e.contains("int64"), "{e}");
    let ids = Tensor::i64(vec![3], vec![0; 3]).unwrap();
    let e = anyshape_graph::exec::run(&g, &[("input_ids", ids)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank"), "{e}");
    let ids = Tensor::i64(vec![1, 3], vec![0, 5000, 1]).unwrap();
    let mask = Tensor::i64(vec![1, 3], vec![1; 3]).unwrap();
    let types = Tensor::i64(vec![1, 3], vec![0; 3]).unwrap();
    let e = anyshape_graph::exec::run(
        &g,
        &[
            ("input_ids", ids),
            ("attention_mask", mask),
            ("token_type_ids", types),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("out of range"), "{e}");
}
