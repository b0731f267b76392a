//! Multi-head attention's contractions, found around their `MatMul`s with the layout
//! changes and scalings that feed them, so that the kernels read the projections'
//! `[batch, sequence, heads, dim]` tensors in place:
//!
//! - `MatMul(Transpose(Q, [0,2,1,3]), Transpose(K, [0,2,3,1]))` is `attention_scores`,
//!   the product of the constant scales on either side as its first epilogue op. A
//!   transpose may be a chain of them with reshapes between that merge and split axes
//!   (what the dynamo exporter writes): what counts is the permutation it comes to.
//! - `Transpose(MatMul(P, Transpose(V, [0,2,1,3])), [0,2,1,3])` is `attention_context`
//!   (reshapes that keep the shape may come before the last transpose).
//! - A decoder's keys and values come from its cache (`present = Concat(past, new)`) in
//!   the `[batch, heads, sequence, dim]` layout: `MatMul(Transpose(Q, [0,2,1,3]),
//!   Transpose(K, [0,1,3,2]))` is `cache_attention_scores` and `Transpose(MatMul(P, V),
//!   [0,2,1,3])` `cache_attention_context`, which read the cache in place — with room
//!   past its end (`R` = [`CACHE_RESERVE`]) where it is the model's `present` output
//!   (the runtime may then keep it across runs and append to it).
//!
//! - Grouped-query attention (Llama's) repeats each cache head for its group of query
//!   heads (`Reshape(Expand(Unsqueeze(present, 2)))` to `[batch, heads·group,
//!   sequence, dim]`): with queries and probabilities in `[batch, heads, sequence,
//!   dim]`, `MatMul(Q, Transpose(repeated K, [0,1,3,2]))` is
//!   `grouped_cache_attention_scores` and `MatMul(P, repeated V)`
//!   `grouped_cache_attention_context`, which read each cache head in place for its
//!   whole group instead of the repeated copy.
//!
//! In a bf16 fusion the scores are computed in bf16 (`attention_scores_bf16` and the
//! cache and grouped forms: queries and keys rounded in pairs along the head dim, which
//! must be an even constant), as the dense layers round their activations; the
//! context stays `f32` (its reduction, the sequence, may be odd).
//!
//! Every value inside a pattern must have that one use; anything else stays the plain
//! `batch_matmul_nn` and host steps.
use super::{Fuser, VIEWS};
use crate::fact;
use anyshape_ir::{AxisKind, Expr, Precision, Workload, CACHE_RESERVE};
use anyshape_tensor::{exact_quotient, DType, ValueId};

/// An attention contraction found around a `MatMul`.
pub(super) struct Attention {
    /// The workload, without the epilogue.
    pub workload: Workload,
    /// The tensors it reads, in the workload's operand order.
    pub inputs: [ValueId; 2],
    /// The product of the constant scales folded into it (1 for none).
    pub scale: f32,
    /// The nodes it covers besides the `MatMul`.
    pub nodes: Vec<usize>,
    /// The value it computes (the `MatMul`'s output, or the transpose's after it).
    pub output: ValueId,
}

/// The head split: `[batch, sequence, heads, dim]` to `[batch, heads, sequence, dim]`
/// (and back).
const HEADS: [usize; 4] = [0, 2, 1, 3];
/// The keys' transpose straight to `[batch, heads, dim, sequence]`.
const HEADS_T: [usize; 4] = [0, 2, 3, 1];
/// The keys' transpose from a cache's `[batch, heads, sequence, dim]`.
const CACHE_T: [usize; 4] = [0, 1, 3, 2];
/// No transpose: reshapes that come back to the same axes, and scalings.
const IDENTITY: [usize; 4] = [0, 1, 2, 3];

