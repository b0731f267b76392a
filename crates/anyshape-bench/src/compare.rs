//! `anyshape bench --compare`: the module against the vendor libraries and the tuned
//! baselines (per-shape, Nimble-style, bucketing), instance by instance, in one run,
//! with a CSV, a Markdown report and plots.
use crate::error::{BenchError, Result};
use crate::out::OutDir;
use crate::peak::{Ceiling, Peak};
use crate::report::{median, Report};
use crate::tuned::{buckets, tuned_baselines, PerShapeTuner};
use crate::{build_vendors, Harness};
use anyshape_abi::{Manifest, ENTRY_SYMBOL};
use anyshape_codegen::{ContractionKernel, Sketch, Target as _};
use anyshape_files::Reads;
use anyshape_ir::{Bindings, ShapeVar, Workload};
use anyshape_measure::{Candidate, Kernels, MeasureOptions, Measurer, Outcome, Progress};
use anyshape_tune::TuneOptions;
use std::collections::HashMap;
use std::path::Path;

/// Instances up to this many FLOPs are checked against the reference (it is slow).
pub(crate) const CHECK_FLOPS: f64 = 1e8;

/// One system's timing on one instance, over the interleaved rounds.
pub(crate) struct Cell {
    /// The minimum over the rounds.
    pub min: f64,
    /// The median over the rounds of each round's median call.
    pub median: f64,
    /// Each round's minimum, in round order.
    pub rounds: Vec<f64>,
}

impl Cell {
    /// The cell of per-round `(minimum, median)` timings; `None` without any.
    fn of_rounds(timed: &[(f64, f64)]) -> Option<Cell> {
        let rounds: Vec<f64> = timed.iter().map(|t| t.0).collect();
        let medians: Vec<f64> = timed.iter().map(|t| t.1).collect();
        Some(Cell {
            min: rounds.iter().copied().reduce(f64::min)?,
            median: median(medians)?,
            rounds,
        })
    }
}

/// A system under comparison: where its kernels are and which one serves an instance.
pub(crate) struct System {
    pub name: String,
    pub kernels: Kernels,
    /// The symbol for each instance it runs; `None` for all instances with `all`.
    pub symbols: HashMap<Bindings, String>,
    pub all: Option<String>,
}

impl System {
    pub fn everywhere(name: &str, kernels: Kernels, symbol: String) -> System {
        System {
            name: name.into(),
            kernels,
            symbols: HashMap::new(),
            all: Some(symbol),
        }
    }

    fn symbol(&self, b: &Bindings) -> Option<&String> {
        self.all.as_ref().or_else(|| self.symbols.get(b))
    }
}

/// A tuned system's tuning: wall time (seconds, from its records) and trials.
pub(crate) struct TuningTime {
    pub name: String,
    pub seconds: f64,
    pub trials: usize,
}

/// Options of the comparison (from `anyshape bench`).
pub struct CompareOptions<'a> {
    /// Instances for the module and the vendors (`T=1..128`, a domain per shape var);
    /// the module's domain if empty.
    pub range: &'a [ShapeVar],
    /// Instances for the tuned baselines (per-shape, Nimble-style), e.g. `T=5,24,43`.
    pub samples: Option<&'a str>,
    /// Trials per instance of per-shape tuning (0: no tuned baselines).
    pub per_shape_trials: usize,
    /// Width of the bucketing baseline's buckets along the shape var (0: no bucketing).
    pub bucket: i64,
    /// Where the report, CSV and the baselines' records go.
    pub out_dir: &'a Path,
    /// Seconds of timed calls per system, instance and round.
    pub seconds: f64,
    /// Interleaved rounds per instance (the order of the systems rotates each round).
    pub rounds: usize,
}

