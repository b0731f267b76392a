//! The rotary embeddings' rewrite (`rotate_half`): every exported chain of both
//! exporters' Llama-style decoders becomes one `anyshape.RotateHalf` whose outputs are
//! the chain's to the bit, and a chain that is not exactly the rotation (a value
//! inside it read elsewhere, the halves the other way round, bounds off the half) is
//! left as exported.
use anyshape_graph::{exec, infer, onnx, rotate_half, Graph, Input};
use anyshape_ir::Expr;
use anyshape_tensor::ops::ROTATE_HALF;
use anyshape_tensor::{Attr, DType, Node, Tensor};
use std::path::Path;

fn count(g: &Graph, op: &str) -> usize {
    g.nodes.iter().filter(|n| n.op == op).count()
}

fn rewritten(g: &Graph) -> Graph {
    let mut r = g.clone();
    let facts = infer(&r).unwrap();
    rotate_half(&mut r, facts).unwrap();
    r
}

fn same_bits(a: &[Tensor], b: &[Tensor], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.shape, y.shape, "{what}");
        if let (Ok(p), Ok(q)) = (x.as_f32(), y.as_f32()) {
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert!(bits(p) == bits(q), "{what}: outputs differ");
        }
    }
}

/// Two layers, queries and keys each: four chains, no `Neg` left, and the recorded
/// cases' outputs (logits and caches) bit for bit the exported graph's.
#[test]
fn llama_rotary_embeddings_become_one_pass_each() {
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    for (model, case) in [
        ("llama_tiny.ts", "s37"),
        ("llama_tiny.dynamo18", "b3s17"),
        ("llama_tiny_past.ts", "p5s3"),
        ("llama_tiny_past.dynamo18", "p37s1"),
    ] {
        let g = onnx::load(&models.join(format!("{model}.onnx"))).unwrap();
        assert_eq!(count(&g, "Neg"), 4, "{model}");
        let r = rewritten(&g);
        assert_eq!(count(&r, ROTATE_HALF), 4, "{model}");
        assert_eq!(count(&r, "Neg"), 0, "{model}");
        assert_eq!(r.nodes.len(), g.nodes.len() - 4 * 6, "{model}");
        let arrays =
            anyshape_tensor::npz::read(&models.join(format!("{model}.{case}.npz"))).unwrap();
        let inputs: Vec<(&str, Tensor)> = g
            .inputs
            .iter()
            .map(|i| {
                let name = g.values[i.value].as_str();
                let t = arrays.iter().find(|(n, _)| n == name).unwrap();
                (name, t.1.clone())
            })
            .collect();
        same_bits(
            &exec::run(&r, &inputs).unwrap(),
            &exec::run(&g, &inputs).unwrap(),
            model,
        );
    }
}

/// A chain over `x` `[s, 6]` with tables `[s, 6]` (`cos`, `sin`) or broadcast along
/// the rows (`[1, 6]`); `edit` changes it before the graph is made.
fn chain(table_rows: Expr, edit: impl FnOnce(&mut Vec<Node>, &mut Vec<usize>)) -> Graph {
    let values = [
        "x", "cos", "sin", "xc", "hi", "lo", "neg", "turned", "ts", "y", "c0", "c3", "c6", "axis",
    ];
    let node = |op: &str, inputs: &[usize], out: usize| Node {
        name: values[out].into(),
        op: op.into(),
        inputs: inputs.iter().map(|&v| Some(v)).collect(),
        outputs: vec![out],
        attrs: Default::default(),
    };
    let mut concat = node("Concat", &[6, 5], 7);
    concat.attrs.insert("axis".into(), Attr::Int(-1));
    let mut nodes = vec![
        node("Mul", &[0, 1], 3),
        node("Slice", &[0, 11, 12, 13], 4),
        node("Slice", &[0, 10, 11, 13], 5),
        node("Neg", &[4], 6),
        concat,
        node("Mul", &[2, 7], 8),
        node("Add", &[3, 8], 9),
    ];
    let mut outputs = vec![9];
    edit(&mut nodes, &mut outputs);
    let one = |v: i64| Tensor::i64(vec![1], vec![v]).unwrap();
    let input = |value: usize, rows: Expr| Input {
        value,
        dtype: DType::F32,
        dims: vec![rows, Expr::Const(6)],
    };
    Graph {
        values: values.map(String::from).to_vec(),
        nodes,
        inputs: vec![
            input(0, Expr::var("s")),
            input(1, table_rows.clone()),
            input(2, table_rows),
        ],
        outputs,
        initializers: [
            (10, one(0)),
            (11, one(3)),
            (12, one(i64::MAX)),
            (13, one(-1)),
        ]
        .into(),
        opset: 17,
        ..Graph::default()
    }
}

fn run(g: &Graph, s: usize, table_rows: usize) -> Vec<Tensor> {
    let data = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin() * 3.0).collect();
    let t = |rows: usize, k: f32| Tensor::f32(vec![rows, 6], data(rows * 6, k)).unwrap();
    let inputs = [
        ("x", t(s, 0.71)),
        ("cos", t(table_rows, 0.13)),
        ("sin", t(table_rows, 0.29)),
    ];
    exec::run(g, &inputs).unwrap()
}

#[test]
fn a_hand_made_chain_is_rewritten_and_agrees() {
    for (rows, broadcast) in [(Expr::var("s"), false), (Expr::Const(1), true)] {
        let g = chain(rows, |_, _| {});
        let r = rewritten(&g);
        assert_eq!(r.nodes.len(), 1, "{:?}", r.nodes);
        assert_eq!(r.nodes[0].op, ROTATE_HALF);
        for s in [1, 2, 7, 31, 700] {
            let t = if broadcast { 1 } else { s };
            same_bits(&run(&r, s, t), &run(&g, s, t), &format!("s={s}"));
        }
    }
}

#[test]
fn chains_that_are_not_the_rotation_stay() {
    type Edit = Box<dyn FnOnce(&mut Vec<Node>, &mut Vec<usize>)>;
    let cases: [(&str, Edit); 4] = [
        ("the negated half is an output", Box::new(|_, o| o.push(6))),
        (
            "the halves the other way round",
            Box::new(|n, _| n[4].inputs = vec![Some(5), Some(6)]),
        ),
        (
            "the low half of another tensor",
            Box::new(|n, _| n[2].inputs[0] = Some(1)),
        ),
        ("a difference", Box::new(|n, _| n[6].op = "Sub".into())),
    ];
    for (what, edit) in cases {
        let g = chain(Expr::var("s"), edit);
        infer(&g).unwrap_or_else(|e| panic!("{what}: {e}"));
        let r = rewritten(&g);
        assert_eq!(count(&r, ROTATE_HALF), 0, "{what}");
        assert_eq!(r.nodes.len(), g.nodes.len(), "{what}");
    }
}
