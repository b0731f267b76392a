//! The C API from C: `examples/c/run_model.c` compiled with the system's C compiler
//! against `anyshape.h` and `libanyshape.so`, run on model modules (tiny BERT, and tiny
//! GPT-2 with its cache, whose mask's dim is an expression over the dims; compiled
//! untuned here) in their compiled range and past it, its outputs the runtime's for the
//! same inputs; its errors (no such module) reported, not aborted; and one handle run
//! at changing shapes through the C entry points.
use anyshape_runtime::Model;
use anyshape_tensor::{Tensor, TensorRef};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where cargo put this package's shared library: `cargo test` leaves it beside the test
/// binary (`target/<profile>/deps`); `cargo build` also copies it one level up.
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let found = [deps, deps.parent().unwrap()]
        .into_iter()
        .find(|d| d.join("libanyshape.so").is_file())
        .unwrap_or_else(|| panic!("no libanyshape.so in {} or above it", deps.display()))
        .to_path_buf();
    found
}

/// `models/{model}` compiled untuned for `dims` into `dir/m`.
fn module(dir: &Path, model: &str, dims: &[&str]) -> PathBuf {
    struct Quiet;
    impl anyshape_tune::Observer for Quiet {
        fn stage(&mut self, _: &anyshape_tune::Stage) {}
        fn round(&mut self, _: &anyshape_tune::RoundSummary) {}
        fn trials(&mut self, _: usize) {}
    }
    let out = dir.join("m");
    let measurer = anyshape_measure::Measurer {
        builder: anyshape_measure::Builder::new(
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("anyshape-test-cache"),
        ),
        runner: anyshape_measure::Runner {
            // Untuned: nothing is measured.
            worker: anyshape_measure::WorkerCommand {
                program: "/nonexistent".into(),
                args: vec![],
            },
            options: Default::default(),
        },
        queue: None,
    };
    let dims: Vec<_> = dims
        .iter()
        .map(|d| anyshape_ir::ShapeVar::parse(d).unwrap())
        .collect();
    anyshape_tune::compile_model(
        &root().join("models").join(model),
        &dims,
        &anyshape_codegen::CpuTarget::detect(),
        &measurer,
        &anyshape_tune::ModelOptions::default(),
        &out,
        &mut Quiet,
    )
    .unwrap();
    out
}

/// Tiny BERT compiled untuned for batch 1..2, sequence 1..64.
fn bert(dir: &Path) -> PathBuf {
    module(dir, "bert_tiny.ts.onnx", &["batch=1..2", "sequence=1..64"])
}

/// The example compiled against the header and the shared library into `dir`.
fn example(dir: &Path) -> PathBuf {
    let exe = dir.join("run_model");
    let libs = lib_dir();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(cc)
        .arg(root().join("examples/c/run_model.c"))
        .arg(format!(
            "-I{}",
            root().join("crates/anyshape-capi/include").display()
        ))
        .arg(format!("-L{}", libs.display()))
        .arg(format!("-Wl,-rpath,{}", libs.display()))
        .args(["-Wall", "-Werror", "-lanyshape", "-o"])
        .arg(&exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    exe
}

/// The example run on module `m` at `dims` (`NAME=VALUE`): each output it prints has
/// the runtime's shape, first element and sum for the same inputs (int64 inputs all 1,
/// float inputs 0.5, as the example makes them), shaped by `shapes` from the dims.
fn runs_as_the_runtime(exe: &Path, m: &Path, dims: &[&str], shapes: &[Vec<usize>]) {
    let o = Command::new(exe).arg(m).args(dims).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let model = Model::load(m).unwrap();
    let tensors: Vec<Tensor> = model
        .inputs()
        .iter()
        .zip(shapes)
        .map(|(s, shape)| {
            let n = shape.iter().product();
            match s.dtype {
                anyshape_tensor::DType::I64 => Tensor::i64(shape.clone(), vec![1; n]),
                _ => Tensor::f32(shape.clone(), vec![0.5; n]),
            }
            .unwrap()
        })
        .collect();
    let inputs: Vec<(&str, TensorRef)> = model
        .inputs()
        .iter()
        .zip(&tensors)
        .map(|(s, t)| (s.name.as_str(), t.view()))
        .collect();
    let outs = model.run(&inputs).unwrap();
    for (spec, t) in model.outputs().iter().zip(&outs) {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("output {} ", spec.name)))
            .unwrap_or_else(|| panic!("no output {} in {text}", spec.name));
        let shape: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
        assert!(line.contains(&format!("[{}]", shape.join(", "))), "{line}");
        let v = t.as_f32().unwrap();
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        let printed: f64 = line.rsplit("sum ").next().unwrap().trim().parse().unwrap();
        assert!(
            (printed - sum).abs() <= 1e-3 * sum.abs().max(1.0),
            "{line}: {sum}"
        );
        let first = format!("first {:.6}", v[0]);
        assert!(line.contains(&first), "{line}: {first}");
    }
}

