//! How long work shows its progress: a bar on a terminal, a line per step elsewhere (a
//! log file, CI). One [`Reporter`] hears both the libraries' counted work
//! ([`Progress`]) and the tuning pipeline's stages and rounds ([`Observer`]).
use anyshape_ir::Workload;
use anyshape_measure::Progress;
use anyshape_tune::{FamilyQuality, Observer, RoundSummary, Slice, Stage};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Shows progress on standard error.
pub struct Reporter {
    /// Whether bars are drawn (a terminal, not `--quiet`).
    bars: bool,
    bar: Option<ProgressBar>,
    /// Counted work without a bar: its name, total, count and when it was last printed.
    plain: Option<Plain>,
}

struct Plain {
    what: String,
    total: usize,
    done: usize,
    printed: Instant,
}

/// Without a bar, counted work prints a line at most this often.
const PLAIN_EVERY: Duration = Duration::from_secs(10);

impl Reporter {
    /// Bars on a terminal unless `quiet`; lines otherwise.
    pub fn new(quiet: bool) -> Reporter {
        Reporter {
            bars: !quiet && std::io::stderr().is_terminal(),
            bar: None,
            plain: None,
        }
    }

    fn bar(&mut self, total: Option<usize>, template: &str) {
        self.finish();
        if self.bars {
            let bar = match total {
                Some(n) => ProgressBar::new(n as u64),
                None => ProgressBar::new_spinner(),
            };
            bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
            bar.enable_steady_tick(Duration::from_millis(200));
            self.bar = Some(bar);
        }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }
}

impl Progress for Reporter {
    fn start(&mut self, what: &str, total: usize) {
        self.bar(
            Some(total),
            &format!(
                "{{bar:40}} {{pos}}/{{len}} {what}  {{msg}}  {{elapsed_precise}}  eta {{eta}}"
            ),
        );
        if self.bar.is_none() {
            eprintln!("{what}: 0/{total}");
            self.plain = Some(Plain {
                what: what.into(),
                total,
                done: 0,
                printed: Instant::now(),
            });
        }
    }

    fn inc(&mut self, n: usize) {
        if let Some(bar) = &self.bar {
            bar.inc(n as u64);
        }
        if let Some(p) = &mut self.plain {
            p.done += n;
            if p.printed.elapsed() >= PLAIN_EVERY {
                eprintln!("{}: {}/{}", p.what, p.done, p.total);
                p.printed = Instant::now();
            }
        }
    }

    fn message(&mut self, text: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(text.to_string());
        }
    }

    fn note(&mut self, line: &str) {
        self.line(line);
    }

    fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        if let Some(p) = self.plain.take() {
            if p.done > 0 {
                eprintln!("{}: {}/{} done", p.what, p.done, p.total);
            }
        }
    }
}

impl Observer for Reporter {
    fn stage(&mut self, stage: &Stage) {
        self.finish();
        match stage {
            Stage::Search {
                instances,
                budget,
                resumed,
            } => {
                eprintln!("search: {instances} instances, a budget of {budget} trials ({resumed} from the records)");
                self.bar(
                    Some(*budget),
                    "{bar:40} {pos}/{len} trials  {elapsed_precise}  eta {eta}",
                );
                if let Some(bar) = &self.bar {
                    bar.set_position(*resumed as u64);
                }
            }
            Stage::Votes { recorded: true, .. } => {
                eprintln!(
                    "votes: the records' vote round, re-timing only the close calls it lacks ..."
                );
                self.bar(None, "{spinner} votes: {pos} records  {elapsed_precise}");
            }
            Stage::Votes { trials, .. } => {
                eprintln!("votes: measuring the candidate micro-kernels on every instance (some {trials} measurements), then re-timing the close calls ...");
                self.bar(None, "{spinner} votes: {pos} records  {elapsed_precise}");
            }
            Stage::Tree { tuned, between: 0 } => {
                eprintln!("dispatch tree: training on the {tuned} votes ...")
            }
            Stage::Tree { tuned, between } => eprintln!(
                "dispatch tree: training on the {tuned} votes and {between} estimated between their instances ..."
            ),
            Stage::Module {
                symbolic,
                specialized,
            } => eprintln!(
                "module: building {symbolic} symbolic + {specialized} specialized kernels ..."
            ),
            Stage::Check => {
                eprintln!("check: the best kernel of every instance against the reference ...")
            }
        }
    }

    fn round(&mut self, s: &RoundSummary) {
        self.line(&format!(
            "round {:>3}  trials {:>4}/{}  failed {:>2}  weighted latency: predicted {:>9.3} ms, measured {:>9.3} ms ({} instances)  best {:>6.1} GFLOP/s{}",
            s.round, s.trials, s.budget, s.failed, s.predicted_weighted_latency * 1e3, s.measured_weighted_latency * 1e3, s.measured_instances, s.best_gflops,
            if s.exploiting { "  (the winners' neighbours)" } else { "" }
        ));
    }

    fn trials(&mut self, n: usize) {
        if let Some(bar) = &self.bar {
            bar.set_position(n as u64);
        }
    }

    fn task(&mut self, index: usize, total: usize, workload: &Workload, count: usize) {
        self.note(&format!(
            "task {}/{total}: {workload} (run {count}x per call)",
            index + 1
        ));
    }

    fn slice(&mut self, s: &Slice) {
        self.finish();
        let expected = if s.expected_seconds > 0.0 {
            format!(
                "; expected model latency {:.3} ms",
                s.expected_seconds * 1e3
            )
        } else {
            String::new()
        };
        self.note(&format!(
            "scheduler: {}/{} trials given; task {} to {} trials: {}{expected}",
            s.given,
            s.total,
            s.task + 1,
            s.budget,
            s.workload
        ));
        self.bar(
            Some(s.budget),
            "{bar:40} {pos}/{len} trials  {elapsed_precise}",
        );
    }

    fn scheduled(&mut self, given: usize, expected_seconds: f64) {
        self.finish();
        self.note(&format!(
            "scheduler: done, {given} trials given; expected model latency {:.3} ms",
            expected_seconds * 1e3
        ));
    }

    fn reused(&mut self, database: &std::path::Path, trials: &[usize]) {
        self.note(&anyshape_tune::Reuse { database, trials }.to_string());
    }

    fn unseen(&mut self, q: &anyshape_tune::DatabaseQuality) {
        self.note(&q.to_string());
    }

    fn family(&mut self, q: &FamilyQuality) {
        let rho = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{r:.3}"));
        self.note(&format!(
            "family {}: tasks {}, {} trials; held-out Spearman {} (each task's own model: {})",
            q.family,
            q.members
                .iter()
                .map(|m| (m + 1).to_string())
                .collect::<Vec<_>>()
                .join(", "),
            q.samples,
            rho(q.spearman),
            rho(q.spearman_alone)
        ));
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
