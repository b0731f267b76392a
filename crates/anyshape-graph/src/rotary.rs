//! Rotary embeddings as one pass, a rewrite of the graph before fusion: PyTorch's
//! exporters write Hugging Face's `q·cos + rotate_half(q)·sin` (Llama, Mistral, Qwen,
//! GPT-NeoX with a whole-head rotation) as seven nodes —
//!
//! ```text
//! Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, h..d)), Slice(x, 0..h)), sin))
//! ```
//!
//! along `x`'s last axis of constant length `d = 2h` — six passes over the queries
//! and keys of every layer, each a host step. Each such chain becomes one
//! `anyshape.RotateHalf(x, cos, sin)` (`anyshape_tensor::ops`' `rotary.rs`), which
//! computes the same products and sum, element by element, in one pass.
//!
//! A chain is rewritten only where every value inside it has no other use and is no
//! graph output, the slices' bounds and axes are constants, and `cos`, `sin` and both
//! products have (or broadcast to) `x`'s shape; anything else stays as exported.
use crate::graph::Graph;
use crate::infer::{fact, infer};
use crate::Result;
use anyshape_tensor::ops::ROTATE_HALF;
use anyshape_tensor::{DType, Fact, Node, ValueId};
use std::collections::{BTreeMap, BTreeSet};

/// Rewrite every rotary embedding chain of `g` (see the module doc) given the facts of
/// `g`; the facts of the graph rewritten.
pub fn rotate_half(g: &mut Graph, facts: Vec<Option<Fact>>) -> Result<Vec<Option<Fact>>> {
    let mut producer = vec![None; g.values.len()];
    let mut uses = vec![0usize; g.values.len()];
    for (k, n) in g.nodes.iter().enumerate() {
        for &v in &n.outputs {
            producer[v] = Some(k);
        }
        for v in n.inputs.iter().flatten() {
            uses[*v] += 1;
        }
    }
    for &o in &g.outputs {
        uses[o] += 1;
    }
    let chains = Chains {
        g,
        facts: &facts,
        producer,
        uses,
    };
    // Each chain's `Add` and the node that takes its place; the other nodes it covers.
    let mut replaced: BTreeMap<usize, Node> = BTreeMap::new();
    let mut dropped = BTreeSet::new();
    for k in 0..g.nodes.len() {
        if let Some((node, covered)) = chains.at(k) {
            replaced.insert(k, node);
            dropped.extend(covered);
        }
    }
    if replaced.is_empty() {
        return Ok(facts);
    }
    let old = std::mem::take(&mut g.nodes);
    g.nodes = old
        .into_iter()
        .enumerate()
        .filter(|(k, _)| !dropped.contains(k))
        .map(|(k, n)| replaced.remove(&k).unwrap_or(n))
        .collect();
    infer(g)
}

/// The graph, its facts, and who makes and reads each value.
struct Chains<'a> {
    g: &'a Graph,
    facts: &'a [Option<Fact>],
    producer: Vec<Option<usize>>,
    /// Reads by nodes, and one more for a graph output.
    uses: Vec<usize>,
}

