//! The tuned baselines of the comparison: per-shape tuning (Ansor-style: the joint
//! search on one instance at a time, tiles dividing its extents, specialized kernels),
//! Nimble-style (the largest sample's micro-kernel, symbolic with loop partitioning, on
//! every instance) and bucketing (each bucket's largest instance tuned per shape, the
//! others padded up to it by a global-padding wrapper).
use crate::bucket_c;
use crate::compare::{System, TuningTime};
use crate::error::{io, BenchError, Result};
use anyshape_codegen::{CpuTarget, PaddingStrategy, Program};
use anyshape_ir::{Bindings, ShapeVar, Workload};
use anyshape_measure::{KernelSource, Measurer, Progress};
use anyshape_tune::{RecordLog, TuneOptions, Tuner};
use std::collections::HashMap;
use std::path::Path;

/// One instance tuned on its own (per-shape tuning): its best program and the cost.
#[derive(Clone)]
pub(crate) struct PerShape {
    program: Program,
    seconds: f64,
    trials: usize,
}

/// Per-shape tuning of the instances the tuned baselines need, each once, with records
/// per instance under `records_dir` (a resumed instance keeps its recorded time).
pub(crate) struct PerShapeTuner<'a> {
    pub w: &'a Workload,
    pub trials: usize,
    pub target: &'a CpuTarget,
    pub measurer: &'a Measurer,
    pub records_dir: &'a Path,
    pub done: HashMap<Bindings, PerShape>,
}

impl PerShapeTuner<'_> {
    fn tune(&mut self, b: &Bindings, progress: &mut dyn Progress) -> Result<PerShape> {
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
            progress.note(&format!("warning: {untimed} records of {} carry no time (an older version's): the tuning time leaves them out", file.display()));
        }
        let mk = report.best[0].micro_kernel;
        progress.note(&format!(
            "per-shape tuning at {b}: {} trials ({} resumed), {seconds:.1} s of tuning -> {mk} ({:.1} GFLOP/s)",
            report.trials, report.resumed_trials, report.best[0].gflops
        ));
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
pub(crate) fn buckets(instances: &[Bindings], width: i64) -> Result<Vec<(Bindings, Bindings)>> {
    let var = match instances.first().map(|b| b.iter().collect::<Vec<_>>()) {
        Some(v) if v.len() == 1 => v[0].0.to_string(),
        _ => {
            return Err(BenchError::Options(
                "bucketing needs instances of exactly one shape var".into(),
            ))
        }
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
pub(crate) fn tuned_baselines(
    samples: &[Bindings],
    buckets: &[(Bindings, Bindings)],
    tuner: &mut PerShapeTuner,
    progress: &mut dyn Progress,
) -> Result<(Vec<System>, Vec<TuningTime>)> {
    let (w, target, measurer) = (tuner.w, tuner.target, tuner.measurer);
    std::fs::create_dir_all(tuner.records_dir).map_err(io(tuner.records_dir))?;
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
        let p = tuner.tune(b, progress)?;
        add(p.program.symbol(target), p.program.source(target)?);
        per_shape.insert(b.clone(), p.program.symbol(target));
        seconds += p.seconds;
        trials += p.trials;
        let flops = w.flops(&w.bind(b)?);
        if largest.as_ref().is_none_or(|l| flops > l.0) {
            largest = Some((flops, p));
        }
    }
    let (_, largest) =
        largest.ok_or_else(|| BenchError::Options("no samples for the tuned baselines".into()))?;
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
    add(nimble.symbol(target), nimble.source(target)?);
    let mut bucketed = HashMap::new();
    let mut maxima: Vec<&Bindings> = buckets.iter().map(|b| &b.1).collect();
    maxima.sort();
    maxima.dedup();
    let (mut seconds, mut trials) = (0.0, 0);
    for max in &maxima {
        let p = tuner.tune(max, progress)?;
        seconds += p.seconds;
        trials += p.trials;
        let inner = p.program.symbol(target);
        let wrapper = format!("{inner}_bucket");
        add(inner.clone(), p.program.source(target)?);
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
    lib.require_all()?;
    let mut systems = vec![
        System {
            name: "per-shape".into(),
            kernels: lib.kernels(),
            symbols: per_shape,
            all: None,
        },
        System::everywhere("nimble", lib.kernels(), nimble.symbol(target)),
    ];
    if !maxima.is_empty() {
        systems.push(System {
            name: "bucketing".into(),
            kernels: lib.kernels(),
            symbols: bucketed,
            all: None,
        });
    }
    Ok((systems, times))
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
}
