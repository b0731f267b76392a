//! The comparison's report: a summary (speedups over the best vendor, tuning times,
//! fraction of the FMA peak), a per-instance Markdown table, a CSV, and the plots.
use crate::compare::{Cell, TuningTime, CHECK_FLOPS};
use crate::plot::{bars_svg, lines_svg, PlotError, Series};
use anyshape_ir::Bindings;
use std::fmt::Write as _;
use std::path::Path;

pub(crate) struct Report<'a> {
    pub module: &'a Path,
    pub command: &'a str,
    pub workload: &'a str,
    pub target: &'a str,
    pub peak: f64,
    pub seconds: f64,
    /// Interleaved rounds per system and instance.
    pub rounds: usize,
    /// Index of the first vendor system (anyshape is 0, tuned baselines before vendors).
    pub first_vendor: usize,
    pub systems: Vec<String>,
    pub instances: &'a [Bindings],
    pub flops: Vec<f64>,
    pub table: &'a [Vec<Option<Cell>>],
    pub tuning: &'a [TuningTime],
    pub tuning_note: Option<String>,
    /// Whether anyshape's tuning time leaves out records without times (older versions').
    pub tuning_untimed: bool,
    pub unavailable: &'a [String],
    /// How the tuned baselines were made (budgets, bucket width).
    pub methods: &'a [String],
    pub failures: &'a [String],
}

/// `x` with four significant digits (latencies span microseconds to seconds).
pub(crate) fn significant(x: f64) -> String {
    if !(x.is_finite() && x > 0.0) {
        return format!("{x}");
    }
    let digits = (3 - (x.log10().floor() as i32).clamp(-9, 9)).clamp(0, 9) as usize;
    format!("{x:.digits$}")
}

/// The median (the mean of the middle two of an even count); `None` when empty.
pub(crate) fn median(mut x: Vec<f64>) -> Option<f64> {
    x.sort_by(f64::total_cmp);
    let n = x.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(x[n / 2]),
        _ => Some((x[n / 2 - 1] + x[n / 2]) / 2.0),
    }
}

