//! `anyshape generate`: tokens from a decoder model module that carries its key/value
//! cache (the loop is `anyshape_runtime::Decoder`'s): the prompt from an int64 `.npy`
//! or a recorded `.npz` (whose generated tokens and logits are then checked), the new
//! tokens and the time to the first token and of each further one printed, and with
//! `--output` written as a `.npz` of the recorded layout.
use anyhow::{bail, Context, Result};
use anyshape_files::Reads;
use anyshape_runtime::{Decoder, GenerateOptions, Model, Sampling};
use anyshape_tensor::Tensor;
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Options of `anyshape generate`.
#[derive(Args)]
pub struct GenerateArgs {
    /// The model module (compiled from a decoder whose inputs are `input_ids`,
    /// optionally `attention_mask` and `position_ids`, and `past…` caches, and whose
    /// outputs are `logits` and the `present…` caches).
    #[arg(long, value_name = "DIR")]
    module: PathBuf,
    /// The prompt's token ids: an int64 `.npy` of `[length]` or `[batch, length]`, or a
    /// `.npz` holding `prompt_ids` — where it also holds `generated_ids` (and `logits`),
    /// as `models/export.py` records them, greedy generation is checked against them.
    #[arg(long, value_name = "FILE")]
    prompt_ids: PathBuf,
    /// How many tokens to generate after the prompt.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_new_tokens: u64,
    /// Sample each token (softmax of the logits over `--temperature`, among the
    /// `--top-k` most likely) instead of taking the most likely one.
    #[arg(long)]
    sample: bool,
    /// With --sample: the logits are divided by it (below 1 sharpens).
    #[arg(long, default_value_t = 1.0, value_parser = crate::positive)]
    temperature: f64,
    /// With --sample: only the this many most likely tokens are drawn from.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    top_k: Option<u64>,
    /// With --sample: the generator's seed (the same seed draws the same tokens).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A token that ends a row (the end-of-text token).
    #[arg(long)]
    stop_token: Option<i64>,
    /// Write `prompt_ids` and `generated_ids` to this `.npz`.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// The largest relative error of the logits from recorded ones that passes
    /// [default: 1e-4; 2e-2 for a module compiled with --precision bf16, 1e-1 with
    /// --precision i8].
    #[arg(long, value_parser = crate::positive)]
    max_error: Option<f64>,
}

/// What a recorded generation holds besides its prompt.
struct Recorded {
    tokens: Option<Tensor>,
    logits: Option<Tensor>,
}

/// The prompt as `[batch, length]` and what the file recorded of its generation.
fn prompt(path: &Path) -> Result<(Tensor, Recorded)> {
    let is_npz = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("npz"));
    let (ids, recorded) = if is_npz {
        let mut arrays = anyshape_tensor::npz::read(path)?;
        let mut take = |name: &str| {
            arrays
                .iter()
                .position(|(n, _)| n == name)
                .map(|i| arrays.swap_remove(i).1)
        };
        let ids = take("prompt_ids")
            .with_context(|| format!("{} holds no `prompt_ids` array", path.display()))?;
        let recorded = Recorded {
            tokens: take("generated_ids"),
            logits: take("logits"),
        };
        (ids, recorded)
    } else {
        let recorded = Recorded {
            tokens: None,
            logits: None,
        };
        (anyshape_tensor::npz::read_npy(path)?, recorded)
    };
    let ids = match ids.shape.len() {
        1 => ids.reshaped(vec![1, ids.shape[0]])?,
        2 => ids,
        _ => bail!(
            "{}: the prompt's token ids are {:?}: expected [length] or [batch, length]",
            path.display(),
            ids.shape
        ),
    };
    Ok((ids, recorded))
}

