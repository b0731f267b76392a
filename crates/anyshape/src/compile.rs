//! `anyshape compile`: an ONNX model into a model module — every task tuned over the
//! model's dims (or, with `--trials 0`, given default micro-kernels). Running one is
//! `run_model.rs`.
use crate::progress::Reporter;
use crate::tune::interrupt_flag;
use crate::{queue_summary, runner, Common, DbArgs, QueueArgs};
use anyhow::Result;
use anyshape_bench::peak::{Ceiling, Peak};
use anyshape_codegen::CpuTarget;
use anyshape_ir::{Precision, ShapeVar};
use anyshape_measure::{MeasureOptions, Measurer};
use anyshape_tune::{compile_model, ModelOptions, PipelineOptions, SearchStrategy, TuneOptions};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `anyshape compile`.
#[derive(Args)]
pub struct CompileArgs {
    /// The ONNX model (as `torch.onnx.export` writes it; opsets up to 28, each op of a
    /// version anyshape implements).
    model: PathBuf,
    /// The domain of a model dim: `--dim sequence=1..512`, `--dim batch=1`,
    /// `--dim past_sequence=0..1023` (a decoder's cache, empty at the prompt); one per
    /// dim the model's inputs name (`anyshape inspect model.onnx` lists them; a model
    /// whose inputs have fixed shapes takes none).
    #[arg(long = "dim", value_name = "NAME=DOMAIN")]
    dims: Vec<String>,
    /// Trials per task on average: the tasks' joint searches share trials × tasks,
    /// which the task scheduler gives out where they cut the model's latency most; 0
    /// gives a quick untuned module (every task with its sketch's defaults per instance).
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
    /// dispatch tree covers the values between (each voted kernel's latency at the
    /// nearest tuned value, scaled by its padding there) and past them. Untuned, a task
    /// takes its defaults at every value up to 1,024 instances, at these past that.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u64).range(2..))]
    tune_values: u64,
    /// A directory for the tasks' records (needed with --trials > 0).
    #[arg(long, value_name = "DIR")]
    records: Option<PathBuf>,
    /// Continue the tasks' records: nothing measured is measured again.
    #[arg(long)]
    resume: bool,
    /// What dense layers over constant weights multiply in: `bf16` stores their weights
    /// as bfloat16 pairs (half the bytes) and multiplies with AMX's `tdpbf16ps` tiles
    /// where the CPU has AMX-BF16, else with AVX512_BF16's `vdpbf16ps`, summing in f32
    /// (on a CPU without either the products are widened by shifts: the bytes still
    /// halve, the products are slower, and compile says so; without AMX it measures
    /// `vdpbf16ps` against the f32 FMAs and says when it is no faster);
    /// attention's scores too (queries and keys rounded); attention's context,
    /// softmax, normalizations and residual adds stay f32. Outputs move by
    /// up to ~1e-2 of their range (`anyshape run` checks a bf16 module within 2e-2).
    /// `i8`: those dense layers on 8-bit integers — each weight's output channels
    /// quantized by their own scale (a quarter of f32's bytes), each row of activations
    /// quantized by its own as the layer runs, products of four bytes summed in 32 bits
    /// by AVX512_VNNI's `vpdpbusd` (byte by byte elsewhere, and compile says so);
    /// everything else f32. Outputs move by a few 1e-2 of their range (`anyshape run`
    /// checks an i8 module within 1e-1).
    #[arg(long, default_value = "f32", value_name = "f32|bf16|i8")]
    precision: Precision,
    /// Compute every convolution over its patches (`Im2Col` and a `conv_packed`
    /// kernel) instead of 3 x 3 ones of stride 1 by Winograd's F(2x2, 3x3) — or
    /// F(4x4, 3x3) where the layer's output is 12 pixels or more each way at the dims'
    /// smallest values: 2.25x (4x) fewer multiply-adds, transforms of its tiles on the
    /// host, weights 16/9 (4x) the size (what small images, whose layers read more
    /// weights than they compute, pay for).
    #[arg(long)]
    no_winograd: bool,
    /// Where the model module goes.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Time candidates with warm caches (each call finding its inputs cached by the
    /// previous one) instead of evicting the caches before every call, as happens to a
    /// model's weights between their layer's calls.
    #[arg(long)]
    warm_cache: bool,
    /// With --trials: seconds of timed calls per candidate and instance beyond its 3
    /// cold calls (the minimum counts). More is steadier on a busy machine and slower:
    /// the votes time every candidate where it may win.
    #[arg(long, default_value_t = anyshape_tune::MEASURE_SECONDS, value_name = "SECONDS")]
    seconds: f64,
    /// How each task's search chooses what to measure after the seeds: DietCode's
    /// evolutionary search, or TSCompiler's trust regions around the seeds with a
    /// bandit choosing among them.
    #[arg(
        long,
        default_value = "evolutionary",
        value_name = "evolutionary|trust-region"
    )]
    search: SearchStrategy,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    queue: QueueArgs,
    #[command(flatten)]
    common: Common,
}

