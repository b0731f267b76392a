//! The reports of `bench --model --compare`: `model.md` (per instance, every system's
//! latency, anyshape's rate and share of the peaks, the speedups and errors, then the
//! geomeans), `model.csv` and `model-latency.svg`.
use super::{dim_cells, dim_columns, ModelCompareOptions, Row};
use crate::error::Result;
use crate::out::OutDir;
use crate::peak::Peak;
use crate::plot::{lines_svg, Series};
use crate::report::{geomean, significant};
use std::fmt::Write as _;
use std::path::Path;

/// What the reports show: the module, the machine and its peaks, the options, the
/// systems and the rows.
pub(super) struct ModelReport<'a> {
    pub(super) dir: &'a Path,
    pub(super) target: &'a str,
    pub(super) peak: f64,
    /// A bf16 or i8 module's: its precision's peak (bf16: tile products where the CPU
    /// has AMX-BF16, pair products where it has AVX512_BF16; i8: quad products where it
    /// has AVX512_VNNI), and which.
    pub(super) peak_precision: Option<(Peak, f64)>,
    pub(super) load_seconds: f64,
    pub(super) o: &'a ModelCompareOptions<'a>,
    /// The dims' columns: the --dim values, or those the recorded cases bind.
    pub(super) dims: &'a [(String, Vec<i64>)],
    pub(super) names: &'a [String],
    pub(super) rows: &'a [Row],
    pub(super) unavailable: &'a [String],
    pub(super) failures: &'a [String],
}