impl Chains<'_> {
    /// The node making `v`, if it has op type `op` and `v` is read once (by the chain).
    fn inner(&self, v: ValueId, op: &str) -> Option<usize> {
        let k = self.producer[v]?;
        (self.g.nodes[k].op == op && self.uses[v] == 1 && self.g.nodes[k].outputs.len() == 1)
            .then_some(k)
    }

    /// The chain whose `Add` is node `k`, as its `anyshape.RotateHalf` and the other
    /// nodes it covers.
    fn at(&self, k: usize) -> Option<(Node, [usize; 6])> {
        let add = &self.g.nodes[k];
        let (&[Some(p), Some(q)], &[y]) = (add.inputs.as_slice(), add.outputs.as_slice()) else {
            return None;
        };
        if add.op != "Add" {
            return None;
        }
        [(p, q), (q, p)].into_iter().find_map(|(direct, turned)| {
            let (m1, m2) = (self.inner(direct, "Mul")?, self.inner(turned, "Mul")?);
            let (concat, sin) = self.operands(m2, |v| self.inner(v, "Concat"))?;
            let (x, neg, lo, hi) = self.rotate_half(concat)?;
            let (_, cos) = self.operands(m1, |v| (v == x).then_some(()))?;
            let fx = fact(self.facts, x);
            let same = |v: ValueId| fact(self.facts, v).shape == fx.shape;
            let table = |v: ValueId| {
                let f = fact(self.facts, v);
                f.dtype == DType::F32 && f.rank() <= fx.rank()
            };
            if !(same(y) && same(direct) && same(turned) && table(cos) && table(sin)) {
                return None;
            }
            let node = Node {
                name: add.name.clone(),
                op: ROTATE_HALF.into(),
                inputs: vec![Some(x), Some(cos), Some(sin)],
                outputs: vec![y],
                attrs: Default::default(),
            };
            Some((node, [m1, m2, concat, neg, lo, hi]))
        })
    }

    /// The operands of binary node `k` as (the one `pick` accepts, with what it gives;
    /// the other).
    fn operands<T>(&self, k: usize, pick: impl Fn(ValueId) -> Option<T>) -> Option<(T, ValueId)> {
        match self.g.nodes[k].inputs.as_slice() {
            &[Some(a), Some(b)] => pick(a).map(|t| (t, b)).or_else(|| pick(b).map(|t| (t, a))),
            _ => None,
        }
    }

    /// Concat node `k` as `rotate_half(x)`: `x` and the `Neg`, low-half and high-half
    /// `Slice` nodes.
    fn rotate_half(&self, k: usize) -> Option<(ValueId, usize, usize, usize)> {
        let concat = &self.g.nodes[k];
        let &[Some(negated), Some(low)] = concat.inputs.as_slice() else {
            return None;
        };
        let neg = self.inner(negated, "Neg")?;
        let hi = self.inner(self.g.nodes[neg].input(0).ok()?, "Slice")?;
        let lo = self.inner(low, "Slice")?;
        let x = self.g.nodes[hi].input(0).ok()?;
        let fx = fact(self.facts, x);
        let rank = fx.rank() as i64;
        let d = fx.shape.last()?.as_const()?;
        let last = |axis: i64| axis == rank - 1 || axis == -1;
        if fx.dtype != DType::F32
            || d <= 0
            || d % 2 != 0
            || !last(concat.int("axis", 0).ok()?)
            || self.g.nodes[lo].input(0).ok()? != x
            || self.slice(hi, rank, d)? != (d / 2, d)
            || self.slice(lo, rank, d)? != (0, d / 2)
        {
            return None;
        }
        Some((x, neg, lo, hi))
    }

    /// Slice node `k` (opset 10's form: bounds as inputs) as the bounds it takes along
    /// the last axis of an input of rank `rank` whose last axis is `d` long, with step 1.
    fn slice(&self, k: usize, rank: i64, d: i64) -> Option<(i64, i64)> {
        let n = &self.g.nodes[k];
        let one = |i: usize| -> Option<Option<i64>> {
            match n.optional_input(i) {
                None => Some(None),
                Some(v) => match fact(self.facts, v).value.as_ref()?.as_i64().ok()? {
                    &[x] => Some(Some(x)),
                    _ => None,
                },
            }
        };
        let (start, end) = (one(1)??, one(2)??);
        let axis = one(3)?.unwrap_or(0);
        if !n.attrs.is_empty() || (axis != rank - 1 && axis != -1) || one(4)?.unwrap_or(1) != 1 {
            return None;
        }
        let clamp = |b: i64| if b < 0 { b + d } else { b }.clamp(0, d);
        Some((clamp(start), clamp(end)))
    }
}
