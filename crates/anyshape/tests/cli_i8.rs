//! `--precision i8` through the command line: on the detected target and on one without
//! AVX512_VNNI, AVX512_BF16 and AMX (where `compile` says the 8-bit products run byte
//! by byte and attention stays f32), an encoder's dense layers as `dense_i8` and its
//! outputs within i8's tolerance of onnxruntime's; a decoder's steps with and without a
//! past likewise.
mod support;

use support::{anyshape, models, text};

#[test]
fn i8_compiles_encoders_and_decoders_within_its_precision() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let detected = anyshape(d, &["target"]);
    assert!(detected.status.success(), "{}", text(&detected));
    let mut target: serde_json::Value = serde_json::from_slice(&detected.stdout).unwrap();
    let flag = |t: &serde_json::Value, f: &str| t[f].as_bool().unwrap_or(false);
    let (vnni, bf16) = (
        flag(&target, "avx512_vnni"),
        flag(&target, "avx512_bf16") || flag(&target, "amx"),
    );
    for f in ["avx512_vnni", "avx512_bf16", "amx"] {
        target.as_object_mut().unwrap().remove(f);
    }
    let plain = d.join("plain.json");
    std::fs::write(&plain, target.to_string()).unwrap();
    let compile = |onnx: &str, dims: &[&str], module: &str, target: Option<&str>| {
        let onnx = models().join(onnx);
        let mut args = vec!["compile", onnx.to_str().unwrap()];
        for dim in dims {
            args.extend(["--dim", dim]);
        }
        args.extend(["--precision", "i8", "--quiet", "--out", module]);
        if let Some(t) = target {
            args.extend(["--target", t]);
        }
        let o = anyshape(d, &args);
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let run = |module: &str, case: &str| {
        let case = models().join(case);
        let o = anyshape(
            d,
            &[
                "run",
                "--module",
                module,
                "--inputs",
                case.to_str().unwrap(),
            ],
        );
        // Checked within i8's default bound (1e-1) of the recorded outputs.
        assert!(o.status.success(), "{module} {case:?}: {}", text(&o));
    };
    let plain = plain.to_str().unwrap();
    for (target, vnni, bf16) in [(None, vnni, bf16), (Some(plain), false, false)] {
        let module = format!("bert-{}.module", target.is_some());
        let said = compile(
            "bert_tiny.dynamo.onnx",
            &["batch=1", "sequence=1..64"],
            &module,
            target,
        );
        assert_eq!(said.contains("byte by byte"), !vnni, "{target:?}: {said}");
        let o = anyshape(d, &["inspect", &module]);
        let shown = text(&o);
        assert!(shown.contains("precision    i8"), "{shown}");
        assert!(shown.contains("dense_i8("), "{shown}");
        assert!(!shown.contains("dense_packed("), "{shown}");
        assert_eq!(
            shown.contains("attention_bf16("),
            bf16,
            "{target:?}: {shown}"
        );
        for case in ["bert_tiny.dynamo.s1.npz", "bert_tiny.dynamo.s37.npz"] {
            run(&module, case);
        }
    }
    compile(
        "gpt2_tiny_past.ts.onnx",
        &["batch=1..4", "sequence=1..64", "past_sequence=0..128"],
        "gpt2.module",
        None,
    );
    for case in ["p0s37", "p37s1", "p5s3", "b3p17s1"] {
        run("gpt2.module", &format!("gpt2_tiny_past.ts.{case}.npz"));
    }
}
