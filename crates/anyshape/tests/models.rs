//! Imported models compiled into model modules (`anyshape_tune::compile_model`, every
//! task with its sketch's default micro-kernel, what `--trials 0` gives), loaded by the
//! runtime from their plans and run on every recorded case — in the compiled range and
//! past it — against onnxruntime's outputs.
use anyshape_codegen::CpuTarget;
use anyshape_ir::ShapeVar;
use anyshape_measure::{Builder, MeasureOptions, Measurer, Runner, WorkerCommand};
use anyshape_runtime::Model;
use anyshape_tensor::TensorRef;
use anyshape_tune::{compile_model, ModelOptions, Observer, Stage};
use std::path::{Path, PathBuf};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// Hears nothing.
struct Quiet;

impl Observer for Quiet {
    fn stage(&mut self, _: &Stage) {}
    fn round(&mut self, _: &anyshape_tune::RoundSummary) {}
    fn trials(&mut self, _: usize) {}
}

/// Compile `model` for `dims` into a model module in `dir` and load it.
fn compile(model: &str, dims: &[&str], dir: &Path) -> Model {
    compile_with(model, dims, dir, &ModelOptions::default())
}

/// [`compile`] with `options`.
fn compile_with(model: &str, dims: &[&str], dir: &Path, options: &ModelOptions) -> Model {
    let out = dir.join("m");
    let measurer = Measurer {
        builder: Builder::new(Path::new(env!("CARGO_TARGET_TMPDIR")).join("anyshape-test-cache")),
        runner: Runner {
            worker: WorkerCommand {
                program: env!("CARGO_BIN_EXE_anyshape").into(),
                args: vec!["__worker".into()],
            },
            options: MeasureOptions::default(),
        },
        queue: None,
    };
    let dims: Vec<ShapeVar> = dims.iter().map(|d| ShapeVar::parse(d).unwrap()).collect();
    compile_model(
        &models().join(format!("{model}.onnx")),
        &dims,
        &CpuTarget::detect(),
        &measurer,
        options,
        &out,
        &mut Quiet,
    )
    .unwrap_or_else(|e| panic!("{model}: {e}"));
    Model::load(&out).unwrap()
}

/// Compile `model` for `dims`, then run every case and compare every output; every
/// case again through `run_into` with the last case's outputs to write over (of
/// other shapes from case to case), which must give the same.
fn check(model: &str, dims: &[&str], cases: &[&str]) {
    check_with(model, dims, cases, &ModelOptions::default())
}

/// [`check`] with `options`.
fn check_with(model: &str, dims: &[&str], cases: &[&str], options: &ModelOptions) {
    let dir = tempfile::tempdir().unwrap();
    let m = compile_with(model, dims, dir.path(), options);
    let mut reused = vec![None; m.outputs().len()];
    for case in cases {
        let arrays =
            anyshape_tensor::npz::read(&models().join(format!("{model}.{case}.npz"))).unwrap();
        let inputs: Vec<(&str, TensorRef)> = m
            .inputs()
            .iter()
            .map(|s| {
                let t = &arrays.iter().find(|(n, _)| *n == s.name).unwrap().1;
                (s.name.as_str(), t.view())
            })
            .collect();
        let outs = m
            .run(&inputs)
            .unwrap_or_else(|e| panic!("{model} {case}: {e}"));
        for (spec, got) in m.outputs().iter().zip(&outs) {
            let want = &arrays.iter().find(|(n, _)| *n == spec.name).unwrap().1;
            let c = anyshape_tensor::compare(got, want).unwrap();
            eprintln!("{model} {case} {}: compiled, {c}", spec.name);
            assert!(c.passes(1e-4), "{model} {case} {}: {c}", spec.name);
        }
        m.run_into(&inputs, &mut reused)
            .unwrap_or_else(|e| panic!("{model} {case} into given outputs: {e}"));
        let again: Vec<_> = reused.iter().flatten().cloned().collect();
        assert!(again == outs, "{model} {case}: run_into differs from run");
    }
}

const TEXT: [&str; 2] = ["batch=1..2", "sequence=1..64"];

/// Sequence 128 and batch 3 are past the compiled range.
#[test]
fn bert_runs_compiled() {
    check("bert_tiny.ts", &TEXT, &["s1", "s37", "s128", "b3s17"]);
    check("bert_tiny.dynamo", &TEXT, &["s37", "b3s17"]);
}

