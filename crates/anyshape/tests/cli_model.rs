//! A model through the command line: `compile`, `run --module`, `inspect` and `bench`
//! on recorded cases in and past the range; tuned compiles and their tuning logs.
mod support;

use support::{anyshape, anyshape_cached, text};

/// A CSV report's rows after its header, cell by cell.
fn csv_rows(csv: &str) -> Vec<Vec<&str>> {
    csv.lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect()
}

/// The options that race both Python peers where the test command gave their Python
/// (`ANYSHAPE_TEST_PYTHON`, which must then have them); none otherwise (the peers at
/// hand are raced).
fn python_peers(python: Option<&str>) -> Vec<&str> {
    match python {
        Some(p) => vec![
            "--python",
            p,
            "--peers",
            "onnxruntime,openvino-f32,openvino",
        ],
        None => vec![],
    }
}

/// A model from ONNX to a module and back: `compile` (untuned: default micro-kernels)
/// for a range of sequence lengths, `run --module` on recorded cases in the range and
/// past it (onnxruntime's outputs in the same file are compared), outputs to `.npz`;
/// and the mistakes a user makes are clear errors.
#[test]
fn compile_run_and_bench_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let onnx = models.join("bert_tiny.dynamo.onnx");
    let module = dir.path().join("bert.module");
    let m = module.to_str().unwrap();
    let o = anyshape_cached(
        &[
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..64",
            "--out",
            m,
            "--quiet",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success() && out.contains("7 tasks"), "{out}");
    for case in ["s1", "s37", "s128", "b3s17"] {
        let npz = models.join(format!("bert_tiny.dynamo.{case}.npz"));
        let written = dir.path().join(format!("{case}.out.npz"));
        let o = anyshape_cached(
            &[
                "run",
                "--module",
                m,
                "--inputs",
                npz.to_str().unwrap(),
                "--output",
                written.to_str().unwrap(),
                "--seconds",
                "0",
            ],
            dir.path(),
        );
        let out = text(&o);
        assert!(o.status.success(), "{case}: {out}");
        let errors: Vec<f64> = out
            .lines()
            .filter_map(|l| l.split("max relative error ").nth(1))
            .map(|r| r.split_whitespace().next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(errors.len(), 2, "{case}: {out}");
        assert!(errors.iter().all(|&e| e <= 1e-4), "{case}: {out}");
        assert!(written.exists());
    }
    // Raced against the peers that are installed (onnxruntime and OpenVINO where their
    // Python packages are; tract only in a `--features tract` build): a report, and every
    // peer's outputs agree with anyshape's. With ANYSHAPE_TEST_PYTHON (the test command
    // sets it to the project's .venv, which has both packages) the Python peers must
    // all run. The reports go beside the module, into the directory that holds it (as
    // the main job writes them).
    let report = dir.path();
    let python = std::env::var("ANYSHAPE_TEST_PYTHON").ok();
    let peers = python_peers(python.as_deref());
    let o = anyshape_cached(
        &[
            &[
                "bench",
                "--model",
                m,
                "--compare",
                "--dim",
                "batch=1",
                "--dim",
                "sequence=1,5,64,70",
                "--rounds",
                "1",
                "--seconds",
                "0",
                "--out-dir",
                report.to_str().unwrap(),
                "--quiet",
            ][..],
            &peers,
        ]
        .concat(),
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success() && out.contains("sequence=70"), "{out}");
    let csv = std::fs::read_to_string(report.join("model.csv")).unwrap();
    let rows = csv_rows(&csv);
    assert!(
        rows.iter().filter(|r| r[2] == "\"anyshape\"").count() == 4,
        "{csv}"
    );
    assert!(rows.iter().all(|r| r.len() == 9), "{csv}");
    // The report gives anyshape's rate: its kernels' flops over its latency, and the
    // share of the FMA peak measured in the run.
    let md = std::fs::read_to_string(report.join("model.md")).unwrap();
    let header = md.lines().find(|l| l.starts_with("| instance |")).unwrap();
    let column = header.split(" | ").position(|c| c == "anyshape GFLOP/s");
    let column = column.unwrap_or_else(|| panic!("no GFLOP/s column: {md}"));
    for line in md.lines().filter(|l| l.starts_with("| batch=")) {
        let rate: f64 = line.split(" | ").nth(column).unwrap().parse().unwrap();
        assert!(rate > 0.0 && rate.is_finite(), "{line}");
        assert!(line.contains(" % |"), "{line}");
    }
    let raced: Vec<&Vec<&str>> = rows.iter().filter(|r| r[2] != "\"anyshape\"").collect();
    if python.is_some() {
        for peer in ["onnxruntime", "OpenVINO"] {
            assert!(raced.iter().any(|r| r[2].contains(peer)), "{peer}: {csv}");
        }
    }
    for r in raced {
        // A peer at half precision (OpenVINO's default where the CPU has BF16) is
        // checked at that precision's tolerance.
        let half = ["BF16", "FP16"].iter().any(|p| r[2].contains(p));
        let e: f64 = r[5].parse().unwrap_or_else(|_| panic!("{csv}"));
        assert!(e <= if half { 2e-2 } else { 1e-4 }, "{csv}");
        // One round: the paired speedup is that round's ratio, the ratio of minima.
        let (speedup, paired): (f64, f64) = (r[4].parse().unwrap(), r[6].parse().unwrap());
        assert!((speedup - paired).abs() <= 1e-3 * speedup, "{csv}");
    }
    let s37 = models.join("bert_tiny.dynamo.s37.npz");
    let bad: &[(&[&str], &str)] = &[
        (
            &[
                "compile",
                onnx.to_str().unwrap(),
                "--dim",
                "seq=1..4",
                "--dim",
                "batch=1",
                "--out",
                "x.module",
            ],
            "no dim of that name",
        ),
        (
            &[
                "compile",
                onnx.to_str().unwrap(),
                "--dim",
                "batch=1",
                "--out",
                "x.module",
            ],
            "needs a domain",
        ),
        (
            &[
                "compile",
                "/nonexistent.onnx",
                "--dim",
                "batch=1",
                "--out",
                "x.module",
            ],
            "nonexistent",
        ),
        (
            &[
                "compile",
                onnx.to_str().unwrap(),
                "--dim",
                "batch=1",
                "--dim",
                "sequence=1..4",
                "--trials",
                "4",
                "--out",
                "x.module",
            ],
            "--records",
        ),
        (&["run", "--module", m], "--inputs"),
        (
            &["run", "--module", m, "--inputs", onnx.to_str().unwrap()],
            "not a .npz file",
        ),
        (
            &[
                "run",
                "--module",
                m,
                "--inputs",
                s37.to_str().unwrap(),
                "--max-error",
                "0",
            ],
            "outputs differ from those recorded",
        ),
        (
            &["run", "--module", m, "--input", "ids=/nonexistent.npy"],
            "no input of that name",
        ),
        (
            &[
                "run",
                "--module",
                m,
                "--input",
                "input_ids=/nonexistent.npy",
            ],
            "nonexistent.npy",
        ),
        (
            &["bench", "--model", m, "--compare", "--dim", "batch=1"],
            "--dim sequence=… is missing",
        ),
        (
            &[
                "bench",
                "--model",
                m,
                "--compare",
                "--dim",
                "seq=1",
                "--dim",
                "batch=1",
            ],
            "no dim of that name",
        ),
        (
            &[
                "bench",
                "--model",
                m,
                "--compare",
                "--dim",
                "batch=1",
                "--dim",
                "sequence=1",
                "--peers",
                "onnxruntime,nope",
            ],
            "no peer \"nope\"",
        ),
        (
            // A peer asked for by name that cannot start is an error, not a note.
            &[
                "bench",
                "--model",
                m,
                "--compare",
                "--dim",
                "batch=1",
                "--dim",
                "sequence=1",
                "--peers",
                "onnxruntime",
                "--python",
                "/nonexistent/python",
            ],
            "cannot start /nonexistent/python",
        ),
        (
            &[
                "bench",
                "--model",
                m,
                "--tuning-against",
                m,
                "--peers",
                "openvino",
            ],
            "--peers are for --compare",
        ),
    ];
    for (args, needle) in bad {
        let o = anyshape_cached(args, dir.path());
        let out = text(&o);
        assert!(
            !o.status.success() && out.contains(needle) && !out.contains("panicked"),
            "{args:?}: {out}"
        );
    }
}

/// A tuned model compile with families (the default) and one without, equal shares:
/// each writes its tuning log (a curve point per slice, trials rising to the budget);
/// the families of more than one task are reported; equal shares give every task the
/// same trials; and `bench --tuning-against` compares the two curves.
#[test]
fn tuning_logs_of_two_compiles_compared() {
    let dir = tempfile::tempdir().unwrap();
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let onnx = models.join("bert_tiny.ts.onnx");
    let compile = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let records = dir.path().join(format!("{name}.records"));
        let mut args = vec![
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..16",
            "--trials",
            "4",
            "--tune-values",
            "3",
            "--records",
            records.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ];
        args.extend_from_slice(extra);
        let o = anyshape_cached(&args, dir.path());
        let said = text(&o);
        assert!(o.status.success(), "{said}");
        let log: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("tuning.json")).unwrap())
                .unwrap();
        (said, log, out)
    };
    let (said, fam, fam_dir) = compile("families", &[]);
    assert!(
        said.contains("family dense_packed[batch,sequence]: tasks ")
            && said.contains("tuning (scheduler + families)"),
        "{said}"
    );
    assert_eq!(fam["mode"], "scheduler + families");
    let curve = fam["curve"].as_array().unwrap();
    assert!(curve.len() >= 8, "{fam}");
    let trials: Vec<u64> = curve
        .iter()
        .map(|p| p["trials"].as_u64().unwrap())
        .collect();
    assert!(trials.windows(2).all(|w| w[0] <= w[1]), "{trials:?}");
    assert!(curve.last().unwrap()["expected_seconds"].as_f64().unwrap() > 0.0);
    // Without the tuning database: it holds the first compile's trials, which would
    // make this one a module build instead of a search of its own.
    let (said, ind, ind_dir) = compile(
        "independent",
        &["--equal-shares", "--no-families", "--no-db"],
    );
    assert_eq!(ind["mode"], "equal shares", "{said}");
    assert!(!ind["families"].as_array().unwrap().is_empty());
    assert!(!said.contains("tuning (scheduler"), "{said}");
    // Both within the budget of 7 tasks (the layer norms' and the fused attention's
    // among them) x 4 trials.
    for log in [&fam, &ind] {
        let last = log["curve"].as_array().unwrap().last().unwrap()["trials"]
            .as_u64()
            .unwrap();
        assert!((14..=28).contains(&last), "{log}");
    }
    // The trust-region search, within the same budget; its curve joins the comparison.
    let (said, regions, regions_dir) = compile("regions", &["--search", "trust-region", "--no-db"]);
    assert_eq!(
        regions["mode"], "scheduler + families + trust-region search",
        "{said}"
    );
    let last = regions["curve"].as_array().unwrap().last().unwrap()["trials"]
        .as_u64()
        .unwrap();
    assert!((18..=36).contains(&last), "{regions}");
    let report = dir.path().join("report");
    let o = anyshape_cached(
        &[
            "bench",
            "--model",
            fam_dir.to_str().unwrap(),
            "--tuning-against",
            ind_dir.to_str().unwrap(),
            "--tuning-against",
            regions_dir.to_str().unwrap(),
            "--out-dir",
            report.to_str().unwrap(),
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for row in [
        "| 80 % |",
        "| 90 % |",
        "| 100 % |",
        "trials per hour",
        "| regions: scheduler + families + trust-region search |",
    ] {
        assert!(out.contains(row), "{out}");
    }
    assert!(report.join("tuning.csv").exists() && report.join("tuning.md").exists());
    // A module without a tuning log (untuned) is a clear error.
    let o = anyshape_cached(
        &[
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..16",
            "--out",
            dir.path().join("untuned").to_str().unwrap(),
            "--quiet",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = anyshape_cached(
        &[
            "bench",
            "--model",
            fam_dir.to_str().unwrap(),
            "--tuning-against",
            dir.path().join("untuned").to_str().unwrap(),
            "--out-dir",
            report.to_str().unwrap(),
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(!o.status.success() && out.contains("tuning.json"), "{out}");
}

/// A decoder with a key/value cache through the command line: `compile` with a past
/// from 0, `generate` checked token for token (and each step's logits) against
/// onnxruntime's recorded generation, sampling reproducible by its seed, what
/// `generate` refuses, and `bench --generate` racing the peers that are installed
/// (all of them with ANYSHAPE_TEST_PYTHON), each choosing anyshape's tokens.
#[test]
fn generate_text_and_race_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let onnx = models.join("gpt2_tiny_past.ts.onnx");
    let m = d.join("gpt2.module");
    let m = m.to_str().unwrap();
    let o = anyshape(
        d,
        &[
            "compile",
            onnx.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..64",
            "--dim",
            "past_sequence=0..128",
            "--out",
            m,
            "--quiet",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let recorded = models.join("gpt2_tiny_past.ts.gen_p37.npz");
    let recorded = recorded.to_str().unwrap();
    let generate = |extra: &[&str]| {
        let args = [
            &["generate", "--module", m, "--prompt-ids", recorded][..],
            extra,
        ]
        .concat();
        anyshape(d, &args)
    };
    let o = generate(&["--max-new-tokens", "64", "--output", "gen.npz"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("tokens: 64 of 64 as recorded"), "{out}");
    assert!(out.contains("logits of 64 steps"), "{out}");
    assert!(
        out.contains("time to first token") && out.contains("tokens/s"),
        "{out}"
    );
    let written = anyshape_tensor::npz::read(&d.join("gen.npz")).unwrap();
    assert_eq!(written[1].0, "generated_ids");
    assert_eq!(written[1].1.shape, vec![1, 64]);
    // The written generation is a prompt file too, and checks as recorded.
    let again = anyshape(
        d,
        &[
            "generate",
            "--module",
            m,
            "--prompt-ids",
            "gen.npz",
            "--max-new-tokens",
            "64",
        ],
    );
    assert!(
        text(&again).contains("tokens: 64 of 64"),
        "{}",
        text(&again)
    );
    let sampled = |seed: &str| {
        let o = generate(&[
            "--max-new-tokens",
            "8",
            "--sample",
            "--top-k",
            "40",
            "--seed",
            seed,
        ]);
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
            .lines()
            .find(|l| l.starts_with("generated"))
            .unwrap()
            .to_string()
    };
    assert_eq!(sampled("5"), sampled("5"));
    assert_ne!(sampled("5"), sampled("6"));
    let o = generate(&["--seed", "5"]);
    assert!(
        !o.status.success() && text(&o).contains("add --sample"),
        "{}",
        text(&o)
    );
    let o = generate(&["--max-new-tokens", "0"]);
    assert!(!o.status.success(), "{}", text(&o));
    let bert = models.join("bert_tiny.ts.onnx");
    let o = anyshape(
        d,
        &[
            "compile",
            bert.to_str().unwrap(),
            "--dim",
            "batch=1",
            "--dim",
            "sequence=1..8",
            "--out",
            "bert.module",
            "--quiet",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = anyshape(
        d,
        &[
            "generate",
            "--module",
            "bert.module",
            "--prompt-ids",
            recorded,
        ],
    );
    let out = text(&o);
    assert!(
        !o.status.success()
            && out.contains("cannot generate")
            && out.contains("no `logits` output"),
        "{out}"
    );
    let python = std::env::var("ANYSHAPE_TEST_PYTHON").ok();
    let peers = python_peers(python.as_deref());
    let o = anyshape(
        d,
        &[
            &[
                "bench",
                "--model",
                m,
                "--generate",
                "--prompts",
                "1,37",
                "--new-tokens",
                "16",
                "--rounds",
                "1",
                "--out-dir",
                "report",
                "--quiet",
            ][..],
            &peers,
        ]
        .concat(),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let csv = std::fs::read_to_string(d.join("report/generate.csv")).unwrap();
    let rows = csv_rows(&csv);
    assert!(rows.len() >= 2, "{csv}");
    if python.is_some() {
        // anyshape, onnxruntime and OpenVINO at FP32; OpenVINO at its default precision
        // too where that is BF16 (the CPU has AVX512_BF16; else it is raced once).
        let systems: std::collections::BTreeSet<&str> = rows.iter().map(|r| r[1]).collect();
        let bf16 = anyshape_abi::host_cpu_features()
            .iter()
            .any(|f| f == "avx512_bf16");
        assert_eq!(systems.len(), if bf16 { 4 } else { 3 }, "{csv}");
        assert_eq!(rows.len(), 2 * systems.len(), "{csv}");
    }
    // Every system that ran chose anyshape's 16 tokens.
    for r in &rows {
        assert_eq!(r[5], "16", "{csv}");
    }
    assert!(out.contains("% of the measured read bandwidth"), "{out}");
    // Its forward pass raced too, with no past (a dim whose domain starts at 0) and a
    // past of 5: every peer agrees on every output (OpenVINO named a compiled cache
    // output after the Concat that makes it), and anyshape's rate is counted (its
    // cache kernels bound without rows to spare).
    let o = anyshape(
        d,
        &[
            &[
                "bench",
                "--model",
                m,
                "--compare",
                "--dim",
                "batch=1",
                "--dim",
                "sequence=1,7",
                "--dim",
                "past_sequence=0,5",
                "--rounds",
                "1",
                "--seconds",
                "0",
                "--out-dir",
                "forward",
                "--quiet",
            ][..],
            &peers,
        ]
        .concat(),
    );
    let out = text(&o);
    assert!(o.status.success() && !out.contains("failed"), "{out}");
    let md = std::fs::read_to_string(d.join("forward/model.md")).unwrap();
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| batch=")).collect();
    assert_eq!(rows.len(), 4, "{md}");
    for r in rows {
        let cells: Vec<&str> = r.split('|').map(str::trim).collect();
        assert!(cells[3].parse::<f64>().is_ok_and(|g| g > 0.0), "{md}");
    }
    // 0 is a value only of a dim whose domain starts there.
    let o = anyshape(
        d,
        &[
            "bench",
            "--model",
            m,
            "--compare",
            "--dim",
            "batch=0",
            "--dim",
            "sequence=1",
            "--dim",
            "past_sequence=0",
        ],
    );
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("--dim batch: values must be at least 1"),
        "{out}"
    );
}

/// A CNN's convolutions against oneDNN's, layer by layer (`bench --model
/// --conv-kernels`; the test command installs libdnnl): every convolution of the tiny
/// ResNet at each instance (batch 2 and an odd image too), timed on both sides, and
/// oneDNN's output agrees with the operator reference (so the geometry read from the
/// plan is the model's).
#[test]
fn convolutions_against_onednn() {
    let dir = tempfile::tempdir().unwrap();
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let onnx = models.join("resnet_tiny.ts.onnx");
    let module = dir.path().join("m");
    let (m, report) = (module.to_str().unwrap(), dir.path().join("report"));
    let o = support::compile(
        &onnx,
        &["batch=1..2", "height=32..96", "width=32..96"],
        &module,
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = anyshape_cached(
        &[
            "bench",
            "--model",
            m,
            "--conv-kernels",
            "--dim",
            "batch=1,2",
            "--dim",
            "height=33",
            "--dim",
            "width=64",
            "--rounds",
            "1",
            "--seconds",
            "0",
            "--out-dir",
            report.to_str().unwrap(),
            "--quiet",
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("batch=2,height=33,width=64: 6 convolutions"),
        "{out}"
    );
    let csv = std::fs::read_to_string(report.join("conv.csv")).unwrap();
    let rows = csv_rows(&csv);
    assert!(
        csv.starts_with("batch,height,width,convolution,calls,"),
        "{csv}"
    );
    for batch in ["1", "2"] {
        let mine: Vec<_> = rows.iter().filter(|r| r[0] == batch).collect();
        let calls: usize = mine.iter().map(|r| r[4].parse::<usize>().unwrap()).sum();
        assert_eq!(calls, 6, "{csv}");
        for r in mine {
            let v: Vec<f64> = r[5..].iter().map(|x| x.parse().unwrap()).collect();
            let [flops, layout, kernel, in_order, repeated, error] = v[..] else {
                panic!("{csv}")
            };
            assert!(flops > 0.0 && layout >= 0.0 && kernel > 0.0, "{csv}");
            assert!(in_order > 0.0 && repeated > 0.0, "{csv}");
            assert!(error <= 1e-4, "{csv}");
        }
    }
    // --dim names every dim of the model.
    let o = anyshape_cached(
        &["bench", "--model", m, "--conv-kernels", "--dim", "batch=1"],
        dir.path(),
    );
    let out = text(&o);
    assert!(!o.status.success() && out.contains("--dim height"), "{out}");
}

/// `inspect model.onnx --value NAME` prints a value's element type, symbolic shape (a
/// shape computation's elements too) and the node that makes it; `--values` prints
/// every value; a name the model lacks, a missing file and `--value` on a module are
/// clear errors.
#[test]
fn inspect_prints_a_models_values() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = support::models().join("llama_tiny.ts.onnx");
    let onnx = onnx.to_str().unwrap();
    let inspect = |extra: &[&str]| anyshape(dir.path(), &[&["inspect", onnx], extra].concat());
    let o = inspect(&[
        "--value",
        "/model/model/Shape_output_0",
        "--value",
        "/model/model/Gather_output_0",
        "--value",
        "model.model.embed_tokens.weight",
        "--value",
        "logits",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for line in [
        "value        /model/model/Shape_output_0 int64 [3] = [batch, sequence, 64]  (Shape '/model/model/Shape')",
        "value        /model/model/Gather_output_0 int64 [] = sequence  (Gather '/model/model/Gather')",
        "value        model.model.embed_tokens.weight float [1000, 64]  (a weight)",
        "value        logits float [batch, sequence, 1000]  (MatMul '/model/lm_head/MatMul')",
    ] {
        assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
    }
    // Every node's outputs and the inputs, once each, in the model's order.
    let o = inspect(&["--values"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let values: Vec<&str> = out.lines().filter(|l| l.starts_with("value ")).collect();
    assert_eq!(values.len(), 363, "{out}");
    assert!(values[0].starts_with("value        input_ids int64 [batch, sequence]  (an input)"));
    assert!(values.last().unwrap().starts_with("value        logits "));

    let o = inspect(&["--value", "no_such_value"]);
    let out = text(&o);
    assert!(
        !o.status.success()
            && out.contains("--value no_such_value: the model has no value of that name"),
        "{out}"
    );
    let missing = dir.path().join("missing.onnx");
    let o = anyshape(dir.path(), &["inspect", missing.to_str().unwrap()]);
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("missing.onnx: no such file"),
        "{out}"
    );
    let o = anyshape(
        dir.path(),
        &["inspect", dir.path().to_str().unwrap(), "--values"],
    );
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("--value and --values are for an .onnx file"),
        "{out}"
    );
}

/// `bench --model A --compare --against B`: two compiles of one model race side by
/// side in one process (no Python peers unless named), each labelled by its module,
/// their outputs the same; on recorded cases (`--inputs`), each named by its file and
/// every system's error against the recorded outputs; a compile of another model,
/// `--against` without `--compare`, a case without the model's inputs, neither `--dim`
/// nor `--inputs`, and both, are clear errors.
#[test]
fn bench_races_compiles_of_a_model_against_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let models = support::models();
    let compile = |onnx: &str, range: &str, out: &str| {
        let module = dir.path().join(out);
        let o = support::compile(&models.join(onnx), &["batch=1", range], &module, dir.path());
        assert!(o.status.success(), "{}", text(&o));
        module.to_str().unwrap().to_string()
    };
    let wide = compile("bert_tiny.dynamo.onnx", "sequence=1..64", "wide.module");
    let narrow = compile("bert_tiny.dynamo.onnx", "sequence=1..8", "narrow.module");
    let other = compile("bert_tiny.ts.onnx", "sequence=1..8", "other.module");
    let report = dir.path().join("ab");
    let bench = |against: &str, compare: bool| {
        let mut args = vec!["bench", "--model", &wide, "--against", against];
        if compare {
            args.extend(["--compare", "--dim", "batch=1", "--dim", "sequence=1,5,20"]);
        }
        args.extend([
            "--rounds",
            "2",
            "--seconds",
            "0",
            "--out-dir",
            report.to_str().unwrap(),
            "--quiet",
        ]);
        anyshape_cached(&args, dir.path())
    };
    let o = bench(&narrow, true);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("- anyshape (wide.module) vs anyshape (narrow.module): geomean speedup"),
        "{out}"
    );
    let csv = std::fs::read_to_string(report.join("model.csv")).unwrap();
    let systems: std::collections::BTreeSet<&str> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap())
        .collect();
    assert_eq!(
        systems.into_iter().collect::<Vec<_>>(),
        ["\"anyshape (narrow.module)\"", "\"anyshape (wide.module)\""],
        "{csv}"
    );
    // The narrow compile runs past its range at 20; both give the same outputs.
    let md = std::fs::read_to_string(report.join("model.md")).unwrap();
    for line in md.lines().filter(|l| l.starts_with("| batch=")) {
        let error: f64 = line
            .trim_end_matches(" |")
            .rsplit(" | ")
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(error < 1e-5, "{line}");
    }
    // On recorded cases: 37 is past the narrow compile's range.
    let case = |name: &str| models.join(name).to_str().unwrap().to_string();
    let cases = format!(
        "{},{}",
        case("bert_tiny.dynamo.s1.npz"),
        case("bert_tiny.dynamo.s37.npz")
    );
    let race_cases = |cases: &str, extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--model",
            &wide,
            "--against",
            &narrow,
            "--compare",
            "--inputs",
            cases,
        ];
        args.extend(extra);
        args.extend(["--rounds", "1", "--seconds", "0", "--quiet"]);
        args.extend(["--out-dir", report.to_str().unwrap()]);
        anyshape_cached(&args, dir.path())
    };
    let o = race_cases(&cases, &[]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    let csv = std::fs::read_to_string(report.join("model.csv")).unwrap();
    let rows = csv_rows(&csv);
    assert_eq!(rows.len(), 4, "{csv}");
    for row in &rows {
        // batch, sequence, system, latency, speedup, error, paired, against, case
        assert!(row[8].starts_with("bert_tiny.dynamo.s"), "{csv}");
        assert_eq!(row[7], "recorded", "{csv}");
        let error: f64 = row[5].parse().unwrap();
        assert!(error < 1e-4, "{csv}");
    }
    assert_eq!(rows[2][1], "37", "{csv}");
    let md = std::fs::read_to_string(report.join("model.md")).unwrap();
    assert!(
        md.contains("| error of anyshape (wide.module) |")
            && md.contains("| bert_tiny.dynamo.s37.npz (batch=1,sequence=37) |")
            && md.contains("against the outputs the case records"),
        "{md}"
    );
    // A file of outputs only is no case; nor is a grid at once.
    let outputs = dir.path().join("outputs.npz");
    let o = anyshape(
        dir.path(),
        &[
            "run",
            "--module",
            &wide,
            "--inputs",
            &case("bert_tiny.dynamo.s1.npz"),
            "--output",
            outputs.to_str().unwrap(),
            "--seconds",
            "0",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = race_cases(outputs.to_str().unwrap(), &[]);
    let out = text(&o);
    assert!(
        !o.status.success()
            && out.contains("the model's input `input_ids` is not given")
            && out.contains("outputs.npz has no array of that name")
            && !out.contains("panicked"),
        "{out}"
    );
    let o = anyshape_cached(
        &[
            "bench",
            "--model",
            &wide,
            "--compare",
            "--out-dir",
            report.to_str().unwrap(),
        ],
        dir.path(),
    );
    let out = text(&o);
    assert!(
        !o.status.success()
            && out.contains(
                "(--dim NAME=VALUES for each of batch, sequence) or on recorded cases (--inputs"
            ),
        "{out}"
    );
    let o = race_cases(&cases, &["--dim", "batch=1"]);
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("cannot be used with"),
        "{out}"
    );
    let o = bench(&other, true);
    let out = text(&o);
    assert!(
        !o.status.success()
            && out.contains("a compile of another model than")
            && !out.contains("panicked"),
        "{out}"
    );
    let o = bench(&narrow, false);
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("--against is for --compare"),
        "{out}"
    );
}
