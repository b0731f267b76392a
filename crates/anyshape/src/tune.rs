//! `anyshape tune`: joint tuning of a workload for every instance of its domain, on the
//! CPU (the sketch of the workload's class) or a CUDA GPU, through the compile pipeline.
use crate::progress::Reporter;
use crate::{queue_summary, runner, Common, DbArgs, QueueArgs};
use anyhow::{bail, Context, Result};
use anyshape_codegen::{
    cpu_sketch, DeviceKind, GpuContractionKernel, GpuTarget, Sketch, Target as _,
};
use anyshape_ir::{ShapeVar, Workload};
use anyshape_measure::{GpuDevice, Measurer};
use anyshape_tune::{
    check_outputs, instances, tune_workload, Instance, Packaged, PipelineOptions, RecordLog,
    ResumeSummary, SearchStrategy, SketchBackend, Specialize, StopReason, TuneOptions, TuneReport,
    Tuned, Tuner, VoteOptions, MAX_INSTANCES,
};
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Options of `anyshape tune`.
#[derive(Args)]
pub struct TuneArgs {
    /// The workload, e.g. `dense(M=16*T,N=2304,K=768)`.
    #[arg(long, short)]
    pub(crate) workload: String,
    /// Domain of a shape var: `T=1..128` (inclusive) or `T=1,8,16`; one per shape var.
    #[arg(long = "range", value_name = "VAR=DOMAIN", required = true)]
    pub(crate) ranges: Vec<String>,
    /// Shape weights (how often each value occurs), JSON: `{"T": {"1": 4, "64": 10}}`;
    /// values not listed weigh 1. Uniform when absent.
    #[arg(long, value_name = "FILE")]
    pub(crate) weights: Option<PathBuf>,
    /// Trial budget of the search (programs measured on an instance), counting resumed
    /// trials; the votes' measurements come on top.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) trials: u64,
    /// Records file (JSONL), appended to after every trial; needed by `tune`
    /// (`anyshape gpu`: OUT_DIR/records.jsonl when absent).
    #[arg(long, value_name = "FILE")]
    pub(crate) records: Option<PathBuf>,
    /// Continue the run in the records file: nothing measured is measured again.
    #[arg(long)]
    pub(crate) resume: bool,
    /// Micro-kernels built and measured per round.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) batch: u64,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// How the search chooses what to measure after the seeds: DietCode's evolutionary
    /// search, or TSCompiler's trust regions around the seeds with a bandit choosing
    /// among them.
    #[arg(
        long,
        default_value = "evolutionary",
        value_name = "evolutionary|trust-region"
    )]
    pub(crate) search: SearchStrategy,
    /// The device to tune for: `cpu` (this machine, or --target) or `cuda` (the first
    /// NVIDIA GPU; no module yet, see `anyshape gpu`).
    #[arg(long, default_value = "cpu", value_parser = device)]
    pub device: DeviceKind,
    /// How tiles that overhang the tensors are handled.
    #[arg(long, default_value = "local-pad", value_parser = clap::builder::PossibleValuesParser::new(["boundary-check", "loop-partition", "local-pad"]))]
    pub strategy: String,
    /// Write the report (best micro-kernel per instance, history, timings) as JSON.
    #[arg(long, value_name = "FILE")]
    pub(crate) report: Option<PathBuf>,
    /// After tuning, check the best kernel of every instance against the reference
    /// (instances up to --check-flops; the reference is a plain loop nest).
    #[arg(long)]
    pub(crate) check: bool,
    /// FLOP cap for --check.
    #[arg(long, default_value_t = 2e9, value_parser = crate::positive)]
    pub(crate) check_flops: f64,
    /// Write the module (kernels for every shape + dispatcher + manifest) to this directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// Instances that get kernels specialized for them in the module: `none` (one
    /// symbolic kernel per micro-kernel: smallest), `all` (fastest, largest), or a count
    /// (the heaviest instances, evenly spread where weights tie).
    #[arg(long, default_value = "none", value_name = "none|all|N")]
    pub(crate) specialize: Specialize,
    /// A micro-kernel within this fraction of an instance's best may take its vote
    /// (fewer micro-kernels, smaller module); in [0, 1).
    #[arg(long, default_value_t = 0.02, value_parser = crate::fraction)]
    pub(crate) tolerance: f64,
    /// At most this many micro-kernels in the module.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub(crate) max_kernels: u64,
    /// Vote on the cost model's predictions instead of measuring the candidate
    /// micro-kernels on every instance (faster, less exact).
    #[arg(long)]
    pub(crate) predicted_votes: bool,
    /// No progress bar.
    #[arg(long)]
    pub(crate) quiet: bool,
    #[command(flatten)]
    pub(crate) db: DbArgs,
    #[command(flatten)]
    pub(crate) queue: QueueArgs,
    #[command(flatten)]
    pub(crate) common: Common,
}

