//! Generating tokens with a decoder that carries its key/value cache ([`Decoder`],
//! [`Decoder::generate`]): the calling convention read from the model's inputs and
//! outputs (token ids, an optional attention mask and position ids, and each
//! `past…` cache input paired with its `present…` output, the axis that grows found
//! where their dims differ), then the loop — the prompt in one run, then one token per
//! run, the caches kept in place in a [`crate::CacheState`] where the plan records them
//! (else each run's present caches passed as the next one's past) — choosing tokens
//! greedily or by seeded sampling, and timing every step.
use crate::sampling::{argmax, sample, Sampling};
use crate::{Model, Result, RuntimeError};
use anyshape_ir::{Bindings, DType, Expr};
use anyshape_tensor::{Tensor, TensorRef, TensorSpec};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use smallvec::SmallVec;
use std::time::Instant;

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// How many tokens to generate after the prompt (at least 1).
    pub max_new_tokens: usize,
    /// How each is chosen.
    pub sampling: Sampling,
    /// A token that ends a row's generation (the end-of-text token); a row that chose
    /// it generates nothing more, and generation stops when every row has.
    pub stop_token: Option<i64>,
    /// Keep the logits each token was chosen from ([`Generation::logits`]).
    pub keep_logits: bool,
}

/// What a generation produced and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Each row's new tokens (a row that stopped is shorter, its stop token included).
    pub tokens: Vec<Vec<i64>>,
    /// Seconds of each run of the model with the choice of its tokens: the prompt's
    /// first (the time to the first token), then one per further token.
    pub step_seconds: Vec<f64>,
    /// The heap allocations each step made, counted as `step_seconds` are timed (on
    /// every thread; 0 where the process's global allocator is not
    /// [`anyshape_abi::CacheLineAllocator`], which counts them).
    pub step_allocations: Vec<u64>,
    /// With [`GenerateOptions::keep_logits`]: each step's logits `[batch, vocab]` at
    /// the last position (what its tokens were chosen from); otherwise empty.
    pub logits: Vec<Tensor>,
}

impl Generation {
    /// Seconds from the call to the first new token: the prompt's run.
    pub fn time_to_first_token(&self) -> f64 {
        self.step_seconds.first().copied().unwrap_or(0.0)
    }

    /// Tokens per second of the steps after the first (one token per row and step);
    /// `None` where there were none.
    pub fn decode_tokens_per_second(&self) -> Option<f64> {
        let rest = self.step_seconds.get(1..)?;
        let total: f64 = rest.iter().sum();
        (!rest.is_empty() && total > 0.0).then(|| (rest.len() * self.tokens.len()) as f64 / total)
    }
}

/// A key/value cache input and the output that extends it.
#[derive(Clone, Debug)]
struct Cache {
    /// The input (`past…`).
    past: TensorSpec,
    /// The output's index among the model's outputs (`present…`).
    present: usize,
    /// The axis that grows.
    axis: usize,
}

/// A model's decoder calling convention.
#[derive(Clone, Debug)]
pub struct Decoder {
    /// The batch dim's name (the token ids' first axis).
    batch: String,
    /// The past length's dim (every cache's growing axis).
    past: String,
    mask: Option<String>,
    positions: Option<String>,
    caches: Vec<Cache>,
    /// The logits output's index.
    logits: usize,
}

/// The `present…` output name for a `past…` input: `past_key_values.0.key` →
/// `present.0.key` (onnxruntime's and Optimum's names), `past_0` → `present_0`.
fn present_name(past: &str) -> Option<String> {
    past.strip_prefix("past_key_values")
        .or_else(|| past.strip_prefix("past"))
        .map(|rest| format!("present{rest}"))
}

fn not_a_decoder(why: String) -> RuntimeError {
    RuntimeError::Decoder(why)
}

