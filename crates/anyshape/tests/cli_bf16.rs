//! `--precision bf16` through the command line: what `compile` says a bf16 module's
//! products run on here (AMX's tiles; `vdpbf16ps`, its peak measured against the f32
//! FMAs' because on some CPUs it is no faster; shifts without AVX512_BF16), on the
//! detected target and on the same target without AMX, and each module's outputs within
//! bf16's tolerance of onnxruntime's.
mod support;

use support::{anyshape, models, text};

#[test]
fn bf16_compile_says_what_its_products_run_on() {
    let dir = tempfile::tempdir().unwrap();
    let features = anyshape_abi::host_cpu_features();
    let pairs = features.iter().any(|f| f == "avx512_bf16");
    let detected = anyshape(dir.path(), &["target"]);
    assert!(detected.status.success(), "{}", text(&detected));
    let mut target: serde_json::Value = serde_json::from_slice(&detected.stdout).unwrap();
    let amx = target["amx"].as_bool().unwrap_or(false);
    target.as_object_mut().unwrap().remove("amx");
    let no_amx = dir.path().join("no-amx.json");
    std::fs::write(&no_amx, target.to_string()).unwrap();
    let products = |amx: bool| match (amx, pairs) {
        (true, _) => "multiply on its tiles (tdpbf16ps)",
        (false, true) => "bf16 products (vdpbf16ps) peak at",
        (false, false) => "this CPU has no AVX512_BF16",
    };
    let onnx = models().join("bert_tiny.dynamo.onnx");
    let case = models().join("bert_tiny.dynamo.s37.npz");
    for (file, says) in [(None, products(amx)), (Some(&no_amx), products(false))] {
        let module = dir.path().join("bf16.module");
        let _ = std::fs::remove_dir_all(&module);
        let mut args = vec![
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..64",
            "--precision",
            "bf16",
            "--quiet",
            "--out",
            module.to_str().unwrap(),
        ];
        if let Some(f) = file {
            args.extend(["--target", f.to_str().unwrap()]);
        }
        let o = anyshape(dir.path(), &args);
        let out = text(&o);
        assert!(o.status.success() && out.contains(says), "{file:?}: {out}");
        let o = anyshape(
            dir.path(),
            &[
                "run",
                "--module",
                module.to_str().unwrap(),
                "--inputs",
                case.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{file:?}: {}", text(&o));
    }
}
