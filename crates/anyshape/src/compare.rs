//! `anyshape bench --compare`: the module against the vendor libraries and the tuned
//! baselines (per-shape, Nimble-style, bucketing), instance by instance, in one run,
//! with a CSV, a Markdown report and plots.
use crate::{peak, runner, Common};
use anyhow::{Context, Result};
use anyshape_abi::ENTRY_SYMBOL;
use anyshape_bench::build_vendors;
use anyshape_bench::plot::{bars_svg, lines_svg, PlotError, Series};
use anyshape_codegen::{bucket_c, CpuTarget, PaddingStrategy, Program};
use anyshape_ir::{Bindings, ShapeVar, Workload};
use anyshape_measure::{Candidate, KernelSource, MeasureOptions, Measurer, Outcome};
use anyshape_runtime::Module;
use anyshape_tune::{RecordLog, TuneOptions, Tuner};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Instances up to this many FLOPs are checked against the reference (it is slow).
const CHECK_FLOPS: f64 = 1e8;

/// One system's timing on one instance.
struct Cell {
    min: f64,
    median: f64,
}

/// A system under comparison: where its kernels are and which one serves an instance.
struct System {
    name: String,
    library: PathBuf,
    /// The symbol for each instance it runs; `None` for all instances with `all`.
    symbols: HashMap<Bindings, String>,
    all: Option<String>,
}

impl System {
    fn everywhere(name: &str, library: PathBuf, symbol: String) -> System {
        System {
            name: name.into(),
            library,
            symbols: HashMap::new(),
            all: Some(symbol),
        }
    }

    fn symbol(&self, b: &Bindings) -> Option<&String> {
        self.all.as_ref().or_else(|| self.symbols.get(b))
    }
}

/// A tuned system's tuning: wall time (seconds, from its records) and trials.
struct TuningTime {
    name: String,
    seconds: f64,
    trials: usize,
}

/// Options of the comparison (from `anyshape bench`).
pub struct CompareOptions<'a> {
    /// The module's path (for the report).
    pub path: &'a Path,
    /// Instances for the module and the vendors (`T=1..128`); the module's domain if absent.
    pub range: Option<&'a str>,
    /// Instances for the tuned baselines (per-shape, Nimble-style), e.g. `T=5,24,43`.
    pub samples: Option<&'a str>,
    /// Trials per instance of per-shape tuning (0: no tuned baselines).
    pub per_shape_trials: usize,
    /// Width of the bucketing baseline's buckets along the shape var (0: no bucketing).
    pub bucket: i64,
    /// Where the report, CSV and the baselines' records go.
    pub out_dir: &'a Path,
    /// Seconds of timed calls per system and instance.
    pub seconds: f64,
    /// No progress bars.
    pub quiet: bool,
}

/// One instance tuned on its own (per-shape tuning): its best program and the cost.
#[derive(Clone)]
struct PerShape {
    program: Program,
    seconds: f64,
    trials: usize,
}

/// Per-shape tuning of the instances the tuned baselines need, each once, with records
/// per instance under `records_dir` (a resumed instance keeps its recorded time).
struct PerShapeTuner<'a> {
    w: &'a Workload,
    trials: usize,
    target: &'a CpuTarget,
    measurer: &'a Measurer,
    records_dir: &'a Path,
    quiet: bool,
    done: HashMap<Bindings, PerShape>,
}

impl PerShapeTuner<'_> {
    fn tune(&mut self, b: &Bindings) -> Result<PerShape> {
        if let Some(p) = self.done.get(b) {
            return Ok(p.clone());
        }
        let vars: Vec<ShapeVar> = b
            .iter()
            .map(|(n, v)| ShapeVar::parse(&format!("{n}={v}")))
            .collect::<Result<_, _>>()?;
        let inst = anyshape_tune::instances(self.w, &vars)?;
        let file = self.records_dir.join(format!(
            "per-shape-{}.jsonl",
            b.to_string().replace([',', '='], "_")
        ));
        let (log, previous) = RecordLog::open(&file, true)?;
        let options = TuneOptions {
            trials: self.trials,
            per_shape: true,
            ..TuneOptions::default()
        };
        let mut tuner = Tuner::new(
            self.w,
            self.target,
            inst,
            options,
            self.measurer,
            log,
            previous,
        )?;
        let report = tuner.run(&mut |_| {}, &mut |_| {})?;
        let (seconds, untimed) = tuner.tuning_seconds();
        if untimed > 0 {
            eprintln!("warning: {untimed} records of {} carry no time (an older version's): the tuning time leaves them out", file.display());
        }
        let mk = report.best[0].micro_kernel;
        if !self.quiet {
            eprintln!(
                "per-shape tuning at {b}: {} trials ({} resumed), {seconds:.1} s of tuning -> {mk} ({:.1} GFLOP/s)",
                report.trials, report.resumed_trials, report.best[0].gflops
            );
        }
        let p = PerShape {
            program: tuner.program(mk),
            seconds,
            trials: report.trials,
        };
        self.done.insert(b.clone(), p.clone());
        Ok(p)
    }
}