#[test]
fn the_c_example_runs_a_model() {
    let dir = tempfile::tempdir().unwrap();
    let m = bert(dir.path());
    let exe = example(dir.path());
    // In the range, and past it (batch 3, sequence 100).
    for (batch, seq) in [(1usize, 37usize), (3, 100)] {
        let dims = [format!("batch={batch}"), format!("sequence={seq}")];
        let dims: Vec<&str> = dims.iter().map(String::as_str).collect();
        runs_as_the_runtime(&exe, &m, &dims, &vec![vec![batch, seq]; 3]);
    }
    // Errors are messages and a status, not an abort.
    let o = Command::new(&exe)
        .arg(dir.path().join("absent"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("not an anyshape module"), "{err}");
    let o = Command::new(&exe)
        .arg(&m)
        .args(["batch=1", "sequence=5000"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    // Past the model's position embeddings: the caller's input, named.
    assert!(
        err.starts_with("error 1:") && err.contains("broadcast"),
        "{err}"
    );
}

/// A decoder with its cache: the mask's dim is an expression over the dims
/// (`past_sequence + sequence`), which the example evaluates from the dims given.
#[test]
fn the_c_example_runs_a_decoder_with_a_past() {
    let dir = tempfile::tempdir().unwrap();
    let dims = ["batch=1..2", "sequence=1..16", "past_sequence=0..31"];
    let m = module(dir.path(), "gpt2_tiny_past.ts.onnx", &dims);
    let exe = example(dir.path());
    let (batch, seq, past) = (2usize, 5usize, 3usize);
    let model = Model::load(&m).unwrap();
    // input_ids, the mask over the past and the new positions, then the caches.
    let mut shapes = vec![vec![batch, seq], vec![batch, past + seq]];
    for s in &model.inputs()[2..] {
        let heads = s.shape[1].as_const().unwrap() as usize;
        let dim = s.shape[3].as_const().unwrap() as usize;
        shapes.push(vec![batch, heads, past, dim]);
    }
    runs_as_the_runtime(
        &exe,
        &m,
        &["batch=2", "sequence=5", "past_sequence=3"],
        &shapes,
    );
}

/// One handle run again and again at other shapes (larger, smaller, larger): each run
/// writes over the outputs the handle kept from the last (`Model::run_into`), and each
/// answer is still the runtime's for its own inputs — a stale element or shape of the
/// last run fails it.
#[test]
fn a_handle_runs_again_at_other_shapes() {
    use anyshape::{anyshape_model_free, anyshape_model_load, anyshape_model_run};
    use anyshape::{AnyshapeModel, AnyshapeTensor, MAX_RANK, OK};
    let dir = tempfile::tempdir().unwrap();
    let m = bert(dir.path());
    let model = Model::load(&m).unwrap();
    let path = std::ffi::CString::new(m.to_str().unwrap()).unwrap();
    let mut handle: *mut AnyshapeModel = std::ptr::null_mut();
    // SAFETY: a path and somewhere to put the handle.
    assert_eq!(
        unsafe { anyshape_model_load(path.as_ptr(), &mut handle) },
        OK
    );
    let outputs = model.outputs().len();
    for (batch, seq) in [(1usize, 37usize), (2, 64), (1, 2), (3, 100), (1, 1)] {
        // Token ids that differ by position, so that a stale row would show (the mask
        // and token types ones).
        let ids: Vec<i64> = (0..batch * seq).map(|i| (i * 7 % 50) as i64).collect();
        let ids = Tensor::i64(vec![batch, seq], ids).unwrap();
        let ones = Tensor::i64(vec![batch, seq], vec![1; batch * seq]).unwrap();
        let inputs: Vec<(&str, TensorRef)> = model
            .inputs()
            .iter()
            .map(|s| match s.name == "input_ids" {
                true => (s.name.as_str(), ids.view()),
                false => (s.name.as_str(), ones.view()),
            })
            .collect();
        let want = model.run(&inputs).unwrap();
        let mut dims = [0i64; MAX_RANK];
        dims[..2].copy_from_slice(&[batch as i64, seq as i64]);
        let given: Vec<AnyshapeTensor> = inputs
            .iter()
            .map(|(_, t)| AnyshapeTensor {
                dtype: 7,
                rank: 2,
                dims,
                data: t.as_i64().unwrap().as_ptr() as *mut std::ffi::c_void,
                capacity: 0,
            })
            .collect();
        let mut bufs: Vec<Vec<f32>> = (0..outputs).map(|_| vec![f32::NAN; 1 << 20]).collect();
        let mut outs: Vec<AnyshapeTensor> = bufs
            .iter_mut()
            .map(|b| AnyshapeTensor {
                dtype: 0,
                rank: 0,
                dims: [0; MAX_RANK],
                data: b.as_mut_ptr().cast(),
                capacity: b.len() * 4,
            })
            .collect();
        // SAFETY: the inputs hold their dims' int64 elements; the outputs' buffers
        // their capacity.
        let status = unsafe {
            anyshape_model_run(
                handle,
                given.as_ptr(),
                given.len(),
                outs.as_mut_ptr(),
                outputs,
            )
        };
        assert_eq!(status, OK, "batch {batch}, sequence {seq}");
        for ((t, o), b) in want.iter().zip(&outs).zip(&bufs) {
            let shape: Vec<usize> = o.dims[..o.rank].iter().map(|&d| d as usize).collect();
            assert_eq!(shape, t.shape, "batch {batch}, sequence {seq}");
            let v = t.as_f32().unwrap();
            assert_eq!(&b[..v.len()], v, "batch {batch}, sequence {seq}");
        }
    }
    // SAFETY: the handle loaded above, freed once.
    unsafe { anyshape_model_free(handle) };
}
