//! `anyshape run`: one program (any sketch the workload's class has on the CPU) or a
//! module's entry point, on random data in the worker: latency, throughput and, with
//! `--check`, the comparison with the reference.
use crate::{bindings, runner, Common};
use anyhow::{bail, Result};
use anyshape_abi::ModuleKind;
use anyshape_abi::ENTRY_SYMBOL;
use anyshape_codegen::{
    cpu_sketch, CpuTarget, KernelMode, PaddingStrategy, Program, Sketch, Target,
};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{Candidate, Kernels, MeasureOptions, Measurement, Outcome};
use anyshape_runtime::Module;
use clap::Args;
use std::path::{Path, PathBuf};

/// Options of `anyshape run`.
#[derive(Args)]
pub struct RunArgs {
    /// The workload, e.g. `dense(M=16*T,N=2304,K=768)+bias+gelu` or
    /// `softmax(B=12,M=T,N=T)`; see the README for the operators and epilogues.
    #[arg(long, short, required_unless_present = "module")]
    workload: Option<String>,
    /// Run a module (from `anyshape tune --out`) instead: its dispatcher picks the kernel.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["workload", "strategy", "mode", "micro_kernel", "print_c"])]
    module: Option<PathBuf>,
    /// A model module's inputs: a `.npz` file with one array per input, by name (its
    /// outputs, where also present, are compared).
    #[arg(long, value_name = "FILE.npz", requires = "module")]
    inputs: Option<PathBuf>,
    /// A model module's input from a NumPy `.npy` file, by the input's name (repeat
    /// for each input; wins over the `--inputs` array of the same name).
    #[arg(long = "input", value_name = "NAME=FILE.npy", requires = "module")]
    input: Vec<String>,
    /// Write a model module's outputs to this `.npz` file.
    #[arg(long, value_name = "FILE.npz", requires = "module")]
    output: Option<PathBuf>,
    /// A model's outputs recorded in the `--inputs` file must match within this
    /// relative error (max |error| ÷ max |recorded|; a NaN or an infinity must be
    /// matched by the same value), or the run fails [default: 1e-4; 2e-2 for a module
    /// compiled with --precision bf16, 1e-1 with --precision i8].
    #[arg(long, value_parser = relative_error, requires = "module")]
    max_error: Option<f64>,
    /// With a model module: print where a run spends its time, per task and host op.
    #[arg(long, requires = "module")]
    profile: bool,
    /// Shape var values, e.g. `--set T=37` (repeat or comma-separate for several).
    #[arg(long = "set", value_name = "VAR=VALUE")]
    set: Vec<String>,
    /// How tiles that overhang the tensors are handled [default: local-pad].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["boundary-check", "global-pad", "loop-partition", "local-pad"]))]
    strategy: Option<String>,
    /// Bake the shape into the kernel (specialized) or read it at run time (symbolic)
    /// [default: specialized].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(["specialized", "symbolic"]))]
    mode: Option<String>,
    /// Micro-kernel parameters of the workload's sketch (contractions:
    /// `mr=12,nr=32,mc=96,nc=384,kc=256,uk=4`; softmax: `rows=4,vectors=2`) or JSON; a
    /// default for the target when absent.
    #[arg(long, value_name = "PARAMS")]
    micro_kernel: Option<String>,
    /// Compare the output with the reference implementation.
    #[arg(long)]
    check: bool,
    /// Print the generated C and stop.
    #[arg(long)]
    print_c: bool,
    /// Keep timing for at least this many seconds (at most a week).
    #[arg(long, default_value_t = 0.5, value_parser = crate::seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// Time cold, as `anyshape compile` times a model's kernels: before every call the
    /// inputs and output are flushed from the caches and the TLB emptied (the other
    /// layers evict a model's weights between its calls).
    #[arg(long)]
    cold: bool,
    /// Kill the program if it runs longer than this many seconds [default: 60].
    #[arg(long, value_parser = crate::time_limit, allow_negative_numbers = true)]
    timeout: Option<f64>,
    #[command(flatten)]
    common: Common,
}

/// The options given that only apply to a program or an operator module, not to a
/// model module (which runs on its inputs, not on random data).
fn operator_only(args: &RunArgs) -> Vec<&'static str> {
    let given = [
        (!args.set.is_empty(), "--set"),
        (args.strategy.is_some(), "--strategy"),
        (args.mode.is_some(), "--mode"),
        (args.micro_kernel.is_some(), "--micro-kernel"),
        (args.check, "--check"),
        (args.print_c, "--print-c"),
        (args.cold, "--cold"),
        (args.timeout.is_some(), "--timeout"),
        (args.common.target.is_some(), "--target"),
        (args.common.cache_dir.is_some(), "--cache-dir"),
    ];
    crate::given(&given)
}