/// The bucketing baseline's buckets: each instance with the largest instance of its
/// bucket (buckets of `width` values of the one shape var, from the smallest instance).
fn buckets(instances: &[Bindings], width: i64) -> Result<Vec<(Bindings, Bindings)>> {
    let var = match instances.first().map(|b| b.iter().collect::<Vec<_>>()) {
        Some(v) if v.len() == 1 => v[0].0.to_string(),
        _ => anyhow::bail!("bucketing needs instances of exactly one shape var"),
    };
    let values: Vec<i64> = instances.iter().filter_map(|b| b.get(&var)).collect();
    let (lo, hi) = (
        values.iter().copied().min().unwrap_or(0),
        values.iter().copied().max().unwrap_or(0),
    );
    Ok(values
        .iter()
        .map(|&t| {
            let max = (lo + ((t - lo) / width + 1) * width - 1).min(hi);
            (
                Bindings::from_pairs([(var.as_str(), t)]),
                Bindings::from_pairs([(var.as_str(), max)]),
            )
        })
        .collect())
}

/// The tuned baselines: per-shape (Ansor-style) kernels for the samples, the
/// Nimble-style kernel (the largest sample's micro-kernel, symbolic with loop
/// partitioning) and bucketing (each bucket's largest instance tuned per shape, the
/// others padded up to it).
fn tuned_baselines(
    samples: &[Bindings],
    buckets: &[(Bindings, Bindings)],
    tuner: &mut PerShapeTuner,
) -> Result<(Vec<System>, Vec<TuningTime>)> {
    let (w, target, measurer) = (tuner.w, tuner.target, tuner.measurer);
    std::fs::create_dir_all(tuner.records_dir)
        .with_context(|| format!("creating {}", tuner.records_dir.display()))?;
    let mut sources: Vec<KernelSource> = Vec::new();
    let mut add = |symbol: String, code: String| {
        if !sources.iter().any(|s| s.symbol == symbol) {
            sources.push(KernelSource { symbol, code });
        }
    };
    let mut times = Vec::new();
    let mut per_shape = HashMap::new();
    let (mut seconds, mut trials) = (0.0, 0);
    let mut largest: Option<(f64, PerShape)> = None;
    for b in samples {
        let p = tuner.tune(b)?;
        add(p.program.symbol(target), p.program.c_source(target)?);
        per_shape.insert(b.clone(), p.program.symbol(target));
        seconds += p.seconds;
        trials += p.trials;
        let flops = w.flops(&w.bind(b)?);
        if largest.as_ref().is_none_or(|l| flops > l.0) {
            largest = Some((flops, p));
        }
    }
    let (_, largest) = largest.context("no samples for the tuned baselines")?;
    times.push(TuningTime {
        name: "per-shape".into(),
        seconds,
        trials,
    });
    times.push(TuningTime {
        name: "nimble".into(),
        seconds: largest.seconds,
        trials: largest.trials,
    });
    // Nimble-style: the largest sample's micro-kernel, symbolic, loop partitioning.
    let nimble = Program::symbolic(
        w,
        largest.program.micro_kernel,
        PaddingStrategy::LoopPartition,
    );
    add(nimble.symbol(target), nimble.c_source(target)?);
    let mut bucketed = HashMap::new();
    let mut maxima: Vec<&Bindings> = buckets.iter().map(|b| &b.1).collect();
    maxima.sort();
    maxima.dedup();
    let (mut seconds, mut trials) = (0.0, 0);
    for max in &maxima {
        let p = tuner.tune(max)?;
        seconds += p.seconds;
        trials += p.trials;
        let inner = p.program.symbol(target);
        let wrapper = format!("{inner}_bucket");
        add(inner.clone(), p.program.c_source(target)?);
        add(wrapper.clone(), bucket_c(w, max, &wrapper, &inner)?);
        for (b, m) in buckets {
            if m == *max {
                bucketed.insert(b.clone(), wrapper.clone());
            }
        }
    }
    if !maxima.is_empty() {
        times.push(TuningTime {
            name: "bucketing".into(),
            seconds,
            trials,
        });
    }
    let lib = measurer.builder.build(target, &sources)?;
    if let Some((sym, err)) = lib.failed.iter().next() {
        anyhow::bail!("baseline kernel {sym} did not compile:\n{err}");
    }
    let mut systems = vec![
        System {
            name: "per-shape".into(),
            library: lib.path.clone(),
            symbols: per_shape,
            all: None,
        },
        System::everywhere("nimble", lib.path.clone(), nimble.symbol(target)),
    ];
    if !maxima.is_empty() {
        systems.push(System {
            name: "bucketing".into(),
            library: lib.path,
            symbols: bucketed,
            all: None,
        });
    }
    Ok((systems, times))
}

