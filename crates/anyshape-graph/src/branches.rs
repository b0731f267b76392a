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
use crate::graph::Graph;
use crate::infer::infer_upto;
use crate::{GraphError, Result};
use anyshape_tensor::ops::IF_SELECT;
use anyshape_tensor::{Attr, Branch, Node};
use std::collections::BTreeMap;

/// The ops inlined here.
const INLINED: &[&str] = &["If", "Scan"];

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
    while let Some(k) = g
        .nodes
        .iter()
        .position(|n| INLINED.contains(&n.op.as_str()))
    {
        if g.nodes[k].op == "Scan" {
            let spliced = unroll_scan(g, k)?;
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
        let facts = infer_upto(g, k)?;
        let known = match facts[cond].as_ref().and_then(|f| f.value.as_ref()) {
            None => None,
            Some(t) => match t.as_bool().map_err(|e| node.error(e))? {
                [c] => Some(*c),
                _ => return Err(node.error("the condition must be one boolean").into()),
            },
        };
        let mut spliced = Vec::new();
        match known {
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
            "a graph attribute of an op other than If and Scan".into(),
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
fn unroll_scan(g: &mut Graph, k: usize) -> Result<Vec<Node>> {
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
    let facts = infer_upto(g, k)?;
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
