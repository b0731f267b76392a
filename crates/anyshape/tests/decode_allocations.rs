//! A decoder's step allocates nothing: this test binary declares the counting global
//! allocator the `anyshape` binary declares ([`anyshape_abi::CacheLineAllocator`]) and
//! holds this one test alone, so that the count between two reads is the generate
//! loop's own (every thread's allocations count, the kernels' OpenMP threads too).
mod support;

use anyshape_runtime::{Decoder, GenerateOptions, Model, Sampling};

#[global_allocator]
static ALLOCATOR: anyshape_abi::CacheLineAllocator = anyshape_abi::CacheLineAllocator;

/// GPT-2 (TorchScript export) and the Llama-style decoder (dynamo export: the mask's
/// length a dim of its own), compiled by the CLI, generate 64 tokens from prompts of
/// 1 and 37 tokens in this process: the prompt's run allocates (the counter counts),
/// every decode step after it — the first included — allocates nothing, and the
/// tokens are onnxruntime's.
#[test]
fn a_decode_step_allocates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (model, extra) in [
        ("gpt2_tiny_past.ts", None),
        ("llama_tiny_past.dynamo18", Some("total_sequence=1..192")),
    ] {
        let onnx = support::models().join(format!("{model}.onnx"));
        let out = dir.path().join(model);
        let mut args = vec![
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..64",
            "--dim",
            "past_sequence=0..128",
            "--trials",
            "0",
            "--out",
            out.to_str().unwrap(),
        ];
        if let Some(d) = extra {
            args.extend(["--dim", d]);
        }
        let o = support::anyshape(dir.path(), &args);
        assert!(o.status.success(), "{}", support::text(&o));
        let m = Model::load(&out).unwrap();
        let decoder = Decoder::of(&m).unwrap();
        for prompt in [1, 37] {
            let case = support::models().join(format!("{model}.gen_p{prompt}.npz"));
            let arrays = anyshape_tensor::npz::read(&case).unwrap();
            let get = |name: &str| &arrays.iter().find(|(n, _)| n == name).unwrap().1;
            let options = GenerateOptions {
                max_new_tokens: 64,
                sampling: Sampling::Greedy,
                stop_token: None,
                keep_logits: false,
            };
            let g = decoder.generate(&m, get("prompt_ids"), &options).unwrap();
            assert_eq!(
                g.tokens[0],
                get("generated_ids").as_i64().unwrap(),
                "{model} prompt {prompt}"
            );
            let steps = &g.step_allocations;
            assert_eq!(steps.len(), 64);
            assert!(
                steps[0] > 0,
                "{model}: the prompt's run counted no allocation"
            );
            assert!(
                steps[1..].iter().all(|&n| n == 0),
                "{model} prompt {prompt}: decode steps allocated {:?}",
                &steps[1..]
            );
        }
    }
}