/// Say what a bf16 module's products run on here: AMX's tiles; `vdpbf16ps`, whose peak
/// is measured against the f32 FMAs' (about two seconds) because on some CPUs it is no
/// faster (Intel's run it at half their FMA peak: Emerald Rapids 163 against 330 GFLOP/s,
/// where Zen 5 runs it at twice its own); or shifts, on a CPU without AVX512_BF16.
fn bf16_note(target: &CpuTarget, common: &Common) {
    if target.amx {
        eprintln!(
            "note: this CPU has AMX-BF16: the dense layers and attention's scores multiply \
             on its tiles (tdpbf16ps) where their reduction is whole tiles of 32"
        );
        return;
    }
    if !Peak::DotBf16.available(target) {
        eprintln!(
            "note: this CPU has no AVX512_BF16: bf16 weights still halve the bytes read, but \
             their products are widened to f32 by shifts (slower than f32 where the layers \
             are compute-bound)"
        );
        return;
    }
    let builder = common.builder();
    let peak = |kind| Ceiling::measure(kind, target, &builder).map(|c| c.gflops);
    // A failed measurement only loses the note.
    let (Ok(dot), Ok(fma)) = (peak(Peak::DotBf16), peak(Peak::Fma)) else {
        return;
    };
    let verdict = if dot > fma {
        "faster than f32 where the layers are compute-bound"
    } else {
        "no faster than f32 FMAs: bf16 weights halve the bytes read, but compute-bound \
         layers (long sequences, large batches) may run slower than --precision f32 \
         (anyshape bench --model tells on your shapes)"
    };
    eprintln!(
        "note: bf16 products (vdpbf16ps) peak at {dot:.0} GFLOP/s on this CPU, f32 FMAs at \
         {fma:.0} (measured now): {verdict}"
    );
}

/// Say so where an i8 module's products cannot run on `vpdpbusd`: the kernels use it
/// with AVX-512 vectors where the CPU has AVX512_VNNI, and multiply byte by byte
/// elsewhere.
fn i8_note(target: &CpuTarget) {
    if !Peak::DotI8.available(target) {
        eprintln!(
            "note: without AVX512_VNNI the 8-bit products run byte by byte: the weights \
             still take a quarter of f32's bytes, but compute-bound layers run slower than \
             --precision f32 (anyshape bench --model tells on your shapes)"
        );
    }
}

/// Run `anyshape compile`.
pub fn compile(args: CompileArgs) -> Result<()> {
    let dims: Vec<ShapeVar> = args
        .dims
        .iter()
        .map(|d| ShapeVar::parse(d))
        .collect::<Result<_, _>>()?;
    let target = args.common.target()?;
    let precision = args.precision;
    match precision {
        Precision::Bf16 => bf16_note(&target, &args.common),
        Precision::I8 => i8_note(&target),
        Precision::F32 => {}
    }
    let defaults = ModelOptions::default();
    let options = ModelOptions {
        trials: args.trials as usize,
        equal_shares: args.equal_shares,
        families: !args.no_families,
        tune_values: args.tune_values as usize,
        records: args.records.clone(),
        resume: args.resume,
        tune: TuneOptions {
            interrupt: Some(interrupt_flag()),
            database: (args.trials > 0)
                .then(|| args.db.path(&args.common))
                .flatten(),
            search: args.search,
            measure: MeasureOptions {
                cold: !args.warm_cache,
                min_seconds: args.seconds,
                ..defaults.tune.measure.clone()
            },
            ..defaults.tune
        },
        pipeline: PipelineOptions {
            reads: args.common.reads(),
            ..defaults.pipeline
        },
        precision,
        winograd: !args.no_winograd,
    };
    options
        .tune
        .measure
        .check()
        .map_err(|e| anyhow::anyhow!("--seconds {}: {e}", args.seconds))?;
    let measurer = Measurer {
        builder: args.common.builder(),
        runner: runner(options.tune.measure.clone())?,
        queue: if options.trials > 0 {
            args.queue.queue()?
        } else {
            None
        },
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
    let reused = match compiled.tuning.as_ref().map_or(0, |t| t.reused_trials) {
        0 => String::new(),
        n => format!("; {n} of them reused from the tuning database"),
    };
    println!(
        "model module written to {} in {:.1} s: {} tasks ({runs} kernel calls per run), {} measurements (search and votes{reused}); run it with `anyshape run --module {} --inputs case.npz`",
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
    if let Some(line) = queue_summary(measurer.queue.as_ref()) {
        println!("{line}");
    }
    Ok(())
}
