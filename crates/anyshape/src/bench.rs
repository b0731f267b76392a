//! `anyshape bench`: a module side by side with the baselines (`--compare`), how well it
//! dispatches (`--dispatch-loss`) and what dispatching costs (`--overhead`); the
//! measuring is `anyshape-bench`'s, this parses the options and shows the reports. A
//! model module (`--model`, from `anyshape compile`) is raced against onnxruntime,
//! OpenVINO and tract (`--compare`), and its tuning against another compile's (`--tuning-against`).
use crate::progress::Reporter;
use crate::Common;
use anyhow::{bail, Result};
use anyshape_bench::{
    compare, compare_convolutions, compare_generate, compare_model, dispatch_loss, overhead,
    read_tuning, CompareOptions, ConvCompareOptions, GenerateCompareOptions, ModelCompareOptions,
    OutDir, PeerKind, PeerOptions, TuningComparison,
};
use anyshape_ir::ShapeVar;
use anyshape_runtime::Module;
use anyshape_tune::TuningLog;
use clap::Args;
use std::path::{Path, PathBuf};

/// Options of `anyshape bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// The module to benchmark (from `anyshape tune --out`).
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "model",
        conflicts_with = "model"
    )]
    module: Option<PathBuf>,
    /// A model module (from `anyshape compile`): with --compare, raced against
    /// onnxruntime and OpenVINO (Python packages, --threads; onnxruntime at FP32, and
    /// on its dynamically quantized model against an i8 module; OpenVINO at FP32 and at
    /// its default precision) and tract (when built with `--features tract`) on the same
    /// `.onnx` and inputs at every combination of the --dim values (--peers chooses);
    /// writes `model.csv`, `model.md` and `model-latency.svg` to --out-dir.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// With --model, a decoder with a key/value cache: race it at generating text
    /// against onnxruntime (IO binding) and OpenVINO (made stateful; FP32 and its
    /// default precision), greedy, on prompts of --prompts tokens, --new-tokens each,
    /// in --rounds interleaved rounds; time to the first token, decode tokens/s, the
    /// tokens checked against anyshape's, decode against the measured memory read
    /// bandwidth; writes `generate.md` and `generate.csv` to --out-dir.
    #[arg(long, requires = "model")]
    generate: bool,
    /// With --generate: the prompt lengths.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_value = "16,256", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    prompts: Vec<u64>,
    /// With --generate: tokens generated after each prompt.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(2..=1_000_000))]
    new_tokens: u64,
    /// With --model: compare its tuning with another compile of the same model (e.g.
    /// `anyshape compile --equal-shares --no-families`): when each reached 80, 90 and
    /// 100 % of that compile's final expected latency, trials per hour, build share,
    /// the families' model quality; writes `tuning.md`, `tuning.csv` and
    /// `tuning-curve.svg` to --out-dir. Repeated: the first is the baseline, the others'
    /// curves join the plot and the tables.
    #[arg(long, value_name = "MODEL_MODULE", requires = "model")]
    tuning_against: Vec<PathBuf>,
    /// With --model and --compare: another compile of the same model (tuned or
    /// untuned, another precision or range) raced as a peer, in this process,
    /// interleaved as the others are, with the paired speedup of --model over it;
    /// repeat for several. Without --peers only these modules race.
    #[arg(long, value_name = "MODEL_MODULE", requires = "model")]
    against: Vec<PathBuf>,
    /// With --model: each convolution against oneDNN's convolution primitive (the
    /// system's libdnnl, loaded in this process), layer by layer at every combination
    /// of the --dim values: anyshape's patch layout and kernel timed step by step in
    /// whole-model runs, oneDNN's layer called again and again, its output checked
    /// against the operator reference; writes `conv.md` and `conv.csv` to --out-dir.
    #[arg(long, requires = "model")]
    conv_kernels: bool,
    /// With --model: the ONNX model the peers run, the one the module was compiled
    /// from (checked by its SHA-256) [default: where it was when compiled].
    #[arg(long, value_name = "FILE", requires = "model")]
    onnx: Option<PathBuf>,
    /// With --model: the values of a model dim, e.g. `--dim sequence=1,8,16,32
    /// --dim batch=1` (ranges such as `1..4` too); every dim of the model is named.
    #[arg(long = "dim", value_name = "NAME=VALUES", requires = "model")]
    dims: Vec<String>,
    /// With --model and --compare: race on recorded cases instead of generated inputs
    /// at --dim values — `.npz` files of the model's inputs by name (the arrays
    /// `anyshape run --inputs` takes), one instance each, comma-separated or repeated;
    /// where a case also records every output (the models' `models/full/*.npz`), every
    /// system's error is against those outputs, anyshape's too.
    #[arg(
        long = "inputs",
        value_name = "FILE.npz",
        value_delimiter = ',',
        requires = "model",
        conflicts_with = "dims"
    )]
    cases: Vec<PathBuf>,
    /// Interleaved rounds per instance, for --model and --compare: every system is timed
    /// once per round, in an order that rotates; each keeps its minimum, and the paired
    /// speedup is the median over rounds of the ratio within a round.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// With --model: the peers' threads (onnxruntime's intra-op threads, OpenVINO's
    /// inference threads) [default: 2].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    threads: Option<u32>,
    /// With --model: the Python interpreter that has the onnxruntime and openvino
    /// packages [default: python3].
    #[arg(long)]
    python: Option<String>,
    /// With --model: the Python interpreter that has torch and transformers, for the
    /// pytorch peer (the model rebuilt by the repository's models/export.py, e.g.
    /// `.venv-export/bin/python` of scripts/export-models.sh) [default: --python's].
    #[arg(long, value_name = "PYTHON")]
    torch_python: Option<String>,
    /// With --model: the peers to race, of onnxruntime, onnxruntime-int8 (the model
    /// quantized by onnxruntime's dynamic quantization, in a temporary directory; needs
    /// the onnx package), openvino-f32, openvino (its default precision: BF16 where the
    /// CPU has it), pytorch and tract; a peer named here that cannot start is an error
    /// [default: every one at hand, the others noted; onnxruntime-int8 only against a
    /// --precision i8 module].
    #[arg(long, value_name = "PEER,...", value_delimiter = ',', value_parser = peer_kind)]
    peers: Option<Vec<PeerKind>>,
    /// Compare the module, instance by instance in one run, with the vendor libraries
    /// (oneDNN, OpenBLAS: whichever are installed, a missing one is skipped with a
    /// warning; the `gemm` crate) and, with --per-shape-trials, per-shape (Ansor-style),
    /// Nimble-style and bucketing; writes `results.csv`, `report.md` and the plots
    /// `latency.svg`, `throughput.svg` and `tuning.svg` to --out-dir.
    #[arg(long)]
    compare: bool,
    /// Instances for --compare and --dispatch-loss: a domain per shape var, e.g.
    /// `T=1..128` (repeat for each var: `--range batch=1 --range sequence=1..64` for a
    /// model's task) [default: --compare: the module's domain; --dispatch-loss: its
    /// tuned instances].
    #[arg(long, value_name = "VAR=DOMAIN")]
    range: Vec<String>,
    /// Instances the tuned baselines are tuned and run on, e.g. `T=5,24,43,62,81,100,119,128`.
    #[arg(long, value_name = "VAR=VALUES")]
    samples: Option<String>,
    /// Trials per sample for per-shape tuning (factor-only tiles, specialized kernels);
    /// Nimble-style runs the largest sample's micro-kernel everywhere with loop
    /// partitioning. 0 (the default): no tuned baselines. Records go to --out-dir/records
    /// (resumable).
    #[arg(long)]
    per_shape_trials: Option<usize>,
    /// With --per-shape-trials: the bucketing baseline's bucket width along the shape
    /// var (buckets start at the smallest instance); the largest instance of each bucket
    /// is tuned per shape and the others are padded up to it (global padding: inputs
    /// copied into zero-filled buffers, the output copied back, all inside the timed
    /// call). 0: no bucketing [default: 16].
    #[arg(long, value_name = "WIDTH", value_parser = clap::value_parser!(i64).range(0..))]
    bucket: Option<i64>,
    /// Where --compare writes `results.csv`, `report.md`, the plots and the baselines'
    /// records.
    #[arg(long, value_name = "DIR", default_value = "benchmarks/results")]
    out_dir: PathBuf,
    /// Measure, on every tuned instance (or those of --range), the dispatched kernel
    /// against every micro-kernel of the module (again, up to two more passes, where
    /// it loses more than 3 %); print the loss distribution.
    #[arg(long)]
    dispatch_loss: bool,
    /// With --dispatch-loss: time cold (inputs and output flushed from the caches, the
    /// TLB emptied, before every call), as a model's compile times its tasks.
    #[arg(long)]
    cold: bool,
    /// Measure the dispatch overhead per call (tree walk + call) against calling the
    /// kernel directly, in this process, on the module's cheapest instance (or --set).
    #[arg(long)]
    overhead: bool,
    /// Instance for --overhead, e.g. `T=1`.
    #[arg(long = "set", value_name = "VAR=VALUE")]
    set: Option<String>,
    /// Seconds of timed calls per kernel and instance (the minimum latency is used).
    #[arg(long, default_value_t = 0.05, value_parser = crate::seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// Write the per-instance dispatch-loss table as CSV.
    #[arg(long, value_name = "FILE")]
    csv: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    common: Common,
}

