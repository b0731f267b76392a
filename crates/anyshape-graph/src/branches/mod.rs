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
//!
//! The `If`s and the driver are here; `unroll.rs` unrolls `Scan` and `Loop`,
//! `flex_attention.rs` expands `FlexAttention`.
mod flex_attention;
mod unroll;

use crate::graph::Graph;
use crate::infer::Partial;
use crate::{GraphError, Result};
use anyshape_tensor::ops::IF_SELECT;
use anyshape_tensor::{Attr, Branch, Node};
use flex_attention::expand_flex_attention;
use std::collections::BTreeMap;
use unroll::{unroll_loop, unroll_scan};

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

/// A copy of subgraph `b` (see [`renamed`]) appended to `out`; the values it gives.
fn copy_of(
    g: &mut Graph,
    b: &Branch,
    suffix: &str,
    map: &mut BTreeMap<usize, usize>,
    out: &mut Vec<Node>,
) -> Vec<usize> {
    out.extend(renamed(g, &b.nodes, suffix, map));
    b.outputs.iter().map(|v| *map.get(v).unwrap_or(v)).collect()
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
