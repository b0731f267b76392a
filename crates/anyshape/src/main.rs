//! The `anyshape` command-line tool.
mod bench;
mod compile;
mod generate;
mod gpu;
mod inspect;
mod progress;
mod run;
mod run_model;
mod tune;
mod worker;

use anyhow::{bail, Context, Result};
use anyshape_bench::Harness;
use anyshape_codegen::CpuTarget;
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{Builder, MeasureOptions, Runner, WorkerCommand};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

/// Every buffer a kernel is measured, tuned or run on starts on a cache line, as a
/// framework's tensors do: where it started at the heap's whim, which of two kernels
/// was faster changed from one process to the next (see
/// [`anyshape_abi::CacheLineAllocator`]).
#[global_allocator]
static ALLOCATOR: anyshape_abi::CacheLineAllocator = anyshape_abi::CacheLineAllocator;

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
    Run(run::RunArgs),
    /// Tune a workload once for every instance of its shape vars' domains.
    Tune(tune::TuneArgs),
    /// Compile an ONNX model for its dims' domains into a model module.
    Compile(compile::CompileArgs),
    /// Generate tokens with a decoder model module that carries its key/value cache:
    /// the prompt in one run, then a run per token; greedy or sampled with a seed.
    Generate(generate::GenerateArgs),
    /// Print what a module holds (micro-kernels, dispatch tree, where each instance
    /// goes) or what an ONNX model is (symbolic shapes, fused steps and tasks).
    Inspect {
        /// The module directory (from `anyshape tune --out` or `anyshape compile`), or
        /// an `.onnx` file.
        module: PathBuf,
        /// With an `.onnx` file: a value's symbolic shape and element type, and the node
        /// that makes it, by its name in the model (repeat for several)
        #[arg(long = "value", value_name = "NAME")]
        value: Vec<String>,
        /// With an `.onnx` file: every value's symbolic shape, element type and node, in
        /// the model's order
        #[arg(long, conflicts_with = "value")]
        values: bool,
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
        #[arg(long, default_value_t = 0.5, value_parser = positive)]
        seconds: f64,
        #[command(flatten)]
        common: Common,
    },
    /// Measure for a work queue: take the jobs of this machine's CPU that
    /// `tune`/`compile --queue URL` put on it, build and measure them, post the results.
    Worker(worker::WorkerArgs),
    /// The measuring worker (started by anyshape itself).
    #[command(name = "__worker", hide = true)]
    Measure,
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

impl Common {
    /// What these options make a command read (the target description).
    fn reads(&self) -> anyshape_files::Reads {
        let mut reads = anyshape_files::Reads::new();
        if let Some(t) = &self.target {
            reads.file(t);
        }
        reads
    }