/// The paired speedup of `ours` over `theirs` (latencies per round, `None` where not
/// timed): the median over the rounds of `theirs / ours` within the round, so that a
/// slow spell of the machine weighs on both sides of each ratio (minima pair up the
/// best moments of each system, which may lie in different spells).
pub(crate) fn paired_speedup(ours: &[Option<f64>], theirs: &[Option<f64>]) -> Option<f64> {
    median(
        ours.iter()
            .zip(theirs)
            .filter_map(|(a, x)| Some(x.as_ref()? / a.as_ref()?))
            .collect(),
    )
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

    /// The paired speedup of anyshape over the best vendor on instance `i`: the median
    /// over rounds of the fastest vendor in that round against anyshape in that round.
    fn paired_speedup(&self, i: usize) -> Option<f64> {
        let row = &self.table[i];
        let round = |c: &Cell, r: usize| c.rounds.get(r).copied();
        let ours = row[0].as_ref()?;
        let (a, v): (Vec<_>, Vec<_>) = (0..self.rounds)
            .map(|r| {
                let vendor = row[self.first_vendor..]
                    .iter()
                    .flatten()
                    .filter_map(|c| round(c, r))
                    .reduce(f64::min);
                (round(ours, r), vendor)
            })
            .unzip();
        paired_speedup(&a, &v)
    }

    fn peak_fractions(&self, min_t: i64) -> Vec<f64> {
        (0..self.instances.len())
            .filter(|&i| self.instances[i].iter().all(|(_, v)| v >= min_t))
            .filter_map(|i| Some(self.flops[i] / self.table[i][0].as_ref()?.min / 1e9 / self.peak))
            .collect()
    }

    pub fn summary(&self) -> String {
        let mut s = String::new();
        let sp = self.speedups();
        let x: Vec<f64> = sp.iter().map(|p| p.1).collect();
        let low = |x: &[f64]| x.iter().copied().fold(f64::INFINITY, f64::min);
        let _ = writeln!(
            s,
            "anyshape vs best vendor on {} instances of {}: geomean speedup {:.3}x (min {:.3}x, max {:.3}x; > 1 means anyshape is faster)",
            x.len(),
            self.workload,
            geomean(&x),
            low(&x),
            x.iter().copied().fold(0.0, f64::max)
        );
        let paired: Vec<f64> = (0..self.instances.len())
            .filter_map(|i| self.paired_speedup(i))
            .collect();
        if self.rounds > 1 {
            let _ = writeln!(
                s,
                "  paired over {} rounds (median per instance of the round's ratio): geomean {:.3}x (min {:.3}x)",
                self.rounds,
                geomean(&paired),
                low(&paired)
            );
        }
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

    /// The plots, by file name: latency and GFLOP/s against the shape var per system,
    /// tuning time per tuned system.
    pub fn plots(&self) -> Vec<Result<(&'static str, String), PlotError>> {
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
        let mut plot = |name: &'static str, svg: Result<String, PlotError>| {
            out.push(svg.map(|svg| (name, svg)));
        };
        plot(
            "latency.svg",
            lines_svg(
                &format!("{}: latency (min) per system", self.workload),
                (&var, "latency, ms"),
                true,
                &series(&|_, c| c.min * 1e3),
            ),
        );
        plot(
            "throughput.svg",
            lines_svg(
                &format!(
                    "{}: GFLOP/s per system (peak {:.0})",
                    self.workload, self.peak
                ),
                (&var, "GFLOP/s"),
                false,
                &series(&|i, c| self.flops[i] / c.min / 1e9),
            ),
        );
        plot(
            "tuning.svg",
            bars_svg(
                &format!("{}: tuning time", self.workload),
                "seconds",
                &self
                    .tuning
                    .iter()
                    .map(|t| (t.name.clone(), t.seconds))
                    .collect::<Vec<_>>(),
            ),
        );
        out
    }

    pub fn csv(&self) -> String {
        let mut s = String::from(
            "instance,system,min_seconds,median_seconds,gflops_at_min,round_min_seconds\n",
        );
        for (i, b) in self.instances.iter().enumerate() {
            for (k, name) in self.systems.iter().enumerate() {
                if let Some(c) = &self.table[i][k] {
                    let _ = writeln!(
                        s,
                        "\"{b}\",{name},{:e},{:e},{:.2},{}",
                        c.min,
                        c.median,
                        self.flops[i] / c.min / 1e9,
                        c.rounds
                            .iter()
                            .map(|r| format!("{r:e}"))
                            .collect::<Vec<_>>()
                            .join(";")
                    );
                }
            }
        }
        s
    }

    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# anyshape vs vendor libraries: `{}`\n", self.workload);
        let _ = writeln!(s, "- command: `{}`", self.command);
        let _ = writeln!(s, "- module: `{}`", self.module.display());
        let _ = writeln!(
            s,
            "- machine: {}; FMA peak on all cores measured in this run: {:.1} GFLOP/s (the better of a measurement before the runs and one after)",
            self.target, self.peak
        );
        let _ = writeln!(
            s,
            "- latency: minimum over {} rounds of >= {} s of timed calls per system and instance (medians in `results.csv`); systems measured interleaved, instance by instance, in rounds whose order rotates, in isolated worker processes; paired speedup = the median over rounds of the ratio within a round; instances up to {CHECK_FLOPS:.0e} FLOPs checked against the reference",
            self.rounds, self.seconds
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
        s.push_str(" best vendor | speedup | paired |\n|---|---|---|---|");
        for _ in self.systems.iter().skip(1) {
            s.push_str("---|");
        }
        s.push_str("---|---|---|\n");
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
                " {} | {} | {} |",
                best.map_or("—".into(), |b| self.systems[b.0].clone()),
                match (best, ours) {
                    (Some(b), Some(o)) => format!("{:.3}", b.1 / o.min),
                    _ => "—".into(),
                },
                self.paired_speedup(i)
                    .map_or("—".into(), |p| format!("{p:.3}"))
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn significant_digits() {
        assert_eq!(significant(0.0007240), "0.0007240");
        assert_eq!(significant(27.06), "27.06");
        assert_eq!(significant(1234.5), "1234");
        assert_eq!(significant(0.0), "0");
        assert_eq!(significant(f64::NAN), "NaN");
    }
}
