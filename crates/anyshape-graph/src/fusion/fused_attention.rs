//! Attention's three kernels — the scores (`attention_scores`, in f32 or bf16, a
//! constant scale and a mask `add(b,m,n)` as their epilogue), their `softmax` (with or
//! without `+nan_to_zero`) and the context (`attention_context`) — fused into one
//! `attention` or `masked_attention` task ([`anyshape_ir::OpClass::Attention`]) where
//! the scores and the probabilities, through views, have no other use: the scores
//! (`batch · heads · sequence²` elements, 12.6 MB per BERT-base layer at sequence 512)
//! are never written. In a bf16 fusion it is `attention_bf16` / `masked_attention_bf16`:
//! both products on AMX tiles where the CPU has them (in f32 elsewhere).
//!
//! The decoders' forms fuse the same way: `cache_attention_scores` /
//! `cache_attention_context` (keys and values in a cache, read in place with its rows
//! to spare) into `cache_attention`, and the grouped-query ones into
//! `grouped_cache_attention` (each key/value head packed once for its group of query
//! heads).
use super::{Fuser, Step, StepKind, VIEWS};
use anyshape_ir::{Binary, EpilogueOp, Precision, Unary, Workload};
use anyshape_tensor::ValueId;

/// The steps a fused attention replaces: the scores', the softmax's, the context's and
/// the views between them.
struct Parts {
    steps: Vec<usize>,
    fused: Step,
}

impl Fuser<'_> {
    /// `steps` with every attention whose scores and probabilities have no other use
    /// fused into one kernel step (in the context's place).
    pub(super) fn fuse_attention(&self, mut steps: Vec<Step>) -> Vec<Step> {
        let mut owner = vec![None; self.g.nodes.len()];
        for (i, s) in steps.iter().enumerate() {
            for &n in &s.nodes {
                owner[n] = Some(i);
            }
        }
        let mut gone = vec![false; steps.len()];
        for i in 0..steps.len() {
            let Some(parts) = self.attention_parts(&steps, &owner, i) else {
                continue;
            };
            let (&last, rest) = parts.steps.split_last().expect("the context's step");
            for &s in rest {
                gone[s] = true;
            }
            steps[last] = parts.fused;
        }
        let mut gone = gone.into_iter();
        steps.retain(|_| !gone.next().unwrap_or(false));
        steps
    }

    /// The fused attention whose scores are step `i`, if the pattern holds.
    fn attention_parts(&self, steps: &[Step], owner: &[Option<usize>], i: usize) -> Option<Parts> {
        let scores = &steps[i];
        let StepKind::Kernel(ws) = &scores.kind else {
            return None;
        };
        let form = FORMS
            .iter()
            .find(|f| ws.op == f.scores || ws.op == format!("{}_bf16", f.scores))?;
        let lead = form.lead;
        let (scale, mask) = scores_epilogue(ws, [0, lead - 1, lead])?;
        let (p_in, mut views, sm) = self.after_views(scores.output?, steps, owner)?;
        let softmax = &steps[sm];
        let StepKind::Kernel(wp) = &softmax.kind else {
            return None;
        };
        let nan_to_zero = match wp.epilogue.ops() {
            [] => false,
            [EpilogueOp::Unary(Unary::NanToZero)] => true,
            _ => return None,
        };
        if wp.op != "softmax" || softmax.inputs.first()?.0 != p_in {
            return None;
        }
        let (c_in, more, cx) = self.after_views(softmax.output?, steps, owner)?;
        views.extend(more);
        let context = &steps[cx];
        let StepKind::Kernel(wc) = &context.kind else {
            return None;
        };
        if wc.op != form.context || !wc.epilogue.is_empty() || context.inputs.first()?.0 != c_in {
            return None;
        }
        // Scores (B, H, [G,] M, N, K = the head dim, [R]); context (B, H, [G,] M, N = the
        // head dim, K = the keys, [R]).
        let (s, c) = (args(ws), args(wc));
        if s.len() != c.len()
            || s[..lead] != c[..lead]
            || s[lead] != c[lead + 1]
            || s[lead + 1] != c[lead]
            || s[lead + 2..] != c[lead + 2..]
        {
            return None;
        }
        let masked = if mask.is_some() { "masked_" } else { "" };
        let precision = match self.attention_precision {
            Precision::Bf16 => "_bf16",
            Precision::F32 | Precision::I8 => "",
        };
        let op = format!("{masked}{}{precision}", form.fused);
        let workload = Workload::of(&op, &s)
            .ok()?
            .with_attention(scale, nan_to_zero)
            .ok()?;
        let mut inputs = vec![scores.inputs[0], scores.inputs[1], *context.inputs.get(1)?];
        if let Some(m) = mask {
            inputs.push(*scores.inputs.get(m)?);
        }
        let mut parts: Vec<usize> = [i, sm].into_iter().chain(views).collect();
        parts.push(cx);
        let mut nodes: Vec<usize> = parts.iter().flat_map(|&p| steps[p].nodes.clone()).collect();
        nodes.sort_unstable();
        Some(Parts {
            steps: parts,
            fused: Step {
                kind: StepKind::Kernel(workload),
                nodes,
                inputs,
                output: context.output,
            },
        })
    }

    /// `v` followed through views (each its value's one use, a step of its own): the
    /// value reached, the views' steps, and the step that reads it (its one use). None
    /// where a value on the way is a graph output or has another use.
    fn after_views(
        &self,
        mut v: ValueId,
        steps: &[Step],
        owner: &[Option<usize>],
    ) -> Option<(ValueId, Vec<usize>, usize)> {
        let mut views = Vec::new();
        loop {
            if self.g.outputs.contains(&v) {
                return None;
            }
            let [c] = self.consumers[v][..] else {
                return None;
            };
            let step = owner[c]?;
            let node = &self.g.nodes[c];
            if steps[step].kind == StepKind::View
                && steps[step].nodes == [c]
                && VIEWS.contains(&node.op.as_str())
            {
                views.push(step);
                v = node.outputs[0];
                continue;
            }
            return Some((v, views, step));
        }
    }
}

