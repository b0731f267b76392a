//! Symbolic shape propagation (TSCompiler §4.1): a [`Fact`] for every value of a graph,
//! node by node — shapes as expressions over the shape vars, shape plumbing folded into
//! expressions, small constant subgraphs evaluated. What is left for run time is the
//! evaluation of expressions — and the run-time dims (`Expr::runtime_dim`) of ops whose
//! shapes only their evaluation tells; an op or a shape that cannot be handled is an error that
//! names the node, the op and what could not be inferred.
use crate::graph::Graph;
use crate::{GraphError, Result};
use anyshape_ir::Expr;
use anyshape_tensor::ops::{op, unsupported};
use anyshape_tensor::{Fact, TensorRef, ValueId, FOLD_LIMIT};

/// The facts of every value of `g`, by value id (`None` for values no node makes).
pub fn infer(g: &Graph) -> Result<Vec<Option<Fact>>> {
    let mut p = Partial::default();
    p.extend(g, g.nodes.len())?;
    let facts = p.facts;
    for &o in &g.outputs {
        if facts[o].is_none() {
            return Err(GraphError::Format(format!(
                "graph output `{}` has no value",
                g.values[o]
            )));
        }
    }
    Ok(facts)
}

/// Facts of a graph as far as its first `done` nodes, extended as the graph grows past
/// them (the inlining of control flow splices nodes in after those).
#[derive(Default)]
pub(crate) struct Partial {
    /// By value id.
    pub(crate) facts: Vec<Option<Fact>>,
    done: usize,
}

impl Partial {
    /// The facts up to node `upto` of `g`, whose first `done` nodes have not changed
    /// (its new values and constants taken in).
    pub(crate) fn extend(&mut self, g: &Graph, upto: usize) -> Result<()> {
        let facts = &mut self.facts;
        facts.resize(g.values.len(), None);
        for (&id, t) in &g.initializers {
            if facts[id].is_none() {
                facts[id] = Some(Fact::known(t.clone()));
            }
        }
        for i in &g.inputs {
            if facts[i.value].is_none() {
                facts[i.value] = Some(Fact::new(i.dtype, i.dims.clone()));
            }
        }
        infer_nodes(g, facts, self.done..upto)?;
        self.done = upto;
        Ok(())
    }
}

/// The facts the nodes `range` of `g` make, into `facts`.
fn infer_nodes(g: &Graph, facts: &mut [Option<Fact>], range: std::ops::Range<usize>) -> Result<()> {
    for node in &g.nodes[range] {
        let spec = op(&node.op).ok_or_else(|| unsupported(node))?;
        let ins: Vec<Option<&Fact>> = node
            .inputs
            .iter()
            .map(|i| i.and_then(|id| facts[id].as_ref()))
            .collect();
        // Constant subgraphs are evaluated: every input known and small, and every
        // output small (its shape inferred first, so nothing large is ever allocated).
        let known: Option<Vec<Option<TensorRef>>> = node
            .inputs
            .iter()
            .map(|i| match i {
                None => Some(None),
                Some(id) => facts[*id]
                    .as_ref()
                    .and_then(|f| f.value.as_ref())
                    .filter(|t| t.len() <= FOLD_LIMIT)
                    .map(|t| Some(t.view())),
            })
            .collect();
        let inferred = (spec.infer)(node, &ins);
        let small = |outs: &[Fact]| {
            outs.iter().all(|f| {
                f.const_shape()
                    .is_some_and(|s| anyshape_tensor::numel(&s).is_ok_and(|n| n <= FOLD_LIMIT))
            })
        };
        let outs = match (known, inferred) {
            (Some(tensors), Ok(outs)) if small(&outs) && outs.iter().any(|f| f.value.is_none()) => {
                (spec.eval)(node, &tensors)?
                    .into_iter()
                    .map(Fact::known)
                    .collect()
            }
            (_, Ok(outs)) => outs,
            (Some(tensors), Err(_)) => (spec.eval)(node, &tensors)?
                .into_iter()
                .map(Fact::known)
                .collect(),
            (None, Err(e)) => return Err(e.into()),
        };
        if outs.len() < node.outputs.len() {
            return Err(node
                .error(format!(
                    "{} outputs inferred for {} outputs",
                    outs.len(),
                    node.outputs.len()
                ))
                .into());
        }
        for (&id, mut f) in node.outputs.iter().zip(outs) {
            // Shape plumbing over run-time dims is computed by its steps, not kept as
            // expressions for the run to evaluate before the steps.
            if f.sym
                .as_ref()
                .is_some_and(|s| s.iter().any(Expr::has_runtime_dims))
            {
                f.sym = None;
            }
            facts[id] = Some(f);
        }
    }
    Ok(())
}

/// The fact of value `v`, which [`infer`] made.
pub fn fact(facts: &[Option<Fact>], v: ValueId) -> &Fact {
    facts[v]
        .as_ref()
        .expect("infer makes a fact for every value a node makes")
}
