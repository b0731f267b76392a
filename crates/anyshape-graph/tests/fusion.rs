//! Fusion of the test models into steps and tasks: every run-time node in exactly one
//! step; the contractions with their epilogues (bias, GELU in both decompositions, a
//! residual, tanh) found alike in both exporters' graphs; layer norms and softmaxes.
use anyshape_graph::{fuse, infer, onnx, StepKind};
use std::path::Path;

fn tasks(file: &str) -> (Vec<(String, usize)>, anyshape_graph::Fusion, usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file);
    let g = onnx::load(&path).unwrap();
    let facts = infer(&g).unwrap();
    let f = fuse(&g, &facts);
    let t = f
        .tasks()
        .into_iter()
        .map(|t| (t.workload, t.count))
        .collect();
    (t, f, g.nodes.len())
}

fn steps_cover_each_node_once(f: &anyshape_graph::Fusion, n: usize) {
    let mut seen = vec![0; n];
    for s in &f.steps {
        for &k in &s.nodes {
            seen[k] += 1;
        }
    }
    assert!(seen.iter().all(|&c| c <= 1), "a node in two steps");
}

#[test]
fn bert_fuses_alike_from_both_exporters() {
    let (ts, f, n) = tasks("bert_tiny.ts.onnx");
    steps_cover_each_node_once(&f, n);
    let (dynamo, f2, n2) = tasks("bert_tiny.dynamo.onnx");
    steps_cover_each_node_once(&f2, n2);
    assert_eq!(ts, dynamo);
    let want = [
        ("dense(M=batch*sequence,N=64,K=64)+add(n)", 6),
        ("dense(M=batch*sequence,N=128,K=64)+add(n)+gelu", 2),
        ("dense(M=batch*sequence,N=64,K=128)+add(n)+add(m,n)", 2),
        ("dense(M=batch*sequence,N=64,K=64)+add(n)+add(m,n)", 2),
        ("softmax(M=4*batch*sequence,N=sequence)", 2),
        ("dense(M=batch,N=64,K=64)+add(n)+tanh", 1),
    ];
    for (w, c) in want {
        assert!(
            ts.contains(&(w.to_string(), c)),
            "{w} x {c} missing from {ts:#?}"
        );
    }
    let norms = f
        .steps
        .iter()
        .filter(|s| matches!(s.kind, StepKind::LayerNorm(_)))
        .count();
    assert_eq!(norms, 5);
}

#[test]
fn gpt2_fuses_the_tanh_gelu() {
    let (ts, _, _) = tasks("gpt2_tiny.ts.onnx");
    let (dynamo, _, _) = tasks("gpt2_tiny.dynamo18.onnx");
    assert_eq!(ts, dynamo);
    assert!(
        ts.contains(&(
            "dense(M=batch*sequence,N=256,K=64)+add(n)+gelu_tanh".to_string(),
            2
        )),
        "{ts:#?}"
    );
    assert!(
        ts.contains(&("dense(M=batch*sequence,N=1000,K=64)".to_string(), 1)),
        "{ts:#?}"
    );
}

#[test]
fn vit_fuses_its_encoder() {
    for file in ["vit_tiny.ts.onnx", "vit_tiny.dynamo.onnx"] {
        let (t, f, n) = tasks(file);
        steps_cover_each_node_once(&f, n);
        assert!(
            t.iter().any(|(w, c)| w.ends_with("+gelu") && *c == 2),
            "{file}: {t:#?}"
        );
        assert!(
            t.iter().any(|(w, c)| w.starts_with("softmax(") && *c == 2),
            "{file}: {t:#?}"
        );
    }
}