#[test]
fn gpt2_runs_compiled() {
    check("gpt2_tiny.dynamo18", &TEXT, &["s1", "s37", "s128", "b3s17"]);
    check("gpt2_tiny.ts", &TEXT, &["s37", "b3s17"]);
}

#[test]
fn vit_runs_compiled() {
    let dims = ["batch=1", "height=160..224", "width=160..224"];
    check(
        "vit_tiny.dynamo",
        &dims,
        &["i224", "i160x256", "i384", "b2i224"],
    );
    check("vit_tiny.ts", &dims, &["i224", "b2i224"]);
}

/// The other encoder families: RoBERTa (position ids from a `CumSum` of the mask, and
/// `GatherElements`), ALBERT (factorized embeddings, layers sharing weights), DistilBERT,
/// T5's encoder (relative position buckets: `Log`, `Min`, `Where` over the positions;
/// RMS norm decomposed; gated GELU) — both exporters where both export them.
#[test]
fn encoder_families_run_compiled() {
    let cases = ["s1", "s37", "s128", "b3s17"];
    for model in [
        "roberta_tiny.ts",
        "roberta_tiny.dynamo",
        "albert_tiny.ts",
        "albert_tiny.dynamo",
        "distilbert_tiny.ts",
        "distilbert_tiny.dynamo",
        "t5enc_tiny.ts",
    ] {
        check(model, &TEXT, &cases);
    }
}

/// A Llama-style decoder (RMS norm, rotary embeddings from `Sin`/`Cos` of the positions,
/// SiLU-gated MLP, grouped-query attention: 4 query heads over 2 key/value heads, a
/// causal mask) without its cache.
#[test]
fn llama_runs_compiled() {
    check("llama_tiny.ts", &TEXT, &["s1", "s37", "s128", "b3s17"]);
    check("llama_tiny.dynamo18", &TEXT, &["s37", "b3s17"]);
}

/// A ResNet (convolutions with batch norm, max pooling, residual adds, global average
/// pooling) over any image size: 64x64, 96x96 at batch 2, 160x224, and 97x97 (odd, and
/// past the range); its 3 x 3 convolutions by Winograd's transforms (the default: 2 x 2
/// tiles for images from 32 up, 4 x 4 ones in the first stage for images from 48 up)
/// and over their patches (`--no-winograd`), whose plan has no Winograd step.
#[test]
fn resnet_runs_compiled() {
    let dims = ["batch=1..2", "height=32..96", "width=32..96"];
    let cases = ["i64", "b2i96", "i160x224", "i97"];
    check("resnet_tiny.ts", &dims, &cases);
    check("resnet_tiny.dynamo18", &dims, &cases);
    let direct = ModelOptions {
        winograd: false,
        ..ModelOptions::default()
    };
    check_with("resnet_tiny.ts", &dims, &cases, &direct);
    let winograd_steps = |options: &ModelOptions| {
        let dir = tempfile::tempdir().unwrap();
        let m = compile_with("resnet_tiny.ts", &dims, dir.path(), options);
        m.plan()
            .steps
            .iter()
            .filter(|s| matches!(s, anyshape_plan::Step::Host(n) if n.op.starts_with("anyshape.Winograd")))
            .count()
    };
    assert_eq!(winograd_steps(&ModelOptions::default()), 6);
    assert_eq!(winograd_steps(&direct), 0);
    // From 48 x 48 images up, the first stage's outputs are 12 x 12 or more: its two
    // convolutions take F(4x4, 3x3), the second stage's (6 x 6 up) F(2x2, 3x3).
    let wide = ["batch=1..2", "height=48..224", "width=48..224"];
    check("resnet_tiny.ts", &wide, &cases);
    let dir = tempfile::tempdir().unwrap();
    let m = compile_with(
        "resnet_tiny.ts",
        &wide,
        dir.path(),
        &ModelOptions::default(),
    );
    let tiles: Vec<i64> = m
        .plan()
        .steps
        .iter()
        .filter_map(|s| match s {
            anyshape_plan::Step::Host(n) if n.op == "anyshape.WinogradOutput" => {
                n.int("tile", 2).ok()
            }
            _ => None,
        })
        .collect();
    assert_eq!(tiles, [4, 4, 2]);
}

