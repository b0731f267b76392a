//! `anyshape bench --model M --generate`: a decoder model module generating text raced
//! against onnxruntime (IO binding), OpenVINO (the model made stateful) and PyTorch
//! eager (transformers' own cache), each with
//! its own decoder loop on the same prompts, greedy, in interleaved rounds: the time to
//! the first token, the decode steps after it, whether every system chose anyshape's
//! tokens, and anyshape's decode against the machine's measured read bandwidth for the
//! bytes a step must read (its kernels' weights and the caches). Writes
//! `generate.md` and `generate.csv`.
use crate::bandwidth::read_bandwidth;
use crate::error::{BenchError, Result};
use crate::model::source_model;
use crate::out::OutDir;
use crate::peers::{PeerKind, PeerOptions, PeerStart, PythonPeer, Started};
use crate::report::geomean;
use anyshape_files::Reads;
use anyshape_measure::Progress;
use anyshape_runtime::{Decoder, GenerateOptions, Model, Sampling};
use anyshape_tensor::Tensor;
use std::fmt::Write as _;
use std::path::Path;

/// What [`compare_generate`] measures and where it writes.
pub struct GenerateCompareOptions<'a> {
    /// Prompt lengths (batch 1).
    pub prompts: &'a [usize],
    /// Tokens generated after each prompt.
    pub new_tokens: usize,
    /// Interleaved rounds per prompt (the order of the systems rotates).
    pub rounds: usize,
    /// The peers and how they run (by default onnxruntime and both OpenVINO
    /// precisions).
    pub peers: PeerOptions<'a>,
    /// Where the report goes.
    pub out_dir: &'a Path,
}

/// One system's generations of one prompt, round by round.
#[derive(Default)]
struct Runs {
    /// Time to the first token, per round.
    first: Vec<f64>,
    /// The median decode step (every step after the first), per round.
    step: Vec<f64>,
    /// The first round's tokens.
    tokens: Vec<i64>,
    /// Why it failed, if it did.
    failed: Option<String>,
}

impl Runs {
    fn record(&mut self, tokens: Vec<i64>, seconds: &[f64]) {
        let mut steps = seconds.get(1..).unwrap_or_default().to_vec();
        steps.sort_by(f64::total_cmp);
        self.first
            .push(seconds.first().copied().unwrap_or(f64::NAN));
        if let Some(&m) = steps.get(steps.len() / 2) {
            self.step.push(m);
        }
        if self.tokens.is_empty() {
            self.tokens = tokens;
        }
    }

    fn first_token(&self) -> Option<f64> {
        self.first.iter().copied().reduce(f64::min)
    }

    fn decode_step(&self) -> Option<f64> {
        self.step.iter().copied().reduce(f64::min)
    }
}

/// Deterministic prompt ids for `length` tokens of a vocabulary of `vocab`.
fn prompt_ids(length: usize, vocab: usize) -> Result<Tensor> {
    let ids = (0..length)
        .map(|i| ((i * 7919 + 13) % vocab.max(1)) as i64)
        .collect();
    Tensor::i64(vec![1, length], ids).map_err(|e| BenchError::Options(e.to_string()))
}

