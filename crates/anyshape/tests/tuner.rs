//! The tuning library (`anyshape-tune`) end to end on a small workload, measured by the
//! one worker executable (`anyshape __worker`): the run spends its budget, the best
//! micro-kernel of every instance is correct there, and a resumed run measures nothing
//! twice.
use anyshape_codegen::{CpuTarget, PaddingStrategy};
use anyshape_ir::{ShapeVar, Workload};
use anyshape_measure::{Builder, MeasureOptions, Measurer, Runner, WorkerCommand};
use anyshape_tune::{
    check_best, elect, instances, Record, RecordLog, TuneOptions, Tuner, TuningDb, VoteOptions,
};
use std::collections::BTreeSet;

fn runner() -> Runner {
    let worker = WorkerCommand {
        program: env!("CARGO_BIN_EXE_anyshape").into(),
        args: vec!["__worker".into()],
    };
    Runner {
        worker,
        options: MeasureOptions {
            min_repeats: 2,
            max_repeats: 20,
            min_seconds: 0.0,
            timeout_seconds: 20.0,
            interleave: false,
            cold: false,
        },
    }
}

#[test]
fn tunes_resumes_and_every_best_kernel_is_correct() {
    let target = CpuTarget::detect();
    let w = Workload::parse("batch_matmul_nn(B=2,M=T,N=T+5,K=T)").unwrap();
    let vars = [ShapeVar::parse("T=1..24").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let measurer = Measurer {
        builder: Builder::new(dir.path().join("cache")),
        runner: runner(),
        queue: None,
    };
    let records = dir.path().join("records.jsonl");
    let options = |trials| TuneOptions {
        trials,
        batch: 3,
        instances_per_kernel: 3,
        measure: measurer.runner.options.clone(),
        ..TuneOptions::default()
    };

    let (log, previous) = RecordLog::open(&records, false).unwrap();
    let mut tuner = Tuner::new(
        &w,
        &target,
        instances(&w, &vars).unwrap(),
        options(33),
        &measurer,
        log,
        previous,
    )
    .unwrap();
    // More than the seeds' first round (batch_matmul_nn has nine seeds, three trials
    // each), so that the search runs rounds of its own.
    let mut rounds = 0;
    let report = tuner.run(&mut |_| rounds += 1, &mut |_| {}).unwrap();
    assert_eq!(report.trials, 33);
    assert!(rounds >= 2);
    assert_eq!(report.best.len(), 24);

    // Resume with a larger budget: the old trials count, none is repeated. (A run holds
    // its records file until it is dropped.)
    drop(tuner);
    let (log, previous) = RecordLog::open(&records, true).unwrap();
    assert_eq!(previous.len(), 33);
    let mut tuner = Tuner::new(
        &w,
        &target,
        instances(&w, &vars).unwrap(),
        options(42),
        &measurer,
        log,
        previous,
    )
    .unwrap();
    let report = tuner.run(&mut |_| {}, &mut |_| {}).unwrap();
    assert_eq!((report.trials, report.resumed_trials), (42, 33));
    drop(tuner);
    let (_, all): (_, Vec<Record>) = RecordLog::open(&records, true).unwrap();
    assert_eq!(all.len(), 42);
    let pairs: BTreeSet<_> = all
        .iter()
        .map(|r| (r.micro_kernel, r.bindings.clone()))
        .collect();
    assert_eq!(pairs.len(), 42, "a trial was measured twice");

    // The best micro-kernel of every instance computes it correctly.
    let v = check_best(
        &w,
        &target,
        PaddingStrategy::LocalPad,
        &report,
        &measurer,
        f64::INFINITY,
    )
    .unwrap();
    assert_eq!((v.checked, v.skipped), (24, 0));
    assert!(v.failures.is_empty(), "{:#?}", v.failures);
}

/// A run whose records file holds nothing of its workload starts from the tuning
/// database's best earlier run: its trials and votes are reused (nothing measured
/// again, the same votes), written to the new records file marked as reused; a larger
/// budget measures only the difference, and another workload of the family reuses
/// nothing but trains its cost model on the family's trials there.
#[test]
fn a_new_run_starts_from_the_database() {
    let target = CpuTarget::detect();
    let w = Workload::parse("dense(M=T,N=24,K=16)").unwrap();
    let vars = [ShapeVar::parse("T=1..6").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tuning.sqlite");
    let measurer = Measurer {
        builder: Builder::new(dir.path().join("cache")),
        runner: runner(),
        queue: None,
    };
    let run = |w: &Workload, name: &str, trials: usize| {
        let (log, previous) = RecordLog::open(&dir.path().join(name), false).unwrap();
        let mut tuner = Tuner::new(
            w,
            &target,
            instances(w, &vars).unwrap(),
            TuneOptions {
                trials,
                batch: 3,
                instances_per_kernel: 2,
                measure: measurer.runner.options.clone(),
                database: Some(db.clone()),
                ..TuneOptions::default()
            },
            &measurer,
            log,
            previous,
        )
        .unwrap();
        let reused = tuner.resumed().reused;
        let mut measured = 0;
        let report = tuner.run(&mut |_| {}, &mut |_| measured += 1).unwrap();
        let votes = elect(&mut tuner, &VoteOptions::default(), &mut |_| measured += 1).unwrap();
        (
            reused,
            measured,
            tuner.trials(),
            votes,
            report.model_samples,
        )
    };
    let (reused, measured, held, first, _) = run(&w, "a.jsonl", 12);
    assert_eq!(reused, 0);
    assert!(measured > 12, "the votes measure too: {measured}");
    assert_eq!(held, measured);

    let (reused, measured, again, votes, _) = run(&w, "b.jsonl", 12);
    assert_eq!((reused, measured, again), (held, 0, held));
    assert_eq!(
        votes.votes, first.votes,
        "the same records give the same votes"
    );
    let (_, b): (_, Vec<Record>) = RecordLog::open(&dir.path().join("b.jsonl"), true).unwrap();
    assert_eq!(b.len(), held);
    assert!(b.iter().all(|r| r.reused));

    // A larger budget: the search goes on from the reused trials, then votes again.
    let (reused, measured, more, _, _) = run(&w, "c.jsonl", held + 4);
    assert_eq!(reused, held);
    assert!(
        measured >= 4 && more == held + measured,
        "{measured} {more}"
    );

    // Another workload of the family reuses no trial, but its cost model trains on the
    // family's trials in the database from the start.
    let other = Workload::parse("dense(M=T,N=24,K=8)").unwrap();
    let (reused, _, _, _, samples) = run(&other, "d.jsonl", 3);
    assert_eq!(reused, 0);
    assert!(
        samples >= held + 4,
        "{samples} samples: its own 3 trials and the family's"
    );
    let summary = TuningDb::open(&db).unwrap().summary().unwrap();
    assert_eq!((summary.keys, summary.runs), (2, 3));
}

#[test]
fn bad_domains_are_clear_errors() {
    let w = Workload::parse("dense(M=T,N=B,K=4)").unwrap();
    let e = instances(&w, &[ShapeVar::parse("T=1..4").unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`B` needs a domain"), "{e}");
    let e = instances(
        &w,
        &[
            ShapeVar::parse("T=1..4").unwrap(),
            ShapeVar::parse("B=1,2").unwrap(),
            ShapeVar::parse("Q=1").unwrap(),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("`Q` is not a shape var"), "{e}");
    let mut t = ShapeVar::parse("T=1..4").unwrap();
    t.weights = Some(vec![1.0, 2.0]);
    assert!(instances(&w, &[t, ShapeVar::parse("B=1").unwrap()]).is_err());
    let xs = instances(
        &w,
        &[
            ShapeVar::parse("T=1..4").unwrap(),
            ShapeVar::parse("B=1,2").unwrap(),
        ],
    )
    .unwrap();
    assert_eq!(xs.len(), 8);
    assert!((xs.iter().map(|x| x.weight).sum::<f64>() - 1.0).abs() < 1e-12);
}
