//! Control flow at import: a model's subgraphs inlined into its graph.
//!
//! - `If`: where the condition is known when the model is read (shape plumbing,
//!   constants — the `If`s of functions expanded for one rank), the taken branch's nodes
//!   replace it; where it is known only at run time, both branches run and
//!   `anyshape.IfSelect` gives the taken one's values (so a branch that fails at run time
//!   fails the run even when not taken).
//! - `Scan` (opset 9 on): unrolled over its scan axis, whose extent must be known when
//!   the model is read — each iteration a copy of the body (its own values renamed)
//!   on the slices `Gather` takes, its scan outputs `Unsqueeze`d and concatenated. A scan
//!   over an extent only the run knows is refused.
//! - `Loop`: unrolled where its trip count is known when the model is read and its
//!   body passes its condition through unchanged (a `for` loop); a trip count or a
//!   condition only the run knows is refused.
//! - `FlexAttention` (the `ai.onnx.preview` domain): expanded into the default domain's
//!   ops as its reference computes it — keys and values repeated to the query heads,
//!   both operands scaled by the square root of the scale, the scores' `MatMul`, its
//!   `score_mod` subgraph inlined on them, `Softmax`, its `prob_mod` inlined, the
//!   `MatMul` with the values.
use crate::graph::Graph;
use crate::infer::Partial;
use crate::{GraphError, Result};
use anyshape_tensor::ops::IF_SELECT;
use anyshape_tensor::Fact;
use anyshape_tensor::{Attr, Branch, Node};
use std::collections::BTreeMap;

/// The ops inlined here.
const INLINED: &[&str] = &["If", "Scan", "Loop", "FlexAttention"];

/// The most nodes an unrolled `Scan` may make.
const MAX_UNROLLED: usize = 1 << 17;

/// Every node of `nodes` and of their subgraphs, but the inlined ops themselves (what
/// the opset check reads).
pub(crate) fn nodes_within<'a>(nodes: &'a [Node], out: &mut Vec<&'a Node>) {
    for n in nodes {
        if !INLINED.contains(&n.op.as_str()) {
            out.push(n);
        }
        for a in n.attrs.values() {
            if let Attr::Branch(b) = a {
                nodes_within(&b.nodes, out);
            }
        }
    }
}

/// Inline every `If` of `g` (and of its branches), first to last.
pub(crate) fn inline(g: &mut Graph) -> Result<()> {
    // The facts before each inlined op: the nodes before it never change.
    let mut known = Partial::default();
    while let Some(k) = g
        .nodes
        .iter()
        .position(|n| INLINED.contains(&n.op.as_str()))
    {
        known.extend(g, k)?;
        if g.nodes[k].op != "If" {
            let spliced = match g.nodes[k].op.as_str() {
                "Scan" => unroll_scan(g, k, &known.facts)?,
                "Loop" => unroll_loop(g, k, &known.facts)?,
                _ => expand_flex_attention(g, k, &known.facts)?,
            };
            g.nodes.splice(k..k + 1, spliced);
            continue;
        }
        let node = g.nodes[k].clone();
        let branch = |key: &str| -> Result<Branch> {
            match node.attrs.get(key) {
                Some(Attr::Branch(b)) if b.outputs.len() == node.outputs.len() => Ok((**b).clone()),
                _ => Err(node
                    .error(format!(
                        "`{key}` must be a graph giving the {} outputs",
                        node.outputs.len()
                    ))
                    .into()),
            }
        };
        let (then, other) = (branch("then_branch")?, branch("else_branch")?);
        let cond = node.input(0)?;
        let value = match known.facts[cond].as_ref().and_then(|f| f.value.as_ref()) {
            None => None,
            Some(t) => match t.as_bool().map_err(|e| node.error(e))? {
                [c] => Some(*c),
                _ => return Err(node.error("the condition must be one boolean").into()),
            },
        };
        let mut spliced = Vec::new();
        match value {
            Some(c) => {
                let taken = if c { then } else { other };
                spliced.extend(taken.nodes);
                for (i, (&o, &src)) in node.outputs.iter().zip(&taken.outputs).enumerate() {
                    spliced.push(Node {
                        name: format!("{} output {i}", node.name),
                        op: "Identity".into(),
                        inputs: vec![Some(src)],
                        outputs: vec![o],
                        attrs: BTreeMap::new(),
                    });
                }
            }
            None => {
                let inputs = std::iter::once(cond)
                    .chain(then.outputs.iter().copied())
                    .chain(other.outputs.iter().copied())
                    .map(Some)
                    .collect();
                spliced.extend(then.nodes);
                spliced.extend(other.nodes);
                spliced.push(Node {
                    name: node.name.clone(),
                    op: IF_SELECT.into(),
                    inputs,
                    outputs: node.outputs.clone(),
                    attrs: BTreeMap::new(),
                });
            }
        }
        g.nodes.splice(k..k + 1, spliced);
    }
    if g.nodes
        .iter()
        .any(|n| n.attrs.values().any(|a| matches!(a, Attr::Branch(_))))
    {
        return Err(GraphError::Unsupported(
            "a graph attribute of an op other than If, Scan, Loop and FlexAttention".into(),
        ));
    }
    Ok(())
}

