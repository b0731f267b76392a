//! Fusion of the test models into steps and tasks: every run-time node in exactly one
//! step; the contractions with their epilogues (bias, GELU in both decompositions, a
//! residual, tanh) and attention's contractions with the heads' transposes and scales
//! found alike in both exporters' graphs; layer norms and softmaxes.
mod common;
use anyshape_graph::{fuse, infer, onnx, Layout, StepKind};
use std::path::Path;

fn tasks(file: &str) -> (Vec<(String, usize)>, anyshape_graph::Fusion, usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(file);
    let g = onnx::load(&path).unwrap();
    let facts = infer(&g).unwrap();
    let f = fuse(&g, &facts, anyshape_ir::Precision::F32);
    let t = f
        .tasks()
        .into_iter()
        .map(|t| (t.workload.to_string(), t.count))
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
        ("dense_packed(M=batch*sequence,N=64,K=64,P=16)+add(n)", 6),
        (
            "dense_packed(M=batch*sequence,N=128,K=64,P=16)+add(n)+gelu",
            2,
        ),
        (
            "dense_packed(M=batch*sequence,N=64,K=128,P=16)+add(n)+add(m,n)",
            2,
        ),
        (
            "dense_packed(M=batch*sequence,N=64,K=64,P=16)+add(n)+add(m,n)",
            2,
        ),
        // The embeddings' and each block's two, scale and bias fused (ε as f32 holds it).
        (
            "layer_norm(M=batch*sequence,N=64,eps=9.999999960041972e-13)+mul(n)+add(n)",
            5,
        ),
        ("dense_packed(M=batch,N=64,K=64,P=16)+add(n)+tanh", 1),
        // The heads read in place, the two scales folded into one, the mask added, the
        // softmax and its NaN guard, the context: one kernel, the scores never stored.
        (
            "masked_attention(B=batch,H=4,M=sequence,N=sequence,D=16,scale=2.5e-1,nan_to_zero)",
            2,
        ),
    ];
    for (w, c) in want {
        assert!(
            ts.contains(&(w.to_string(), c)),
            "{w} x {c} missing from {ts:#?}"
        );
    }
    // The additive attention mask, a `Where` the TorchScript export repeats in each
    // layer, is computed once.
    let wheres = f
        .steps
        .iter()
        .filter(|s| matches!(&s.kind, StepKind::Elementwise(op) if op == "Where"))
        .count();
    assert_eq!(wheres, 1);
    // No transpose or scaling of the heads, nor the softmax's NaN guard, is left to
    // run on the host.
    for (file, f) in [("ts", &f), ("dynamo", &f2)] {
        let left: Vec<_> = f
            .steps
            .iter()
            .filter(|s| {
                matches!(&s.kind, StepKind::Movement(op) if op == "Transpose")
                    || matches!(&s.kind, StepKind::Elementwise(op) if op == "Mul" || op.contains("IsNaN"))
            })
            .collect();
        assert!(left.is_empty(), "{file}: {left:#?}");
    }
}

#[test]
fn gpt2_fuses_the_tanh_gelu() {
    let (ts, _, _) = tasks("gpt2_tiny.ts.onnx");
    let (dynamo, _, _) = tasks("gpt2_tiny.dynamo18.onnx");
    assert_eq!(ts, dynamo);
    assert!(
        ts.contains(&(
            "dense_packed(M=batch*sequence,N=256,K=64,P=16)+add(n)+gelu_tanh".to_string(),
            2
        )),
        "{ts:#?}"
    );
    assert!(
        ts.contains(&(
            "dense_packed(M=batch*sequence,N=1000,K=64,P=16)".to_string(),
            1
        )),
        "{ts:#?}"
    );
}

