//! Tuning efficiency (FamilySeer Fig. 7): two compiles of one model side by side from
//! their tuning logs (`tuning.json`, see `anyshape_tune::TuningLog`) — typically the
//! task scheduler with families against independent per-task tuning with equal
//! shares. The milestones are the baseline's final expected latency reached at 80 %,
//! 90 % and 100 % (latency ≤ final ÷ fraction), and the tuning time from which each
//! compile's curve stays there; the report also gives each compile's build share of its wall time,
//! trials per hour and the families' held-out Spearman. Writes `tuning.md`,
//! `tuning.csv` and `tuning-curve.svg`.
use crate::out::OutDir;
use crate::plot::{lines_svg, Series};
use crate::{BenchError, Result};
use anyshape_tune::{TuningLog, TUNING_FILE};
use std::fmt::Write;
use std::path::Path;

/// The fractions of the baseline's final performance the milestones are at.
pub const MILESTONES: [f64; 3] = [0.8, 0.9, 1.0];

/// One milestone: a latency and when each compile first reached it.
#[derive(Clone, Debug, PartialEq)]
pub struct Milestone {
    /// Fraction of the baseline's final performance.
    pub fraction: f64,
    /// The latency that is that fraction (seconds per model call).
    pub latency: f64,
    /// Tuning seconds from which the compile under test stays at it (none: never).
    pub seconds: Option<f64>,
    /// Tuning seconds the baseline took.
    pub baseline_seconds: Option<f64>,
}

impl Milestone {
    /// How many times faster the compile under test got there.
    pub fn speedup(&self) -> Option<f64> {
        Some(self.baseline_seconds? / self.seconds?.max(1e-9))
    }
}

/// Two tuning logs compared (and more beside them).
#[derive(Clone, Debug)]
pub struct TuningComparison {
    /// The compile under test.
    pub log: TuningLog,
    /// The baseline compile.
    pub baseline: TuningLog,
    /// Other compiles of the model, in the plot and the tables (no milestones).
    pub others: Vec<TuningLog>,
    /// The milestones of [`MILESTONES`].
    pub milestones: Vec<Milestone>,
}

/// Read a model module's tuning log.
pub fn read_tuning(module: &Path) -> Result<TuningLog> {
    let path = module.join(TUNING_FILE);
    let text = anyshape_files::read_to_string(&path, 256 * anyshape_files::MIB, "a tuning log")?;
    serde_json::from_str(&text).map_err(|e| {
        BenchError::Options(format!(
            "{}: not a tuning log ({e}); a model module compiled with --trials > 0 has one",
            path.display()
        ))
    })
}

impl TuningComparison {
    /// Compare `log` with `baseline`: when each reached the milestones of the
    /// baseline's final expected latency; `others` are shown beside them.
    pub fn new(
        mut log: TuningLog,
        mut baseline: TuningLog,
        others: Vec<TuningLog>,
    ) -> Result<TuningComparison> {
        if log.mode == baseline.mode {
            // Compiles of one mode (with and without a warm tuning database, say):
            // the report tells them apart.
            log.mode.push_str(" (under test)");
            baseline.mode.push_str(" (baseline)");
        }
        let last = baseline.final_latency().ok_or_else(|| {
            BenchError::Options("the baseline's tuning curve has no expected latency".into())
        })?;
        let milestones = MILESTONES
            .iter()
            .map(|&fraction| {
                let latency = last / fraction;
                Milestone {
                    fraction,
                    latency,
                    seconds: log.time_to(latency),
                    baseline_seconds: baseline.time_to(latency),
                }
            })
            .collect();
        Ok(TuningComparison {
            log,
            baseline,
            others,
            milestones,
        })
    }

    /// Every compile: under test, baseline, others.
    fn all(&self) -> impl Iterator<Item = &TuningLog> {
        [&self.log, &self.baseline].into_iter().chain(&self.others)
    }

