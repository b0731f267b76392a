//! `anyshape bench`: how well a module dispatches (loss against every micro-kernel it
//! holds, on every tuned instance) and what dispatching costs per call; `--compare` is
//! in `compare.rs`.
use crate::{runner, Common};
use anyhow::{bail, Context, Result};
use anyshape_abi::ENTRY_SYMBOL;
use anyshape_ir::Bindings;
use anyshape_measure::{
    buffer_bytes, check_fits, random_inputs, Candidate, MeasureOptions, Outcome,
};
use anyshape_runtime::Module;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `anyshape bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// The module to benchmark (from `anyshape tune --out`).
    #[arg(long, value_name = "DIR")]
    module: PathBuf,
    /// Compare the module, instance by instance in one run, with the vendor libraries
    /// (oneDNN, OpenBLAS: whichever are installed, a missing one is skipped with a
    /// warning; the `gemm` crate) and, with --per-shape-trials, per-shape (Ansor-style),
    /// Nimble-style and bucketing; writes `results.csv`, `report.md` and the plots
    /// `latency.svg`, `throughput.svg` and `tuning.svg` to --out-dir.
    #[arg(long)]
    compare: bool,
    /// Instances for --compare, e.g. `T=1..128` [default: the module's domain].
    #[arg(long, value_name = "VAR=DOMAIN")]
    range: Option<String>,
    /// Instances the tuned baselines are tuned and run on, e.g. `T=5,24,43,62,81,100,119,128`.
    #[arg(long, value_name = "VAR=VALUES")]
    samples: Option<String>,
    /// Trials per sample for per-shape tuning (factor-only tiles, specialized kernels);
    /// Nimble-style runs the largest sample's micro-kernel everywhere with loop
    /// partitioning. 0: no tuned baselines. Records go to --out-dir/records (resumable).
    #[arg(long, default_value_t = 0)]
    per_shape_trials: usize,
    /// With --per-shape-trials: the bucketing baseline's bucket width along the shape
    /// var (buckets start at the smallest instance); the largest instance of each bucket
    /// is tuned per shape and the others are padded up to it (global padding: inputs
    /// copied into zero-filled buffers, the output copied back, all inside the timed
    /// call). 0: no bucketing.
    #[arg(long, default_value_t = 16, value_name = "WIDTH", value_parser = clap::value_parser!(i64).range(0..))]
    bucket: i64,
    /// Where --compare writes `results.csv`, `report.md`, the plots and the baselines'
    /// records.
    #[arg(long, value_name = "DIR", default_value = "benchmarks/results")]
    out_dir: PathBuf,
    /// Measure, on every tuned instance, the dispatched kernel against every
    /// micro-kernel of the module; print the loss distribution.
    #[arg(long)]
    dispatch_loss: bool,
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
    if !args.dispatch_loss && !args.overhead && !args.compare {
        bail!("nothing to measure: pass --compare, --dispatch-loss and/or --overhead");
    }
    let module = Module::load(&args.module)?;
    if args.compare {
        let options = crate::compare::CompareOptions {
            path: &args.module,
            range: args.range.as_deref(),
            samples: args.samples.as_deref(),
            per_shape_trials: args.per_shape_trials,
            bucket: args.bucket,
            out_dir: &args.out_dir,
            seconds: args.seconds,
            quiet: args.quiet,
        };
        crate::compare::compare(&module, &options, &args.common)?;
    }
    if args.dispatch_loss {
        dispatch_loss(&args, &module)?;
    }
    if args.overhead {
        overhead(&args, &module)?;
    }
    Ok(())
}

/// Per-instance minimum latencies: `[entry, symbolic kernels..., specialized?]`.
struct Row {
    bindings: Bindings,
    dispatched: usize,
    entry: f64,
    symbolic: Vec<f64>,
    specialized: Option<f64>,
}

fn dispatch_loss(args: &BenchArgs, module: &Module) -> Result<()> {
    let m = module.manifest();
    let mut cands = Vec::new();
    for (i, v) in m.votes.iter().enumerate() {
        let d = module.dispatch(&v.bindings);
        let mut syms = vec![ENTRY_SYMBOL.to_string()];
        syms.extend(m.symbolic.iter().cloned());
        if d.specialized {
            syms.push(d.symbol.clone());
        }
        // Rotate the order from instance to instance: no kernel is always timed first.
        let n = syms.len();
        syms.rotate_left(i % n);
        for s in syms {
            cands.push(Candidate {
                symbol: s,
                workload: module.workload().clone(),
                bindings: v.bindings.clone(),
                check: false,
                gpu: None,
            });
        }
    }
    let options = MeasureOptions {
        min_repeats: 3,
        max_repeats: 1000,
        min_seconds: args.seconds,
        timeout_seconds: 600.0,
        interleave: true,
    };
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(cands.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} measurements (dispatch loss)  {elapsed_precise}  eta {eta}",
        )
        .expect("valid template"),
    );
    let library = module.dir().join(&m.library);
    let outcomes = runner(options)?.measure_with(&library, &cands, &mut |_, _| bar.inc(1))?;
    bar.finish_and_clear();
    let lat = |o: &Outcome| match o {
        Outcome::Measured(x) => Ok(x.min_seconds),
        Outcome::Failed(why) | Outcome::Interrupted(why) => Err(why.clone()),
    };
    let mut rows = Vec::new();
    let mut at = 0;
    for (i, v) in m.votes.iter().enumerate() {
        let d = module.dispatch(&v.bindings);
        let n = 1 + m.symbolic.len() + usize::from(d.specialized);
        let mut times: Vec<f64> = outcomes[at..at + n]
            .iter()
            .map(|o| lat(o).map_err(anyhow::Error::msg))
            .collect::<Result<_>>()
            .with_context(|| format!("measuring the module at {}", v.bindings))?;
        times.rotate_right(i % n);
        at += n;
        rows.push(Row {
            bindings: v.bindings.clone(),
            dispatched: d.micro_kernel,
            entry: times[0],
            symbolic: times[1..1 + m.symbolic.len()].to_vec(),
            specialized: d.specialized.then(|| times[n - 1]),
        });
    }
    report_loss(&rows, module, args)
}

fn report_loss(rows: &[Row], module: &Module, args: &BenchArgs) -> Result<()> {
    let m = module.manifest();
    // The dispatched program was timed twice: through the entry point and called
    // directly (its specialized kernel where it has one, else its symbolic kernel).
    // Both time the same code, so their minimum is its latency and their ratio shows
    // the measurement noise.
    let direct = |r: &Row| r.specialized.unwrap_or(r.symbolic[r.dispatched]);
    let loss: Vec<f64> = rows
        .iter()
        .map(|r| {
            let best = r
                .symbolic
                .iter()
                .chain(r.specialized.iter())
                .fold(r.entry, |a, &b| a.min(b));
            r.entry.min(direct(r)) / best - 1.0
        })
        .collect();
    let mut noise: Vec<f64> = rows
        .iter()
        .map(|r| (r.entry / direct(r)).ln().abs())
        .collect();
    noise.sort_by(f64::total_cmp);
    let n = loss.len() as f64;
    let mean = loss.iter().sum::<f64>() / n;
    let (worst_i, worst) = loss
        .iter()
        .copied()
        .enumerate()
        .fold((0, f64::MIN), |a, (i, l)| if l > a.1 { (i, l) } else { a });
    let mut sorted = loss.clone();
    sorted.sort_by(f64::total_cmp);
    let within = |x: f64| loss.iter().filter(|&&l| l <= x).count();
    println!(
        "dispatch loss over {} instances of {} ({} micro-kernels; min latency over >= {:.2} s per kernel and instance):",
        rows.len(),
        m.workload,
        m.micro_kernels.len(),
        args.seconds
    );
    println!(
        "  mean {:.2}%   median {:.2}%   worst {:.2}% (at {})   within 1%: {}/{}   within 5%: {}/{}",
        mean * 100.0,
        sorted[sorted.len() / 2] * 100.0,
        worst * 100.0,
        rows[worst_i].bindings,
        within(0.01),
        rows.len(),
        within(0.05),
        rows.len()
    );
    println!(
        "  noise floor (the entry point against the same kernel called directly): median {:.2}%, 90th percentile {:.2}%",
        (noise[noise.len() / 2].exp() - 1.0) * 100.0,
        (noise[noise.len() * 9 / 10].exp() - 1.0) * 100.0
    );
    let pairs: Vec<f64> = rows
        .iter()
        .filter_map(|r| Some(r.symbolic[r.dispatched] / r.specialized?))
        .collect();
    if !pairs.is_empty() {
        let geo = (pairs.iter().map(|x| x.ln()).sum::<f64>() / pairs.len() as f64).exp();
        let lo = pairs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = pairs.iter().copied().fold(0.0, f64::max);
        println!(
            "  specialized vs symbolic kernel of the same micro-kernel, {} instances: symbolic/specialized latency geomean {geo:.3}, range {lo:.3} .. {hi:.3}",
            pairs.len()
        );
    }
    if let Some(path) = &args.csv {
        let mut csv = String::from("instance,dispatched,entry_s,best_s,loss");
        for k in 0..m.micro_kernels.len() {
            let _ = write!(csv, ",symbolic{k}_s");
        }
        csv.push_str(",specialized_s\n");
        for (r, l) in rows.iter().zip(&loss) {
            let best = r.entry / (1.0 + l);
            let _ = write!(
                csv,
                "\"{}\",{},{:e},{best:e},{l:.5}",
                r.bindings, r.dispatched, r.entry
            );
            for t in &r.symbolic {
                let _ = write!(csv, ",{t:e}");
            }
            let _ = writeln!(
                csv,
                ",{}",
                r.specialized.map_or(String::new(), |t| format!("{t:e}"))
            );
        }
        std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))?;
        println!("  per-instance table written to {}", path.display());
    }
    Ok(())
}

/// Minimum over rounds of the mean time per call of `f` over a batch of `batch` calls.
fn per_call(batch: usize, f: &mut dyn FnMut()) -> f64 {
    let t0 = Instant::now();
    for _ in 0..batch {
        f();
    }
    t0.elapsed().as_secs_f64() / batch as f64
}

fn overhead(args: &BenchArgs, module: &Module) -> Result<()> {
    let m = module.manifest();
    let bindings = match &args.set {
        Some(s) => crate::bindings(std::slice::from_ref(s), Some(module.workload()))?,
        None => m
            .votes
            .iter()
            .map(|v| &v.bindings)
            .min_by(|a, b| {
                let f = |x: &Bindings| {
                    module
                        .bind(x)
                        .map_or(f64::INFINITY, |bw| module.workload().flops(&bw))
                };
                f(a).total_cmp(&f(b))
            })
            .cloned()
            .context("the module has no instances")?,
    };
    let bound = module.bind(&bindings)?;
    // Two outputs besides the inputs: bare calls and checked calls write their own.
    let n_in = module.workload().inputs.len();
    check_fits(buffer_bytes(&bound) + bound.lens[n_in] as u128 * 4).map_err(anyhow::Error::msg)?;
    let inputs = random_inputs(&bound, n_in, 7);
    let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0.0f32; bound.lens[n_in]];
    let mut checked_out = out.clone();
    let d = module.dispatch(&bindings);
    let kernel = module
        .kernel(&d.symbol)
        .context("the dispatched kernel is not in the module")?;
    let entry = module.entry();
    let vars = module.var_values(&bindings);
    let ins: Vec<*const f32> = views.iter().map(|v| v.as_ptr()).collect();
    let outs = [out.as_mut_ptr()];
    // SAFETY (all calls below): buffers have the lengths `bound` gives for `vars`.
    let mut bare = || unsafe {
        black_box(kernel(
            black_box(vars.as_ptr()),
            ins.as_ptr(),
            outs.as_ptr(),
        ));
    };
    let t_one = per_call(10, &mut bare);
    let batch = ((2e-3 / t_one.max(1e-9)) as usize).clamp(10, 100_000);
    let rounds = 200;
    let (mut tb, mut te, mut tr, mut ts, mut tv) = (
        f64::INFINITY,
        f64::INFINITY,
        f64::INFINITY,
        f64::INFINITY,
        f64::INFINITY,
    );
    for _ in 0..rounds {
        tb = tb.min(per_call(batch, &mut bare));
        te = te.min(per_call(batch, &mut || unsafe {
            black_box(entry(black_box(vars.as_ptr()), ins.as_ptr(), outs.as_ptr()));
        }));
        tr = tr.min(per_call(batch, &mut || {
            black_box(module.run(black_box(&bindings), &views, &mut [&mut checked_out])).ok();
        }));
        tv = tv.min(per_call(batch * 10, &mut || {
            black_box(module.bind(black_box(&bindings))).ok();
        }));
        ts = ts.min(per_call(batch * 10, &mut || {
            black_box(module.select_compiled(black_box(&bindings)));
        }));
    }
    println!(
        "dispatch overhead at {bindings} ({} kernel #{}; min over {rounds} rounds of {batch} calls, mean per call):",
        if d.specialized { "specialized" } else { "symbolic" },
        d.micro_kernel
    );
    println!("  bare kernel call            {:>10.1} ns", tb * 1e9);
    println!(
        "  C entry (tree walk + call)  {:>10.1} ns   overhead {:+.1} ns",
        te * 1e9,
        (te - tb) * 1e9
    );
    println!(
        "  Module::run (checks + entry){:>10.1} ns   overhead {:+.1} ns",
        tr * 1e9,
        (tr - tb) * 1e9
    );
    println!("  shape check alone (bind)    {:>10.1} ns", tv * 1e9);
    println!(
        "  tree walk alone (select)    {:>10.1} ns   (called from Rust, incl. gathering the shape vars)",
        ts * 1e9
    );
    Ok(())
}
