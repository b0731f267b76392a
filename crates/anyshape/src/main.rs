//! The `anyshape` command-line tool.
mod bench;
mod compare;
mod gpu;
mod inspect;
mod peak;
mod tune;

use anyhow::{bail, Context, Result};
use anyshape_codegen::{CpuTarget, KernelMode, MicroKernel, PaddingStrategy, Program};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{
    Builder, Candidate, KernelSource, MeasureOptions, Measurement, Outcome, Runner, WorkerCommand,
};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// anyshape: tune dynamic-shape tensor programs once, run every shape fast.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one program on random data: latency, GFLOP/s and (with --check) correctness.
    Run(RunArgs),
    /// Tune a workload once for every instance of its shape vars' domains.
    Tune(tune::TuneArgs),
    /// Print what a module holds: micro-kernels, dispatch tree, where each instance goes.
    Inspect {
        /// The module directory (from `anyshape tune --out`).
        module: PathBuf,
    },
    /// Benchmark a module: side by side with the vendor libraries and the tuned baselines,
    /// dispatch loss over its instances, dispatch overhead per call.
    Bench(bench::BenchArgs),
    /// Tune a workload jointly on the GPU and compare every instance with cuBLAS (and
    /// the padding strategies on the paper's Fig. 5 case); needs an NVIDIA GPU.
    Gpu(gpu::GpuArgs),
    /// Print the detected CPU target as JSON (edit it and pass it back with --target).
    Target,
    /// Measure this machine's peak FP32 throughput with an FMA microbenchmark.
    Peak {
        /// Seconds to run each measurement.
        #[arg(long, default_value_t = 0.5)]
        seconds: f64,
        #[command(flatten)]
        common: Common,
    },
    /// The measuring worker (started by anyshape itself).
    #[command(name = "__worker", hide = true)]
    Worker,
}

/// Options shared by commands that build and run kernels.
#[derive(Args, Clone)]
struct Common {
    /// Target description (JSON from `anyshape target`); detected when absent.
    #[arg(long, value_name = "FILE")]
    target: Option<PathBuf>,
    /// Where compiled kernels are cached [default: $ANYSHAPE_CACHE or ~/.cache/anyshape].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

#[derive(Args)]
struct RunArgs {
    /// The workload, e.g. `dense(M=16*T,N=2304,K=768)`; built in: dense(M,N,K),
    /// batch_matmul_nt(B,M,N,K), batch_matmul_nn(B,M,N,K); append `+relu` for an epilogue.
    #[arg(long, short, required_unless_present = "module")]
    workload: Option<String>,
    /// Run a module (from `anyshape tune --out`) instead: its dispatcher picks the kernel.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["workload", "strategy", "mode", "micro_kernel", "print_c"])]
    module: Option<PathBuf>,
    /// Shape var values, e.g. `--set T=37` (repeat or comma-separate for several).
    #[arg(long = "set", value_name = "VAR=VALUE")]
    set: Vec<String>,
    /// How tiles that overhang the tensors are handled.
    #[arg(long, default_value = "local-pad", value_parser = clap::builder::PossibleValuesParser::new(["boundary-check", "global-pad", "loop-partition", "local-pad"]))]
    strategy: String,
    /// Bake the shape into the kernel (specialized) or read it at run time (symbolic).
    #[arg(long, default_value = "specialized", value_parser = clap::builder::PossibleValuesParser::new(["specialized", "symbolic"]))]
    mode: String,
    /// Micro-kernel parameters, `mr=12,nr=32,mc=96,nc=384,kc=256,uk=4` or JSON;
    /// a default for the target when absent.
    #[arg(long, value_name = "PARAMS")]
    micro_kernel: Option<String>,
    /// Compare the output with the reference implementation.
    #[arg(long)]
    check: bool,
    /// Print the generated C and stop.
    #[arg(long)]
    print_c: bool,
    /// Keep timing for at least this many seconds.
    #[arg(long, default_value_t = 0.5, value_parser = seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// Kill the program if it runs longer than this many seconds.
    #[arg(long, default_value_t = 60.0, value_parser = time_limit, allow_negative_numbers = true)]
    timeout: f64,
    #[command(flatten)]
    common: Common,
}

impl Common {
    fn target(&self) -> Result<CpuTarget> {
        match &self.target {
            None => Ok(CpuTarget::detect()),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading target {}", path.display()))?;
                Ok(CpuTarget::from_json(&text)?)
            }
        }
    }

    fn builder(&self) -> Builder {
        Builder::new(
            self.cache_dir
                .clone()
                .unwrap_or_else(Builder::default_cache_dir),
        )
    }
}

/// A duration option: a finite number of seconds, at least 0.
pub(crate) fn seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("`{text}` is not a number of seconds >= 0")),
    }
}

/// A time limit: seconds above 0, at most a week.
fn time_limit(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if x > 0.0 && x <= anyshape_measure::MAX_TIMEOUT_SECONDS => Ok(x),
        _ => Err(format!(
            "`{text}` is not a time limit: need seconds above 0, at most {}",
            anyshape_measure::MAX_TIMEOUT_SECONDS
        )),
    }
}

/// A fraction in [0, 1).
pub(crate) fn fraction(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if (0.0..1.0).contains(&x) => Ok(x),
        _ => Err(format!("`{text}` is not a fraction in [0, 1), e.g. 0.02")),
    }
}

