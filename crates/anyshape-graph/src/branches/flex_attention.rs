//! `FlexAttention` (the `ai.onnx.preview` domain) expanded at import into the default
//! domain's ops (see the parent module's doc).
use super::{constant, copy_of, Emit};
use crate::graph::Graph;
use crate::Result;
use anyshape_tensor::{Attr, Fact, Node};
use std::collections::BTreeMap;

/// The nodes that replace the `FlexAttention` at `k` (see the parent module's doc).
/// `facts`: those of the values the nodes before it make.
pub(super) fn expand_flex_attention(
    g: &mut Graph,
    k: usize,
    facts: &[Option<Fact>],
) -> Result<Vec<Node>> {
    use anyshape_tensor::Tensor;
    let node = g.nodes[k].clone();
    let (q, key, v) = (node.input(0)?, node.input(1)?, node.input(2)?);
    if node
        .attrs
        .get("softmax_precision")
        .is_some_and(|a| *a != Attr::Int(1))
    {
        return Err(node.error("a softmax precision other than float32").into());
    }
    let shape = |v: usize| -> Result<Vec<anyshape_ir::Expr>> {
        match facts[v].as_ref() {
            Some(f) if f.rank() == 4 => Ok(f.shape.clone()),
            _ => Err(node.error("Q, K and V must be of rank 4").into()),
        }
    };
    let (qs, ks, vs) = (shape(q)?, shape(key)?, shape(v)?);
    let known = |e: &anyshape_ir::Expr, what: &str| -> Result<i64> {
        e.as_const().ok_or_else(|| {
            node.error(format!("the {what} must be known when the model is read"))
                .into()
        })
    };
    let (hq, e) = (known(&qs[1], "query heads")?, known(&qs[3], "head size")?);
    let (hkv, ev) = (
        known(&ks[1], "key heads")?,
        known(&vs[3], "value head size")?,
    );
    if hkv <= 0 || hq % hkv != 0 || vs[1] != ks[1] {
        return Err(node
            .error("the query heads must be a multiple of the key and value heads")
            .into());
    }
    let scale = match node.attrs.get("scale") {
        Some(Attr::Float(s)) => *s,
        _ => 1.0 / (e as f32).sqrt(),
    };
    let mut at = Emit {
        name: node.name.clone(),
        nodes: Vec::new(),
    };
    // Grouped heads: each key and value head repeated for its query heads.
    let repeat = hq / hkv;
    let aligned =
        |g: &mut Graph, at: &mut Emit, x: usize, size: i64, what: &str| -> Result<usize> {
            if repeat == 1 {
                return Ok(x);
            }
            let grown = at.op(
                g,
                "Unsqueeze",
                vec![x],
                vec![("axes", Attr::Ints(vec![2]))],
                &format!("{what} with a repeat axis"),
            );
            let reps = constant(
                g,
                format!("{} {what} repeats", at.name),
                Tensor::i64(vec![5], vec![1, 1, repeat, 1, 1])?,
            );
            let tiled = at.op(
                g,
                "Tile",
                vec![grown, reps],
                vec![],
                &format!("{what} repeated"),
            );
            let target = constant(
                g,
                format!("{} {what} shape", at.name),
                Tensor::i64(vec![4], vec![0, hq, -1, size])?,
            );
            Ok(at.op(
                g,
                "Reshape",
                vec![tiled, target],
                vec![],
                &format!("{what} per query head"),
            ))
        };
    let key = aligned(g, &mut at, key, e, "keys")?;
    let v = aligned(g, &mut at, v, ev, "values")?;
    let root = constant(
        g,
        format!("{} root of the scale", at.name),
        Tensor::f32(vec![], vec![scale.sqrt()])?,
    );
    let q = at.op(g, "Mul", vec![q, root], vec![], "queries scaled");
    let key = at.op(g, "Mul", vec![key, root], vec![], "keys scaled");
    let kt = at.op(
        g,
        "Transpose",
        vec![key],
        vec![("perm", Attr::Ints(vec![0, 1, 3, 2]))],
        "keys transposed",
    );
    let scores = at.op(g, "MatMul", vec![q, kt], vec![], "scores");
    // A modifier subgraph applied to `x`: its nodes, its input read as `x`.
    let modify = |g: &mut Graph, at: &mut Emit, key: &str, x: usize| -> Result<usize> {
        let Some(Attr::Branch(b)) = node.attrs.get(key) else {
            return Ok(x);
        };
        if b.inputs.len() != 1 || b.outputs.len() != 1 {
            return Err(node
                .error(format!("`{key}` must take one tensor and give one"))
                .into());
        }
        let mut map = BTreeMap::from([(b.inputs[0], x)]);
        Ok(copy_of(g, b, " (inlined)", &mut map, &mut at.nodes)[0])
    };
    let scores = modify(g, &mut at, "score_mod", scores)?;
    let probs = at.op(
        g,
        "Softmax",
        vec![scores],
        vec![("axis", Attr::Int(-1))],
        "probabilities",
    );
    let probs = modify(g, &mut at, "prob_mod", probs)?;
    let mut out = at.nodes;
    out.push(Node {
        name: format!("{} context", node.name),
        op: "MatMul".into(),
        inputs: vec![Some(probs), Some(v)],
        outputs: vec![node.outputs[0]],
        attrs: BTreeMap::new(),
    });
    Ok(out)
}