/// Run `anyshape bench`.
pub fn bench(args: BenchArgs) -> Result<()> {
    if !args.compare && !args.against.is_empty() {
        bail!("--against is for --compare (modules raced side by side)");
    }
    if !args.dispatch_loss
        && !args.overhead
        && !args.compare
        && !args.generate
        && !args.conv_kernels
        && args.tuning_against.is_empty()
    {
        bail!("nothing to measure: pass --compare, --generate, --conv-kernels, --dispatch-loss, --overhead and/or --tuning-against");
    }
    let module = match (&args.model, &args.module) {
        (Some(model), _) => return bench_model(model, &args),
        (None, Some(module)) => Module::load(module)?,
        (None, None) => bail!("give --module or --model"),
    };
    let model_only = [
        (args.threads.is_some(), "--threads"),
        (args.python.is_some(), "--python"),
        (args.torch_python.is_some(), "--torch-python"),
        (args.peers.is_some(), "--peers"),
    ];
    let wrong = crate::given(&model_only);
    if !wrong.is_empty() {
        bail!(
            "{} are for --model (a model raced against its peers), not an operator module",
            wrong.join(", ")
        );
    }
    if args.cold && !args.dispatch_loss {
        bail!("--cold is for --dispatch-loss");
    }
    let range = crate::tune::shape_vars(&args.range, None)?;
    if args.compare {
        let options = CompareOptions {
            range: &range,
            samples: args.samples.as_deref(),
            per_shape_trials: args.per_shape_trials.unwrap_or(0),
            bucket: args.bucket.unwrap_or(16),
            out_dir: &args.out_dir,
            seconds: args.seconds,
            rounds: args.rounds as usize,
        };
        let harness = args.common.harness()?;
        reported(args.quiet, |r| {
            compare(module.dir(), module.manifest(), &options, &harness, r)
        })?;
    }
    if args.dispatch_loss {
        let mut reporter = Reporter::new(args.quiet);
        let report = dispatch_loss(
            &args.common.harness()?,
            &module,
            &range,
            args.cold,
            args.seconds,
            args.csv.as_deref(),
            &mut reporter,
        )?;
        drop(reporter);
        print!("{report}");
    }
    if args.overhead {
        let at = match &args.set {
            Some(s) => Some(crate::bindings(
                std::slice::from_ref(s),
                Some(module.workload()),
            )?),
            None => None,
        };
        print!("{}", overhead(&module, at.as_ref())?);
    }
    Ok(())
}