/// A positive finite number.
pub(crate) fn positive(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("`{text}` is not a positive number")),
    }
}

/// `--set` options as bindings: each shape var once; with `workload`, only its own.
pub(crate) fn bindings(sets: &[String], workload: Option<&Workload>) -> Result<Bindings> {
    let mut b = Bindings::default();
    for s in sets {
        b.extend_from_text(s)?;
    }
    if let Some(w) = workload {
        let vars = w.shape_vars();
        if let Some((name, _)) = b.iter().find(|(n, _)| !vars.iter().any(|v| v == n)) {
            bail!(
                "`{name}` is not a shape var of {w} (its shape vars: {})",
                if vars.is_empty() {
                    "none".to_string()
                } else {
                    vars.join(", ")
                }
            );
        }
    }
    Ok(b)
}

fn runner(options: MeasureOptions) -> Result<Runner> {
    let program =
        std::env::current_exe().context("locating the anyshape executable for the worker")?;
    Ok(Runner {
        worker: WorkerCommand {
            program,
            args: vec!["__worker".into()],
        },
        options,
    })
}

fn run(args: RunArgs) -> Result<()> {
    let options = MeasureOptions {
        min_seconds: args.seconds,
        timeout_seconds: args.timeout,
        ..Default::default()
    };
    if let Some(module) = &args.module {
        let bindings = bindings(&args.set, None)?;
        return inspect::run_module(module, &bindings, args.check, options);
    }
    let workload = Workload::parse(args.workload.as_deref().unwrap_or_default())?;
    let bindings = bindings(&args.set, Some(&workload))?;
    let bound = workload.bind(&bindings)?;
    let target = args.common.target()?;
    let micro_kernel = match &args.micro_kernel {
        Some(text) => MicroKernel::parse(text)?,
        None => MicroKernel::default_for(&target),
    };
    micro_kernel.validate(&target)?;
    let strategy: PaddingStrategy = args.strategy.parse().map_err(anyhow::Error::msg)?;
    let mode: KernelMode = args.mode.parse().map_err(anyhow::Error::msg)?;
    let program = Program {
        workload: workload.clone(),
        micro_kernel,
        strategy,
        mode,
        bindings: bindings.clone(),
    };
    let code = program.c_source(&target)?;
    if args.print_c {
        print!("{}\n{code}", anyshape_codegen::c::header(&target));
        return Ok(());
    }
    let symbol = program.symbol(&target);
    let lib = args.common.builder().build(
        &target,
        &[KernelSource {
            symbol: symbol.clone(),
            code,
        }],
    )?;
    if let Some(err) = lib.failed.get(&symbol) {
        bail!("the generated kernel did not compile (a code generation bug):\n{err}");
    }
    let candidate = Candidate {
        symbol,
        workload: workload.clone(),
        bindings: bindings.clone(),
        check: args.check,
        gpu: None,
    };
    let outcome = runner(options)?.measure(&lib.path, &[candidate])?.remove(0);
    let m = match outcome {
        Outcome::Measured(m) => m,
        Outcome::Failed(why) | Outcome::Interrupted(why) => bail!("the program failed: {why}"),
    };
    let flops = workload.flops(&bound);
    println!("workload     {workload}  [{bindings}]");
    println!(
        "program      {micro_kernel}  strategy={strategy}  mode={mode}  target={} ({} cores, {:?})",
        target.name, target.cores, target.simd
    );
    print_measurement(&m, flops)
}

/// Print a measurement's latency, throughput and check; fail on a mismatch.
fn print_measurement(m: &Measurement, flops: f64) -> Result<()> {
    println!(
        "latency      min {:.3} ms   median {:.3} ms   ({} runs)",
        m.min_seconds * 1e3,
        m.median_seconds * 1e3,
        m.repeats
    );
    println!(
        "throughput   {:.1} GFLOP/s (at min latency)   {:.1} GFLOP/s (at median)",
        flops / m.min_seconds / 1e9,
        flops / m.median_seconds / 1e9
    );
    if let Some(check) = &m.check {
        if check.passed {
            println!(
                "check        ok: matches the reference (max abs error {:.2e})",
                check.max_abs_error
            );
        } else {
            println!("check        MISMATCH: {} elements differ (first at flat index {:?}, max abs error {:.2e})", check.mismatches, check.first_mismatch, check.max_abs_error);
            bail!("the result does not match the reference");
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    // Libraries report what they repair or skip as warnings (a damaged cache entry
    // rebuilt, say); they go to standard error.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .with_max_level(tracing::Level::WARN)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args),
        Command::Tune(args) => tune::tune(args),
        Command::Inspect { module } => inspect::inspect(&module),
        Command::Bench(args) => bench::bench(args),
        Command::Gpu(args) => gpu::gpu(args),
        Command::Target => {
            println!("{}", serde_json::to_string_pretty(&CpuTarget::detect())?);
            Ok(())
        }
        Command::Peak { seconds, common } => {
            peak::report(&common.target()?, &common.builder(), seconds)
        }
        Command::Worker => std::process::exit(anyshape_measure::worker::serve_with(
            anyshape_bench::BUILTINS,
        )),
    }
}