/// A new value of `g` named `name`.
fn fresh(g: &mut Graph, name: String) -> usize {
    g.values.push(name);
    g.values.len() - 1
}

/// A node of one input and output.
fn unary(name: String, op: &str, input: usize, output: usize, attrs: Vec<(&str, Attr)>) -> Node {
    Node {
        name,
        op: op.into(),
        inputs: vec![Some(input)],
        outputs: vec![output],
        attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    }
}

/// `nodes` copied with every value they define (node outputs, subgraph inputs) a new
/// one named with `suffix`, `map` holding the renaming (and, on entry, the values to
/// read in place of others).
fn renamed(
    g: &mut Graph,
    nodes: &[Node],
    suffix: &str,
    map: &mut BTreeMap<usize, usize>,
) -> Vec<Node> {
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        let inputs = n
            .inputs
            .iter()
            .map(|i| i.map(|v| *map.get(&v).unwrap_or(&v)))
            .collect();
        let attrs = n
            .attrs
            .iter()
            .map(|(k, a)| {
                let a = match a {
                    Attr::Branch(b) => {
                        for &v in &b.inputs {
                            let name = format!("{}{suffix}", g.values[v]);
                            map.insert(v, fresh(g, name));
                        }
                        let inputs = b.inputs.iter().map(|v| map[v]).collect();
                        let nodes = renamed(g, &b.nodes, suffix, map);
                        let outputs = b.outputs.iter().map(|v| *map.get(v).unwrap_or(v)).collect();
                        Attr::Branch(Box::new(Branch {
                            inputs,
                            nodes,
                            outputs,
                        }))
                    }
                    other => other.clone(),
                };
                (k.clone(), a)
            })
            .collect();
        let outputs = n
            .outputs
            .iter()
            .map(|&v| {
                let name = format!("{}{suffix}", g.values[v]);
                let id = fresh(g, name);
                map.insert(v, id);
                id
            })
            .collect();
        out.push(Node {
            name: format!("{}{suffix}", n.name),
            op: n.op.clone(),
            inputs,
            outputs,
            attrs,
        });
    }
    out
}

