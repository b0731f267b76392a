//! `anyshape gpu`'s comparison: every instance through the dispatch tree of a joint
//! GPU tuning run against cuBLAS, and the paper's Fig. 5 case (local padding against
//! boundary checks and loop partitioning with a 128×128 micro-kernel); a Markdown
//! report and a CSV.
use crate::error::Result;
use crate::out::OutDir;
use crate::report::{geomean, significant};
use crate::CUBLAS_SYMBOL;
use anyshape_abi::DispatchTree;
use anyshape_codegen::{DeviceKind, GpuContractionKernel, GpuTarget, PaddingStrategy, Program};
use anyshape_ir::{Bindings, Workload};
use anyshape_measure::{Candidate, Kernels, MeasureOptions, Measurer, Outcome, Progress};
use anyshape_tune::Instance;
use std::fmt::Write as _;
use std::path::Path;

/// A joint GPU tuning run's outcome, to compare with cuBLAS.
pub struct GpuComparison<'a> {
    /// The workload.
    pub workload: &'a Workload,
    /// The GPU.
    pub target: &'a GpuTarget,
    /// The padding strategy of the tuned kernels.
    pub strategy: PaddingStrategy,
    /// Every tuned instance.
    pub instances: &'a [Instance],
    /// The micro-kernels the votes chose.
    pub micro_kernels: &'a [GpuContractionKernel],
    /// The dispatch tree over them.
    pub tree: &'a DispatchTree,
    /// Its training accuracy.
    pub accuracy: f64,
    /// Seconds of tuning (search and votes).
    pub tuning_seconds: f64,
    /// The value of the shape var for the Fig. 5 case (0: none).
    pub fig5: i64,
    /// The command that ran, for the report.
    pub command: String,
}

/// What [`compare_gpu`] found and wrote.
pub struct GpuReport {
    /// The Markdown report.
    pub markdown: String,
    /// Files written.
    pub written: Vec<String>,
    /// Measurements that failed (the report shows them too).
    pub problems: Vec<String>,
}

/// Outputs of instances up to this many FLOPs are checked against the reference (a
/// plain loop nest on the host, ~1 GFLOP/s); `tests/gpu.rs` checks every T.
const CHECK_FLOPS: f64 = 1e9;

/// One instance's result.
struct Row {
    bindings: Bindings,
    flops: f64,
    kernel: GpuContractionKernel,
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

/// Measure the dispatched kernel of every instance and cuBLAS (minimum over at least 10
/// calls, CUDA events) and the Fig. 5 case; write `report.md` and `results.csv` to
/// `out_dir`.
pub fn compare_gpu(
    c: &GpuComparison,
    measurer: &Measurer,
    out_dir: &Path,
    progress: &mut dyn Progress,
) -> Result<GpuReport> {
    let (workload, target, strategy) = (c.workload, c.target, c.strategy);
    let mut rows: Vec<Row> = c
        .instances
        .iter()
        .map(|x| Row {
            bindings: x.bindings.clone(),
            flops: x.flops,
            kernel: c.micro_kernels[c.tree.select(&x.bindings)],
            ours: None,
            cublas: None,
        })
        .collect();
    let programs: Vec<Program<GpuContractionKernel>> = c
        .micro_kernels
        .iter()
        .map(|&mk| Program::symbolic(workload, mk, strategy))
        .collect();
    let lib = measurer.builder.build_programs(target, &programs)?;
    lib.require_all()?;
    let runner = anyshape_measure::Runner {
        options: MeasureOptions {
            min_repeats: 10,
            ..measurer.runner.options.clone()
        },
        ..measurer.runner.clone()
    };
    let candidate = |symbol: String, r: &Row, gpu: Option<GpuContractionKernel>| Candidate {
        symbol,
        workload: workload.clone(),
        bindings: r.bindings.clone(),
        check: r.flops <= CHECK_FLOPS,
        gpu,
    };
    let ours: Vec<Candidate> = rows
        .iter()
        .map(|r| {
            let p = Program::symbolic(workload, r.kernel, strategy);
            candidate(p.symbol(target), r, Some(r.kernel))
        })
        .collect();
    let blas: Vec<Candidate> = rows
        .iter()
        .map(|r| candidate(CUBLAS_SYMBOL.into(), r, None))
        .collect();
    progress.start("measurements (anyshape, cuBLAS)", 2 * rows.len());
    let ours = runner.measure_with(&lib.kernels(), &ours, &mut |_, _| progress.inc(1))?;
    let blas = runner.measure_with(&Kernels::Builtin(DeviceKind::Cuda), &blas, &mut |_, _| {
        progress.inc(1)
    })?;
    progress.finish();
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
    let fig5 = fig5(c, measurer, &runner)?;
    let markdown = render(c, &rows, &fig5);
    let out = OutDir::new(out_dir, anyshape_files::Reads::new())?;
    let md = out.write("report.md", markdown.as_bytes())?;
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
    let path = out.write("results.csv", csv.as_bytes())?;
    Ok(GpuReport {
        markdown,
        written: vec![md.display().to_string(), path.display().to_string()],
        problems,
    })
}

fn speedup(r: &Row) -> Option<f64> {
    Some(r.cublas? / r.ours?)
}

/// Fig. 5: the strategies with a 128×128 micro-kernel on one instance.
fn fig5(
    c: &GpuComparison,
    measurer: &Measurer,
    runner: &anyshape_measure::Runner,
) -> Result<Vec<(PaddingStrategy, Result<f64, String>)>> {
    let (w, target) = (c.workload, c.target);
    let vars = w.shape_vars();
    if c.fig5 == 0 || vars.len() != 1 {
        return Ok(vec![]);
    }
    let mk = GpuContractionKernel {
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
    let programs: Vec<Program<GpuContractionKernel>> = strategies
        .iter()
        .map(|&s| Program::symbolic(w, mk, s))
        .collect();
    let lib = measurer.builder.build_programs(target, &programs)?;
    let bindings = Bindings::from_pairs([(vars[0].as_str(), c.fig5)]);
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
    let outs = runner.measure(&lib.kernels(), &cands)?;
    Ok(strategies
        .into_iter()
        .zip(outs.iter().map(latency))
        .collect())
}

fn render(
    c: &GpuComparison,
    rows: &[Row],
    fig5: &[(PaddingStrategy, Result<f64, String>)],
) -> String {
    let (w, target) = (c.workload, c.target);
    let (tuning_seconds, tree, accuracy) = (c.tuning_seconds, c.tree, c.accuracy);
    let mut s = String::new();
    let _ = writeln!(s, "# {w} on {}\n", target.name);
    let _ = writeln!(s, "`{}`\n", c.command);
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
            c.fig5
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