/// A decoder with a key/value cache: its attention reads the `present` keys and values
/// (`Concat(past, new)`, `[batch, heads, sequence, dim]`) in place, the scales and the
/// mask folded as without a cache, scores, softmax and context one fused kernel with
/// the cache's rows to spare; only the new rows' head transposes (before the `Concat`)
/// stay on the host.
#[test]
fn gpt2_with_past_reads_its_cache_in_place() {
    let (ts, f, n) = tasks("gpt2_tiny_past.ts.onnx");
    steps_cover_each_node_once(&f, n);
    let (dynamo, f2, n2) = tasks("gpt2_tiny_past.dynamo18.onnx");
    steps_cover_each_node_once(&f2, n2);
    assert_eq!(ts, dynamo);
    let w = "masked_cache_attention(B=batch,H=4,M=sequence,N=past_sequence+sequence,D=16,R=cache_reserve,scale=2.5e-1,nan_to_zero)";
    assert!(ts.contains(&(w.to_string(), 2)), "{w} missing from {ts:#?}");
    assert!(!ts.iter().any(|(t, _)| t.starts_with("softmax")), "{ts:#?}");
    for (file, f) in [("ts", &f), ("dynamo", &f2)] {
        let transposes = f
            .steps
            .iter()
            .filter(|s| matches!(&s.kind, StepKind::Movement(op) if op == "Transpose"))
            .count();
        assert_eq!(transposes, 4, "{file}: the new keys' and values' per layer");
        let scalings = f
            .steps
            .iter()
            .filter(|s| matches!(&s.kind, StepKind::Elementwise(op) if op == "Mul"))
            .count();
        assert_eq!(scalings, 0, "{file}");
    }
}

/// Grouped-query attention (the Llama-style decoder: 4 query heads over 2 cache heads):
/// one fused kernel reads each cache head in place for its group of query heads — the
/// repeat (`Unsqueeze`, `Expand`, `Reshape`) of the cache is no step at all — with the
/// two scales (Llama scales queries and keys by √scale each) and the mask folded in; and
/// its gated MLP's SiLU and gate fold into the gate projection; its RMSNorms, as both
/// exporters decompose them, are `rms_norm` kernels with their scale.
#[test]
fn llama_reads_its_cache_in_place_for_each_group() {
    let (ts, f, n) = tasks("llama_tiny_past.ts.onnx");
    steps_cover_each_node_once(&f, n);
    let (dynamo, f2, n2) = tasks("llama_tiny_past.dynamo18.onnx");
    steps_cover_each_node_once(&f2, n2);
    for w in [
        "dense_packed(M=batch*sequence,N=128,K=64,P=16)+silu+mul(m,n)",
        "masked_grouped_cache_attention(B=batch,H=2,G=2,M=sequence,N=past_sequence+sequence,D=16,R=cache_reserve,scale=2.5e-1,nan_to_zero)",
    ] {
        for (file, t) in [("ts", &ts), ("dynamo", &dynamo)] {
            assert!(t.contains(&(w.to_string(), 2)), "{file}: {w} missing from {t:#?}");
        }
    }
    let rms = "rms_norm(M=batch*sequence,N=64,eps=9.999999974752427e-7)+mul(n)";
    for (file, t) in [("ts", &ts), ("dynamo", &dynamo)] {
        assert!(
            t.contains(&(rms.to_string(), 5)),
            "{file}: {rms} missing from {t:#?}"
        );
    }
    for (file, f) in [
        ("llama_tiny_past.ts.onnx", &f),
        ("llama_tiny_past.dynamo18.onnx", &f2),
    ] {
        let g = onnx::load(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../models")
                .join(file),
        )
        .unwrap();
        let presents: Vec<usize> = g.outputs[1..].to_vec();
        for s in &f.steps {
            let reads_cache = s.nodes.iter().any(|&k| {
                g.nodes[k]
                    .inputs
                    .iter()
                    .flatten()
                    .any(|v| presents.contains(v))
            });
            assert!(
                !reads_cache || matches!(s.kind, StepKind::Kernel(_)),
                "{file}: a {:?} step reads a cache",
                s.kind
            );
        }
    }
}

/// A ResNet's convolutions become `conv_packed` kernels (filters in panels) over their
/// inputs' patches, each with its bias, the residual add and the ReLU after it, reading
/// columns a host `anyshape.Im2Col` lays out (the shortcut's 1x1 projection strides by
/// 2, so it too).
#[test]
fn resnet_convolutions_become_kernels() {
    for file in ["resnet_tiny.ts.onnx", "resnet_tiny.dynamo18.onnx"] {
        let (t, f, n) = tasks(file);
        steps_cover_each_node_once(&f, n);
        assert_eq!(t.len(), 6, "{file}: {t:#?}");
        assert!(
            t.iter().all(|(w, _)| w.starts_with("conv_packed(")),
            "{t:#?}"
        );
        let with_residual = t
            .iter()
            .filter(|(w, _)| w.ends_with("+add(m)+add(b,m,n)+relu"))
            .count();
        assert_eq!(
            with_residual, 2,
            "{file}: the two blocks' residual adds: {t:#?}"
        );
        let columns = f
            .steps
            .iter()
            .flat_map(|s| &s.inputs)
            .filter(|(_, l)| matches!(l, anyshape_graph::Layout::Columns { .. }))
            .count();
        assert_eq!(columns, 6, "{file}: every convolution reads columns");
    }
}