    fn target(&self) -> Result<CpuTarget> {
        match &self.target {
            None => Ok(CpuTarget::detect()),
            Some(path) => {
                let text = anyshape_files::read_to_string(
                    path,
                    anyshape_files::MIB,
                    "a target description (JSON)",
                )?;
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

/// Where tuning runs record their trials besides their records file.
#[derive(Args, Clone)]
struct DbArgs {
    /// The tuning database (SQLite): every trial is recorded there too, and a task
    /// whose records hold nothing of its workload starts from the database's best
    /// earlier run of the same workload, target and strategy — measured by any
    /// compile or tune before, of this model or another with the same layers
    /// [default: tuning.sqlite in the kernel cache directory].
    #[arg(long, value_name = "FILE")]
    db: Option<PathBuf>,
    /// Use no tuning database: the records alone.
    #[arg(long, conflicts_with = "db")]
    no_db: bool,
}

impl DbArgs {
    /// The database's path, or none with --no-db.
    fn path(&self, common: &Common) -> Option<PathBuf> {
        if self.no_db {
            return None;
        }
        Some(self.db.clone().unwrap_or_else(|| {
            common
                .cache_dir
                .clone()
                .unwrap_or_else(Builder::default_cache_dir)
                .join(anyshape_tune::DATABASE_FILE)
        }))
    }
}

/// Where tuning measures its candidates.
#[derive(Args, Clone)]
struct QueueArgs {
    /// Measure on the workers of a work queue instead of this machine: a Redis server
    /// (6.2 or later), `redis://HOST:PORT`. Each round's kernels go there as jobs (one
    /// per micro-kernel, with the instances to measure it on); run `anyshape worker
    /// --queue URL` on each measuring machine (of the target's CPU). The records and
    /// the tuning database stay here.
    #[arg(long, value_name = "URL")]
    queue: Option<String>,
    /// With --queue: seconds to wait for a worker of the target (also when every worker
    /// went silent with jobs unanswered) before giving up.
    #[arg(long, default_value_t = 60.0, value_parser = time_limit, value_name = "SECONDS")]
    queue_wait: f64,
}

impl QueueArgs {
    /// The queue, connected; none without --queue.
    fn queue(&self) -> Result<Option<anyshape_measure::queue::Queue>> {
        let Some(url) = &self.queue else {
            return Ok(None);
        };
        let mut queue = anyshape_measure::queue::Queue::connect(url)?;
        queue.wait_seconds = self.queue_wait;
        Ok(Some(queue))
    }
}

/// One line on what the work queue did for a run (none without one).
fn queue_summary(queue: Option<&anyshape_measure::queue::Queue>) -> Option<String> {
    let s = queue?.stats();
    Some(format!(
        "work queue {}: {} jobs ({} measurements) answered by {} worker(s) in {:.1} s of waiting; the workers built for {:.1} s and measured for {:.1} s{}",
        queue?.url(),
        s.jobs,
        s.candidates,
        s.workers.len(),
        s.wall_seconds,
        s.build_seconds,
        s.measure_seconds,
        s.overhead_per_job()
            .map(|o| format!("; overhead {:.1} ms a job", o * 1e3))
            .unwrap_or_default()
    ))
}

/// A duration option: seconds, at least 0, at most a week.
pub(crate) fn seconds(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if (0.0..=anyshape_measure::MAX_TIMEOUT_SECONDS).contains(&x) => Ok(x),
        _ => Err(format!(
            "`{text}` is not a duration: need seconds from 0 to {} (a week)",
            anyshape_measure::MAX_TIMEOUT_SECONDS
        )),
    }
}

/// A time limit: seconds above 0, at most a week.
pub(crate) fn time_limit(text: &str) -> Result<f64, String> {
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

/// The names of the options among `flags` (given?, name) that were given: for refusing
/// options that do not apply.
pub(crate) fn given(flags: &[(bool, &'static str)]) -> Vec<&'static str> {
    flags.iter().filter(|g| g.0).map(|g| g.1).collect()
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

impl Common {
    /// The CPU harness: target, builder, and this executable as the measuring worker.
    fn harness(&self) -> Result<Harness> {
        Ok(Harness {
            target: self.target()?,
            builder: self.builder(),
            worker: worker()?,
        })
    }
}

/// This executable as the measuring worker.
fn worker() -> Result<WorkerCommand> {
    let program =
        std::env::current_exe().context("locating the anyshape executable for the worker")?;
    Ok(WorkerCommand {
        program,
        args: vec!["__worker".into()],
    })
}

/// A runner of this executable's worker.
fn runner(options: MeasureOptions) -> Result<Runner> {
    Ok(Runner {
        worker: worker()?,
        options,
    })
}

/// `anyshape peak`: the FMA peak on one thread and on every core.
fn peak(common: &Common, seconds: f64) -> Result<()> {
    use anyshape_bench::peak::Peak;
    let target = common.target()?;
    let lanes = target.lanes_f32();
    println!(
        "FMA peak of {} ({} cores, {:?}): {} independent {lanes}-lane FMA chains per thread, best of repeated runs of >= {seconds} s:",
        target.name,
        target.cores,
        target.simd,
        anyshape_bench::peak::CHAINS
    );
    for (t, best) in anyshape_bench::peak::measure(&target, &common.builder(), seconds)? {
        println!("  {t} thread(s): {best:.1} GFLOP/s");
    }
    for (kind, what) in [
        (
            Peak::DotBf16,
            "4 flops a lane; what a --precision bf16 module's dense layers run on without AMX",
        ),
        (
            Peak::TileBf16,
            "16,384 flops a tile product; what a --precision bf16 module's dense layers run on with AMX",
        ),
        (
            Peak::DotI8,
            "8 operations a lane; what a --precision i8 module's dense layers run on",
        ),
    ] {
        if kind.available(&target) {
            println!(
                "{} ({what}): {} chains per thread:",
                kind.describe(),
                kind.chains()
            );
            for (t, best) in
                anyshape_bench::peak::measure_kind(kind, &target, &common.builder(), seconds)?
            {
                println!("  {t} thread(s): {best:.1} GFLOP/s");
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    // An error is the user's input or the environment, told in its message and its
    // causes: no backtrace of where anyhow caught it, which RUST_BACKTRACE=1 (common in
    // a Rust developer's shell) otherwise prints after every error, 80 lines of this
    // binary's frames. Panics, anyshape's own bugs, keep RUST_BACKTRACE; an error's
    // backtrace is still there with RUST_LIB_BACKTRACE=1, as anyhow documents.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
    // Output piped into `head` ends quietly, as command-line tools do, instead of
    // panicking on the broken pipe.
    // SAFETY: at the start of main, before any thread; SIG_DFL is a valid disposition.
    #[cfg(unix)]
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // A model's activations are allocated and freed on every run; glibc returned the
    // large ones to the system (mmap, trimming), so every run page-faulted them in
    // again (BERT-base, sequence 512: 993 -> 793 ms). Keep freed memory in the
    // process, as a runtime arena would (until the memory plan has one).
    // SAFETY: at the start of main, before any allocation-heavy work or thread; both
    // parameters are documented mallopt options with values glibc accepts.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
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
        Command::Run(args) => run::run(args),
        Command::Tune(args) => tune::tune(args),
        Command::Compile(args) => compile::compile(args),
        Command::Generate(args) => generate::generate(args),
        Command::Inspect {
            module,
            value,
            values,
        } => {
            let shown = match (values, value.is_empty()) {
                (true, _) => inspect::Shown::All,
                (false, false) => inspect::Shown::Named(value),
                (false, true) => inspect::Shown::None,
            };
            inspect::inspect_path(&module, &shown)
        }
        Command::Bench(args) => bench::bench(args),
        Command::Gpu(args) => gpu::gpu(args),
        Command::Target => {
            println!("{}", serde_json::to_string_pretty(&CpuTarget::detect())?);
            Ok(())
        }
        Command::Peak { seconds, common } => peak(&common, seconds),
        Command::Worker(args) => worker::run_worker(args),
        Command::Measure => std::process::exit(anyshape_measure::worker::serve_with(
            anyshape_bench::WORKER_BUILTINS,
        )),
    }
}