impl Decoder {
    /// Read the calling convention of `model`: inputs `input_ids` `[batch, sequence]`
    /// (i64), optionally `attention_mask` `[batch, past + sequence]` and `position_ids`
    /// `[batch, sequence]`, and one `past…` f32 input per cache whose `present…` output
    /// is the same but one axis, where the past length grows; outputs `logits`
    /// `[batch, sequence, vocab]` and the presents. Refused, with what is missing or
    /// unexpected, where the model is not such a decoder.
    pub fn of(model: &Model) -> Result<Decoder> {
        let inputs = model.inputs();
        let outputs = model.outputs();
        let ids = inputs
            .iter()
            .find(|s| s.name == "input_ids")
            .ok_or_else(|| not_a_decoder("it has no `input_ids` input".into()))?;
        let batch = match ids.shape.as_slice() {
            [Expr::Var(b), _] if ids.dtype == DType::I64 => b.clone(),
            _ => {
                return Err(not_a_decoder(format!(
                    "its `input_ids` is {} {}, not int64 [batch, sequence]",
                    ids.dtype,
                    shape_text(&ids.shape)
                )))
            }
        };
        let logits = outputs
            .iter()
            .position(|s| s.name == "logits")
            .ok_or_else(|| not_a_decoder("it has no `logits` output".into()))?;
        if outputs[logits].dtype != DType::F32 || outputs[logits].shape.len() != 3 {
            return Err(not_a_decoder(format!(
                "its `logits` output is {} {}, not float [batch, sequence, vocab]",
                outputs[logits].dtype,
                shape_text(&outputs[logits].shape)
            )));
        }
        let mut d = Decoder {
            batch,
            past: String::new(),
            mask: None,
            positions: None,
            caches: Vec::new(),
            logits,
        };
        for s in inputs.iter().filter(|s| s.name != "input_ids") {
            match s.name.as_str() {
                "attention_mask" | "position_ids"
                    if s.dtype == DType::I64 && s.shape.len() == 2 =>
                {
                    *if s.name == "attention_mask" {
                        &mut d.mask
                    } else {
                        &mut d.positions
                    } = Some(s.name.clone());
                }
                _ => d.caches.push(Self::cache(s, &outputs, &mut d.past)?),
            }
        }
        if d.caches.is_empty() {
            return Err(not_a_decoder(
                "it has no `past…` cache inputs: a model without a key/value cache would run the whole sequence again for every token"
                    .into(),
            ));
        }
        for (i, o) in outputs.iter().enumerate() {
            if i != logits && !d.caches.iter().any(|c| c.present == i) {
                return Err(not_a_decoder(format!(
                    "its output `{}` is neither the logits nor a present cache",
                    o.name
                )));
            }
        }
        Ok(d)
    }

    /// The cache input `s`, paired with its present output; `past` is the past
    /// length's dim, set by the first cache and checked by the others.
    fn cache(s: &TensorSpec, outputs: &[&TensorSpec], past: &mut String) -> Result<Cache> {
        let unexpected = || {
            not_a_decoder(format!(
                "its input `{}` is none of `input_ids`, `attention_mask`, `position_ids` or a `past…` cache with a `present…` output",
                s.name
            ))
        };
        let name = present_name(&s.name).ok_or_else(unexpected)?;
        let present = outputs
            .iter()
            .position(|o| o.name == name)
            .ok_or_else(unexpected)?;
        let o = outputs[present];
        let differ: Vec<usize> = (0..s.shape.len())
            .filter(|&k| o.shape.get(k) != Some(&s.shape[k]))
            .collect();
        let axis = match (
            differ.as_slice(),
            s.dtype == DType::F32 && o.dtype == DType::F32,
        ) {
            ([k], true) if o.shape.len() == s.shape.len() => *k,
            _ => {
                return Err(not_a_decoder(format!(
                "its cache `{}` {} and `{name}` {} are not float tensors that differ on one axis",
                s.name,
                shape_text(&s.shape),
                shape_text(&o.shape)
            )))
            }
        };
        match &s.shape[axis] {
            Expr::Var(v) if past.is_empty() || v == past => *past = v.clone(),
            e => {
                return Err(not_a_decoder(format!(
                    "its cache `{}` grows along a dim `{e}` where the other caches' is `{past}`",
                    s.name
                )))
            }
        }
        Ok(Cache {
            past: s.clone(),
            present,
            axis,
        })
    }

    /// A cache's shape for `batch` rows and a past of `past`: the batch dim `batch`,
    /// every other dim fixed.
    fn cache_shape(&self, c: &Cache, batch: usize, past: usize) -> Result<Vec<usize>> {
        let b = Bindings::from_pairs([(self.batch.as_str(), batch as i64)]);
        let mut shape = Vec::with_capacity(c.past.shape.len());
        for (k, e) in c.past.shape.iter().enumerate() {
            let v = if k == c.axis {
                Ok(past as i64)
            } else {
                e.eval(&b)
            };
            shape.push(usize::try_from(v.unwrap_or(-1)).map_err(|_| {
                not_a_decoder(format!(
                    "its cache `{}` has a dim `{e}` that is neither fixed, the batch nor the past length",
                    c.past.name
                ))
            })?);
        }
        Ok(shape)
    }