/// Race the decoder model module in `dir` at generating text; returns the summary and
/// the files written.
pub fn compare_generate(
    dir: &Path,
    o: &GenerateCompareOptions,
    progress: &mut dyn Progress,
) -> Result<(String, Vec<String>)> {
    let out = OutDir::new(o.out_dir, Reads::new().dir(dir).clone())?;
    if o.prompts.is_empty() || o.prompts.contains(&0) || o.new_tokens < 2 {
        return Err(BenchError::Options(
            "--generate needs prompt lengths of at least 1 and at least 2 new tokens (the first is the prompt's; the rest are decode steps)".into(),
        ));
    }
    let model = Model::load(dir)?;
    let decoder = Decoder::of(&model)?;
    let source = source_model(&model, o.peers.onnx)?;
    let vocab = model
        .outputs()
        .iter()
        .find(|s| s.name == "logits")
        .and_then(|s| s.shape.last()?.as_const())
        .ok_or_else(|| BenchError::Options("the logits' vocabulary is not a fixed size".into()))?;
    progress.note("measuring the memory read bandwidth ...");
    let bandwidth = read_bandwidth(o.peers.threads, 5);
    let scratch = tempfile::Builder::new()
        .prefix("anyshape-bench-generate")
        .tempdir()
        .map_err(|e| BenchError::Environment(format!("a temporary directory: {e}")))?;
    let outputs: Vec<String> = model.outputs().iter().map(|s| s.name.clone()).collect();
    let start = PeerStart {
        python: o.peers.python,
        torch_python: o.peers.torch_python,
        model: &source,
        threads: o.peers.threads,
        outputs: &outputs,
        scratch: scratch.path(),
    };
    let asked = o.peers.peers.unwrap_or(&[
        PeerKind::Onnxruntime,
        PeerKind::OpenvinoF32,
        PeerKind::Openvino,
        PeerKind::Pytorch,
    ]);
    let mut peers: Vec<PythonPeer> = Vec::new();
    let mut unavailable = Vec::new();
    for &kind in asked {
        if kind == PeerKind::Tract {
            let why = "tract: no decoder loop with a key/value cache to race".to_string();
            if o.peers.peers.is_some() {
                return Err(BenchError::Options(why));
            }
            unavailable.push(why);
            continue;
        }
        match start.python_peer(kind, asked, o.peers.peers.is_some(), progress)? {
            Started::Peer(p) => peers.push(p),
            Started::Skipped => {}
            Started::Unavailable(u) => unavailable.push(u),
        }
    }
    for u in &unavailable {
        progress.note(&format!("warning: {u}"));
    }
    let mut names = vec![crate::peers::anyshape_name(&model)];
    names.extend(peers.iter().map(crate::peers::Peer::name));
    let options = GenerateOptions {
        max_new_tokens: o.new_tokens,
        sampling: Sampling::Greedy,
        stop_token: None,
        keep_logits: false,
    };
    let weights = model.plan().kernel_constant_bytes();
    let mut rows = Vec::new();
    progress.start("prompts", o.prompts.len());
    for &length in o.prompts {
        progress.message(&format!("prompt {length}"));
        let ids = prompt_ids(length, vocab as usize)?;
        let npz = scratch.path().join(format!("prompt-{length}.npz"));
        anyshape_tensor::npz::write(
            &npz,
            &[("prompt_ids".into(), ids.clone())],
            &Reads::new(),
            "a prompt file",
        )
        .map_err(|e| BenchError::Environment(e.to_string()))?;
        let n = names.len();
        let mut runs: Vec<Runs> = (0..n).map(|_| Runs::default()).collect();
        for r in 0..o.rounds {
            for k in 0..n {
                let s = (k + r) % n;
                if runs[s].failed.is_some() {
                    continue;
                }
                let result = if s == 0 {
                    decoder
                        .generate(&model, &ids, &options)
                        .map(|g| (g.tokens.concat(), g.step_seconds))
                        .map_err(BenchError::from)
                } else {
                    peers[s - 1]
                        .generate(&npz, o.new_tokens)
                        .map(|(t, times)| (t.concat(), times))
                };
                match result {
                    Ok((tokens, seconds)) => runs[s].record(tokens, &seconds),
                    Err(e) => runs[s].failed = Some(e.to_string()),
                }
            }
        }
        let line: Vec<String> = names
            .iter()
            .zip(&runs)
            .map(|(name, r)| match (r.first_token(), r.decode_step()) {
                (Some(f), Some(d)) => {
                    format!(
                        "{name} first token {:.2} ms, {:.1} tokens/s",
                        f * 1e3,
                        1.0 / d
                    )
                }
                _ => format!("{name} failed"),
            })
            .collect();
        progress.note(&format!("prompt {length}: {}", line.join("; ")));
        // A decode step reads every weight and the caches at their mean past length.
        let mean_past = length + (o.new_tokens - 1) / 2;
        let step_bytes = weights + decoder.cache_bytes(1, mean_past)?;
        rows.push((length, runs, step_bytes));
        progress.inc(1);
    }
    progress.finish();
    let report = Report {
        dir,
        o,
        names: &names,
        rows: &rows,
        bandwidth,
        weights,
        unavailable: &unavailable,
    };
    let md = report.markdown();
    let written = vec![
        out.write("generate.md", md.as_bytes())?
            .display()
            .to_string(),
        out.write("generate.csv", report.csv().as_bytes())?
            .display()
            .to_string(),
    ];
    Ok((md, written))
}

struct Report<'a> {
    dir: &'a Path,
    o: &'a GenerateCompareOptions<'a>,
    names: &'a [String],
    /// Per prompt: its length, each system's runs, the bytes a decode step reads.
    rows: &'a [(usize, Vec<Runs>, u64)],
    bandwidth: f64,
    weights: u64,
    unavailable: &'a [String],
}