/// After the rewrite `anyshape compile` makes, a ResNet's 3 x 3 convolutions of stride
/// 1 are Winograd's: an input transform, a `batch_matmul_nn` of the 16 positions over
/// the transformed filters (a new constant `[16, co, ci]`) and an output transform
/// that adds the bias and applies the ReLU that followed (no `Relu` node left for
/// them); the stem (7 x 7), strided and 1 x 1 convolutions stay `conv_packed`.
#[test]
fn resnet_3x3_convolutions_become_winograd() {
    use anyshape_tensor::ops::{WINOGRAD_INPUT, WINOGRAD_OUTPUT};
    for file in ["resnet_tiny.ts.onnx", "resnet_tiny.dynamo18.onnx"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models")
            .join(file);
        let mut g = onnx::load(&path).unwrap();
        let convs =
            |g: &anyshape_graph::Graph, op: &str| g.nodes.iter().filter(|n| n.op == op).count();
        let before = (convs(&g, "Conv"), convs(&g, "Relu"));
        let facts = infer(&g).unwrap();
        let least = anyshape_ir::Bindings::default();
        let facts = anyshape_graph::winograd(&mut g, facts, &least).unwrap();
        let rewritten = convs(&g, WINOGRAD_OUTPUT);
        assert_eq!(rewritten, 3, "{file}: the two blocks' 3 x 3 and one more");
        assert_eq!(convs(&g, WINOGRAD_INPUT), rewritten, "{file}");
        assert_eq!(convs(&g, "Conv"), before.0 - rewritten, "{file}");
        let fused_relus = g
            .nodes
            .iter()
            .filter(|n| n.op == WINOGRAD_OUTPUT && n.int("relu", 0).unwrap() == 1)
            .count();
        assert_eq!(convs(&g, "Relu"), before.1 - fused_relus, "{file}");
        assert!(fused_relus > 0, "{file}");
        let f = fuse(&g, &facts, anyshape_ir::Precision::F32);
        steps_cover_each_node_once(&f, g.nodes.len());
        let t: Vec<String> = f.tasks().iter().map(|t| t.workload.to_string()).collect();
        let products: Vec<_> = t
            .iter()
            .filter(|w| w.starts_with("batch_matmul_packed(B=16,"))
            .collect();
        assert!(!products.is_empty(), "{file}: {t:#?}");
        assert!(
            t.iter().all(
                |w| w.starts_with("conv_packed(") || w.starts_with("batch_matmul_packed(B=16,")
            ),
            "{file}: {t:#?}"
        );
        let steps = f.tasks().iter().map(|t| t.count).sum::<usize>();
        assert_eq!(steps, before.0, "{file}: one kernel per convolution");
        // The products read the transformed filters from panels, item by item.
        for s in &f.steps {
            if let StepKind::Kernel(w) = &s.kind {
                if w.to_string().starts_with("batch_matmul_packed(") {
                    assert!(
                        matches!(s.inputs[0].1, Layout::Panels { batched: true, .. }),
                        "{file}: {:?}",
                        s.inputs
                    );
                }
            }
        }
    }
}