    /// The report in Markdown.
    pub fn markdown(&self, title: &str) -> String {
        let (a, b) = (&self.log, &self.baseline);
        let secs = |s: Option<f64>| s.map_or("not reached".to_string(), |s| format!("{s:.1}"));
        let mut md = format!("# {title}\n\n");
        let _ = writeln!(
            md,
            "Tuning time: the records' time of a resumed run plus the run's wall time since its search began (build, measurement, cost model and search; votes and modules not included). Expected latency: `Σ count · weighted latency` over the tasks, each task's latency its best measured (elsewhere predicted) micro-kernel per tuned instance, timed cold; a point per slice of the task scheduler once every task has one. A milestone's time is when the curve reaches it for good (a curve can rise: a measurement may replace an optimistic prediction).\n"
        );
        let _ = writeln!(
            md,
            "| milestone (of {}'s final {:.3} ms) | latency ms | {} s | {} s | speedup |",
            b.mode,
            b.final_latency().unwrap_or(f64::NAN) * 1e3,
            a.mode,
            b.mode
        );
        md.push_str("|---|---:|---:|---:|---:|\n");
        for m in &self.milestones {
            let _ = writeln!(
                md,
                "| {:.0} % | {:.3} | {} | {} | {} |",
                m.fraction * 100.0,
                m.latency * 1e3,
                secs(m.seconds),
                secs(m.baseline_seconds),
                m.speedup().map_or("-".into(), |s| format!("{s:.2}x"))
            );
        }
        md.push_str(
            "\n| compile | trials per task | final expected ms | tuning wall s | new trials | trials per hour | build share | measure share | cost model share | search share |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for l in self.all() {
            let share = |x: f64| format!("{:.0} %", 100.0 * x / l.wall_seconds.max(1e-9));
            let _ = writeln!(
                md,
                "| {} | {} | {:.3} | {:.1} | {} | {:.0} | {} | {} | {} | {} |",
                l.mode,
                l.trials_per_task,
                l.final_latency().unwrap_or(f64::NAN) * 1e3,
                l.wall_seconds,
                l.new_trials,
                l.trials_per_hour(),
                share(l.time.build),
                share(l.time.measure),
                share(l.time.model),
                share(l.time.search)
            );
        }
        for l in self.all().filter(|l| !l.families.is_empty()) {
            let _ = writeln!(
                md,
                "\nFamilies of {} (held-out Spearman of predicted and measured throughput on every fifth trial of each member; the family's model trained on the rest of the family's trials, each task's own on its own):\n\n| family | tasks | trials | family model | each task's own model |\n|---|---|---:|---:|---:|",
                l.mode
            );
            let rho = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.3}"));
            for q in &l.families {
                let tasks: Vec<String> = q.members.iter().map(|m| (m + 1).to_string()).collect();
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} |",
                    q.family,
                    tasks.join(", "),
                    q.samples,
                    rho(q.spearman),
                    rho(q.spearman_alone)
                );
            }
        }
        md
    }

    /// Both curves as CSV: `mode,seconds,trials,expected_ms`.
    pub fn csv(&self) -> String {
        let mut csv = String::from("mode,seconds,trials,expected_ms\n");
        for l in self.all() {
            for p in &l.curve {
                let _ = writeln!(
                    csv,
                    "{},{:.3},{},{}",
                    l.mode,
                    p.seconds,
                    p.trials,
                    p.expected_seconds
                        .map_or(String::new(), |e| format!("{:.4}", e * 1e3))
                );
            }
        }
        csv
    }

    /// Write `tuning.md`, `tuning.csv` and `tuning-curve.svg` into `out`; returns the
    /// Markdown (with a line where the plot could not be drawn) and the files written.
    pub fn write(&self, title: &str, out: &OutDir) -> Result<(String, Vec<String>)> {
        let mut md = self.markdown(title);
        let mut written = Vec::new();
        for (name, text) in [("tuning.md", md.clone()), ("tuning.csv", self.csv())] {
            written.push(out.write(name, text.as_bytes())?.display().to_string());
        }
        let series: Vec<Series> = self
            .all()
            .map(|l| Series {
                name: l.mode.clone(),
                points: l
                    .curve
                    .iter()
                    .filter_map(|p| Some((p.seconds, p.expected_seconds? * 1e3)))
                    .collect(),
            })
            .collect();
        match lines_svg(
            title,
            ("tuning time (s)", "expected model latency (ms)"),
            true,
            &series,
        ) {
            Ok(svg) => written.push(
                out.write("tuning-curve.svg", svg.as_bytes())?
                    .display()
                    .to_string(),
            ),
            Err(e) => {
                let _ = writeln!(md, "\n- plot not written: {e}");
            }
        }
        Ok((md, written))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_tune::{CurvePoint, TimeBreakdown};

    fn log(mode: &str, curve: &[(f64, f64)]) -> TuningLog {
        TuningLog {
            mode: mode.into(),
            trials_per_task: 8,
            tasks: 2,
            curve: curve
                .iter()
                .map(|&(seconds, ms)| CurvePoint {
                    seconds,
                    trials: 0,
                    expected_seconds: Some(ms * 1e-3),
                })
                .collect(),
            time: TimeBreakdown::default(),
            wall_seconds: curve.last().unwrap().0,
            new_trials: 16,
            reused_trials: 0,
            database: vec![],
            families: vec![],
        }
    }

    #[test]
    fn milestones_are_the_baselines_final_latency_over_the_fraction() {
        let fam = log(
            "scheduler + families",
            &[(10.0, 120.0), (20.0, 105.0), (30.0, 95.0)],
        );
        let ind = log(
            "equal shares",
            &[(10.0, 130.0), (20.0, 120.0), (40.0, 100.0)],
        );
        let c = TuningComparison::new(fam, ind, vec![]).unwrap();
        // 80 %: 125 ms; 90 %: 111.1 ms; 100 %: 100 ms.
        assert_eq!(c.milestones[0].seconds, Some(10.0));
        assert_eq!(c.milestones[0].baseline_seconds, Some(20.0));
        assert_eq!(c.milestones[1].seconds, Some(20.0));
        assert_eq!(c.milestones[1].baseline_seconds, Some(40.0));
        assert_eq!(c.milestones[1].speedup(), Some(2.0));
        assert_eq!(c.milestones[2].seconds, Some(30.0));
        let md = c.markdown("t");
        assert!(
            md.contains("| 90 % | 111.111 | 20.0 | 40.0 | 2.00x |"),
            "{md}"
        );
        // A compile that never gets there.
        let slow = log("slow", &[(50.0, 200.0)]);
        let others = vec![log("c", &[(2.0, 90.0)])];
        let c = TuningComparison::new(slow, log("b", &[(1.0, 100.0)]), others).unwrap();
        assert_eq!(c.milestones[2].speedup(), None);
        assert!(c.markdown("t").contains("not reached"));
        // Another compile joins the tables and the curves.
        let md = c.markdown("t");
        assert!(md.contains("| c | 8 | 90.000 |"), "{md}");
        assert!(c.csv().contains("c,2.000,0,90.0000"), "{}", c.csv());
    }
}