impl Report<'_> {
    /// How many of system `s`'s tokens match anyshape's, of how many.
    fn agreement(runs: &[Runs], s: usize) -> (usize, usize) {
        let same = runs[s]
            .tokens
            .iter()
            .zip(&runs[0].tokens)
            .take_while(|(a, b)| a == b)
            .count();
        (same, runs[0].tokens.len())
    }

    fn markdown(&self) -> String {
        let mut s = crate::out::heading(format!(
            "anyshape bench --model --generate: {}",
            self.dir.display()
        ));
        let _ = writeln!(
            s,
            "Greedy generation of {} tokens after each prompt (batch 1), every system with its own decoder loop on the same prompt: anyshape's `Decoder`, onnxruntime with IO binding (the present caches bound as the next step's past), OpenVINO with the model made stateful, PyTorch eager with transformers' own cache (the model rebuilt by `models/export.py`). {} interleaved rounds (the order rotates); first token = the minimum over rounds of the prompt's step; decode = the minimum over rounds of the median step after it. Speedup > 1: anyshape is faster. Tokens: how many of the system's tokens equal anyshape's (a prefix).\n",
            self.o.new_tokens, self.o.rounds
        );
        let _ = writeln!(
            s,
            "Memory read bandwidth measured in this run ({} threads, best of 5 passes over 1 GiB): {:.1} GB/s. A decode step reads the kernels' weights ({:.1} MB) and the caches at the mean past length.\n",
            self.o.peers.threads,
            self.bandwidth / 1e9,
            self.weights as f64 / 1e6
        );
        let mut head = "| prompt | system | first token ms | decode ms/token | tokens/s | tokens as anyshape's |".to_string();
        let mut rule = "|---:|---|---:|---:|---:|---:|".to_string();
        head.push_str(" first-token speedup | decode speedup |");
        rule.push_str("---:|---:|");
        let _ = writeln!(s, "{head}\n{rule}");
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); self.names.len()];
        for (length, runs, _) in self.rows {
            for (p, name) in self.names.iter().enumerate() {
                let r = &runs[p];
                let (Some(f), Some(d)) = (r.first_token(), r.decode_step()) else {
                    let why = r.failed.as_deref().unwrap_or("no runs");
                    let _ = writeln!(s, "| {length} | {name} | failed: {why} | | | | | |");
                    continue;
                };
                let (same, of) = Self::agreement(runs, p);
                let (fs, ds) = match (runs[0].first_token(), runs[0].decode_step()) {
                    (Some(af), Some(ad)) if p > 0 => {
                        ratios[p].push(f / af);
                        ratios[p].push(d / ad);
                        (format!("{:.2}x", f / af), format!("{:.2}x", d / ad))
                    }
                    _ => ("".into(), "".into()),
                };
                let _ = writeln!(
                    s,
                    "| {length} | {name} | {:.2} | {:.2} | {:.1} | {same} of {of} | {fs} | {ds} |",
                    f * 1e3,
                    d * 1e3,
                    1.0 / d
                );
            }
        }
        s.push('\n');
        for (p, v) in ratios.iter().enumerate().skip(1) {
            if !v.is_empty() {
                let _ = writeln!(
                    s,
                    "- anyshape vs {}: geomean speedup **{:.2}x** over the first tokens and decode steps of {} prompts.",
                    self.names[p],
                    geomean(v),
                    v.len() / 2
                );
            }
        }
        for (length, runs, bytes) in self.rows {
            if let Some(d) = runs[0].decode_step() {
                let rate = *bytes as f64 / d;
                let _ = writeln!(
                    s,
                    "- anyshape's decode after a prompt of {length}: {:.1} MB per step in {:.2} ms = {:.1} GB/s, {:.0} % of the measured read bandwidth.",
                    *bytes as f64 / 1e6,
                    d * 1e3,
                    rate / 1e9,
                    100.0 * rate / self.bandwidth
                );
            }
        }
        for u in self.unavailable {
            let _ = writeln!(s, "- not compared: {u}");
        }
        s
    }

    fn csv(&self) -> String {
        let mut s = "prompt,system,first_token_ms,decode_ms_per_token,tokens_per_second,tokens_as_anyshape,step_bytes\n".to_string();
        for (length, runs, bytes) in self.rows {
            for (p, name) in self.names.iter().enumerate() {
                let r = &runs[p];
                let (same, _) = Self::agreement(runs, p);
                let f = r
                    .first_token()
                    .map_or(String::new(), |f| format!("{:.4}", f * 1e3));
                let d = r.decode_step();
                let _ = writeln!(
                    s,
                    "{length},\"{name}\",{f},{},{},{same},{bytes}",
                    d.map_or(String::new(), |d| format!("{:.4}", d * 1e3)),
                    d.map_or(String::new(), |d| format!("{:.2}", 1.0 / d)),
                );
            }
        }
        s
    }
}