/// Measure the module, every vendor variant and (with `per_shape_trials`) the tuned
/// baselines on each instance, and write the report.
pub fn compare(module: &Module, o: &CompareOptions, common: &Common) -> Result<()> {
    let m = module.manifest();
    let w = module.workload();
    let vars: Vec<ShapeVar> = match o.range {
        Some(r) => vec![ShapeVar::parse(r)?],
        None => m.shape_vars.clone(),
    };
    let domain = |vars: &[ShapeVar]| -> Result<Vec<Bindings>> {
        Ok(anyshape_tune::instances(w, vars)?
            .into_iter()
            .map(|x| x.bindings)
            .collect())
    };
    let mut instances = domain(&vars)?;
    let target = common.target()?;
    let builder = common.builder();
    let mut systems = vec![System::everywhere(
        "anyshape",
        module.dir().join(&m.library),
        ENTRY_SYMBOL.into(),
    )];
    let mut tuning: Vec<TuningTime> = Vec::new();
    if let Some(t) = &m.tuning {
        tuning.push(TuningTime {
            name: "anyshape".into(),
            seconds: t.seconds,
            trials: t.trials,
        });
    }
    let mut methods = Vec::new();
    if o.per_shape_trials > 0 {
        methods.push(format!("per-shape (Ansor-style): anyshape's search on one instance at a time, factor-only tiles, specialized kernels, {} trials per sample (DietCode gave Ansor >= 1000 per shape); Nimble-style: the largest sample's micro-kernel, symbolic with loop partitioning, on every instance; its tuning time is that sample's", o.per_shape_trials));
        let buckets = if o.bucket > 0 {
            buckets(&instances, o.bucket).unwrap_or_else(|e| {
                eprintln!("warning: no bucketing baseline: {e}");
                Vec::new()
            })
        } else {
            Vec::new()
        };
        if !buckets.is_empty() {
            methods.push(format!("bucketing: buckets of {} values from the smallest instance; the largest instance of each bucket tuned per shape ({} trials); the others padded up to it (global padding: inputs copied into zero-filled buffers of the bucket's shape and the output copied back, inside the timed call)", o.bucket, o.per_shape_trials));
        }
        let samples = domain(&[ShapeVar::parse(o.samples.context(
            "--per-shape-trials needs --samples, e.g. T=5,24,43,62,81,100,119,128",
        )?)?])?;
        let measurer = Measurer {
            builder: builder.clone(),
            runner: runner(TuneOptions::default().measure)?,
        };
        eprintln!(
            "tuning the baselines: per-shape ({} trials on each of {} samples), Nimble-style{} ...",
            o.per_shape_trials,
            samples.len(),
            if !buckets.is_empty() {
                format!(
                    " and bucketing (buckets of {}: the largest instance of each tuned per shape)",
                    o.bucket
                )
            } else {
                String::new()
            }
        );
        let records = o.out_dir.join("records");
        let mut tuner = PerShapeTuner {
            w,
            trials: o.per_shape_trials,
            target: &target,
            measurer: &measurer,
            records_dir: &records,
            quiet: o.quiet,
            done: HashMap::new(),
        };
        let (baselines, times) = tuned_baselines(&samples, &buckets, &mut tuner)?;
        systems.extend(baselines);
        tuning.extend(times);
        for b in samples {
            if !instances.contains(&b) {
                instances.push(b);
            }
        }
        instances.sort();
    }
    eprintln!("building the vendor baselines for {w} ...");
    let first_vendor = systems.len();
    let mut unavailable = Vec::new();
    for lib in build_vendors(w, &target, &builder) {
        match lib.built {
            Ok((so, kernels)) => {
                for k in kernels {
                    systems.push(System::everywhere(&k.name, so.clone(), k.symbol));
                }
            }
            Err(why) => {
                eprintln!(
                    "warning: {} unavailable, comparing without it: {why}",
                    lib.vendor
                );
                unavailable.push(format!("{}: {why}", lib.vendor));
            }
        }
    }
    eprintln!("measuring the FMA peak ...");
    let peak = peak::measure(&target, &builder, 0.3)?
        .last()
        .map_or(f64::NAN, |p| p.1);
    let options = MeasureOptions {
        // At least 5 calls: a minimum over fewer can be all stalled by a neighbour.
        min_repeats: 5,
        max_repeats: 1000,
        min_seconds: o.seconds,
        timeout_seconds: 120.0,
        interleave: false,
    };
    let run = runner(options)?;
    let total: usize = instances
        .iter()
        .map(|b| systems.iter().filter(|s| s.symbol(b).is_some()).count())
        .sum();
    let bar = if o.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total as u64)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} measurements  {elapsed_precise}  eta {eta}  {msg}",
        )
        .expect("valid template"),
    );
    // Interleaved: every system on an instance before the next instance, so drift on a
    // shared machine hits all systems alike.
    let mut table: Vec<Vec<Option<Cell>>> = Vec::new();
    let mut failures = Vec::new();
    for b in &instances {
        bar.set_message(b.to_string());
        let bound = w.bind(b)?;
        let check = w.flops(&bound) <= CHECK_FLOPS;
        let mut row = Vec::new();
        for sys in &systems {
            let Some(symbol) = sys.symbol(b) else {
                row.push(None);
                continue;
            };
            let cand = Candidate {
                symbol: symbol.clone(),
                workload: w.clone(),
                bindings: b.clone(),
                check,
                gpu: None,
            };
            let cell = match run.measure(&sys.library, &[cand])?.remove(0) {
                Outcome::Measured(r) if r.check.as_ref().is_none_or(|c| c.passed) => Some(Cell {
                    min: r.min_seconds,
                    median: r.median_seconds,
                }),
                Outcome::Measured(_) => {
                    failures.push(format!("{} at {b}: wrong result", sys.name));
                    None
                }
                Outcome::Failed(why) | Outcome::Interrupted(why) => {
                    failures.push(format!("{} at {b}: {why}", sys.name));
                    None
                }
            };
            row.push(cell);
            bar.inc(1);
        }
        table.push(row);
    }
    bar.finish_and_clear();
    for f in &failures {
        eprintln!("warning: {f}");
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let report = Report {
        module: o.path,
        command: &command,
        workload: &m.workload,
        target: &format!(
            "{} ({} cores, {:?})",
            target.name, target.cores, target.simd
        ),
        peak,
        seconds: o.seconds,
        first_vendor,
        systems: systems.iter().map(|s| s.name.clone()).collect(),
        instances: &instances,
        flops: instances
            .iter()
            .map(|b| w.bind(b).map(|bw| w.flops(&bw)))
            .collect::<Result<_, _>>()?,
        table: &table,
        tuning: &tuning,
        tuning_untimed: m.tuning.as_ref().is_some_and(|t| t.untimed_trials > 0),
        tuning_note: m.tuning.as_ref().filter(|t| t.untimed_trials > 0).map(|t| {
            format!(
                "anyshape: {} trials, {} of them from records without times (an older version's; their time is not included)",
                t.trials, t.untimed_trials
            )
        }),
        unavailable: &unavailable,
        methods: &methods,
        failures: &failures,
    };
    std::fs::create_dir_all(o.out_dir)
        .with_context(|| format!("creating {}", o.out_dir.display()))?;
    let csv = o.out_dir.join("results.csv");
    std::fs::write(&csv, report.csv()).with_context(|| format!("writing {}", csv.display()))?;
    let md = o.out_dir.join("report.md");
    std::fs::write(&md, report.markdown()).with_context(|| format!("writing {}", md.display()))?;
    let mut written = vec![csv.display().to_string(), md.display().to_string()];
    for plot in report.plots(o.out_dir) {
        match plot {
            Ok(p) => written.push(p.display().to_string()),
            Err(e) => eprintln!("warning: no plot: {e}"),
        }
    }
    print!("{}", report.summary());
    println!("written: {}", written.join(", "));
    Ok(())
}

