//! `anyshape compile`: an ONNX model into a model module — every task tuned over the
//! model's dims (or, with `--trials 0`, given default micro-kernels) — and running one
//! (`anyshape run --module M --inputs case.npz`), with NumPy files in and out.
use crate::progress::Reporter;
use crate::tune::interrupt_flag;
use crate::{runner, Common};
use anyhow::{bail, Context, Result};
use anyshape_graph::{Data, Tensor};
use anyshape_ir::ShapeVar;
use anyshape_measure::{MeasureOptions, Measurer};
use anyshape_tune::{compile_model, ModelOptions, PipelineOptions, TuneOptions};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Options of `anyshape compile`.
#[derive(Args)]
pub struct CompileArgs {
    /// The ONNX model (as `torch.onnx.export` writes it, opsets 13–21).
    model: PathBuf,
    /// The domain of a model dim: `--dim sequence=1..512`, `--dim batch=1`; one per
    /// dim the model's inputs name (`anyshape inspect model.onnx` lists them).
    #[arg(long = "dim", value_name = "NAME=DOMAIN", required = true)]
    dims: Vec<String>,
    /// Trials per task on average: the tasks' joint searches share trials × tasks,
    /// which the task scheduler gives out where they cut the model's latency most; 0
    /// gives a quick untuned module (every task with its sketch's default micro-kernel).
    #[arg(long, default_value_t = 0)]
    trials: u64,
    /// Give every task the same trials instead of scheduling them (for comparison).
    #[arg(long)]
    equal_shares: bool,
    /// Tune every task on its own: no cost model and candidates shared by the tasks of
    /// a family (same operator over the same dims; for comparison).
    #[arg(long)]
    no_families: bool,
    /// With --trials: each dim is tuned (searched and voted) on at most this many of
    /// its values, spread geometrically from its smallest to its largest; each task's
    /// dispatch tree covers the values between (and past) them.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(2..))]
    tune_values: u64,
    /// A directory for the tasks' records (needed with --trials > 0).
    #[arg(long, value_name = "DIR")]
    records: Option<PathBuf>,
    /// Continue the tasks' records: nothing measured is measured again.
    #[arg(long)]
    resume: bool,
    /// Where the model module goes.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Time candidates with warm caches (each call finding its inputs cached by the
    /// previous one) instead of evicting the caches before every call, as happens to a
    /// model's weights between their layer's calls.
    #[arg(long)]
    warm_cache: bool,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    common: Common,
}

/// Run `anyshape compile`.
pub fn compile(args: CompileArgs) -> Result<()> {
    let dims: Vec<ShapeVar> = args
        .dims
        .iter()
        .map(|d| ShapeVar::parse(d))
        .collect::<Result<_, _>>()?;
    let target = args.common.target()?;
    let defaults = TuneOptions::default();
    let options = ModelOptions {
        trials: args.trials as usize,
        equal_shares: args.equal_shares,
        families: !args.no_families,
        tune_values: args.tune_values as usize,
        records: args.records.clone(),
        resume: args.resume,
        tune: TuneOptions {
            interrupt: Some(interrupt_flag()),
            measure: MeasureOptions {
                cold: !args.warm_cache,
                ..defaults.measure.clone()
            },
            ..defaults
        },
        pipeline: PipelineOptions {
            votes: Default::default(),
            out: None,
            specialize: anyshape_tune::Specialize::None,
            verify_flops: None,
            dispatch: false,
        },
    };
    let measurer = Measurer {
        builder: args.common.builder(),
        runner: runner(options.tune.measure.clone())?,
    };
    let start = Instant::now();
    let mut reporter = Reporter::new(args.quiet);
    let compiled = compile_model(
        &args.model,
        &dims,
        &target,
        &measurer,
        &options,
        &args.out,
        &mut reporter,
    )?;
    drop(reporter);
    let m = &compiled.manifest;
    let runs: usize = m.tasks.iter().map(|t| t.count).sum();
    println!(
        "model module written to {} in {:.1} s: {} tasks ({runs} kernel calls per run), {} measurements (search and votes); run it with `anyshape run --module {} --inputs case.npz`",
        args.out.display(),
        start.elapsed().as_secs_f64(),
        m.tasks.len(),
        m.tasks.iter().map(|t| t.trials).sum::<usize>(),
        args.out.display()
    );
    if let Some(t) = &compiled.tuning {
        println!(
            "tuning ({}): {} new trials in {:.1} s ({:.0} trials per hour), building kernels {:.0}% of it; expected model latency {} ms; the curve is in {}",
            t.mode,
            t.new_trials,
            t.wall_seconds,
            t.trials_per_hour(),
            100.0 * t.build_share(),
            t.final_latency().map_or("-".into(), |l| format!("{:.3}", l * 1e3)),
            args.out.join(anyshape_tune::TUNING_FILE).display()
        );
    }
    Ok(())
}

