//! `anyshape tune`: joint tuning of a workload for every instance of its domain.
use crate::{runner, Common};
use anyhow::{bail, Context, Result};
use anyshape_ir::{ShapeVar, Workload};
use anyshape_measure::Measurer;
use anyshape_tune::{
    check_outputs, elect, instances, train_tree, verify, write_module, Backend, CpuBackend,
    ModuleSpec, RecordLog, ResumeSummary, RoundSummary, Specialize, TuneOptions, TuneReport, Tuner,
    VoteOptions, MAX_INSTANCES,
};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Options of `anyshape tune`.
#[derive(Args)]
pub struct TuneArgs {
    /// The workload, e.g. `dense(M=16*T,N=2304,K=768)`.
    #[arg(long, short)]
    workload: String,
    /// Domain of a shape var: `T=1..128` (inclusive) or `T=1,8,16`; one per shape var.
    #[arg(long = "range", value_name = "VAR=DOMAIN", required = true)]
    ranges: Vec<String>,
    /// Shape weights (how often each value occurs), JSON: `{"T": {"1": 4, "64": 10}}`;
    /// values not listed weigh 1. Uniform when absent.
    #[arg(long, value_name = "FILE")]
    weights: Option<PathBuf>,
    /// Trial budget (programs measured on an instance), counting resumed trials.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    trials: u64,
    /// Records file (JSONL), appended to after every trial.
    #[arg(long, value_name = "FILE")]
    records: PathBuf,
    /// Continue the run in the records file: nothing measured is measured again.
    #[arg(long)]
    resume: bool,
    /// Micro-kernels built and measured per round.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    batch: u64,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the report (best micro-kernel per instance, history, timings) as JSON.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// After tuning, check the best kernel of every instance against the reference
    /// (instances up to --verify-flops; the reference is a plain loop nest).
    #[arg(long)]
    verify: bool,
    /// FLOP cap for --verify.
    #[arg(long, default_value_t = 2e9, value_parser = crate::positive)]
    verify_flops: f64,
    /// Write the module (kernels for every shape + dispatcher + manifest) to this directory.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Instances that get kernels specialized for them in the module: `none` (one
    /// symbolic kernel per micro-kernel: smallest), `all` (fastest, largest), or a count
    /// (the heaviest instances, evenly spread where weights tie).
    #[arg(long, default_value = "none", value_name = "none|all|N")]
    specialize: Specialize,
    /// A micro-kernel within this fraction of an instance's best may take its vote
    /// (fewer micro-kernels, smaller module); in [0, 1).
    #[arg(long, default_value_t = 0.02, value_parser = crate::fraction)]
    tolerance: f64,
    /// At most this many micro-kernels in the module.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    max_kernels: u64,
    /// Vote on the cost model's predictions instead of measuring the candidate
    /// micro-kernels on every instance (faster, less exact).
    #[arg(long)]
    predicted_votes: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    common: Common,
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
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading weights {}", path.display()))?;
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
    let mut parts = vec![format!("{} trials reused", r.trials)];
    if r.other_runs > 0 {
        parts.push(format!(
            "{} records of another workload, target or strategy ignored",
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

/// Run the tuner with a progress bar of trials (or, with `quiet`, only a line per round).
pub fn run_with_progress<B: Backend>(
    tuner: &mut Tuner<B>,
    trials: usize,
    quiet: bool,
) -> Result<TuneReport<B::MicroKernel>> {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(trials as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} trials  {elapsed_precise}  eta {eta}")
            .expect("valid template"),
    );
    let report = tuner.run(
        &mut |s| {
            if quiet {
                eprintln!("{}", round_line(s));
            } else {
                bar.println(round_line(s));
            }
        },
        &mut |n| bar.set_position(n as u64),
    )?;
    bar.finish_and_clear();
    Ok(report)
}

/// One line per tuning round.
fn round_line(s: &RoundSummary) -> String {
    format!(
        "round {:>3}  trials {:>4}/{}  failed {:>2}  weighted latency: predicted {:>9.3} ms, measured {:>9.3} ms ({} instances)  best {:>6.1} GFLOP/s",
        s.round, s.trials, s.budget, s.failed, s.predicted_weighted_latency * 1e3, s.measured_weighted_latency * 1e3, s.measured_instances, s.best_gflops
    )
}

/// Run `anyshape tune`.
pub fn tune(args: TuneArgs) -> Result<()> {
    let workload = Workload::parse(&args.workload)?;
    let vars = shape_vars(&args.ranges, args.weights.as_deref())?;
    let domain = instances(&workload, &vars)?;
    let target = args.common.target()?;
    // Everything that could only fail at the end is checked before any work.
    check_outputs(&args.records, args.report.as_deref(), args.out.as_deref())?;

    let options = TuneOptions {
        trials: args.trials as usize,
        batch: args.batch as usize,
        seed: args.seed,
        ..TuneOptions::default()
    };
    let strategy = options.strategy;
    let measurer = Measurer {
        builder: args.common.builder(),
        runner: runner(options.measure.clone())?,
    };
    let (log, previous) = RecordLog::open(&args.records, args.resume)?;
    report_log(&log);
    let n_instances = domain.len();
    let mut tuner = Tuner::new(
        &workload, &target, domain, options, &measurer, log, previous,
    )?;
    eprintln!(
        "tuning {workload} for {n_instances} instances on {} ({} cores, {:?}); records: {}",
        target.name,
        target.cores,
        target.simd,
        args.records.display()
    );
    report_resumed(&tuner.resumed());
    let start = Instant::now();
    let report = run_with_progress(&mut tuner, args.trials as usize, args.quiet)?;
    print_report(&report, start.elapsed().as_secs_f64());
    if let Some(out) = &args.out {
        build_module(
            &args, out, &mut tuner, &report, &workload, &vars, &target, strategy, &measurer,
        )?;
    }
    if args.verify {
        let v = verify(
            &workload,
            &target,
            strategy,
            &report,
            &measurer,
            args.verify_flops,
        )?;
        println!("verify: the best kernels of {} instances match the reference; {} failed; {} skipped (over {:.1e} FLOPs)", v.checked - v.failures.len(), v.failures.len(), v.skipped, args.verify_flops);
        if !v.failures.is_empty() {
            bail!("verification failed:\n{}", v.failures.join("\n"));
        }
    }
    if let Some(path) = &args.report {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("report written to {}", path.display());
    }
    Ok(())
}

/// Vote, train the dispatch tree and write the module.
#[allow(clippy::too_many_arguments)]
fn build_module(
    args: &TuneArgs,
    out: &std::path::Path,
    tuner: &mut Tuner<CpuBackend>,
    report: &TuneReport,
    workload: &Workload,
    vars: &[ShapeVar],
    target: &anyshape_codegen::CpuTarget,
    strategy: anyshape_codegen::PaddingStrategy,
    measurer: &Measurer,
) -> Result<()> {
    let options = VoteOptions {
        tolerance: args.tolerance,
        max_kernels: args.max_kernels as usize,
        measure: !args.predicted_votes,
    };
    let start = Instant::now();
    let n = tuner.instances().len();
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} voting: measuring candidates on every instance, {pos} records  {elapsed_precise}")
            .expect("valid template"),
    );
    let votes = elect(tuner, &options, &mut |r| bar.set_position(r as u64))?;
    bar.finish_and_clear();
    let measured = votes.votes.iter().filter(|v| v.measured).count();
    let vote_secs = start.elapsed().as_secs_f64();
    let (tree, accuracy) = train_tree(&workload.shape_vars(), &votes.votes)?;
    let bindings: Vec<_> = votes.votes.iter().map(|v| v.bindings.clone()).collect();
    let weights: Vec<f64> = tuner.instances().iter().map(|x| x.weight).collect();
    let specialize = args.specialize.pick(&bindings, &weights);
    eprintln!(
        "building the module: {} symbolic + {} specialized kernels ...",
        votes.micro_kernels.len(),
        specialize.len()
    );
    let (tuning_seconds, untimed_trials) = tuner.tuning_seconds();
    let t0 = Instant::now();
    let manifest = write_module(
        &ModuleSpec {
            workload,
            shape_vars: vars,
            target,
            strategy,
            votes: &votes,
            tree: &tree,
            tree_accuracy: accuracy,
            specialize: &specialize,
            tuning: Some(anyshape_abi::TuningInfo {
                seconds: tuning_seconds,
                trials: tuner.trials(),
                resumed_trials: report.resumed_trials,
                untimed_trials,
            }),
        },
        &measurer.builder,
        out,
    )?;
    let bytes: u64 = manifest.files.values().map(|f| f.bytes).sum();
    println!(
        "votes: {} micro-kernels for {n} instances ({measured} votes measured, tolerance {:.0}%) in {vote_secs:.1} s; dispatch tree: depth {}, {} leaves, training accuracy {:.1}%",
        votes.micro_kernels.len(),
        args.tolerance * 100.0,
        tree.depth(),
        tree.leaves(),
        accuracy * 100.0
    );
    println!(
        "module written to {} ({} specialized kernels, {:.1} KiB, built in {:.1} s); inspect it with `anyshape inspect {}`",
        out.display(),
        manifest.specialized.len(),
        bytes as f64 / 1024.0,
        t0.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

fn print_report(r: &TuneReport, wall: f64) {
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
    let weighted: f64 = r.best.iter().map(|b| b.weight * b.latency_seconds).sum();
    println!(
        "weighted latency over all instances: {:.3} ms",
        weighted * 1e3
    );
}