struct Report<'a> {
    module: &'a Path,
    command: &'a str,
    workload: &'a str,
    target: &'a str,
    peak: f64,
    seconds: f64,
    /// Index of the first vendor system (anyshape is 0, tuned baselines before vendors).
    first_vendor: usize,
    systems: Vec<String>,
    instances: &'a [Bindings],
    flops: Vec<f64>,
    table: &'a [Vec<Option<Cell>>],
    tuning: &'a [TuningTime],
    tuning_note: Option<String>,
    /// Whether anyshape's tuning time leaves out records without times (older versions').
    tuning_untimed: bool,
    unavailable: &'a [String],
    /// How the tuned baselines were made (budgets, bucket width).
    methods: &'a [String],
    failures: &'a [String],
}

/// `x` with four significant digits (latencies span microseconds to seconds).
pub(crate) fn significant(x: f64) -> String {
    if !(x.is_finite() && x > 0.0) {
        return format!("{x}");
    }
    let digits = (3 - (x.log10().floor() as i32).clamp(-9, 9)).clamp(0, 9) as usize;
    format!("{x:.digits$}")
}

/// Geometric mean.
pub(crate) fn geomean(x: &[f64]) -> f64 {
    (x.iter().map(|v| v.ln()).sum::<f64>() / x.len().max(1) as f64).exp()
}