/// Run `anyshape generate`.
pub fn generate(a: GenerateArgs) -> Result<()> {
    let mut reads = Reads::new();
    reads.dir(&a.module);
    reads.file(&a.prompt_ids);
    if let Some(out) = &a.output {
        reads.check("--output", out)?;
    }
    if !a.sample && (a.top_k.is_some() || a.seed != 0 || a.temperature != 1.0) {
        bail!("--temperature, --top-k and --seed choose how --sample draws: add --sample, or leave them out for greedy generation");
    }
    let (ids, recorded) = prompt(&a.prompt_ids)?;
    let loading = Instant::now();
    let model = Model::load(&a.module)?;
    let decoder = Decoder::of(&model)?;
    println!(
        "model        {}  (loaded in {:.1} ms; cache grows along `{}`, {})",
        a.module.display(),
        loading.elapsed().as_secs_f64() * 1e3,
        decoder.past_dim(),
        if decoder.keeps_caches(&model) {
            "kept in place"
        } else {
            "passed from run to run: a step other than the attention reads it"
        }
    );
    let options = GenerateOptions {
        max_new_tokens: usize::try_from(a.max_new_tokens)?,
        sampling: if a.sample {
            Sampling::Sample {
                temperature: a.temperature as f32,
                top_k: a.top_k.map(usize::try_from).transpose()?,
                seed: a.seed,
            }
        } else {
            Sampling::Greedy
        },
        stop_token: a.stop_token,
        keep_logits: recorded.logits.is_some() && !a.sample,
    };
    let g = decoder.generate(&model, &ids, &options)?;
    println!(
        "prompt       {} x {} tokens from {}",
        ids.shape[0],
        ids.shape[1],
        a.prompt_ids.display()
    );
    for (r, row) in g.tokens.iter().enumerate() {
        let shown: Vec<String> = row.iter().take(24).map(|t| t.to_string()).collect();
        println!(
            "generated    row {r}: {} tokens: {}{}",
            row.len(),
            shown.join(" "),
            if row.len() > 24 { " ..." } else { "" }
        );
    }
    let mut steps = g.step_seconds.get(1..).unwrap_or_default().to_vec();
    steps.sort_by(f64::total_cmp);
    println!(
        "timing       time to first token {:.3} ms; {}",
        g.time_to_first_token() * 1e3,
        match g.decode_tokens_per_second() {
            Some(rate) => format!(
                "decode {rate:.1} tokens/s over {} steps (median step {:.3} ms)",
                steps.len(),
                steps[steps.len() / 2] * 1e3
            ),
            None => "no decode steps".into(),
        }
    );
    if let (Some(first), Some(rest)) = (g.step_allocations.first(), g.step_allocations.get(1..)) {
        println!(
            "allocations  the prompt's run {first}; the decode steps {} in all, at most {} in one",
            rest.iter().sum::<u64>(),
            rest.iter().max().unwrap_or(&0)
        );
    }
    if let Some(path) = &a.output {
        let width = g.tokens.iter().map(Vec::len).max().unwrap_or(0);
        if g.tokens.iter().any(|r| r.len() != width) {
            bail!("rows stopped at different lengths: --output writes rows of one length; generate without --stop-token");
        }
        let generated = Tensor::i64(
            vec![g.tokens.len(), width],
            g.tokens.iter().flatten().copied().collect(),
        )?;
        let arrays = [
            ("prompt_ids".to_string(), ids.clone()),
            ("generated_ids".to_string(), generated),
        ];
        anyshape_tensor::npz::write(path, &arrays, &reads, "--output")?;
        println!("written      {}", path.display());
    }
    if a.sample {
        if recorded.tokens.is_some() {
            println!("check        none: the recorded tokens are greedy, these were sampled");
        }
        return Ok(());
    }
    let max_error = a
        .max_error
        .unwrap_or(model.manifest().precision.expected_error());
    check(&a, &g, &recorded, max_error)
}

/// Compare a greedy generation with a recorded one: every token, and each step's
/// logits within `max_error`.
fn check(
    a: &GenerateArgs,
    g: &anyshape_runtime::Generation,
    recorded: &Recorded,
    max_error: f64,
) -> Result<()> {
    let source = a.prompt_ids.display();
    if let Some(want) = &recorded.tokens {
        let want = want
            .as_i64()
            .context("recorded generated_ids must be int64")?;
        let got: Vec<i64> = g.tokens.iter().flatten().copied().collect();
        let n = got.len().min(want.len());
        let same = got.iter().zip(want).take_while(|(x, y)| x == y).count();
        println!("check        tokens: {same} of {n} as recorded in {source}");
        if same < n {
            bail!(
                "token {same} differs from the recording in {source}: {} where {} is recorded",
                got[same],
                want[same]
            );
        }
    }
    if let Some(want) = &recorded.logits {
        let steps = g.logits.len().min(want.shape.first().copied().unwrap_or(0));
        let row = want.len() / want.shape.first().copied().unwrap_or(1).max(1);
        let values = want.as_f32().context("recorded logits must be float")?;
        let mut worst: Option<(usize, anyshape_tensor::Comparison)> = None;
        for (step, got) in g.logits.iter().take(steps).enumerate() {
            let expected = Tensor::f32(
                got.shape.clone(),
                values[step * row..(step + 1) * row].to_vec(),
            )
            .context("the recorded logits' rows do not match the model's")?;
            let c = anyshape_tensor::compare(got, &expected).map_err(anyhow::Error::msg)?;
            if worst.as_ref().is_none_or(|(_, w)| c.error() > w.error()) {
                worst = Some((step, c));
            }
        }
        if let Some((step, c)) = worst {
            println!("check        logits of {steps} steps: worst at step {step}: {c}");
            if !c.passes(max_error) {
                bail!(
                    "the logits differ from those recorded in {source} by more than {max_error:e}"
                );
            }
        }
    }
    Ok(())
}
