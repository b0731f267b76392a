//! `anyshape bench --vendor`: the module against the vendor libraries, instance by
//! instance, in one run, with a CSV and a Markdown report.
use crate::{peak, runner, Common};
use anyhow::{Context, Result};
use anyshape_bench::build_vendors;
use anyshape_codegen::{CpuTarget, PaddingStrategy, Program, ENTRY_SYMBOL};
use anyshape_ir::{Bindings, ShapeVar, Workload};
use anyshape_measure::{Candidate, KernelSource, MeasureOptions, Measurer, Outcome};
use anyshape_runtime::Module;
use anyshape_tune::{RecordLog, TuneOptions, Tuner};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

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

/// A tuned system's name and tuning wall time, seconds.
type TuningTime = (String, f64);

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
    /// Where the report, CSV and the baselines' records go.
    pub out_dir: &'a Path,
    /// Seconds of timed calls per system and instance.
    pub seconds: f64,
    /// No progress bars.
    pub quiet: bool,
}

/// The tuned baselines: per-shape (Ansor-style) kernels for the samples and the
/// Nimble-style kernel (the largest sample's micro-kernel, symbolic with loop partitioning).
fn tuned_baselines(
    w: &Workload,
    samples: &[Bindings],
    trials: usize,
    target: &CpuTarget,
    measurer: &Measurer,
    records_dir: &Path,
    quiet: bool,
) -> Result<(Vec<System>, Vec<TuningTime>)> {
    std::fs::create_dir_all(records_dir)
        .with_context(|| format!("creating {}", records_dir.display()))?;
    let mut best = Vec::new();
    let mut times = Vec::new();
    let mut total = 0.0;
    for b in samples {
        let vars: Vec<ShapeVar> = b
            .iter()
            .map(|(n, v)| ShapeVar::parse(&format!("{n}={v}")))
            .collect::<Result<_, _>>()?;
        let inst = anyshape_tune::instances(w, &vars)?;
        let file = records_dir.join(format!(
            "per-shape-{}.jsonl",
            b.to_string().replace([',', '='], "_")
        ));
        let (log, previous) = RecordLog::open(&file, true)?;
        let options = TuneOptions {
            trials,
            per_shape: true,
            ..TuneOptions::default()
        };
        let start = Instant::now();
        let mut tuner = Tuner::new(w, target, inst, options, measurer, log, previous)?;
        let report = tuner.run(&mut |_| {}, &mut |_| {})?;
        let secs = start.elapsed().as_secs_f64();
        total += secs;
        let mk = report.best[0].micro_kernel;
        if !quiet {
            eprintln!(
                "per-shape tuning at {b}: {} trials ({} resumed) in {secs:.1} s -> {mk} ({:.1} GFLOP/s)",
                report.trials, report.resumed_trials, report.best[0].gflops
            );
        }
        best.push((b.clone(), tuner.program(mk), secs));
    }
    times.push(("per-shape".to_string(), total));
    // Nimble-style: the largest sample's micro-kernel, symbolic, loop partitioning.
    let largest = samples
        .iter()
        .zip(&best)
        .max_by(|a, b| {
            let f = |x: &Bindings| w.bind(x).map_or(0.0, |bw| w.flops(&bw));
            f(a.0).total_cmp(&f(b.0))
        })
        .map(|(_, p)| p.clone())
        .context("no samples for the tuned baselines")?;
    times.push(("nimble".to_string(), largest.2));
    let nimble = Program::symbolic(w, largest.1.micro_kernel, PaddingStrategy::LoopPartition);
    let mut sources = Vec::new();
    for p in best.iter().map(|x| &x.1).chain([&nimble]) {
        sources.push(KernelSource {
            symbol: p.symbol(target),
            code: p.c_source(target)?,
        });
    }
    let lib = measurer.builder.build(target, &sources)?;
    if let Some((sym, err)) = lib.failed.iter().next() {
        anyhow::bail!("baseline kernel {sym} did not compile:\n{err}");
    }
    let per_shape = System {
        name: "per-shape".into(),
        library: lib.path.clone(),
        symbols: best
            .iter()
            .map(|(b, p, _)| (b.clone(), p.symbol(target)))
            .collect(),
        all: None,
    };
    let nimble = System::everywhere("nimble", lib.path, nimble.symbol(target));
    Ok((vec![per_shape, nimble], times))
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
    let mut tuning: Vec<(String, f64)> = Vec::new();
    if let Some(t) = &m.tuning {
        tuning.push(("anyshape".into(), t.seconds));
    }
    if o.per_shape_trials > 0 {
        let samples = domain(&[ShapeVar::parse(o.samples.context(
            "--per-shape-trials needs --samples, e.g. T=5,24,43,62,81,100,119,128",
        )?)?])?;
        let measurer = Measurer {
            builder: builder.clone(),
            runner: runner(TuneOptions::default().measure)?,
        };
        eprintln!(
            "tuning the baselines: per-shape ({} trials on each of {} samples) and Nimble-style ...",
            o.per_shape_trials,
            samples.len()
        );
        let records = o.out_dir.join("records");
        let (baselines, times) = tuned_baselines(
            w,
            &samples,
            o.per_shape_trials,
            &target,
            &measurer,
            &records,
            o.quiet,
        )?;
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
        min_repeats: 3,
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
                Outcome::Failed(why) => {
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
        tuning_resumed: m.tuning.as_ref().is_some_and(|t| t.untimed_trials > 0),
        tuning_note: m.tuning.as_ref().filter(|t| t.untimed_trials > 0).map(|t| {
            format!(
                "anyshape: {} trials, {} of them from records without times (an older version's; their time is not included)",
                t.trials, t.untimed_trials
            )
        }),
        unavailable: &unavailable,
        failures: &failures,
    };
    std::fs::create_dir_all(o.out_dir)
        .with_context(|| format!("creating {}", o.out_dir.display()))?;
    let csv = o.out_dir.join("results.csv");
    std::fs::write(&csv, report.csv()).with_context(|| format!("writing {}", csv.display()))?;
    let md = o.out_dir.join("report.md");
    std::fs::write(&md, report.markdown()).with_context(|| format!("writing {}", md.display()))?;
    print!("{}", report.summary());
    println!("written: {}, {}", csv.display(), md.display());
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
    tuning: &'a [(String, f64)],
    tuning_note: Option<String>,
    /// Whether anyshape's tuning time leaves out trials resumed from records.
    tuning_resumed: bool,
    unavailable: &'a [String],
    failures: &'a [String],
}

fn geomean(x: &[f64]) -> f64 {
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
        // A ratio only against a complete anyshape time (no trials resumed from records).
        let ours = self
            .tuning
            .iter()
            .find(|t| t.0 == "anyshape")
            .map(|t| t.1)
            .filter(|_| !self.tuning_resumed);
        for (name, secs) in self.tuning {
            let _ = writeln!(
                s,
                "tuning time {name:<10} {secs:>8.1} s{}",
                match ours {
                    Some(a) if name != "anyshape" && a > 0.0 =>
                        format!("  ({:.2}x anyshape's)", secs / a),
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
        let _ = writeln!(s, "- oneDNN: the matmul primitive is created in the runner's untimed warm-up call (creation is outside the timed region); OpenBLAS: `openblas` = one multi-threaded `cblas_sgemm` per batch item, `openblas-omp` = an OpenMP loop over the batch with one-threaded calls");
        for u in self.unavailable {
            let _ = writeln!(s, "- unavailable: {u}");
        }
        for f in self.failures {
            let _ = writeln!(s, "- failed: {f}");
        }
        let _ = writeln!(s, "\n## Summary\n\n```\n{}```\n", self.summary());
        let _ = write!(s, "## Per instance (ms; speedup = best vendor / anyshape)\n\n| instance | anyshape | GFLOP/s | % peak |");
        for name in self.systems.iter().skip(1) {
            let _ = write!(s, " {name} |");
        }
        s.push_str(" best vendor | speedup |\n|---|---|---|---|");
        for _ in self.systems.iter().skip(1) {
            s.push_str("---|");
        }
        s.push_str("---|---|\n");
        let ms = |c: &Option<Cell>| {
            c.as_ref()
                .map_or("—".into(), |c| format!("{:.3}", c.min * 1e3))
        };
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