/// Given the dims' smallest values, a convolution whose output is 12 pixels or more
/// each way there takes F(4x4, 3x3) (36 positions): the tiny ResNet's first stage
/// from 45 x 45 images up (12 x 12), its second from 89 x 89 up; from 44 x 44 up
/// (11 x 11), neither stage takes it.
#[test]
fn wide_images_take_the_larger_winograd_tiles() {
    use anyshape_tensor::ops::WINOGRAD_OUTPUT;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/resnet_tiny.ts.onnx");
    for (least, want) in [
        (89, [4, 4, 4]),
        (88, [4, 4, 2]),
        (45, [4, 4, 2]),
        (44, [2, 2, 2]),
    ] {
        let mut g = onnx::load(&path).unwrap();
        let b =
            anyshape_ir::Bindings::from_pairs([("batch", 1), ("height", least), ("width", 300)]);
        let facts = infer(&g).unwrap();
        let facts = anyshape_graph::winograd(&mut g, facts, &b).unwrap();
        let tiles: Vec<i64> = g
            .nodes
            .iter()
            .filter(|n| n.op == WINOGRAD_OUTPUT)
            .map(|n| n.int("tile", 0).unwrap())
            .collect();
        assert_eq!(tiles, want, "images from {least}");
        let f = fuse(&g, &facts, anyshape_ir::Precision::F32);
        let wide = f
            .tasks()
            .iter()
            .filter(|t| {
                t.workload
                    .to_string()
                    .starts_with("batch_matmul_packed(B=36,")
            })
            .map(|t| t.count)
            .sum::<usize>();
        assert_eq!(
            wide,
            want.iter().filter(|&&m| m == 4).count(),
            "images from {least}"
        );
    }
}

/// In bf16 every dense layer over a weight becomes `dense_bf16` and attention's scores
/// `…_scores_bf16` (the same tasks otherwise: attention's context and softmax stay
/// f32), the weights stored as words of bfloat16 pairs: half the bytes of the f32
/// plan's panels.
#[test]
fn bf16_fuses_dense_layers_over_half_the_weight_bytes() {
    use anyshape_ir::Precision;
    use anyshape_plan::ConstantLayout;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/gpt2_tiny.ts.onnx");
    let g = onnx::load(&path).unwrap();
    let facts = infer(&g).unwrap();
    let [f32_plan, bf16_plan] = [Precision::F32, Precision::Bf16]
        .map(|p| anyshape_graph::lower(&g, &facts, &fuse(&g, &facts, p)).unwrap());
    let names = |plan: &anyshape_plan::PlanFile| -> Vec<String> {
        let tasks = &plan.plan().tasks;
        tasks.iter().map(|t| t.workload.to_string()).collect()
    };
    let (f, b) = (names(&f32_plan), names(&bf16_plan));
    assert_eq!(f.len(), b.len());
    assert!(b.iter().any(|w| w.starts_with("dense_bf16(")));
    // Attention is one kernel at either precision (in bf16 on AMX tiles where it can).
    assert!(b.iter().any(|w| w.starts_with("masked_attention_bf16(")));
    for (f, b) in f.iter().zip(&b) {
        let f = f
            .replace("dense_packed(", "dense_bf16(")
            .replace("_scores(", "_scores_bf16(")
            .replace("_attention(", "_attention_bf16(");
        assert_eq!(f, *b);
    }
    let panel_bytes = |plan: &anyshape_plan::PlanFile, precision: Precision| -> u64 {
        let consts = &plan.plan().constants;
        consts
            .iter()
            .filter(|k| {
                k.layout
                    == ConstantLayout::Panels {
                        width: 16,
                        precision,
                    }
            })
            .map(|k| k.bytes)
            .sum()
    };
    let (fb, bb) = (
        panel_bytes(&f32_plan, Precision::F32),
        panel_bytes(&bf16_plan, Precision::Bf16),
    );
    assert!(
        fb > 0 && bb * 2 == fb,
        "{fb} bytes of f32 panels, {bb} of bf16 ones"
    );
}