/// A device name.
fn device(text: &str) -> Result<DeviceKind, String> {
    match text {
        "cpu" => Ok(DeviceKind::Cpu),
        "cuda" | "gpu" => Ok(DeviceKind::Cuda),
        _ => Err(format!("`{text}` is not a device: cpu or cuda")),
    }
}

/// The shape vars of `--range` options, weighted by the `--weights` file.
pub fn shape_vars(ranges: &[String], weights: Option<&Path>) -> Result<Vec<ShapeVar>> {
    let mut vars: Vec<ShapeVar> = ranges
        .iter()
        .map(|r| ShapeVar::parse(r))
        .collect::<Result<_, _>>()?;
    for v in &vars {
        if v.domain.len() > MAX_INSTANCES {
            bail!(
                "--range {}: {} values; one joint search takes at most {MAX_INSTANCES} instances (list representative values instead, e.g. `{}=1,2,4,8,16,...`)",
                v.name,
                v.domain.len(),
                v.name
            );
        }
    }
    if let Some(path) = weights {
        let text =
            anyshape_files::read_to_string(path, anyshape_files::MIB * 64, "weights (JSON)")?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("weights {} are not JSON", path.display()))?;
        let Some(map) = json.as_object() else {
            bail!(
                "weights {}: expected an object like {{\"T\": {{\"1\": 4}}}}",
                path.display()
            )
        };
        for (name, table) in map {
            let Some(var) = vars.iter_mut().find(|v| &v.name == name) else {
                bail!("weights name `{name}`, which has no --range")
            };
            let Some(table) = table.as_object() else {
                bail!("weights of `{name}`: expected an object of value -> weight")
            };
            let values: Vec<i64> = var.domain.iter().collect();
            let mut w = vec![1.0; values.len()];
            for (value, weight) in table {
                let v: i64 = value.parse().with_context(|| {
                    format!("weights of `{name}`: `{value}` is not a whole number")
                })?;
                let Some(i) = values.iter().position(|&x| x == v) else {
                    bail!("weights of `{name}`: {v} is outside its domain")
                };
                w[i] = weight
                    .as_f64()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .with_context(|| {
                        format!("weights of `{name}`: the weight of {v} must be a number >= 0")
                    })?;
            }
            var.weights = Some(w);
        }
    }
    Ok(vars)
}

/// Say what opening the records file repaired or skipped.
pub fn report_log(log: &RecordLog) {
    if log.torn_bytes() > 0 {
        eprintln!(
            "warning: {}: cut off a torn last record of {} bytes (a run killed while writing it); that trial is measured again",
            log.path().display(),
            log.torn_bytes()
        );
    }
    for (line, why) in log.invalid() {
        eprintln!(
            "warning: {}: line {line} skipped: {why}",
            log.path().display()
        );
    }
}

/// Say which records a resumed run reuses and which it leaves aside.
pub fn report_resumed(r: &ResumeSummary) {
    if r.trials + r.other_runs + r.outside_domain + r.transient == 0 {
        return;
    }
    let mut parts = vec![match r.reused {
        0 => format!("{} trials reused", r.trials),
        n => format!("{n} trials reused from the tuning database's best earlier run"),
    }];
    if r.other_runs > 0 {
        parts.push(format!(
            "{} records of another workload, target, strategy, version or caches' state ignored",
            r.other_runs
        ));
    }
    if r.outside_domain > 0 {
        parts.push(format!(
            "{} records outside the domain ignored",
            r.outside_domain
        ));
    }
    if r.transient > 0 {
        parts.push(format!(
            "{} trials the environment failed are measured again",
            r.transient
        ));
    }
    eprintln!("resuming: {}", parts.join("; "));
}

/// Set on Ctrl-C: the search stops after the current round, with its records written.
/// A second Ctrl-C ends the process at once (the records survive that too).
pub fn interrupt_flag() -> Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let set = flag.clone();
        let installed = ctrlc::set_handler(move || {
            if set.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
            eprintln!("\ninterrupted: finishing the current round (Ctrl-C again to stop at once; the records keep every trial either way)");
        });
        if let Err(e) = installed {
            tracing::warn!("Ctrl-C stops the process at once (no handler: {e})");
        }
        flag
    })
    .clone()
}

