//! Attention's three kernels — the scores (`attention_scores`, in f32 or bf16, a
//! constant scale and a mask `add(b,m,n)` as their epilogue), their `softmax` (with or
//! without `+nan_to_zero`) and the context (`attention_context`) — fused into one
//! `attention` or `masked_attention` task ([`anyshape_ir::OpClass::Attention`]) where
//! the scores and the probabilities, through views, have no other use: the scores
//! (`batch · heads · sequence²` elements, 12.6 MB per BERT-base layer at sequence 512)
//! are never written. In a bf16 fusion it is `attention_bf16` / `masked_attention_bf16`:
//! both products on AMX tiles where the CPU has them (in f32 elsewhere).
//!
//! The decoders' cache and grouped forms are left as they are.
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
        if ws.op != "attention_scores" && ws.op != "attention_scores_bf16" {
            return None;
        }
        let (scale, mask) = scores_epilogue(ws)?;
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
        if wc.op != "attention_context"
            || !wc.epilogue.is_empty()
            || context.inputs.first()?.0 != c_in
        {
            return None;
        }
        // Scores (B, H, M, N, K = the head dim); context (B, H, M, N = the head dim, K =
        // the keys).
        let (s, c) = (args(ws), args(wc));
        if s[..3] != c[..3] || s[3] != c[4] || s[4] != c[3] {
            return None;
        }
        let op = match (mask.is_some(), self.precision) {
            (true, Precision::Bf16) => "masked_attention_bf16",
            (true, Precision::F32) => "masked_attention",
            (false, Precision::Bf16) => "attention_bf16",
            (false, Precision::F32) => "attention",
        };
        let workload = Workload::of(op, &s)
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

/// The scores' scale and where their mask input is, if their epilogue is a constant
/// scale and then a mask along `(b, m, n)`, either or both.
fn scores_epilogue(w: &Workload) -> Option<(f64, Option<usize>)> {
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
        }] if w.inputs.get(*input)?.plain_axes()? == [0, 2, 3] => Some((scale, Some(*input))),
        _ => None,
    }
}

/// A workload's argument values, in order.
fn args(w: &Workload) -> Vec<anyshape_ir::Expr> {
    w.args.iter().map(|(_, e)| e.clone()).collect()
}