/// An attention form that fuses: its scores' op (`_bf16` too), its context's, the
/// fused op (`masked_` and `_bf16` added as they apply), and the arguments before the
/// keys' count (`B, H, [G,] M`).
struct Form {
    scores: &'static str,
    context: &'static str,
    fused: &'static str,
    lead: usize,
}

/// Every form that fuses.
const FORMS: [Form; 3] = [
    Form {
        scores: "attention_scores",
        context: "attention_context",
        fused: "attention",
        lead: 3,
    },
    Form {
        scores: "cache_attention_scores",
        context: "cache_attention_context",
        fused: "cache_attention",
        lead: 3,
    },
    Form {
        scores: "grouped_cache_attention_scores",
        context: "grouped_cache_attention_context",
        fused: "grouped_cache_attention",
        lead: 4,
    },
];

/// The scores' scale and where their mask input is, if their epilogue is a constant
/// scale and then a mask along `mask_axes` (the scores' `b, m, n`), either or both.
fn scores_epilogue(w: &Workload, mask_axes: [usize; 3]) -> Option<(f64, Option<usize>)> {
    let mut ops = w.epilogue.ops();
    let mut scale = 1.0;
    if let [EpilogueOp::Scale(s), rest @ ..] = ops {
        scale = s.0;
        ops = rest;
    }
    match ops {
        [] => Some((scale, None)),
        [EpilogueOp::With {
            op: Binary::Add,
            input,
        }] if w.inputs.get(*input)?.plain_axes()? == mask_axes => Some((scale, Some(*input))),
        _ => None,
    }
}

/// A workload's argument values, in order.
fn args(w: &Workload) -> Vec<anyshape_ir::Expr> {
    w.args.iter().map(|(_, e)| e.clone()).collect()
}