/// A model's host steps (the ResNet's patch layouts and max pool) split their work over
/// the threads its kernels run on: a task module's parallel loop runs every part once,
/// on as many threads as the target has cores, and a part's panic reaches the caller
/// (not unwinding through C).
#[test]
fn host_steps_split_over_the_kernels_threads() {
    use anyshape_tensor::Split;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let m = compile(
        "resnet_tiny.ts",
        &["batch=1", "height=32..64", "width=32..64"],
        dir.path(),
    );
    assert!(m.workers().is_parallel());
    let task = &m.manifest().tasks[0].module;
    let module = anyshape_runtime::Module::load(dir.path().join("m").join(task)).unwrap();
    let threads = module.threads().expect("a module's parallel loop");
    let runs: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
    let ids = std::sync::Mutex::new(std::collections::HashSet::new());
    threads.split(runs.len(), &|i| {
        runs[i].fetch_add(1, Ordering::Relaxed);
        ids.lock().unwrap().insert(std::thread::current().id());
    });
    assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
    let cores = CpuTarget::detect().cores;
    assert_eq!(ids.into_inner().unwrap().len(), cores.min(runs.len()));
    // A panic without the hook's message (`resume_unwind`), so the log stays quiet.
    let panicked = std::panic::catch_unwind(|| {
        threads.split(8, &|i| {
            if i == 5 {
                std::panic::resume_unwind(Box::new("part 5 fails"));
            }
        });
    });
    let message = panicked.unwrap_err();
    let text = message.downcast_ref::<&str>().copied().unwrap_or_default();
    assert!(text.contains("part 5 fails"), "{text}");
}

/// GPT-2 with its key/value cache as inputs and outputs, compiled for a past from 0
/// (the prompt) to 64: prompts, later steps, a past of 128 (past the range) and batch 3
/// (past it too), in one process, so a step with an empty past follows ones with a
/// past (a reduction over no past must not leave an earlier run's values).
#[test]
fn gpt2_with_past_runs_compiled() {
    let dims = ["batch=1..2", "sequence=1..64", "past_sequence=0..64"];
    let cases = ["p37s1", "p0s1", "p5s3", "p0s37", "p128s1", "b3p17s1"];
    check("gpt2_tiny_past.ts", &dims, &cases);
    let total = [&dims[..], &["total_sequence=1..128"]].concat();
    check("gpt2_tiny_past.dynamo18", &total, &cases);
    check("llama_tiny_past.ts", &dims, &cases);
    check("llama_tiny_past.dynamo18", &total, &cases);
}