/// Measure the module in `dir` (its manifest `m`, checked by the caller), every vendor
/// variant and (with `per_shape_trials`) the tuned baselines on each instance, and write
/// the report; returns its summary and the files written.
pub fn compare(
    dir: &Path,
    m: &Manifest,
    o: &CompareOptions,
    h: &Harness,
    progress: &mut dyn Progress,
) -> Result<(String, Vec<String>)> {
    // The reports' directory is checked before any work.
    let out = OutDir::new(o.out_dir, Reads::new().dir(dir).clone())?;
    let workload = Workload::parse(&m.workload)?;
    let w = &workload;
    // The vendors and the tuned baselines are GEMMs.
    ContractionKernel::applies(w).map_err(|e| {
        BenchError::Options(format!(
            "--compare races contractions against vendor GEMMs; {w} is not one ({e}); --dispatch-loss and --overhead measure any module"
        ))
    })?;
    let vars: Vec<ShapeVar> = match o.range {
        [] => m.shape_vars.clone(),
        given => given.to_vec(),
    };
    let domain = |vars: &[ShapeVar]| -> Result<Vec<Bindings>> {
        Ok(anyshape_tune::instances(w, vars)?
            .into_iter()
            .map(|x| x.bindings)
            .collect())
    };
    let mut instances = domain(&vars)?;
    let (target, builder) = (&h.target, &h.builder);
    let mut systems = vec![System::everywhere(
        "anyshape",
        Kernels::Library(dir.join(&m.library)),
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
                progress.note(&format!("warning: no bucketing baseline: {e}"));
                Vec::new()
            })
        } else {
            Vec::new()
        };
        if !buckets.is_empty() {
            methods.push(format!("bucketing: buckets of {} values from the smallest instance; the largest instance of each bucket tuned per shape ({} trials); the others padded up to it (global padding: inputs copied into zero-filled buffers of the bucket's shape and the output copied back, inside the timed call)", o.bucket, o.per_shape_trials));
        }
        let samples = domain(&[ShapeVar::parse(o.samples.ok_or_else(|| {
            BenchError::Options(
                "--per-shape-trials needs --samples, e.g. T=5,24,43,62,81,100,119,128".into(),
            )
        })?)?])?;
        let measurer = Measurer {
            builder: builder.clone(),
            runner: h.runner(TuneOptions::default().measure),
            queue: None,
        };
        progress.note(&format!(
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
        ));
        let records = o.out_dir.join("records");
        let mut tuner = PerShapeTuner {
            w,
            trials: o.per_shape_trials,
            target,
            measurer: &measurer,
            records_dir: &records,
            done: HashMap::new(),
        };
        let (baselines, times) = tuned_baselines(&samples, &buckets, &mut tuner, progress)?;
        systems.extend(baselines);
        tuning.extend(times);
        for b in samples {
            if !instances.contains(&b) {
                instances.push(b);
            }
        }
        instances.sort();
    }
    progress.note(&format!("building the vendor baselines for {w} ..."));
    let first_vendor = systems.len();
    let mut unavailable = Vec::new();
    for lib in build_vendors(w, target, builder) {
        match lib.built {
            Ok((kernels, variants)) => {
                for k in variants {
                    systems.push(System::everywhere(&k.name, kernels.clone(), k.symbol));
                }
            }
            Err(why) => {
                progress.note(&format!(
                    "warning: {} unavailable, comparing without it: {why}",
                    lib.vendor
                ));
                unavailable.push(format!("{}: {why}", lib.vendor));
            }
        }
    }
    progress.note("measuring the FMA peak ...");
    let mut peak = Ceiling::measure(Peak::Fma, target, builder)?;
    let options = MeasureOptions {
        // At least 5 calls: a minimum over fewer can be all stalled by a neighbour.
        min_repeats: 5,
        max_repeats: 1000,
        min_seconds: o.seconds,
        timeout_seconds: 120.0,
        interleave: false,
        cold: false,
    };
    let run = h.runner(options);
    let total: usize = instances
        .iter()
        .map(|b| systems.iter().filter(|s| s.symbol(b).is_some()).count())
        .sum();
    let rounds = o.rounds.max(1);
    progress.start("measurements", total * rounds);
    // Interleaved: every system on an instance, in rounds whose order rotates, before
    // the next instance, so that drift on a shared machine hits all systems alike and
    // a slow spell spoils one round of a system, not its minimum.
    let mut table: Vec<Vec<Option<Cell>>> = Vec::new();
    let mut failures = Vec::new();
    for b in &instances {
        progress.message(&b.to_string());
        let bound = w.bind(b)?;
        let check = w.flops(&bound) <= CHECK_FLOPS;
        let n = systems.len();
        // Per system: its (minimum, median) of each round; `None` once it failed.
        let mut timed: Vec<Option<Vec<(f64, f64)>>> = systems
            .iter()
            .map(|s| s.symbol(b).map(|_| Vec::new()))
            .collect();
        for r in 0..rounds {
            for k in 0..n {
                let s = (k + r) % n;
                let Some(symbol) = systems[s].symbol(b) else {
                    continue;
                };
                progress.inc(1);
                let Some(times) = timed[s].as_mut() else {
                    continue;
                };
                let cand = Candidate {
                    symbol: symbol.clone(),
                    workload: w.clone(),
                    bindings: b.clone(),
                    // The first round checks the result; the others time the same code.
                    check: check && r == 0,
                    gpu: None,
                };
                let why = match run.measure(&systems[s].kernels, &[cand])?.remove(0) {
                    Outcome::Measured(m) if m.check.as_ref().is_none_or(|c| c.passed) => {
                        times.push((m.min_seconds, m.median_seconds));
                        None
                    }
                    Outcome::Measured(_) => Some("wrong result".to_string()),
                    Outcome::Failed(why) | Outcome::Interrupted(why) => Some(why),
                };
                if let Some(why) = why {
                    failures.push(format!("{} at {b}: {why}", systems[s].name));
                    timed[s] = None;
                }
            }
        }
        table.push(
            timed
                .iter()
                .map(|t| t.as_deref().and_then(Cell::of_rounds))
                .collect(),
        );
    }
    progress.finish();
    for f in &failures {
        progress.note(&format!("warning: {f}"));
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    progress.note("measuring the FMA peak again ...");
    peak.remeasure(target, builder)?;
    let report = Report {
        module: dir,
        command: &command,
        workload: &m.workload,
        target: &target.describe(),
        peak: peak.gflops,
        seconds: o.seconds,
        rounds,
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
    let mut written = Vec::new();
    for (name, text) in [
        ("results.csv", report.csv()),
        ("report.md", report.markdown()),
    ] {
        written.push(out.write(name, text.as_bytes())?.display().to_string());
    }
    for plot in report.plots() {
        match plot {
            Ok((name, svg)) => written.push(out.write(name, svg.as_bytes())?.display().to_string()),
            Err(e) => progress.note(&format!("warning: no plot: {e}")),
        }
    }
    Ok((report.summary(), written))
}