/// The nodes that replace the `Scan` at `k`: its body unrolled over the scan axis.
/// `facts`: those of the values the nodes before it make.
fn unroll_scan(g: &mut Graph, k: usize, facts: &[Option<Fact>]) -> Result<Vec<Node>> {
    let node = g.nodes[k].clone();
    if g.opset < 9 {
        return Err(GraphError::Unsupported(format!(
            "node `{}`: Scan before opset 9 (batch-major, with sequence lengths) is not implemented",
            node.name
        )));
    }
    let body = match node.attrs.get("body") {
        Some(Attr::Branch(b)) => (**b).clone(),
        _ => return Err(node.error("`body` must be a graph").into()),
    };
    let m = node.int("num_scan_inputs", 0)?;
    let n_in = node.inputs.len();
    let m = usize::try_from(m)
        .ok()
        .filter(|&m| m >= 1 && m <= n_in)
        .ok_or_else(|| node.error(format!("num_scan_inputs {m} for {n_in} inputs")))?;
    let states = n_in - m;
    let scans_out = node
        .outputs
        .len()
        .checked_sub(states)
        .ok_or_else(|| node.error("fewer outputs than states"))?;
    if body.inputs.len() != n_in || body.outputs.len() != node.outputs.len() {
        return Err(node.error("the body takes the states and a slice of each scan input, and gives the states and a slice of each scan output").into());
    }
    let list = |name: &str, len: usize| -> Result<Vec<i64>> {
        let v = node.ints(name)?.unwrap_or_else(|| vec![0; len]);
        match v.len() == len {
            true => Ok(v),
            false => Err(node.error(format!("`{name}` needs {len} values")).into()),
        }
    };
    let (in_axes, in_dirs) = (
        list("scan_input_axes", m)?,
        list("scan_input_directions", m)?,
    );
    let (out_axes, out_dirs) = (
        list("scan_output_axes", scans_out)?,
        list("scan_output_directions", scans_out)?,
    );
    // The scan axis's extent, which every scan input shares.
    let mut steps = None;
    let mut axes = Vec::with_capacity(m);
    for (&input, &axis) in node.inputs[states..].iter().zip(&in_axes) {
        let v = input.ok_or_else(|| node.error("a scan input is left out"))?;
        let f = facts[v]
            .as_ref()
            .ok_or_else(|| node.error("a scan input without a value"))?;
        let r = f.rank() as i64;
        let a = match axis {
            a if (0..r).contains(&a) => a as usize,
            a if (-r..0).contains(&a) => (a + r) as usize,
            a => return Err(node.error(format!("scan axis {a} for rank {r}")).into()),
        };
        let t = f.shape[a].as_const().ok_or_else(|| {
            GraphError::Unsupported(format!(
                "node `{}`: a Scan over an extent known only at run time ({}) cannot be unrolled",
                node.name, f.shape[a]
            ))
        })?;
        if steps.is_some_and(|s| s != t) {
            return Err(node
                .error("scan inputs of different extents along their axes")
                .into());
        }
        steps = Some(t);
        axes.push(a);
    }
    let steps = steps.unwrap_or(0) as usize;
    if steps == 0 || steps.saturating_mul(body.nodes.len() + m + scans_out) > MAX_UNROLLED {
        return Err(GraphError::Unsupported(format!(
            "node `{}`: a Scan of {steps} iterations of {} nodes (1 to {MAX_UNROLLED} nodes unrolled)",
            node.name,
            body.nodes.len()
        )));
    }
    let mut out = Vec::new();
    let mut state: Vec<usize> = (0..states)
        .map(|i| node.inputs[i].ok_or_else(|| node.error("a state is left out")))
        .collect::<std::result::Result<_, _>>()?;
    let mut pieces: Vec<Vec<usize>> = vec![Vec::new(); scans_out];
    for t in 0..steps {
        let suffix = format!(" (step {t})");
        let mut map = BTreeMap::new();
        for (i, &s) in state.iter().enumerate() {
            map.insert(body.inputs[i], s);
        }
        for j in 0..m {
            let at = if in_dirs[j] != 0 { steps - 1 - t } else { t };
            let index = fresh(g, format!("{} scan index {at}", node.name));
            g.initializers
                .insert(index, anyshape_tensor::Tensor::scalar_i64(at as i64));
            let slice = fresh(g, format!("{}{suffix}", g.values[body.inputs[states + j]]));
            out.push(Node {
                name: format!("{} slice {j}{suffix}", node.name),
                op: "Gather".into(),
                inputs: vec![node.inputs[states + j], Some(index)],
                outputs: vec![slice],
                attrs: [("axis".to_string(), Attr::Int(axes[j] as i64))].into(),
            });
            map.insert(body.inputs[states + j], slice);
        }
        out.extend(renamed(g, &body.nodes, &suffix, &mut map));
        let given: Vec<usize> = body
            .outputs
            .iter()
            .map(|v| *map.get(v).unwrap_or(v))
            .collect();
        state = given[..states].to_vec();
        for (o, &v) in given[states..].iter().enumerate() {
            let grown = fresh(g, format!("{}{suffix} (unsqueezed)", g.values[v]));
            out.push(unary(
                format!("{} output {o}{suffix}", node.name),
                "Unsqueeze",
                v,
                grown,
                vec![("axes", Attr::Ints(vec![out_axes[o]]))],
            ));
            pieces[o].push(grown);
        }
    }
    for (i, &s) in state.iter().enumerate() {
        out.push(unary(
            format!("{} state {i}", node.name),
            "Identity",
            s,
            node.outputs[i],
            vec![],
        ));
    }
    for (o, mut p) in pieces.into_iter().enumerate() {
        if out_dirs[o] != 0 {
            p.reverse();
        }
        out.push(Node {
            name: format!("{} output {o}", node.name),
            op: "Concat".into(),
            inputs: p.into_iter().map(Some).collect(),
            outputs: vec![node.outputs[states + o]],
            attrs: [("axis".to_string(), Attr::Int(out_axes[o]))].into(),
        });
    }
    Ok(out)
}