impl Fuser<'_> {
    /// The attention contraction whose `MatMul` is node `k`, if the pattern holds.
    pub(super) fn attention(&self, k: usize) -> Option<Attention> {
        let node = &self.g.nodes[k];
        if node.op != "MatMul" || fact(self.facts, node.input(0).ok()?).dtype != DType::F32 {
            return None;
        }
        let (a, b) = (node.input(0).ok()?, node.input(1).ok()?);
        let y = node.outputs[0];
        if let Some(grouped) = self.grouped_attention(a, b, y) {
            return Some(grouped);
        }
        if let Some(q) = self.transposed_from(a, HEADS) {
            // Q [B, M, H, K]; K [B, N, H, K] from the projection, or [B, H, N, K] from
            // a cache.
            let (kt, cached) = match self.transposed_from(b, HEADS_T) {
                Some(kt) => (kt, false),
                None => (self.transposed_from(b, CACHE_T)?, true),
            };
            let (sq, sk) = (self.shape(q.0), self.shape(kt.0));
            let (op, n) = if cached {
                ("cache_attention_scores", 2)
            } else {
                ("attention_scores", 1)
            };
            let heads = 3 - n;
            if sq.len() != 4
                || sk.len() != 4
                || sq[0] != sk[0]
                || sq[2] != sk[heads]
                || sq[3] != sk[3]
            {
                return None;
            }
            let mut args = vec![
                sq[0].clone(),
                sq[2].clone(),
                sq[1].clone(),
                sk[n].clone(),
                sq[3].clone(),
            ];
            if cached {
                args.push(self.cache_rows(kt.0));
            }
            return Some(Attention {
                workload: self.attention_workload(op, &args)?,
                inputs: [q.0, kt.0],
                scale: q.1 * kt.1,
                nodes: [q.2, kt.2].concat(),
                output: y,
            });
        }
        // V [B, K, H, N] from the projection, or [B, H, K, N] (a cache's) as it is.
        let (v, cached) = match self.transposed_from(b, HEADS) {
            Some(v) => (v, false),
            None => ((b, 1.0, Vec::new()), true),
        };
        // Reshapes that keep the shape may come between (the TorchScript exporter's).
        let (after, views) = self.through_views(y);
        if self.shape(after) != self.shape(y) {
            return None;
        }
        let back = self.sole_use(after)?;
        let t = &self.g.nodes[back];
        if t.op != "Transpose" || self.permutation(after, &[back]) != Some(HEADS) {
            return None;
        }
        // P [B, H, M, K] and V [B, K, H, N] (or [B, H, K, N]).
        let (sp, sv) = (self.shape(a), self.shape(v.0));
        let (op, heads, k) = if cached {
            ("cache_attention_context", 1, 2)
        } else {
            ("attention_context", 2, 1)
        };
        if sp.len() != 4 || sv.len() != 4 || sp[0] != sv[0] || sp[1] != sv[heads] || sp[3] != sv[k]
        {
            return None;
        }
        let mut nodes = v.2;
        nodes.extend(views);
        nodes.push(back);
        let mut args = vec![
            sp[0].clone(),
            sp[1].clone(),
            sp[2].clone(),
            sv[3].clone(),
            sp[3].clone(),
        ];
        if cached {
            args.push(self.cache_rows(v.0));
        }
        Some(Attention {
            workload: Workload::of(op, &args).ok()?,
            inputs: [a, v.0],
            scale: v.1,
            nodes,
            output: t.outputs[0],
        })
    }

    /// The workload `op(args)`: where attention multiplies in bf16, scores whose
    /// reduction (the head dim) is an even constant in bf16 (`op` with `_bf16`).
    fn attention_workload(&self, op: &str, args: &[Expr]) -> Option<Workload> {
        let w = Workload::of(op, args).ok()?;
        let even = |a: &anyshape_ir::Axis| {
            a.kind == AxisKind::Reduction && a.extent.as_const().is_some_and(|k| k % 2 == 0)
        };
        match self.attention_precision == Precision::Bf16
            && op.ends_with("_scores")
            && w.axes.iter().any(even)
        {
            true => Workload::of(&format!("{op}_bf16"), args).ok(),
            false => Some(w),
        }
    }

    /// Grouped-query attention's contraction `MatMul(a, b) = y`: the scores where `b`
    /// is a repeated cache transposed (`[0,1,3,2]`), the context where it is the
    /// repeated cache itself; `a` (scaled or not) in `[batch, heads·group, sequence,
    /// dim]`.
    fn grouped_attention(&self, a: ValueId, b: ValueId, y: ValueId) -> Option<Attention> {
        let (x, x_scale, x_nodes) =
            self.transposed_from(a, IDENTITY)
                .unwrap_or((a, 1.0, Vec::new()));
        let sx = self.shape(x);
        let (op, (cache, group, c_nodes), c_scale, t_nodes) = match self.transposed_from(b, CACHE_T)
        {
            Some((kt, s, nodes)) => (
                "grouped_cache_attention_scores",
                self.repeated(kt)?,
                s,
                nodes,
            ),
            None => {
                let (v, s, nodes) =
                    self.transposed_from(b, IDENTITY)
                        .unwrap_or((b, 1.0, Vec::new()));
                (
                    "grouped_cache_attention_context",
                    self.repeated(v)?,
                    s,
                    nodes,
                )
            }
        };
        let sc = self.shape(cache);
        if sx.len() != 4
            || sc.len() != 4
            || sx[0] != sc[0]
            || !same_product(&sx[1], &[sc[1].clone(), group.clone()])
        {
            return None;
        }
        // Scores: Q [B, H·G, M, K] against keys [B, H, N, K]; context: P [B, H·G, M, K]
        // against values [B, H, K, N].
        let (n, k) = if op == "grouped_cache_attention_scores" {
            if sx[3] != sc[3] {
                return None;
            }
            (sc[2].clone(), sx[3].clone())
        } else {
            if sx[3] != sc[2] {
                return None;
            }
            (sc[3].clone(), sx[3].clone())
        };
        let args = [
            sx[0].clone(),
            sc[1].clone(),
            group,
            sx[2].clone(),
            n,
            k,
            self.cache_rows(cache),
        ];
        Some(Attention {
            workload: self.attention_workload(op, &args)?,
            inputs: [x, cache],
            scale: x_scale * c_scale,
            nodes: [x_nodes, t_nodes, c_nodes].concat(),
            output: y,
        })
    }

    /// A cache `[B, H, S, D]` repeated for groups of `G` heads: `v` is
    /// `Reshape(Expand(Unsqueeze(cache, 2) → [B, H, G, S, D]) → [B, H·G, S, D])`, each
    /// value on the way used once. The cache, `G` and the three nodes.
    fn repeated(&self, v: ValueId) -> Option<(ValueId, Expr, Vec<usize>)> {
        let step = |v: ValueId, op: &str| -> Option<(usize, ValueId)> {
            let p = self.producer[v]?;
            let n = &self.g.nodes[p];
            (n.op == op
                && self.consumers[v].len() == 1
                && !self.g.outputs.contains(&v)
                && !self.taken[p])
                .then_some((p, n.input(0).ok()?))
        };
        let (reshape, e) = step(v, "Reshape")?;
        let (expand, u) = step(e, "Expand")?;
        let (unsqueeze, cache) = step(u, "Unsqueeze")?;
        let (sv, se, su, sc) = (
            self.shape(v),
            self.shape(e),
            self.shape(u),
            self.shape(cache),
        );
        let one = Expr::Const(1);
        if sc.len() != 4
            || su
                != [
                    sc[0].clone(),
                    sc[1].clone(),
                    one,
                    sc[2].clone(),
                    sc[3].clone(),
                ]
            || se.len() != 5
            || se[..2] != sc[..2]
            || se[3..] != sc[2..]
            || sv.len() != 4
            || sv[0] != sc[0]
            || sv[2..] != sc[2..]
            || !same_product(&sv[1], &[sc[1].clone(), se[2].clone()])
        {
            return None;
        }
        Some((cache, se[2].clone(), vec![unsqueeze, expand, reshape]))
    }

    /// The rows a cache holds past `v`'s: [`CACHE_RESERVE`] where `v` is a decoder's
    /// cache ([`crate::Graph::cache_append`]), which the runtime may keep across runs
    /// with room to grow; 0 for any other tensor in that layout.
    fn cache_rows(&self, v: ValueId) -> Expr {
        match self.g.cache_append(v) {
            Some(_) => Expr::var(CACHE_RESERVE),
            None => Expr::Const(0),
        }
    }

    /// `v` as a permutation `perm` of a rank-4 value: transposes, reshapes that merge
    /// and split axes again (the dynamo exporter transposes the keys as `[B·H, S, D]`)
    /// and constant scalings, each value on the way used once. That value, the product
    /// of the scales and the nodes passed; the longest such chain.
    fn transposed_from(&self, v: ValueId, perm: [usize; 4]) -> Option<(ValueId, f32, Vec<usize>)> {
        // The chain back from `v`: each node with the value it reads and its scale.
        let mut chain: Vec<(usize, ValueId, f32)> = Vec::new();
        let mut at = v;
        while let Some(p) = self.producer[at] {
            if self.consumers[at].len() != 1 || self.g.outputs.contains(&at) || self.taken[p] {
                break;
            }
            let n = &self.g.nodes[p];
            let Some((src, factor)) = (match n.op.as_str() {
                "Transpose" => n.input(0).ok().map(|x| (x, 1.0)),
                op if VIEWS.contains(&op) => n.input(0).ok().map(|x| (x, 1.0)),
                "Mul" => n.inputs.iter().flatten().find_map(|&x| {
                    let s = self.scalar(self.operand(n, x)?)?;
                    (self.scalar(x).is_none()).then_some((x, s))
                }),
                "Div" => n.input(0).ok().zip(
                    n.input(1)
                        .ok()
                        .and_then(|d| self.scalar(d))
                        .filter(|&d| d != 0.0)
                        .map(|d| 1.0 / d),
                ),
                _ => None,
            }) else {
                break;
            };
            chain.push((p, src, factor));
            at = src;
        }
        (1..=chain.len()).rev().find_map(|len| {
            let src = chain[len - 1].1;
            let nodes: Vec<usize> = chain[..len].iter().rev().map(|c| c.0).collect();
            (self.permutation(src, &nodes)? == perm).then(|| {
                let scale = chain[..len].iter().map(|c| c.2).product();
                (src, scale, nodes)
            })
        })
    }

    /// What `nodes` (in order, each reading the last's output, the first reading the
    /// rank-4 `src`) do to `src`'s axes, if the result is a permutation of them. Each
    /// axis of a value is tracked as the run of `src`'s axes merged into it.
    fn permutation(&self, src: ValueId, nodes: &[usize]) -> Option<[usize; 4]> {
        let extents = self.shape(src).to_vec();
        if extents.len() != 4 {
            return None;
        }
        let mut axes: Vec<Vec<usize>> = (0..4).map(|a| vec![a]).collect();
        for &k in nodes {
            let n = &self.g.nodes[k];
            if n.op == "Transpose" {
                let p: Vec<usize> = match n.ints("perm").ok()? {
                    Some(p) => p
                        .iter()
                        .map(|&a| usize::try_from(a).ok())
                        .collect::<Option<_>>()?,
                    None => (0..axes.len()).rev().collect(),
                };
                axes = p
                    .iter()
                    .map(|&a| axes.get(a).cloned())
                    .collect::<Option<_>>()?;
            } else if VIEWS.contains(&n.op.as_str()) {
                // Regroup the runs in order to the new shape.
                let flat: Vec<usize> = axes.concat();
                let mut rest = flat.as_slice();
                axes = Vec::new();
                for d in self.shape(n.outputs[0]) {
                    let mut take = 0;
                    while !same_product(
                        d,
                        &rest[..take]
                            .iter()
                            .map(|&a| extents[a].clone())
                            .collect::<Vec<_>>(),
                    ) {
                        take += 1;
                        if take > rest.len() {
                            return None;
                        }
                    }
                    axes.push(rest[..take].to_vec());
                    rest = &rest[take..];
                }
                if !rest.is_empty() {
                    return None;
                }
            }
        }
        let singles: Vec<usize> = axes
            .iter()
            .map(|run| match run.as_slice() {
                [a] => Some(*a),
                _ => None,
            })
            .collect::<Option<_>>()?;
        singles.try_into().ok()
    }
}

/// Whether `d` is the product of `parts` (1 for none) for every binding.
fn same_product(d: &Expr, parts: &[Expr]) -> bool {
    exact_quotient(std::slice::from_ref(d), parts).is_some_and(|q| q == Expr::Const(1))
}
