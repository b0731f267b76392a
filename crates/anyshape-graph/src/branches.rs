//! `If` at import: a model's branches inlined into its graph. Where the condition is
//! known when the model is read (shape plumbing, constants — the `If`s of functions
//! expanded for one rank), the taken branch's nodes replace the `If`; where it is known
//! only at run time, both branches run and `anyshape.IfSelect` gives the taken one's
//! values (so a branch that fails at run time fails the run even when not taken).
use crate::graph::Graph;
use crate::infer::infer_upto;
use crate::{GraphError, Result};
use anyshape_tensor::ops::IF_SELECT;
use anyshape_tensor::{Attr, Branch, Node};
use std::collections::BTreeMap;

/// Every node of `nodes` and of their branches, but the `If`s themselves (what the
/// opset check reads).
pub(crate) fn nodes_within<'a>(nodes: &'a [Node], out: &mut Vec<&'a Node>) {
    for n in nodes {
        if n.op != "If" {
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
    while let Some(k) = g.nodes.iter().position(|n| n.op == "If") {
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
            "a graph attribute of an op other than If".into(),
        ));
    }
    Ok(())
}
