//! `anyshape gpu`: tune a workload jointly on the GPU (`anyshape tune --device cuda`
//! with the votes and the dispatch tree), then compare every instance's dispatched
//! kernel with cuBLAS and run the paper's Fig. 5 case (`anyshape_bench::compare_gpu`).
use crate::progress::Reporter;
use crate::runner;
use crate::tune::{gpu_target, tune_on, Job, TuneArgs};
use anyhow::{bail, Context, Result};
use anyshape_bench::{compare_gpu, GpuComparison};
use anyshape_codegen::{DeviceKind, GpuContractionKernel, Sketch};
use anyshape_measure::Measurer;
use clap::Args;
use std::path::PathBuf;

/// Options of `anyshape gpu`: those of `anyshape tune` (always on the first GPU, no
/// module) and the comparison's.
#[derive(Args)]
pub struct GpuArgs {
    #[command(flatten)]
    tune: TuneArgs,
    /// The instance of the Fig. 5 comparison (strategies with a 128×128 micro-kernel):
    /// the value of the workload's shape var; skipped when 0.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(i64).range(0..))]
    fig5: i64,
    /// Keep timing each kernel on each instance for at least this many seconds.
    #[arg(long, default_value_t = 0.02, value_parser = crate::seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// Where the report (report.md, results.csv) goes.
    #[arg(long, value_name = "DIR", default_value = "gpu-results")]
    out_dir: PathBuf,
}

/// Run `anyshape gpu`.
pub fn gpu(mut args: GpuArgs) -> Result<()> {
    if args.tune.out.is_some() {
        bail!("`anyshape gpu` writes no module (the runtime loads CPU modules yet); drop --out");
    }
    args.tune.device = DeviceKind::Cuda;
    let job = Job::new(&args.tune, Some(&args.out_dir.join("records.jsonl")))?;
    GpuContractionKernel::applies(&job.workload)?;
    let workload = job.workload.clone();
    let strategy = job.options.strategy;
    let mut measure = job.options.measure.clone();
    let target = gpu_target()?;
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("creating {}", args.out_dir.display()))?;
    let (tuned, instances, tuning_seconds) = tune_on::<GpuContractionKernel>(job, &target)?;
    let Some((votes, tree, accuracy)) = &tuned.dispatch else {
        bail!("the search was interrupted before the votes: nothing to compare");
    };
    measure.min_seconds = args.seconds;
    let measurer = Measurer {
        builder: args.tune.common.builder(),
        runner: runner(measure)?,
        queue: None,
    };
    let comparison = GpuComparison {
        workload: &workload,
        target: &target,
        strategy,
        instances: &instances,
        micro_kernels: &votes.micro_kernels,
        tree,
        accuracy: *accuracy,
        tuning_seconds,
        fig5: args.fig5,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let mut reporter = Reporter::new(args.tune.quiet);
    let report = compare_gpu(&comparison, &measurer, &args.out_dir, &mut reporter)?;
    drop(reporter);
    print!("{}", report.markdown);
    eprintln!("wrote {}", report.written.join(", "));
    if !report.problems.is_empty() {
        bail!("some measurements failed:\n{}", report.problems.join("\n"));
    }
    Ok(())
}
