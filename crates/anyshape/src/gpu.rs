//! `anyshape gpu`: tune a workload jointly for every instance on the GPU, dispatch each
//! instance through the decision tree, and compare it with cuBLAS instance by instance;
//! plus the paper's Fig. 5 case (local padding against boundary checks and loop
//! partitioning with a 128×128 micro-kernel).
use crate::compare::{geomean, significant};
use crate::runner;
use crate::tune::{run_with_progress, shape_vars};
use anyhow::{bail, Context, Result};
use anyshape_codegen::{GpuMicroKernel, GpuProgram, PaddingStrategy};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{
    Builder, Candidate, GpuDevice, MeasureOptions, Measurer, Outcome, CUBLAS_LIBRARY, CUBLAS_SYMBOL,
};
use anyshape_tune::{
    elect, instances, train_tree, GpuBackend, RecordLog, TuneOptions, Tuner, VoteOptions,
};
use clap::Args;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `anyshape gpu`.
#[derive(Args)]
pub struct GpuArgs {
    /// The workload, e.g. `batch_matmul_nt(B=192,M=T,N=T,K=64)`.
    #[arg(long, short)]
    workload: String,
    /// Domain of a shape var: `T=1..128` (inclusive) or `T=1,8,16`; one per shape var.
    #[arg(long = "range", value_name = "VAR=DOMAIN", required = true)]
    ranges: Vec<String>,
    /// Trial budget of the joint search (programs measured on an instance).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    trials: u64,
    /// Records file (JSONL) [default: OUT_DIR/records.jsonl].
    #[arg(long, value_name = "FILE")]
    records: Option<PathBuf>,
    /// Continue the run in the records file: nothing measured is measured again.
    #[arg(long)]
    resume: bool,
    /// Padding strategy of the tuned kernels.
    #[arg(long, default_value = "local-pad", value_parser = clap::builder::PossibleValuesParser::new(["boundary-check", "loop-partition", "local-pad"]))]
    strategy: String,
    /// The instance of the Fig. 5 comparison (strategies with a 128×128 micro-kernel):
    /// the value of the workload's shape var; skipped when 0.
    #[arg(long, default_value_t = 60)]
    fig5: i64,
    /// Keep timing each kernel on each instance for at least this many seconds.
    #[arg(long, default_value_t = 0.02, value_parser = crate::seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// Where the report (report.md, results.csv) goes.
    #[arg(long, value_name = "DIR", default_value = "gpu-results")]
    out_dir: PathBuf,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Where compiled kernels are cached [default: $ANYSHAPE_CACHE or ~/.cache/anyshape].
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

/// Outputs of instances up to this many FLOPs are checked against the reference (a
/// plain loop nest on the host, ~1 GFLOP/s); `tests/gpu.rs` checks every T.
const CHECK_FLOPS: f64 = 1e9;

/// One instance's result.
struct Row {
    bindings: Bindings,
    flops: f64,
    kernel: GpuMicroKernel,
    ours: Option<f64>,
    cublas: Option<f64>,
}

fn latency(o: &Outcome) -> Result<f64, String> {
    match o {
        Outcome::Measured(m) if m.check.as_ref().is_none_or(|c| c.passed) => Ok(m.min_seconds),
        Outcome::Measured(m) => Err(format!("wrong result: {:?}", m.check)),
        Outcome::Failed(why) | Outcome::Interrupted(why) => Err(why.clone()),
    }
}

/// Run `anyshape gpu`.
pub fn gpu(args: GpuArgs) -> Result<()> {
    let workload = Workload::parse(&args.workload)?;
    let vars = shape_vars(&args.ranges, None)?;
    let domain = instances(&workload, &vars)?;
    // GPU 0 (as the workers use it); CUDA_VISIBLE_DEVICES picks another.
    let dev = GpuDevice::open(0).context(
        "`anyshape gpu` needs an NVIDIA GPU with CUDA 12 (tuning on the CPU is `anyshape tune`)",
    )?;
    let target = dev.target.clone();
    // The device is the workers' from here on.
    drop(dev);
    let strategy: PaddingStrategy = args.strategy.parse().map_err(anyhow::Error::msg)?;
    let mut options = TuneOptions {
        trials: args.trials as usize,
        strategy,
        ..TuneOptions::default()
    };
    options.measure.min_seconds = args.seconds;
    let measurer = Measurer {
        builder: Builder::new(
            args.cache_dir
                .clone()
                .unwrap_or_else(Builder::default_cache_dir),
        ),
        runner: runner(options.measure.clone())?,
    };
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let records = args
        .records
        .clone()
        .unwrap_or_else(|| args.out_dir.join("records.jsonl"));
    let (log, previous) = RecordLog::open(&records, args.resume)?;
    crate::tune::report_log(&log);
    let n = domain.len();
    let backend = GpuBackend::new(&target, &measurer);
    let mut tuner = Tuner::with_backend(backend, &workload, domain, options, log, previous)?;
    eprintln!(
        "tuning {workload} for {n} instances on {} ({} SMs, sm_{}{}); records: {}",
        target.name,
        target.sm_count,
        target.compute_capability.0,
        target.compute_capability.1,
        records.display()
    );
    let start = Instant::now();
    crate::tune::report_resumed(&tuner.resumed());
    let report = run_with_progress(&mut tuner, args.trials as usize, args.quiet)?;
    eprintln!(
        "search: {} trials ({} failed) in {:.1} s; voting on every instance…",
        report.trials,
        report.failed_trials,
        start.elapsed().as_secs_f64()
    );
    let votes = elect(&mut tuner, &VoteOptions::default(), &mut |_| {})?;
    let (tree, accuracy) = train_tree(&workload.shape_vars(), &votes.votes)?;
    let (tuning_seconds, _) = tuner.tuning_seconds();
    eprintln!(
        "{} micro-kernels, tree depth {} with {} leaves, {:.0} % training accuracy; tuning {:.1} s in all",
        votes.micro_kernels.len(),
        tree.depth(),
        tree.leaves(),
        accuracy * 100.0,
        tuning_seconds
    );

    // Every instance through the dispatcher, against cuBLAS.
    let mut rows: Vec<Row> = tuner
        .instances()
        .iter()
        .map(|x| Row {
            bindings: x.bindings.clone(),
            flops: x.flops,
            kernel: votes.micro_kernels[tree.select(&x.bindings)],
            ours: None,
            cublas: None,
        })
        .collect();
    let programs: Vec<GpuProgram> = votes
        .micro_kernels
        .iter()
        .map(|&mk| GpuProgram::symbolic(&workload, mk, strategy))
        .collect();
    let lib = measurer.builder.build_gpu(&target, &programs)?;
    let compare = MeasureOptions {
        min_repeats: 10,
        ..measurer.runner.options.clone()
    };
    let runner = runner(compare)?;
    let candidate = |symbol: String, r: &Row, gpu: Option<GpuMicroKernel>| Candidate {
        symbol,
        workload: workload.clone(),
        bindings: r.bindings.clone(),
        check: r.flops <= CHECK_FLOPS,
        gpu,
    };
    let ours: Vec<Candidate> = rows
        .iter()
        .map(|r| {
            let p = GpuProgram::symbolic(&workload, r.kernel, strategy);
            candidate(p.symbol(&target), r, Some(r.kernel))
        })
        .collect();
    let blas: Vec<Candidate> = rows
        .iter()
        .map(|r| candidate(CUBLAS_SYMBOL.into(), r, None))
        .collect();
    eprintln!("measuring {n} instances: the dispatched kernel and cuBLAS…");
    let ours = runner.measure(&lib.path, &ours)?;
    let blas = runner.measure(CUBLAS_LIBRARY.as_ref(), &blas)?;
    let mut problems = Vec::new();
    for (r, (o, b)) in rows.iter_mut().zip(ours.iter().zip(&blas)) {
        match latency(o) {
            Ok(l) => r.ours = Some(l),
            Err(e) => problems.push(format!("anyshape at {}: {e}", r.bindings)),
        }
        match latency(b) {
            Ok(l) => r.cublas = Some(l),
            Err(e) => problems.push(format!("cuBLAS at {}: {e}", r.bindings)),
        }
    }
    let fig5 = fig5(&args, &workload, &target, &measurer, &runner)?;
    let text = render(
        &args,
        &workload,
        &target,
        &rows,
        &fig5,
        tuning_seconds,
        &tree,
        accuracy,
    );
    print!("{text}");
    std::fs::write(args.out_dir.join("report.md"), &text)?;
    let mut csv = String::from("instance,gflop,kernel,anyshape_s,cublas_s,speedup\n");
    for r in &rows {
        let _ = writeln!(
            csv,
            "\"{}\",{},\"{}\",{},{},{}",
            r.bindings,
            r.flops / 1e9,
            r.kernel,
            r.ours.map_or(String::new(), |x| x.to_string()),
            r.cublas.map_or(String::new(), |x| x.to_string()),
            speedup(r).map_or(String::new(), |x| x.to_string())
        );
    }
    std::fs::write(args.out_dir.join("results.csv"), csv)?;
    eprintln!("wrote {}/report.md and results.csv", args.out_dir.display());
    if !problems.is_empty() {
        bail!("some measurements failed:\n{}", problems.join("\n"));
    }
    Ok(())
}

fn speedup(r: &Row) -> Option<f64> {
    Some(r.cublas? / r.ours?)
}

/// Fig. 5: the strategies with a 128×128 micro-kernel on one instance.
fn fig5(
    args: &GpuArgs,
    w: &Workload,
    target: &anyshape_codegen::GpuTarget,
    measurer: &Measurer,
    runner: &anyshape_measure::Runner,
) -> Result<Vec<(PaddingStrategy, Result<f64, String>)>> {
    let vars = w.shape_vars();
    if args.fig5 == 0 || vars.len() != 1 {
        return Ok(vec![]);
    }
    let mk = GpuMicroKernel {
        bm: 128,
        bn: 128,
        bk: 8,
        tm: 8,
        tn: 8,
    };
    let strategies = [
        PaddingStrategy::LocalPad,
        PaddingStrategy::BoundaryCheck,
        PaddingStrategy::LoopPartition,
    ];
    let programs: Vec<GpuProgram> = strategies
        .iter()
        .map(|&s| GpuProgram::symbolic(w, mk, s))
        .collect();
    let lib = measurer.builder.build_gpu(target, &programs)?;
    let bindings = Bindings::from_pairs([(vars[0].as_str(), args.fig5)]);
    let cands: Vec<Candidate> = programs
        .iter()
        .map(|p| Candidate {
            symbol: p.symbol(target),
            workload: w.clone(),
            bindings: bindings.clone(),
            check: true,
            gpu: Some(mk),
        })
        .collect();
    let outs = runner.measure(&lib.path, &cands)?;
    Ok(strategies
        .into_iter()
        .zip(outs.iter().map(latency))
        .collect())
}

#[allow(clippy::too_many_arguments)]
fn render(
    args: &GpuArgs,
    w: &Workload,
    target: &anyshape_codegen::GpuTarget,
    rows: &[Row],
    fig5: &[(PaddingStrategy, Result<f64, String>)],
    tuning_seconds: f64,
    tree: &anyshape_abi::DispatchTree,
    accuracy: f64,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# {w} on {}\n", target.name);
    let _ = writeln!(
        s,
        "`anyshape gpu -w \"{w}\" --range {} --trials {} --strategy {}`\n",
        args.ranges.join(" --range "),
        args.trials,
        args.strategy
    );
    let ratios: Vec<f64> = rows.iter().filter_map(speedup).collect();
    let (lo, hi) = ratios
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
    let _ = writeln!(
        s,
        "Speedup over cuBLAS (its latency ÷ anyshape's; > 1: anyshape is faster), geomean over {} instances: **{:.3}×** (range {:.3}–{:.3}; anyshape faster on {}).",
        ratios.len(),
        geomean(&ratios),
        lo,
        hi,
        ratios.iter().filter(|&&x| x > 1.0).count()
    );
    let _ = writeln!(
        s,
        "Tuning: {tuning_seconds:.1} s (search and votes, all instances). Dispatcher: depth {}, {} leaves, {:.0} % training accuracy. Latency: minimum over ≥ 10 calls timed by CUDA events; outputs of instances up to {CHECK_FLOPS:.0e} FLOPs checked against the reference.\n",
        tree.depth(),
        tree.leaves(),
        accuracy * 100.0
    );
    if !fig5.is_empty() {
        let _ = writeln!(
            s,
            "## Fig. 5: micro-kernel 128×128 (bk 8, 8×8 per thread) at {}={}\n\n| strategy | latency (ms) | vs local-pad |\n|---|---|---|",
            w.shape_vars()[0],
            args.fig5
        );
        let base = fig5.first().and_then(|f| f.1.as_ref().ok().copied());
        for (strategy, l) in fig5 {
            match l {
                Ok(l) => {
                    let rel = base.map_or(String::new(), |b| format!("{:.3}×", l / b));
                    let _ = writeln!(s, "| {strategy} | {} | {rel} |", significant(l * 1e3));
                }
                Err(e) => {
                    let _ = writeln!(s, "| {strategy} | failed: {e} | |");
                }
            }
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "## Per instance\n\n| instance | micro-kernel | anyshape (ms) | cuBLAS (ms) | speedup | anyshape TFLOP/s |\n|---|---|---|---|---|---|"
    );
    let ms = |x: Option<f64>| x.map_or("failed".into(), |v| significant(v * 1e3));
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.bindings,
            r.kernel,
            ms(r.ours),
            ms(r.cublas),
            speedup(r).map_or(String::new(), |x| format!("{x:.3}")),
            r.ours
                .map_or(String::new(), |l| format!("{:.2}", r.flops / l / 1e12))
        );
    }
    s
}