impl Report<'_> {
    /// Best vendor (index into systems, min latency) per instance.
    fn best_vendor(&self, i: usize) -> Option<(usize, f64)> {
        self.table[i]
            .iter()
            .enumerate()
            .skip(self.first_vendor)
            .filter_map(|(s, c)| Some((s, c.as_ref()?.min)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Speedups of anyshape over the best vendor, per instance where both ran.
    fn speedups(&self) -> Vec<(usize, f64)> {
        (0..self.instances.len())
            .filter_map(|i| {
                let ours = self.table[i][0].as_ref()?.min;
                Some((i, self.best_vendor(i)?.1 / ours))
            })
            .collect()
    }

    fn peak_fractions(&self, min_t: i64) -> Vec<f64> {
        (0..self.instances.len())
            .filter(|&i| self.instances[i].iter().all(|(_, v)| v >= min_t))
            .filter_map(|i| Some(self.flops[i] / self.table[i][0].as_ref()?.min / 1e9 / self.peak))
            .collect()
    }

    fn summary(&self) -> String {
        let mut s = String::new();
        let sp = self.speedups();
        let x: Vec<f64> = sp.iter().map(|p| p.1).collect();
        let _ = writeln!(
            s,
            "anyshape vs best vendor on {} instances of {}: geomean speedup {:.3}x (min {:.3}x, max {:.3}x; > 1 means anyshape is faster)",
            x.len(),
            self.workload,
            geomean(&x),
            x.iter().copied().fold(f64::INFINITY, f64::min),
            x.iter().copied().fold(0.0, f64::max)
        );
        for (k, name) in self.systems.iter().enumerate().skip(1) {
            let r: Vec<f64> = (0..self.instances.len())
                .filter_map(|i| {
                    Some(self.table[i][k].as_ref()?.min / self.table[i][0].as_ref()?.min)
                })
                .collect();
            let wins = (0..self.instances.len())
                .filter(|&i| self.best_vendor(i).is_some_and(|b| b.0 == k))
                .count();
            let _ = writeln!(
                s,
                "  vs {name:<14} geomean {:.3}x over {} instances{}",
                geomean(&r),
                r.len(),
                if k >= self.first_vendor {
                    format!("; best vendor on {wins}")
                } else {
                    String::new()
                }
            );
        }
        // A ratio only against a complete anyshape time (every record timed).
        let ours = self
            .tuning
            .iter()
            .find(|t| t.name == "anyshape")
            .map(|t| t.seconds)
            .filter(|_| !self.tuning_untimed);
        for t in self.tuning {
            let _ = writeln!(
                s,
                "tuning time {:<10} {:>8.1} s, {:>5} trials{}",
                t.name,
                t.seconds,
                t.trials,
                match ours {
                    Some(a) if t.name != "anyshape" && a > 0.0 =>
                        format!("  ({:.2}x anyshape's)", t.seconds / a),
                    _ => String::new(),
                }
            );
        }
        if let Some(p) = self
            .tuning
            .iter()
            .find(|t| t.name == "per-shape" && t.trials > 0)
        {
            let samples = (0..self.instances.len())
                .filter(|&i| {
                    self.table[i]
                        .iter()
                        .zip(&self.systems)
                        .any(|(c, n)| n == "per-shape" && c.is_some())
                })
                .count();
            let paper = p.seconds / p.trials as f64 * 1000.0 * samples as f64;
            let _ = writeln!(
                s,
                "  per-shape at DietCode's budget for Ansor (1000 trials on each of {samples} samples): ~{paper:.0} s, extrapolated at this run's {:.2} s per trial{}",
                p.seconds / p.trials as f64,
                match ours {
                    Some(a) if a > 0.0 => format!(" ({:.1}x anyshape's)", paper / a),
                    _ => String::new(),
                }
            );
        }
        if let Some(n) = &self.tuning_note {
            let _ = writeln!(s, "  ({n})");
        }
        let f = self.peak_fractions(64);
        if !f.is_empty() {
            let _ = writeln!(
                s,
                "anyshape at T >= 64: {:.1}% of the {:.1} GFLOP/s peak on average (min {:.1}%, max {:.1}%)",
                f.iter().sum::<f64>() / f.len() as f64 * 100.0,
                self.peak,
                f.iter().copied().fold(f64::INFINITY, f64::min) * 100.0,
                f.iter().copied().fold(0.0, f64::max) * 100.0
            );
        }
        s
    }

    /// The plots: latency and GFLOP/s against the shape var per system, tuning time per
    /// tuned system.
    fn plots(&self, dir: &Path) -> Vec<Result<PathBuf, PlotError>> {
        let x = |b: &Bindings| match b.iter().collect::<Vec<_>>().as_slice() {
            [(_, v)] => Some(*v as f64),
            _ => None,
        };
        let var = self
            .instances
            .first()
            .and_then(|b| b.iter().next())
            .map_or("T".into(), |v| v.0.to_string());
        let series = |f: &dyn Fn(usize, &Cell) -> f64| -> Vec<Series> {
            self.systems
                .iter()
                .enumerate()
                .map(|(k, name)| Series {
                    name: name.clone(),
                    points: (0..self.instances.len())
                        .filter_map(|i| {
                            Some((x(&self.instances[i])?, f(i, self.table[i][k].as_ref()?)))
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect()
        };
        let mut out = Vec::new();
        let mut plot = |name: &str, draw: &dyn Fn(&Path) -> Result<(), PlotError>| {
            let path = dir.join(name);
            out.push(draw(&path).map(|_| path));
        };
        plot("latency.svg", &|p| {
            lines_svg(
                p,
                &format!("{}: latency (min) per system", self.workload),
                (&var, "latency, ms (log)"),
                true,
                &series(&|_, c| c.min * 1e3),
            )
        });
        plot("throughput.svg", &|p| {
            lines_svg(
                p,
                &format!(
                    "{}: GFLOP/s per system (peak {:.0})",
                    self.workload, self.peak
                ),
                (&var, "GFLOP/s"),
                false,
                &series(&|i, c| self.flops[i] / c.min / 1e9),
            )
        });
        plot("tuning.svg", &|p| {
            bars_svg(
                p,
                &format!("{}: tuning time", self.workload),
                "seconds",
                &self
                    .tuning
                    .iter()
                    .map(|t| (t.name.clone(), t.seconds))
                    .collect::<Vec<_>>(),
            )
        });
        out
    }

    fn csv(&self) -> String {
        let mut s = String::from("instance,system,min_seconds,median_seconds,gflops_at_min\n");
        for (i, b) in self.instances.iter().enumerate() {
            for (k, name) in self.systems.iter().enumerate() {
                if let Some(c) = &self.table[i][k] {
                    let _ = writeln!(
                        s,
                        "\"{b}\",{name},{:e},{:e},{:.2}",
                        c.min,
                        c.median,
                        self.flops[i] / c.min / 1e9
                    );
                }
            }
        }
        s
    }

    fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# anyshape vs vendor libraries: `{}`\n", self.workload);
        let _ = writeln!(s, "- command: `{}`", self.command);
        let _ = writeln!(s, "- module: `{}`", self.module.display());
        let _ = writeln!(
            s,
            "- machine: {}; FMA peak on all cores measured in this run: {:.1} GFLOP/s",
            self.target, self.peak
        );
        let _ = writeln!(
            s,
            "- latency: minimum over >= {} s of timed calls per system and instance (medians in `results.csv`); systems measured interleaved, instance by instance, in isolated worker processes; instances up to {CHECK_FLOPS:.0e} FLOPs checked against the reference",
            self.seconds
        );
        let _ = writeln!(s, "- oneDNN: the matmul primitive is created in the runner's untimed warm-up call (creation is outside the timed region); OpenBLAS: `openblas` = one multi-threaded `cblas_sgemm` per batch item, `openblas-omp` = an OpenMP loop over the batch with one-threaded calls; the `gemm` crate: `gemm` = one call per batch item, parallel inside (rayon), `gemm-par` = a rayon loop over the batch with one-threaded calls");
        for m in self.methods {
            let _ = writeln!(s, "- {m}");
        }
        for u in self.unavailable {
            let _ = writeln!(s, "- unavailable: {u}");
        }
        for f in self.failures {
            let _ = writeln!(s, "- failed: {f}");
        }
        let _ = writeln!(s, "\n## Summary\n\n```\n{}```\n", self.summary());
        let _ = writeln!(s, "![latency per system](latency.svg)\n\n![GFLOP/s per system](throughput.svg)\n\n![tuning time per system](tuning.svg)\n");
        let _ = write!(s, "## Per instance (minimum latency in ms; speedup = best vendor / anyshape)\n\n| instance | anyshape | GFLOP/s | % peak |");
        for name in self.systems.iter().skip(1) {
            let _ = write!(s, " {name} |");
        }
        s.push_str(" best vendor | speedup |\n|---|---|---|---|");
        for _ in self.systems.iter().skip(1) {
            s.push_str("---|");
        }
        s.push_str("---|---|\n");
        let ms = |c: &Option<Cell>| c.as_ref().map_or("—".into(), |c| significant(c.min * 1e3));
        for (i, b) in self.instances.iter().enumerate() {
            let ours = self.table[i][0].as_ref();
            let gf = ours.map(|c| self.flops[i] / c.min / 1e9);
            let _ = write!(
                s,
                "| {b} | {} | {} | {} |",
                ms(&self.table[i][0]),
                gf.map_or("—".into(), |g| format!("{g:.1}")),
                gf.map_or("—".into(), |g| format!("{:.1}", g / self.peak * 100.0))
            );
            for k in 1..self.systems.len() {
                let _ = write!(s, " {} |", ms(&self.table[i][k]));
            }
            let best = self.best_vendor(i);
            let _ = writeln!(
                s,
                " {} | {} |",
                best.map_or("—".into(), |b| self.systems[b.0].clone()),
                match (best, ours) {
                    (Some(b), Some(o)) => format!("{:.3}", b.1 / o.min),
                    _ => "—".into(),
                }
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(values: &[i64]) -> Vec<Bindings> {
        values
            .iter()
            .map(|&t| Bindings::from_pairs([("T", t)]))
            .collect()
    }

    #[test]
    fn buckets_pad_up_to_their_largest_instance() {
        let maxima = |values: &[i64], width| -> Vec<i64> {
            buckets(&ts(values), width)
                .unwrap()
                .iter()
                .map(|(_, m)| m.get("T").unwrap())
                .collect()
        };
        let all: Vec<i64> = (1..=40).collect();
        let got = maxima(&all, 16);
        assert_eq!(&got[..16], &[16; 16]);
        assert_eq!(&got[16..32], &[32; 16]);
        assert_eq!(&got[32..], &[40; 8], "the last bucket ends at the range");
        assert_eq!(maxima(&[1, 5, 12], 8), vec![8, 8, 12]);
        assert_eq!(maxima(&[3], 1), vec![3]);
        let two = vec![Bindings::from_pairs([("T", 1), ("B", 2)])];
        assert!(buckets(&two, 4).is_err());
        assert!(buckets(&[], 4).is_err());
    }

    #[test]
    fn significant_digits() {
        assert_eq!(significant(0.0007240), "0.0007240");
        assert_eq!(significant(27.06), "27.06");
        assert_eq!(significant(1234.5), "1234");
        assert_eq!(significant(0.0), "0");
        assert_eq!(significant(f64::NAN), "NaN");
    }
}
