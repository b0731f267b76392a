//! Repeated computations computed once (common subexpressions): a node with the op,
//! attributes and inputs of an earlier one — small constants compared by value — is
//! dropped and its uses read the earlier node's outputs. PyTorch's exporters repeat
//! model-wide work in every layer: BERT's additive attention mask, a `Where` over the
//! same mask and the same two constants, once per layer.
use crate::graph::Graph;
use anyshape_tensor::ValueId;
use std::collections::HashMap;

/// Initializers of at most this many elements are compared by value (scalars and
/// shapes; weights are not compared).
const SMALL: usize = 64;

/// Ops whose outputs differ from one evaluation to the next.
const RANDOM: [&str; 7] = [
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Bernoulli",
    "Multinomial",
    "Dropout",
];

/// Merge `g`'s repeated nodes (see the module doc); how many were dropped. Random ops
/// and the nodes that write a graph output stay; an initializer a caller may override
/// (one that is also a graph input) is never another's equal.
pub fn merge_repeated(g: &mut Graph) -> usize {
    let mut canonical: Vec<ValueId> = (0..g.values.len()).collect();
    let inputs: Vec<ValueId> = g.inputs.iter().map(|i| i.value).collect();
    let small: Vec<_> = g
        .initializers
        .iter()
        .filter(|(v, t)| t.len() <= SMALL && !inputs.contains(v))
        .collect();
    for (i, &(&v, t)) in small.iter().enumerate() {
        if let Some(&(&first, _)) = small[..i].iter().find(|(_, u)| *u == t) {
            canonical[v] = canonical[first];
        }
    }
    let mut kept: Vec<anyshape_tensor::Node> = Vec::with_capacity(g.nodes.len());
    let mut seen: HashMap<(String, Vec<Option<ValueId>>), Vec<usize>> = HashMap::new();
    let mut dropped = 0;
    for mut node in std::mem::take(&mut g.nodes) {
        for i in node.inputs.iter_mut().flatten() {
            *i = canonical[*i];
        }
        let key = (node.op.clone(), node.inputs.clone());
        let mergeable = !RANDOM.contains(&node.op.as_str())
            && !node.outputs.iter().any(|o| g.outputs.contains(o));
        let earlier = seen.get(&key).and_then(|ks| {
            ks.iter().copied().find(|&k| {
                kept[k].attrs == node.attrs && kept[k].outputs.len() == node.outputs.len()
            })
        });
        match earlier {
            Some(k) if mergeable => {
                for (&o, &first) in node.outputs.iter().zip(&kept[k].outputs) {
                    canonical[o] = first;
                }
                dropped += 1;
            }
            _ => {
                seen.entry(key).or_default().push(kept.len());
                kept.push(node);
            }
        }
    }
    g.nodes = kept;
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_tensor::{Data, Node, Tensor};

    fn node(op: &str, inputs: &[ValueId], outputs: &[ValueId]) -> Node {
        Node {
            name: format!("{op}{outputs:?}"),
            op: op.into(),
            inputs: inputs.iter().map(|&v| Some(v)).collect(),
            outputs: outputs.to_vec(),
            attrs: Default::default(),
        }
    }

    /// An `Add` of the same input and an equal constant is computed once and its uses
    /// read the first; a different constant, random ops, and nodes that write graph
    /// outputs stay.
    #[test]
    fn repeated_nodes_are_computed_once() {
        let scalar = |x: f32| Tensor::new(vec![], Data::F32(vec![x])).unwrap();
        // Values: x, three constants (two equal), then the nodes' outputs.
        let (x, zero, zero2, one) = (0, 1, 2, 3);
        let mut g = Graph {
            values: (0..13).map(|v| format!("v{v}")).collect(),
            initializers: [
                (zero, scalar(0.0)),
                (zero2, scalar(0.0)),
                (one, scalar(1.0)),
            ]
            .into_iter()
            .collect(),
            outputs: vec![8, 9, 10, 11, 12],
            ..Graph::default()
        };
        g.inputs.push(crate::graph::Input {
            value: x,
            dtype: anyshape_tensor::DType::F32,
            dims: vec![],
        });
        g.nodes = vec![
            node("Add", &[x, zero], &[4]),
            node("Add", &[x, zero2], &[5]),
            node("Add", &[x, one], &[6]),
            node("Mul", &[4, 6], &[8]),
            node("Mul", &[5, 6], &[7]),
            node("RandomNormalLike", &[x], &[9]),
            node("RandomNormalLike", &[x], &[10]),
            node("Neg", &[7], &[11]),
            node("Neg", &[7], &[12]),
        ];
        // The second Add, then the Mul that it made the first's twin (whose output is
        // a graph output: it stays, the other goes).
        assert_eq!(merge_repeated(&mut g), 2);
        let ops: Vec<(&str, Vec<Option<ValueId>>)> = g
            .nodes
            .iter()
            .map(|n| (n.op.as_str(), n.inputs.clone()))
            .collect();
        assert_eq!(
            ops,
            [
                ("Add", vec![Some(x), Some(zero)]),
                ("Add", vec![Some(x), Some(one)]),
                ("Mul", vec![Some(4), Some(6)]),
                ("RandomNormalLike", vec![Some(x)]),
                ("RandomNormalLike", vec![Some(x)]),
                ("Neg", vec![Some(8)]),
                ("Neg", vec![Some(8)]),
            ]
        );
    }
}