/// What `anyshape run --module M` does with a model module.
pub struct ModelRun<'a> {
    /// A `.npz` of inputs by name (outputs of the same names are compared).
    pub inputs: Option<&'a Path>,
    /// `NAME=FILE.npy` inputs (they win over the `.npz`'s arrays of the same name).
    pub input: &'a [String],
    /// Where to write the outputs (`.npz`).
    pub output: Option<&'a Path>,
    /// Keep timing for this many seconds.
    pub seconds: f64,
    /// The largest relative error from recorded outputs that passes.
    pub max_error: f64,
    /// Print where a run spends its time.
    pub profile: bool,
}

/// `anyshape run --module M` for a model module: its inputs from `.npz`/`.npy`, its
/// outputs printed (and written with `--output`), the latency of a run; outputs that
/// the `.npz` also records are compared, and an error past `max_error` fails the run.
pub fn run_model(dir: &Path, r: &ModelRun) -> Result<()> {
    let ModelRun {
        inputs,
        output,
        seconds,
        max_error,
        profile,
        ..
    } = *r;
    let model = anyshape_runtime::Model::load(dir)?;
    let g = model.graph();
    let input_names: Vec<&str> = g
        .inputs
        .iter()
        .map(|i| g.values[i.value].as_str())
        .collect();
    for spec in r.input {
        let name = spec.split('=').next().unwrap_or_default();
        if !input_names.contains(&name) {
            bail!(
                "--input {name}: the model has no input of that name (its inputs: {})",
                input_names.join(", ")
            );
        }
    }
    let mut arrays = match inputs {
        Some(p) => anyshape_graph::npz::read(p)?,
        None => Vec::new(),
    };
    for spec in r.input {
        let (name, file) = spec
            .split_once('=')
            .with_context(|| format!("--input {spec}: expected NAME=FILE.npy"))?;
        let t = anyshape_graph::npz::read_npy(Path::new(file))?;
        arrays.retain(|(n, _)| n != name);
        arrays.push((name.to_string(), t));
    }
    let sources = match (inputs, r.input.is_empty()) {
        (Some(p), true) => p.display().to_string(),
        (Some(p), false) => format!("{} and --input", p.display()),
        (None, _) => "--input".to_string(),
    };
    let given: Vec<(&str, Tensor)> = g
        .inputs
        .iter()
        .map(|i| {
            let name = g.values[i.value].as_str();
            arrays
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| (name, t.clone()))
                .with_context(|| {
                    format!("the model's input `{name}` is not given ({sources} has no array of that name)")
                })
        })
        .collect::<Result<_>>()?;
    let t0 = Instant::now();
    let outs = model.run(&given)?;
    let mut best = t0.elapsed().as_secs_f64();
    let mut runs = 1;
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        model.run(&given)?;
        best = best.min(t.elapsed().as_secs_f64());
        runs += 1;
    }
    println!(
        "model        {}  ({} runs, min latency {:.3} ms)",
        dir.display(),
        runs,
        best * 1e3
    );
    if profile {
        let steps = model.profile(&given)?;
        let total: f64 = steps.iter().map(|s| s.2).sum();
        println!("profile      one run, {:.3} ms in steps:", total * 1e3);
        for (label, n, s) in steps.iter().filter(|s| s.2 >= total * 1e-3) {
            println!(
                "  {:>9.3} ms {:>5.1}%  {n:>3}x  {label}",
                s * 1e3,
                100.0 * s / total.max(1e-30)
            );
        }
    }
    let mut named = Vec::new();
    let mut mismatched = Vec::new();
    for (&o, t) in g.outputs.iter().zip(outs) {
        let name = g.values[o].clone();
        let preview: Vec<String> = match &t.data {
            Data::F32(v) => v.iter().take(4).map(|x| format!("{x:.5}")).collect(),
            Data::I64(v) => v.iter().take(4).map(|x| x.to_string()).collect(),
            Data::Bool(v) => v.iter().take(4).map(|x| x.to_string()).collect(),
        };
        println!(
            "output       {name} {:?} [{} ...]",
            t.shape,
            preview.join(", ")
        );
        // Where the inputs file also holds this output (a recorded case), compare.
        if let (Some((_, want)), Data::F32(got)) =
            (arrays.iter().find(|(n, _)| *n == name), &t.data)
        {
            if let (Ok(want), true) = (want.as_f32(), want.shape == t.shape) {
                let scale = want.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
                let e = got
                    .iter()
                    .zip(want)
                    .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
                    / scale;
                println!("check        {name}: max relative error {e:.2e} against {sources}");
                if e.is_nan() || e > max_error as f32 {
                    mismatched.push(format!("{name} ({e:.2e})"));
                }
            } else {
                mismatched.push(format!(
                    "{name} (shape {:?}, recorded {:?})",
                    t.shape, want.shape
                ));
            }
        }
        named.push((name, t));
    }
    if let Some(path) = output {
        anyshape_graph::npz::write(path, &named)?;
        println!("outputs written to {}", path.display());
    }
    if !mismatched.is_empty() {
        bail!(
            "outputs differ from those recorded in {sources} by more than {max_error:e}: {}",
            mismatched.join(", ")
        );
    }
    Ok(())
}