/// Nodes made for an expansion, each named under the node it replaces.
struct Emit {
    name: String,
    nodes: Vec<Node>,
}

impl Emit {
    /// A node of op `op` on `inputs`, its one output a new value (returned).
    fn op(
        &mut self,
        g: &mut Graph,
        op: &str,
        inputs: Vec<usize>,
        attrs: Vec<(&str, Attr)>,
        what: &str,
    ) -> usize {
        let name = format!("{} {what}", self.name);
        let o = fresh(g, name.clone());
        self.nodes.push(Node {
            name,
            op: op.into(),
            inputs: inputs.into_iter().map(Some).collect(),
            outputs: vec![o],
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        });
        o
    }
}

/// A new constant of `g`.
fn constant(g: &mut Graph, name: String, t: anyshape_tensor::Tensor) -> usize {
    let id = fresh(g, name);
    g.initializers.insert(id, t);
    id
}

/// The nodes that replace the `FlexAttention` at `k` (see the module's doc).
/// `facts`: those of the values the nodes before it make.
fn expand_flex_attention(g: &mut Graph, k: usize, facts: &[Option<Fact>]) -> Result<Vec<Node>> {
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
        at.nodes
            .extend(renamed(g, &b.nodes, " (inlined)", &mut map));
        Ok(*map.get(&b.outputs[0]).unwrap_or(&b.outputs[0]))
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

/// The nodes that replace the `Loop` at `k`: its body unrolled `M` times, `M` its trip
/// count known when the model is read, the body passing its condition through.
/// `facts`: those of the values the nodes before it make.
fn unroll_loop(g: &mut Graph, k: usize, facts: &[Option<Fact>]) -> Result<Vec<Node>> {
    use anyshape_tensor::Tensor;
    let node = g.nodes[k].clone();
    let body = match node.attrs.get("body") {
        Some(Attr::Branch(b)) => (**b).clone(),
        _ => return Err(node.error("`body` must be a graph").into()),
    };
    let carried = node.inputs.len().saturating_sub(2);
    let scans = node
        .outputs
        .len()
        .checked_sub(carried)
        .ok_or_else(|| node.error("fewer outputs than loop-carried values"))?;
    if body.inputs.len() != carried + 2 || body.outputs.len() != carried + 1 + scans {
        return Err(node.error("the body takes the iteration, the condition and the carried values, and gives the condition, the carried values and the scan outputs").into());
    }
    let trips = match node.optional_input(0) {
        None => None,
        Some(m) => match facts[m].as_ref().and_then(|f| f.value.as_ref()) {
            Some(t) => match t.as_i64().map_err(|e| node.error(e))? {
                [m] => Some(*m),
                _ => return Err(node.error("the trip count must be one integer").into()),
            },
            None => return Err(GraphError::Unsupported(format!(
                "node `{}`: a Loop whose trip count is known only at run time cannot be unrolled",
                node.name
            ))),
        },
    };
    // The body must give its condition back unchanged: the loop then runs its trip
    // count where the condition holds, and not at all where it does not.
    let passes = body.outputs[0] == body.inputs[1]
        || body.nodes.iter().any(|n| {
            n.op == "Identity"
                && n.outputs == [body.outputs[0]]
                && n.inputs == [Some(body.inputs[1])]
        });
    let trips = match (trips, passes) {
        (Some(m), true) => m,
        _ => return Err(GraphError::Unsupported(format!(
            "node `{}`: a Loop whose condition its body computes (a while loop) cannot be unrolled",
            node.name
        ))),
    };
    let cond = match node.optional_input(1) {
        None => true,
        Some(c) => match facts[c].as_ref().and_then(|f| f.value.as_ref()) {
            Some(t) => match t.as_bool().map_err(|e| node.error(e))? {
                [c] => *c,
                _ => return Err(node.error("the condition must be one boolean").into()),
            },
            None => return Err(GraphError::Unsupported(format!(
                "node `{}`: a Loop whose condition is known only at run time cannot be unrolled",
                node.name
            ))),
        },
    };
    let steps = if cond { trips.max(0) as usize } else { 0 };
    if (steps == 0 && scans > 0) || steps.saturating_mul(body.nodes.len() + scans) > MAX_UNROLLED {
        return Err(GraphError::Unsupported(format!(
            "node `{}`: a Loop of {steps} iterations of {} nodes (1 to {MAX_UNROLLED} nodes unrolled, at least one with scan outputs)",
            node.name,
            body.nodes.len()
        )));
    }
    let cond_value = constant(
        g,
        format!("{} condition", node.name),
        Tensor::bool(vec![], vec![cond])?,
    );
    let mut state: Vec<usize> = (0..carried)
        .map(|i| node.inputs[2 + i].ok_or_else(|| node.error("a loop-carried value is left out")))
        .collect::<std::result::Result<_, _>>()?;
    let mut out = Vec::new();
    let mut pieces: Vec<Vec<usize>> = vec![Vec::new(); scans];
    for t in 0..steps {
        let suffix = format!(" (iteration {t})");
        let iteration = constant(
            g,
            format!("{} iteration {t}", node.name),
            Tensor::scalar_i64(t as i64),
        );
        let mut map = BTreeMap::from([(body.inputs[0], iteration), (body.inputs[1], cond_value)]);
        for (i, &s) in state.iter().enumerate() {
            map.insert(body.inputs[2 + i], s);
        }
        out.extend(renamed(g, &body.nodes, &suffix, &mut map));
        let given: Vec<usize> = body
            .outputs
            .iter()
            .map(|v| *map.get(v).unwrap_or(v))
            .collect();
        state = given[1..1 + carried].to_vec();
        for (o, &v) in given[1 + carried..].iter().enumerate() {
            let grown = fresh(g, format!("{}{suffix} (unsqueezed)", g.values[v]));
            out.push(unary(
                format!("{} output {o}{suffix}", node.name),
                "Unsqueeze",
                v,
                grown,
                vec![("axes", Attr::Ints(vec![0]))],
            ));
            pieces[o].push(grown);
        }
    }
    for (i, &s) in state.iter().enumerate() {
        out.push(unary(
            format!("{} carried {i}", node.name),
            "Identity",
            s,
            node.outputs[i],
            vec![],
        ));
    }
    for (o, p) in pieces.into_iter().enumerate() {
        out.push(Node {
            name: format!("{} output {o}", node.name),
            op: "Concat".into(),
            inputs: p.into_iter().map(Some).collect(),
            outputs: vec![node.outputs[carried + o]],
            attrs: [("axis".to_string(), Attr::Int(0))].into(),
        });
    }
    Ok(out)
}