/// Run `anyshape run`.
pub fn run(args: RunArgs) -> Result<()> {
    let options = MeasureOptions {
        min_seconds: args.seconds,
        timeout_seconds: args.timeout.unwrap_or(60.0),
        cold: args.cold,
        ..Default::default()
    };
    if let Some(module) = &args.module {
        if ModuleKind::of(module)? == ModuleKind::Model {
            let wrong = operator_only(&args);
            if !wrong.is_empty() {
                bail!(
                    "{} is a model module: it runs on its inputs (--inputs, --input) and takes no {} (those are for a workload or an operator module)",
                    module.display(),
                    wrong.join(", ")
                );
            }
            if args.inputs.is_none() && args.input.is_empty() {
                bail!(
                    "{} is a model module: give its inputs with --inputs FILE.npz or --input NAME=FILE.npy",
                    module.display()
                );
            }
            let run = crate::run_model::ModelRun {
                inputs: args.inputs.as_deref(),
                input: &args.input,
                output: args.output.as_deref(),
                seconds: args.seconds,
                max_error: args.max_error,
                profile: args.profile,
            };
            return crate::run_model::run_model(module, &run);
        }
        let model_only = [
            (args.inputs.is_some(), "--inputs"),
            (!args.input.is_empty(), "--input"),
            (args.output.is_some(), "--output"),
            (args.profile, "--profile"),
        ];
        let wrong = crate::given(&model_only);
        if !wrong.is_empty() {
            bail!(
                "{} is an operator module: it runs on random data at --set values and takes no {} (those are for a model module, from `anyshape compile`)",
                module.display(),
                wrong.join(", ")
            );
        }
        let bindings = bindings(&args.set, None)?;
        return run_module(module, &bindings, args.check, options);
    }
    let workload = Workload::parse(args.workload.as_deref().unwrap_or_default())?;
    let target = args.common.target()?;
    cpu_sketch!(
        workload.class,
        run_program(&args, &workload, &target, options)
    )
}

/// Run one program of the sketch `K`.
fn run_program<K: Sketch<Target = CpuTarget>>(
    args: &RunArgs,
    workload: &Workload,
    target: &CpuTarget,
    options: MeasureOptions,
) -> Result<()> {
    let bindings = bindings(&args.set, Some(workload))?;
    let bound = workload.bind(&bindings)?;
    let micro_kernel = match &args.micro_kernel {
        Some(text) => K::parse(text)?,
        None => K::default_for_instance(target, workload, &bound),
    };
    micro_kernel.validate(target)?;
    let strategy: PaddingStrategy = args
        .strategy
        .as_deref()
        .unwrap_or("local-pad")
        .parse()
        .map_err(anyhow::Error::msg)?;
    let mode: KernelMode = args
        .mode
        .as_deref()
        .unwrap_or("specialized")
        .parse()
        .map_err(anyhow::Error::msg)?;
    let program = Program {
        workload: workload.clone(),
        micro_kernel,
        strategy,
        mode,
        bindings: bindings.clone(),
    };
    // Lowered here first: a micro-kernel the sketch refuses for this workload (AMX
    // tiles over a reduction of no whole tiles, say) is the user's to change, told why.
    let source = program.source(target)?;
    if args.print_c {
        print!("{}\n{source}", target.prelude());
        return Ok(());
    }
    let lib = args
        .common
        .builder()
        .build_programs(target, std::slice::from_ref(&program))?;
    let symbol = program.symbol(target);
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
    let outcome = runner(options)?
        .measure(&lib.kernels(), &[candidate])?
        .remove(0);
    let m = match outcome {
        Outcome::Measured(m) => m,
        Outcome::Failed(why) | Outcome::Interrupted(why) => bail!("the program failed: {why}"),
    };
    println!("workload     {workload}  [{bindings}]");
    println!(
        "program      {} {micro_kernel}  strategy={strategy}  mode={mode}  target={}",
        K::NAME,
        target.describe()
    );
    print_measurement(&m, workload.flops(&bound))
}

/// `anyshape run --module`: run the module's entry point on one instance in the worker.
fn run_module(
    path: &Path,
    bindings: &Bindings,
    check: bool,
    options: MeasureOptions,
) -> Result<()> {
    let module = Module::load(path)?;
    let bound = module.bind(bindings)?;
    let d = module.dispatch(bindings);
    let m = module.manifest();
    let candidate = Candidate {
        symbol: ENTRY_SYMBOL.into(),
        workload: module.workload().clone(),
        bindings: bindings.clone(),
        check,
        gpu: None,
    };
    let library = Kernels::Library(module.dir().join(&m.library));
    let outcome = runner(options)?.measure(&library, &[candidate])?.remove(0);
    let r = match outcome {
        Outcome::Measured(r) => r,
        Outcome::Failed(why) | Outcome::Interrupted(why) => bail!("the module failed: {why}"),
    };
    let tuned = m.votes.iter().any(|v| &v.bindings == bindings);
    println!(
        "module       {}  [{bindings}]{}",
        path.display(),
        if tuned {
            ""
        } else {
            "  (outside the tuned instances)"
        }
    );
    println!(
        "dispatched   #{} {} ({} kernel {})",
        d.micro_kernel,
        m.micro_kernels[d.micro_kernel],
        if d.specialized {
            "specialized"
        } else {
            "symbolic"
        },
        d.symbol
    );
    print_measurement(&r, module.workload().flops(&bound))
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

/// A relative error bound: a finite number at least 0.
fn relative_error(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(e) if e.is_finite() && e >= 0.0 => Ok(e),
        _ => Err(format!("`{text}` is not a relative error (a number >= 0)")),
    }
}