/// A peer's name (`--peers`).
fn peer_kind(s: &str) -> Result<PeerKind, String> {
    s.parse()
        .map_err(|e: anyshape_bench::BenchError| e.to_string())
}

/// How a model's peers run: `--threads`, `--python`, `--torch-python`, `--peers`,
/// `--onnx`.
fn peer_options(args: &BenchArgs) -> PeerOptions<'_> {
    PeerOptions {
        threads: args.threads.unwrap_or(2) as usize,
        python: args.python.as_deref().unwrap_or("python3"),
        torch_python: args.torch_python.as_deref(),
        peers: args.peers.as_deref(),
        onnx: args.onnx.as_deref(),
    }
}

/// `anyshape bench --model M --compare`.
fn bench_model(model: &std::path::Path, args: &BenchArgs) -> Result<()> {
    let operator_only = [
        (args.dispatch_loss, "--dispatch-loss"),
        (args.overhead, "--overhead"),
        (!args.range.is_empty(), "--range"),
        (args.cold, "--cold"),
        (args.samples.is_some(), "--samples"),
        (args.per_shape_trials.is_some(), "--per-shape-trials"),
        (args.bucket.is_some(), "--bucket"),
        (args.set.is_some(), "--set"),
        (args.csv.is_some(), "--csv"),
    ];
    let wrong = crate::given(&operator_only);
    if !wrong.is_empty() {
        bail!(
            "a model module is benchmarked with --compare (against its peers), --generate, --conv-kernels and --tuning-against; {} are for an operator module (--module)",
            wrong.join(", ")
        );
    }
    let peers_only = [
        (args.onnx.is_some(), "--onnx"),
        (args.peers.is_some(), "--peers"),
        (args.python.is_some(), "--python"),
        (args.torch_python.is_some(), "--torch-python"),
        (args.threads.is_some(), "--threads"),
    ];
    let wrong = crate::given(&peers_only);
    if !args.compare && !args.generate && !wrong.is_empty() {
        bail!("{} are for --compare and --generate", wrong.join(", "));
    }
    if !args.compare && !args.conv_kernels && !args.dims.is_empty() {
        bail!("--dim is for --compare and --conv-kernels");
    }
    if !args.compare && !args.cases.is_empty() {
        bail!("--inputs is for --compare (the recorded cases a model is raced on)");
    }
    if args.generate {
        if !args.compare && !args.dims.is_empty() {
            bail!("--dim is for --compare; --generate runs at the --prompts lengths");
        }
        let prompts: Vec<usize> = args.prompts.iter().map(|&p| p as usize).collect();
        let options = GenerateCompareOptions {
            prompts: &prompts,
            new_tokens: args.new_tokens as usize,
            rounds: args.rounds as usize,
            peers: peer_options(args),
            out_dir: &args.out_dir,
        };
        reported(args.quiet, |r| compare_generate(model, &options, r))?;
    }
    if let Some((baseline, others)) = args.tuning_against.split_first() {
        // Each compile labelled by its module's name beside its mode.
        let labelled = |m: &Path| -> Result<TuningLog> {
            let mut log = read_tuning(m)?;
            let name = m.file_name().unwrap_or(m.as_os_str()).to_string_lossy();
            log.mode = format!("{name}: {}", log.mode);
            Ok(log)
        };
        let c = TuningComparison::new(
            labelled(model)?,
            labelled(baseline)?,
            others.iter().map(|m| labelled(m)).collect::<Result<_>>()?,
        )?;
        let title = format!("Tuning {} against {}", model.display(), baseline.display());
        let mut reads = args.common.reads();
        reads.dir(model);
        for m in &args.tuning_against {
            reads.dir(m);
        }
        let (summary, written) = c.write(&title, &OutDir::new(&args.out_dir, reads)?)?;
        print!("{summary}");
        println!("written: {}", written.join(", "));
    }
    if !args.compare && !args.conv_kernels {
        return Ok(());
    }
    let dims = dim_values(&args.dims)?;
    if args.conv_kernels {
        let options = ConvCompareOptions {
            dims: &dims,
            rounds: args.rounds as usize,
            seconds: args.seconds,
            out_dir: &args.out_dir,
        };
        let harness = args.common.harness()?;
        reported(args.quiet, |r| {
            compare_convolutions(model, &options, &harness, r)
        })?;
    }
    if !args.compare {
        return Ok(());
    }
    let options = ModelCompareOptions {
        dims: &dims,
        cases: &args.cases,
        rounds: args.rounds as usize,
        seconds: args.seconds,
        peers: peer_options(args),
        against: &args.against,
        out_dir: &args.out_dir,
    };
    let harness = args.common.harness()?;
    reported(args.quiet, |r| compare_model(model, &options, &harness, r))
}

/// Run a comparison with a progress reporter (quiet: none), then print its summary and
/// the files it wrote.
fn reported(
    quiet: bool,
    run: impl FnOnce(&mut Reporter) -> anyshape_bench::Result<(String, Vec<String>)>,
) -> Result<()> {
    let mut reporter = Reporter::new(quiet);
    let (summary, written) = run(&mut reporter)?;
    drop(reporter);
    print!("{summary}");
    println!("written: {}", written.join(", "));
    Ok(())
}

/// The values of each `--dim`.
fn dim_values(given: &[String]) -> Result<Vec<(String, Vec<i64>)>> {
    let mut dims = Vec::new();
    for d in given {
        let v = ShapeVar::parse(d)?;
        if v.domain.len() > 4096 {
            bail!("--dim {d}: at most 4096 values");
        }
        if dims.iter().any(|(n, _): &(String, Vec<i64>)| *n == v.name) {
            bail!("--dim {}: given twice", v.name);
        }
        dims.push((v.name.clone(), v.domain.iter().collect()));
    }
    Ok(dims)
}