    /// Whether `model`'s generation keeps the caches in place ([`crate::CacheState`]):
    /// its plan records every one of them (each read only by its attention). Otherwise
    /// each run's present caches are passed as the next run's pasts.
    pub fn keeps_caches(&self, model: &Model) -> bool {
        let plan = model.plan();
        plan.caches.len() == self.caches.len()
            && self.caches.iter().all(|c| {
                plan.caches
                    .iter()
                    .any(|k| plan.inputs[k.past].0.name == c.past.name)
            })
    }

    /// The bytes of every cache for `batch` rows and a past of `past` tokens: what a
    /// step at that past reads of them.
    pub fn cache_bytes(&self, batch: usize, past: usize) -> Result<u64> {
        let mut bytes = 0u64;
        for c in &self.caches {
            let n: usize = self.cache_shape(c, batch, past)?.iter().product();
            bytes += n as u64 * 4;
        }
        Ok(bytes)
    }

    /// Generate from `prompt` (`[batch, prompt length]` token ids, every row as long):
    /// the prompt in one run of `model`, then a run per new token, each feeding the
    /// previous run's present caches as its past.
    pub fn generate(
        &self,
        model: &Model,
        prompt: &Tensor,
        options: &GenerateOptions,
    ) -> Result<Generation> {
        let bad = |why: String| RuntimeError::Options(why);
        let rows = match prompt.shape.as_slice() {
            &[r, p] if r > 0 && p > 0 => r,
            s => {
                return Err(bad(format!(
                    "the prompt is {s:?}: it takes token ids [batch, length], each at least 1"
                )))
            }
        };
        prompt.as_i64().map_err(|_| {
            bad(format!(
                "the prompt holds {} elements: token ids are int64",
                prompt.dtype()
            ))
        })?;
        if options.max_new_tokens == 0 {
            return Err(bad("max new tokens is 0: generate at least one".into()));
        }
        if let Sampling::Sample {
            temperature, top_k, ..
        } = &options.sampling
        {
            if !(*temperature > 0.0 && temperature.is_finite()) || *top_k == Some(0) {
                return Err(bad(format!(
                    "sampling at temperature {temperature} over the top {top_k:?} tokens: the temperature must be above 0, the top at least 1"
                )));
            }
        }
        let mut rng = match options.sampling {
            Sampling::Sample { seed, .. } => Some(ChaCha8Rng::seed_from_u64(seed)),
            Sampling::Greedy => None,
        };
        // The caches kept in place where the plan allows (every one of them read only
        // by its attention), with room for the whole generation; otherwise passed from
        // each run's presents to the next one's pasts.
        let mut state = match self.keeps_caches(model) {
            true => Some(model.cache_state(
                &Bindings::from_pairs([(self.batch.as_str(), rows as i64)]),
                prompt.shape[1] + options.max_new_tokens,
            )?),
            false => None,
        };
        let mut past: Vec<Tensor> = self
            .caches
            .iter()
            .map(|c| Ok(Tensor::f32(self.cache_shape(c, rows, 0)?, Vec::new())?))
            .collect::<Result<_>>()?;
        let mut ids = prompt.clone();
        let mut past_len = 0usize;
        let steps = options.max_new_tokens;
        let mut out = Generation {
            tokens: vec![Vec::with_capacity(steps); rows],
            step_seconds: Vec::with_capacity(steps),
            step_allocations: Vec::with_capacity(steps),
            logits: Vec::new(),
        };
        let mut stopped = vec![false; rows];
        // What every step fills in place: the mask and positions (room for the whole
        // generation), the outputs (written into by a run that keeps its caches), the
        // tokens chosen: a decode step allocates nothing.
        let total = prompt.shape[1] + steps;
        let mut mask = Tensor::i64(vec![rows, 0], Vec::with_capacity(rows * total))?;
        let mut positions = Tensor::i64(vec![rows, 0], Vec::with_capacity(rows * total))?;
        let mut outs: Vec<Option<Tensor>> = vec![None; model.outputs().len()];
        let mut next: Vec<i64> = Vec::with_capacity(rows);
        for _ in 0..steps {
            let start = Instant::now();
            let allocated = anyshape_abi::allocations();
            let len = ids.shape[1];
            mask.fit(DType::I64, &[rows, past_len + len])?;
            mask.i64_mut()?.fill(1);
            positions.fit(DType::I64, &[rows, len])?;
            for (i, p) in positions.i64_mut()?.iter_mut().enumerate() {
                *p = (past_len + i % len) as i64;
            }
            let mut inputs: SmallVec<[(&str, TensorRef); 4]> = SmallVec::new();
            inputs.push(("input_ids", ids.view()));
            if let Some(n) = &self.mask {
                inputs.push((n, mask.view()));
            }
            if let Some(n) = &self.positions {
                inputs.push((n, positions.view()));
            }
            match state.as_mut() {
                Some(state) => model.run_cached_into(&inputs, state, &mut outs)?,
                None => {
                    for (c, t) in self.caches.iter().zip(&past) {
                        inputs.push((&c.past.name, t.view()));
                    }
                    outs = model.run(&inputs)?.into_iter().map(Some).collect();
                }
            }
            drop(inputs);
            let logits = outs[self.logits]
                .as_ref()
                .ok_or_else(|| RuntimeError::Decoder("its run gave no logits".into()))?;
            let vocab = logits.shape[2];
            if logits.shape[..2] != [rows, len] || vocab == 0 {
                return Err(RuntimeError::Decoder(format!(
                    "its logits came out {:?} for {rows} rows of {len} tokens",
                    logits.shape
                )));
            }
            let values = logits.as_f32()?;
            let row_of = |r: usize| last_row(values, r, len, vocab);
            next.clear();
            for (r, (stopped, tokens)) in stopped.iter_mut().zip(&mut out.tokens).enumerate() {
                let row = row_of(r);
                let token = match (&options.sampling, rng.as_mut()) {
                    (
                        Sampling::Sample {
                            temperature, top_k, ..
                        },
                        Some(rng),
                    ) => sample(row, *temperature, top_k.unwrap_or(vocab), rng),
                    _ => argmax(row),
                } as i64;
                if !*stopped {
                    tokens.push(token);
                    *stopped = options.stop_token == Some(token);
                }
                next.push(token);
            }
            for (c, k) in self.caches.iter().enumerate().filter(|_| state.is_none()) {
                let t = outs[k.present].take().ok_or_else(|| {
                    RuntimeError::Decoder(format!("its run gave no `{}`", k.past.name))
                })?;
                if t.shape.get(k.axis) != Some(&(past_len + len)) {
                    return Err(RuntimeError::Decoder(format!(
                        "its present cache `{}` came out {:?}: the past of {past_len} and {len} new tokens should make {} along axis {}",
                        k.past.name,
                        t.shape,
                        past_len + len,
                        k.axis
                    )));
                }
                past[c] = t;
            }
            past_len += len;
            ids.fit(DType::I64, &[rows, 1])?;
            ids.i64_mut()?.copy_from_slice(&next);
            out.step_seconds.push(start.elapsed().as_secs_f64());
            out.step_allocations
                .push(anyshape_abi::allocations() - allocated);
            // The logits kept for the caller (a check), outside the step's count.
            if options.keep_logits {
                let values = outs[self.logits]
                    .as_ref()
                    .ok_or_else(|| RuntimeError::Decoder("its run gave no logits".into()))?
                    .as_f32()?;
                let row_of = |r: usize| last_row(values, r, len, vocab);
                out.logits.push(Tensor::f32(
                    vec![rows, vocab],
                    (0..rows).flat_map(row_of).copied().collect(),
                )?);
            }
            if stopped.iter().all(|&s| s) {
                break;
            }
        }
        Ok(out)
    }

    /// The past length's dim.
    pub fn past_dim(&self) -> &str {
        &self.past
    }
}

/// The logits of row `r`'s last token, of `values` `[rows, len, vocab]`.
fn last_row(values: &[f32], r: usize, len: usize, vocab: usize) -> &[f32] {
    &values[(r * len + len - 1) * vocab..(r * len + len) * vocab]
}

fn shape_text(shape: &[Expr]) -> String {
    let dims: Vec<String> = shape.iter().map(|e| e.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_names_follow_the_past_names() {
        assert_eq!(
            present_name("past_key_values.3.value").as_deref(),
            Some("present.3.value")
        );
        assert_eq!(present_name("past_2").as_deref(), Some("present_2"));
        assert_eq!(present_name("input_ids"), None);
    }
}