/// Greedy generation (the prompt, then a run per token, the caches kept in place and
/// appended to) gives onnxruntime's tokens and, at every step, its
/// logits within 1e-4, for prompts of 1, 37 and 200 tokens (past the compiled range)
/// and 64 new tokens: GPT-2 and the Llama-style decoder (its cache of 2 key/value
/// heads, rotary positions from the cache's length), each from both exporters.
#[test]
fn decoders_generate_onnxruntime_tokens() {
    use anyshape_runtime::{Decoder, GenerateOptions, Sampling};
    let dims = ["batch=1", "sequence=1..64", "past_sequence=0..128"];
    let total = [&dims[..], &["total_sequence=1..192"]].concat();
    for (model, dims) in [
        ("gpt2_tiny_past.ts", dims.to_vec()),
        ("gpt2_tiny_past.dynamo18", total.clone()),
        ("llama_tiny_past.ts", dims.to_vec()),
        ("llama_tiny_past.dynamo18", total.clone()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let m = compile(model, &dims, dir.path());
        let decoder = Decoder::of(&m).unwrap();
        assert_eq!(decoder.past_dim(), "past_sequence");
        // The decoder keeps them in place (what the tokens below check).
        assert_eq!(m.plan().caches.len(), 4, "{model}");
        assert!(decoder.keeps_caches(&m), "{model}");
        for prompt in [1, 37, 200] {
            let case = models().join(format!("{model}.gen_p{prompt}.npz"));
            let arrays = anyshape_tensor::npz::read(&case).unwrap();
            let get = |name: &str| &arrays.iter().find(|(n, _)| n == name).unwrap().1;
            let options = GenerateOptions {
                max_new_tokens: 64,
                sampling: Sampling::Greedy,
                stop_token: None,
                keep_logits: true,
            };
            let g = decoder.generate(&m, get("prompt_ids"), &options).unwrap();
            assert_eq!(
                g.tokens[0],
                get("generated_ids").as_i64().unwrap(),
                "{model} prompt {prompt}"
            );
            let want = get("logits").as_f32().unwrap();
            assert_eq!(g.logits.len(), 64);
            for (step, got) in g.logits.iter().enumerate() {
                let vocab = got.len();
                let row = anyshape_tensor::Tensor::f32(
                    got.shape.clone(),
                    want[step * vocab..(step + 1) * vocab].to_vec(),
                )
                .unwrap();
                let c = anyshape_tensor::compare(got, &row).unwrap();
                assert!(c.passes(1e-4), "{model} prompt {prompt} step {step}: {c}");
            }
            assert_eq!(g.step_seconds.len(), 64);
        }
    }
}

/// GPT-2's caches kept in place: every cache of the plan is one (its attention reads it
/// with rows to spare), and a run that keeps them — the new rows appended, the kernels
/// reading the buffers with the room left — gives what plain runs give with the
/// presents passed back as pasts (a prompt of 37, then single tokens); a run past the
/// room, or at another batch, is refused with why.
#[test]
fn gpt2_keeps_its_caches_in_place() {
    use anyshape_ir::Bindings;
    use anyshape_tensor::{compare, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let m = compile(
        "gpt2_tiny_past.ts",
        &["batch=1..2", "sequence=1..64", "past_sequence=0..64"],
        dir.path(),
    );
    assert_eq!(m.plan().caches.len(), 4, "two layers' keys and values");
    let capacity = 40;
    let mut state = m
        .cache_state(&Bindings::from_pairs([("batch", 1)]), capacity)
        .unwrap();
    let mut past: Vec<Tensor> = (0..4)
        .map(|_| Tensor::f32(vec![1, 4, 0, 16], Vec::new()).unwrap())
        .collect();
    let names: Vec<String> = m.inputs().iter().map(|s| s.name.clone()).collect();
    let mut ids: Vec<i64> = (0..37).map(|i| (i * 7919) % 1000).collect();
    let mut len = 0;
    while len + ids.len() <= capacity {
        let n = ids.len();
        let t_ids = Tensor::i64(vec![1, n], ids.clone()).unwrap();
        let mask = Tensor::i64(vec![1, len + n], vec![1; len + n]).unwrap();
        let given = [("input_ids", t_ids.view()), ("attention_mask", mask.view())];
        let kept = m.run_cached(&given, &mut state).unwrap();
        let mut plain_in: Vec<(&str, anyshape_tensor::TensorRef)> = given.to_vec();
        for (name, t) in names.iter().filter(|n| n.starts_with("past")).zip(&past) {
            plain_in.push((name, t.view()));
        }
        let plain = m.run(&plain_in).unwrap();
        let logits = kept[0].as_ref().unwrap();
        let c = compare(logits, &plain[0]).unwrap();
        assert!(c.passes(1e-5), "past {len}: {c}");
        assert!(
            kept[1..].iter().all(Option::is_none),
            "the presents stay kept"
        );
        past = plain[1..].to_vec();
        len += n;
        assert_eq!(state.len(), len);
        let vocab = logits.shape[2];
        let last = &logits.as_f32().unwrap()[(n - 1) * vocab..];
        let next = (0..vocab)
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap();
        ids = vec![next as i64];
    }
    // What a run of one token per row, `seen` positions in all, says.
    let refused = |state: &mut anyshape_runtime::CacheState, rows: usize, seen: usize| {
        let t_ids = Tensor::i64(vec![rows, 1], vec![1; rows]).unwrap();
        let mask = Tensor::i64(vec![rows, seen], vec![1; rows * seen]).unwrap();
        m.run_cached(
            &[("input_ids", t_ids.view()), ("attention_mask", mask.view())],
            state,
        )
        .unwrap_err()
        .to_string()
    };
    // One more position than the room.
    let e = refused(&mut state, 1, len + 1);
    assert!(e.contains("room for 40"), "{e}");
    assert_eq!(state.len(), len, "a refused run appends nothing");
    // Another batch than the caches were made for.
    let mut state = m
        .cache_state(&Bindings::from_pairs([("batch", 1)]), capacity)
        .unwrap();
    let e = refused(&mut state, 2, 1);
    assert!(e.contains("the caches were made"), "{e}");
}