impl ModelReport<'_> {
    /// Per peer (not anyshape): the speedups of anyshape over it, instance by instance.
    fn speedups(&self, p: usize) -> Vec<Option<f64>> {
        self.rows
            .iter()
            .map(|r| match (r.latency(0), r.latency(p)) {
                (Some(a), Some(x)) => Some(x / a),
                _ => None,
            })
            .collect()
    }

    fn markdown(&self) -> String {
        let mut s = crate::out::heading(format!("anyshape bench --model: {}", self.dir.display()));
        let _ = write!(
            s,
            "Machine: {}; FP32 FMA peak measured in this run: {:.1} GFLOP/s (all cores; the better of a measurement before the runs and one after)",
            self.target, self.peak
        );
        match self.peak_precision {
            Some((kind, p)) => {
                let _ = writeln!(s, "; {}: {p:.1} GFLOP/s.\n", kind.describe());
            }
            None => s.push_str(".\n\n"),
        }
        let _ = writeln!(
            s,
            "anyshape GFLOP/s: the useful flops of its kernels (a multiply and an add per product, the softmax's and epilogues' own; host steps such as layer norms not counted) over its latency; % of peak: of the FP32 FMA peak{}.\n",
            match self.peak_precision {
                Some((kind, _)) => format!(" (and, for a module in {0}, of the {0} one)", kind.precision()),
                None => String::new(),
            }
        );
        let _ = writeln!(
            s,
            "Loading the module took {:.3} s (its plan mapped and checked), once per process.\n",
            self.load_seconds
        );
        let recorded = self.rows.iter().any(|r| r.recorded);
        let _ = writeln!(
            s,
            "Latency: the minimum over {} interleaved rounds of >= {} s of runs per system (the order rotates each round). Speedup = peer latency / anyshape latency (> 1: anyshape is faster); paired = the median over rounds of that ratio within each round (less hostage to a noisy machine than the ratio of minima). {}\n",
            self.o.rounds, self.o.seconds, match recorded {
                true => "Error: max |system - recorded| / max |recorded| over the outputs of the first run, against the outputs the case records (where a case records none: of each peer against anyshape's).",
                false => "Error: max |peer - anyshape| / max |anyshape| over the outputs of the first run.",
            }
        );
        let mut head = "| instance |".to_string();
        let mut rule = "|---|".to_string();
        for (p, n) in self.names.iter().enumerate() {
            let _ = write!(head, " {n} ms |");
            rule.push_str("---:|");
            if p == 0 {
                head.push_str(" anyshape GFLOP/s | % of FMA peak |");
                rule.push_str("---:|---:|");
                if let Some((kind, _)) = self.peak_precision {
                    let _ = write!(head, " % of {} peak |", kind.precision());
                    rule.push_str("---:|");
                }
                if recorded {
                    let _ = write!(head, " error of {n} |");
                    rule.push_str("---:|");
                }
            }
        }
        for n in &self.names[1..] {
            let _ = write!(head, " speedup vs {n} | paired | error of {n} |");
            rule.push_str("---:|---:|---:|");
        }
        let _ = writeln!(s, "{head}\n{rule}");
        let speedups: Vec<Vec<Option<f64>>> =
            (1..self.names.len()).map(|p| self.speedups(p)).collect();
        for (i, r) in self.rows.iter().enumerate() {
            let _ = write!(s, "| {} |", r.label());
            for p in 0..self.names.len() {
                let _ = write!(
                    s,
                    " {} |",
                    r.latency(p)
                        .map_or("failed".into(), |l| significant(l * 1e3))
                );
                if p == 0 {
                    let rate = match (r.flops, r.latency(0)) {
                        (Some(f), Some(l)) => Some(f / l / 1e9),
                        _ => None,
                    };
                    let share = |peak: f64| {
                        rate.map_or("-".into(), |g| match 100.0 * g / peak {
                            x if x < 10.0 => format!("{x:.1} %"),
                            x => format!("{x:.0} %"),
                        })
                    };
                    let _ = write!(
                        s,
                        " {} | {} |",
                        rate.map_or("-".into(), significant),
                        share(self.peak)
                    );
                    if let Some((_, pb)) = self.peak_precision {
                        let _ = write!(s, " {} |", share(pb));
                    }
                    if recorded {
                        let e = r.error[0].filter(|_| r.recorded);
                        let _ = write!(s, " {} |", e.map_or("-".into(), |e| format!("{e:.2e}")));
                    }
                }
            }
            for (p, sp) in speedups.iter().enumerate() {
                let _ = write!(
                    s,
                    " {} | {} | {} |",
                    sp[i].map_or("-".into(), |x| format!("{x:.2}x")),
                    r.paired_speedup(p + 1)
                        .map_or("-".into(), |x| format!("{x:.2}x")),
                    r.error[p + 1].map_or("-".into(), |e| format!("{e:.2e}"))
                );
            }
            s.push('\n');
        }
        s.push('\n');
        for (p, sp) in speedups.iter().enumerate() {
            let v: Vec<f64> = sp.iter().flatten().copied().collect();
            if v.is_empty() {
                continue;
            }
            let (lo, at) = sp
                .iter()
                .enumerate()
                .filter_map(|(i, x)| x.map(|x| (x, i)))
                .fold((f64::INFINITY, 0), |a, b| if b.0 < a.0 { b } else { a });
            let paired: Vec<f64> = self
                .rows
                .iter()
                .filter_map(|r| r.paired_speedup(p + 1))
                .collect();
            let _ = writeln!(
                s,
                "- {} vs {}: geomean speedup **{:.2}x** over {} instances (lowest {:.2}x at {}); paired {:.2}x.",
                self.names[0],
                self.names[p + 1],
                geomean(&v),
                v.len(),
                lo,
                self.rows[at].label(),
                geomean(&paired)
            );
        }
        for u in self.unavailable {
            let _ = writeln!(s, "- not compared: {u}");
        }
        for f in self.failures {
            let _ = writeln!(s, "- failed: {f}");
        }
        s
    }

    fn csv(&self) -> String {
        let mut s = format!(
            "{},system,latency_ms,speedup_of_anyshape,max_rel_error,paired_speedup_of_anyshape,error_against,case\n",
            dim_columns(self.dims)
        );
        for r in self.rows {
            let at = dim_cells(self.dims, &r.bindings);
            let case = r.case.as_deref().unwrap_or("");
            let against = if r.recorded { "recorded" } else { "anyshape" };
            for (p, n) in self.names.iter().enumerate() {
                let l = r.latency(p);
                let sp = match (r.latency(0), l) {
                    (Some(a), Some(x)) if p > 0 => format!("{:.4}", x / a),
                    _ => String::new(),
                };
                let paired = match r.paired_speedup(p) {
                    Some(x) if p > 0 => format!("{x:.4}"),
                    _ => String::new(),
                };
                let _ = writeln!(
                    s,
                    "{at},\"{n}\",{},{sp},{},{paired},{against},{case}",
                    l.map_or(String::new(), |l| format!("{:.6}", l * 1e3)),
                    r.error[p].map_or(String::new(), |e| format!("{e:.3e}"))
                );
            }
        }
        s
    }

    /// Latency against the dim that varies (the instance number if several do).
    fn plot(&self) -> std::result::Result<String, crate::plot::PlotError> {
        let varying: Vec<&str> = self
            .dims
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(d, _)| d.as_str())
            .collect();
        let x = |i: usize, r: &Row| match varying.as_slice() {
            [d] => r.bindings.get(d).map_or(i as f64, |v| v as f64),
            _ => i as f64,
        };
        let series: Vec<Series> = self
            .names
            .iter()
            .enumerate()
            .map(|(p, n)| Series {
                name: n.clone(),
                points: self
                    .rows
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| r.latency(p).map(|l| (x(i, r), l * 1e3)))
                    .collect(),
            })
            .collect();
        let x_label = match varying.as_slice() {
            [d] => *d,
            _ => "instance",
        };
        lines_svg(
            &format!("{}: latency", self.dir.display()),
            (x_label, "latency (ms)"),
            true,
            &series,
        )
    }
}

/// Write `model.md`, `model.csv` and `model-latency.svg`; the summary and the files.
pub(super) fn write_all(r: &ModelReport, out: &OutDir) -> Result<(String, Vec<String>)> {
    let mut written = Vec::new();
    let md = r.markdown();
    for (name, text) in [("model.md", md.clone()), ("model.csv", r.csv())] {
        written.push(out.write(name, text.as_bytes())?.display().to_string());
    }
    let mut summary = md;
    match r.plot() {
        Ok(svg) => written.push(
            out.write("model-latency.svg", svg.as_bytes())?
                .display()
                .to_string(),
        ),
        Err(e) => {
            let _ = writeln!(summary, "- plot not written: {e}");
        }
    }
    Ok((summary, written))
}