/// In i8 every dense layer over a weight becomes `dense_i8` multiplying first by its
/// output channels' scales (`+mul(n)`, a constant of N floats laid out row-major), the
/// weights stored as words of four 8-bit values: a quarter of the bytes of the f32
/// plan's panels; attention stays as in f32.
#[test]
fn i8_fuses_dense_layers_over_a_quarter_of_the_weight_bytes() {
    use anyshape_ir::Precision;
    use anyshape_plan::ConstantLayout;
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/gpt2_tiny.ts.onnx");
    let g = onnx::load(&path).unwrap();
    let facts = infer(&g).unwrap();
    let [f32_plan, i8_plan] = [Precision::F32, Precision::I8]
        .map(|p| anyshape_graph::lower(&g, &facts, &fuse(&g, &facts, p)).unwrap());
    let names = |plan: &anyshape_plan::PlanFile| -> Vec<String> {
        let tasks = &plan.plan().tasks;
        tasks.iter().map(|t| t.workload.to_string()).collect()
    };
    let (f, q) = (names(&f32_plan), names(&i8_plan));
    assert_eq!(f.len(), q.len());
    assert!(q.iter().any(|w| w.starts_with("dense_i8(")), "{q:?}");
    for (f, q) in f.iter().zip(&q) {
        let f = match f.split_once(")") {
            Some((head, tail)) if head.starts_with("dense_packed(") => {
                format!(
                    "{})+mul(n){tail}",
                    head.replace("dense_packed(", "dense_i8(")
                )
            }
            _ => f.clone(),
        };
        assert_eq!(f, *q);
    }
    let panels = |plan: &anyshape_plan::PlanFile, precision: Precision| {
        let consts = &plan.plan().constants;
        let layout = ConstantLayout::Panels {
            width: 16,
            precision,
        };
        let k: Vec<u64> = consts
            .iter()
            .filter(|k| k.layout == layout)
            .map(|k| k.bytes)
            .collect();
        k
    };
    let (fb, qb) = (
        panels(&f32_plan, Precision::F32),
        panels(&i8_plan, Precision::I8),
    );
    assert_eq!(fb.len(), qb.len());
    assert!(
        !fb.is_empty() && qb.iter().sum::<u64>() * 4 == fb.iter().sum::<u64>(),
        "{fb:?} bytes of f32 panels, {qb:?} of i8 ones"
    );
    let scales = i8_plan.plan().constants.iter();
    let scales = scales.filter(|k| k.name.ends_with("(i8 channel scales)"));
    assert_eq!(scales.count(), qb.len());
}

/// Lowering records each cache of GPT-2 with past (the plan may keep it across runs),
/// and the verifier refuses a cache that a step could not read with room to spare.
#[test]
fn gpt2_with_past_plans_its_caches() {
    for file in ["gpt2_tiny_past.ts.onnx", "gpt2_tiny_past.dynamo18.onnx"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models")
            .join(file);
        let g = onnx::load(&path).unwrap();
        let facts = infer(&g).unwrap();
        let plan =
            anyshape_graph::lower(&g, &facts, &fuse(&g, &facts, anyshape_ir::Precision::F32))
                .unwrap();
        let p = plan.plan();
        assert_eq!(p.caches.len(), 4, "{file}: two layers' keys and values");
        for c in &p.caches {
            assert!(p.inputs[c.past].0.name.starts_with("past_key_values."));
            assert!(p.outputs[c.present].0.name.starts_with("present."));
            assert_eq!(c.axis, 2);
        }
        // A host step reading a present: the run could not keep it in place.
        let mut bad = p.clone();
        let present = bad.outputs[bad.caches[0].present].1;
        let after = bad.caches[0].step;
        let step = (after..bad.steps.len())
            .find(|&k| matches!(&bad.steps[k], anyshape_plan::Step::Host(n) if n.op == "Transpose"))
            .unwrap();
        let anyshape_plan::Step::Host(node) = &mut bad.steps[step] else {
            unreachable!()
        };
        node.inputs[0] = Some(present);
        let e = anyshape_plan::verify(&bad, plan.data().len() as u64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cache 0"), "{file}: {e}");
    }
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
        // Its attention is scores, softmax and context in one kernel: unmasked from
        // TorchScript; the dynamo export adds a mask of zeros `[batch, 1, tokens,
        // tokens]` (a `Where` over a `Range` whose length is clamped at 0: `max(tokens,
        // 0)`, the tokens' count), which becomes the fused kernel's mask.
        let op = if file.contains(".ts.") {
            "attention(B=batch,H=4,"
        } else {
            "masked_attention(B=batch,H=4,"
        };
        let fused = t.iter().any(|(w, c)| w.starts_with(op) && *c == 2);
        let softmax = t.iter().any(|(w, _)| w.starts_with("softmax("));
        assert!(fused && !softmax, "{file}: {t:#?}");
    }
}