/// Run `anyshape tune`.
pub fn tune(args: TuneArgs) -> Result<()> {
    let job = Job::new(&args, None)?;
    match args.device {
        DeviceKind::Cpu => {
            let target = args.common.target()?;
            let class = job.workload.class;
            cpu_sketch!(class, tune_done(job, &target))
        }
        DeviceKind::Cuda => {
            if args.queue.queue.is_some() {
                bail!("--queue: the work queue measures CPU kernels only; tune for CUDA on the GPU's machine");
            }
            if args.out.is_some() {
                bail!("--out: modules of GPU kernels are not built yet (the runtime loads CPU modules); tune without --out, or compare with cuBLAS through `anyshape gpu`");
            }
            GpuContractionKernel::applies(&job.workload)?;
            tune_done::<GpuContractionKernel>(job, &gpu_target()?)
        }
    }
}

/// [`tune_on`] when nothing follows it.
fn tune_done<K: Packaged>(job: Job, target: &K::Target) -> Result<()> {
    tune_on::<K>(job, target).map(drop)
}

/// The first GPU's target (the workers use the GPU from then on).
pub fn gpu_target() -> Result<GpuTarget> {
    // GPU 0, as the workers use it; CUDA_VISIBLE_DEVICES picks another.
    let dev = GpuDevice::open(0).context(
        "tuning for CUDA needs an NVIDIA GPU with a CUDA 12 or 13 driver (tuning on the CPU is `--device cpu`)",
    )?;
    Ok(dev.target.clone())
}

/// What a tuning run needs besides the sketch and its target.
pub struct Job<'a> {
    /// The command line.
    pub args: &'a TuneArgs,
    /// The workload.
    pub workload: Workload,
    /// Its shape vars with their domains.
    pub vars: Vec<ShapeVar>,
    /// Every instance.
    pub domain: Vec<Instance>,
    /// The records file.
    pub records: PathBuf,
    /// Search options.
    pub options: TuneOptions,
    /// What the run reads (a target description, weights): no output replaces them.
    pub reads: anyshape_files::Reads,
}

impl Job<'_> {
    /// The run `args` ask for, every option checked before any work; the records go to
    /// `--records`, else to `default_records`.
    pub fn new<'a>(args: &'a TuneArgs, default_records: Option<&Path>) -> Result<Job<'a>> {
        let workload = Workload::parse(&args.workload)?;
        let vars = shape_vars(&args.ranges, args.weights.as_deref())?;
        let domain = instances(&workload, &vars)?;
        let records = args
            .records
            .as_deref()
            .or(default_records)
            .context("--records FILE is needed: every trial is appended to it, and a killed or interrupted run resumes from it (--resume)")?
            .to_path_buf();
        // Everything that could only fail at the end is checked before any work.
        let mut reads = args.common.reads();
        if let Some(w) = &args.weights {
            reads.file(w);
        }
        let database = args.db.path(&args.common);
        check_outputs(
            &records,
            args.report.as_deref(),
            database.as_deref(),
            args.out.as_deref(),
            &reads,
        )?;
        if let Some(db) = &database {
            anyshape_tune::TuningDb::open(db)?; // a file that is not one is refused now
        }
        let options = TuneOptions {
            trials: args.trials as usize,
            batch: args.batch as usize,
            seed: args.seed,
            search: args.search,
            strategy: args.strategy.parse().map_err(anyhow::Error::msg)?,
            interrupt: Some(interrupt_flag()),
            database,
            ..TuneOptions::default()
        };
        Ok(Job {
            args,
            workload,
            vars,
            domain,
            records,
            options,
            reads,
        })
    }
}