/// `MatMul(x, Transpose(W))` with `W` too large to fold (GPT-2's tied LM head as the
/// dynamo exporter writes it): one dense kernel whose `W` is laid out in panels from
/// its `[N, K]` source (no transpose; N = 300 pads the last panel), and the fused run
/// agrees with the reference executor, at several lengths.
#[test]
fn a_transposed_constant_weight_is_laid_out_from_its_source() {
    use anyshape_graph::{exec, Graph, Input};
    use anyshape_ir::Expr;
    use anyshape_tensor::{DType, Node, Tensor};
    let (n, k) = (300usize, 250usize); // n·k > FOLD_LIMIT
    assert!(n * k > anyshape_tensor::FOLD_LIMIT);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 97.0)
        .collect();
    let node = |name: &str, op: &str, inputs: Vec<usize>, out: usize| Node {
        name: name.into(),
        op: op.into(),
        inputs: inputs.into_iter().map(Some).collect(),
        outputs: vec![out],
        attrs: Default::default(),
    };
    let g = Graph {
        values: ["x", "w", "wt", "y"].map(String::from).to_vec(),
        nodes: vec![
            node("t", "Transpose", vec![1], 2),
            node("mm", "MatMul", vec![0, 2], 3),
        ],
        inputs: vec![Input {
            value: 0,
            dtype: DType::F32,
            dims: vec![Expr::var("m"), Expr::Const(k as i64)],
        }],
        outputs: vec![3],
        initializers: [(1, Tensor::f32(vec![n, k], w).unwrap())].into(),
        opset: 17,
        ..Graph::default()
    };
    let facts = infer(&g).unwrap();
    let f = fuse(&g, &facts, anyshape_ir::Precision::F32);
    let kernels: Vec<_> = f
        .steps
        .iter()
        .filter(|s| matches!(s.kind, StepKind::Kernel(_)))
        .collect();
    assert_eq!(kernels.len(), 1, "{:#?}", f.steps);
    assert_eq!(
        kernels[0].kind,
        StepKind::Kernel(
            anyshape_ir::Workload::parse(&format!("dense_packed(M=m,N={n},K={k},P=16)")).unwrap()
        )
    );
    assert_eq!(
        kernels[0].inputs,
        vec![
            (0, Layout::AsIs),
            (
                1,
                Layout::Panels {
                    width: 16,
                    transposed: false,
                    precision: anyshape_ir::Precision::F32,
                    batched: false,
                }
            )
        ]
    );
    steps_cover_each_node_once(&f, g.nodes.len());
    for m in [1usize, 2, 7, 31] {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect();
        let inputs = [("x", Tensor::f32(vec![m, k], x).unwrap())];
        let want = exec::run(&g, &inputs).unwrap();
        let got = common::run_plan(&g, &inputs, anyshape_ir::Precision::F32).unwrap();
        assert_eq!(got[0].shape, vec![m, n]);
        let (a, b) = (got[0].as_f32().unwrap(), want[0].as_f32().unwrap());
        let err = a.iter().zip(b).fold(0f32, |e, (x, y)| e.max((x - y).abs()));
        assert!(err < 1e-4, "m={m}: {err}");
    }
}

/// A constant weight with no output columns (`W` `[k, 0]`, or `[0, k]` transposed by a
/// `Gemm`) lowers to empty panels: the plan runs and gives an empty output, as the
/// reference does, instead of failing to lay the panels out.
#[test]
fn an_empty_weight_lowers_to_empty_panels() {
    use anyshape_graph::{exec, Graph, Input};
    use anyshape_ir::Expr;
    use anyshape_tensor::{DType, Node, Tensor};
    let k = 4usize;
    let g = Graph {
        values: ["x", "w", "y"].map(String::from).to_vec(),
        nodes: vec![Node {
            name: "mm".into(),
            op: "MatMul".into(),
            inputs: vec![Some(0), Some(1)],
            outputs: vec![2],
            attrs: Default::default(),
        }],
        inputs: vec![Input {
            value: 0,
            dtype: DType::F32,
            dims: vec![Expr::var("m"), Expr::Const(k as i64)],
        }],
        outputs: vec![2],
        initializers: [(1, Tensor::f32(vec![k, 0], vec![]).unwrap())].into(),
        opset: 17,
        ..Graph::default()
    };
    let x: Vec<f32> = (0..3 * k).map(|i| i as f32).collect();
    let inputs = [("x", Tensor::f32(vec![3, k], x).unwrap())];
    let want = exec::run(&g, &inputs).unwrap();
    let got = common::run_plan(&g, &inputs, anyshape_ir::Precision::F32).unwrap();
    assert_eq!(got[0].shape, want[0].shape);
    assert_eq!(got[0].shape, vec![3, 0]);
}