/// Tune with the sketch `K` on `target`: the pipeline, then the report on standard
/// output; returns what the pipeline produced, the instances and the tuning seconds.
pub fn tune_on<K: Packaged>(
    job: Job,
    target: &K::Target,
) -> Result<(Tuned<K>, Vec<Instance>, f64)> {
    let args = job.args;
    let measurer = Measurer {
        builder: args.common.builder(),
        runner: runner(job.options.measure.clone())?,
        queue: args.queue.queue()?,
    };
    let records = job.records;
    let reads = job.reads;
    let (log, previous) = RecordLog::open(&records, args.resume)?;
    report_log(&log);
    let n = job.domain.len();
    let backend = SketchBackend::<K>::new(target, &measurer);
    let mut tuner = Tuner::with_backend(
        backend,
        &job.workload,
        job.domain,
        job.options,
        log,
        previous,
    )?;
    eprintln!(
        "tuning {} for {n} instances with the {} sketch on {}; records: {}",
        job.workload,
        K::NAME,
        target.describe(),
        records.display()
    );
    report_resumed(&tuner.resumed());
    let start = Instant::now();
    let options = PipelineOptions {
        votes: VoteOptions {
            tolerance: args.tolerance,
            max_kernels: args.max_kernels as usize,
            measure: !args.predicted_votes,
            ..VoteOptions::default()
        },
        out: args.out.clone(),
        reads,
        specialize: args.specialize,
        check_flops: args.check.then_some(args.check_flops),
        dispatch: args.device == DeviceKind::Cuda,
        whole_dims: None,
    };
    let mut reporter = Reporter::new(args.quiet);
    let tuned = tune_workload(&mut tuner, &job.vars, &measurer, &options, &mut reporter)?;
    drop(reporter);
    let wall = start.elapsed().as_secs_f64();
    print_report(&tuned.report, wall);
    if let Some(q) = tuner.database_quality() {
        println!("cost model: {q}");
    }
    if let Some((votes, tree, accuracy)) = &tuned.dispatch {
        let measured = votes.votes.iter().filter(|v| v.measured).count();
        println!(
            "votes: {} micro-kernels for {n} instances ({measured} votes measured, tolerance {:.0}%) in {:.1} s; dispatch tree: depth {}, {} leaves, training accuracy {:.1}%",
            votes.micro_kernels.len(),
            args.tolerance * 100.0,
            tuned.vote_seconds,
            tree.depth(),
            tree.leaves(),
            accuracy * 100.0
        );
    }
    if let (Some((manifest, seconds)), Some(out)) = (&tuned.module, &args.out) {
        let bytes: u64 = manifest.files.values().map(|f| f.bytes).sum();
        println!(
            "module written to {} ({} specialized kernels, {:.1} KiB, built in {seconds:.1} s); inspect it with `anyshape inspect {}`",
            out.display(),
            manifest.specialized.len(),
            bytes as f64 / 1024.0,
            out.display()
        );
    }
    if let Some(v) = &tuned.check {
        println!("check: the best kernels of {} instances match the reference; {} failed; {} skipped (over {:.1e} FLOPs)", v.checked - v.failures.len(), v.failures.len(), v.skipped, args.check_flops);
        if !v.failures.is_empty() {
            bail!("the check failed:\n{}", v.failures.join("\n"));
        }
    }
    if let Some(path) = &args.report {
        let json = serde_json::to_string_pretty(&tuned.report)?;
        anyshape_files::write_bytes(path, &options.reads, "--report", json.as_bytes())?;
        println!("report written to {}", path.display());
    }
    if tuned.report.stop == StopReason::Interrupted {
        bail!(
            "interrupted after {} trials; `--resume` goes on from {}",
            tuned.report.trials,
            records.display()
        );
    }
    if let Some(line) = queue_summary(measurer.queue.as_ref()) {
        println!("{line}");
    }
    let (tuning_seconds, _) = tuner.tuning_seconds();
    Ok((tuned, tuner.instances().to_vec(), tuning_seconds))
}

fn print_report<K: std::fmt::Display + PartialEq>(r: &TuneReport<K>, wall: f64) {
    println!("best micro-kernel per instance (m = measured, p = predicted by the cost model):");
    let mut i = 0;
    while i < r.best.len() {
        let mut j = i;
        while j + 1 < r.best.len() && r.best[j + 1].micro_kernel == r.best[i].micro_kernel {
            j += 1;
        }
        let (a, b) = (&r.best[i], &r.best[j]);
        let span = if i == j {
            format!("{}", a.bindings)
        } else {
            format!("{} .. {}", a.bindings, b.bindings)
        };
        let gf: Vec<String> = r.best[i..=j]
            .iter()
            .map(|x| format!("{:.0}{}", x.gflops, if x.measured { "m" } else { "p" }))
            .collect();
        let shown = if gf.len() > 6 {
            format!("{} .. {}", gf[..3].join(" "), gf[gf.len() - 2..].join(" "))
        } else {
            gf.join(" ")
        };
        println!("  {span:<22} {}   GFLOP/s: {shown}", a.micro_kernel);
        i = j + 1;
    }
    let t = &r.time;
    println!(
        "trials {} ({} resumed, {} failed) in {} rounds; wall {:.1} s: build {:.1} s, measure {:.1} s, cost model {:.1} s, search {:.1} s",
        r.trials, r.resumed_trials, r.failed_trials, r.rounds, wall, t.build, t.measure, t.model, t.search
    );
    let rho = r
        .holdout_spearman
        .map_or("n/a (fewer than 20 successful trials)".to_string(), |x| {
            format!("{x:.3}")
        });
    println!(
        "cost model: k = {:.2}, trained on {} trials; Spearman on the last 20% held out: {rho}",
        r.k, r.model_samples
    );
    println!("stopped: {}", r.stop);
    let weighted: f64 = r.best.iter().map(|b| b.weight * b.latency_seconds).sum();
    println!(
        "weighted latency over all instances: {:.3} ms",
        weighted * 1e3
    );
}
