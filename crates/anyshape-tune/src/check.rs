//! The check of a tuning report: the best micro-kernel of every instance, built and
//! run on that instance, compared with the reference implementation.
use crate::{Result, Tunable, TuneReport};
use anyshape_codegen::{PaddingStrategy, Program};
use anyshape_ir::Workload;
use anyshape_measure::{Candidate, Measurer, Outcome};
use std::collections::BTreeSet;

/// The outcome of [`check_best`].
#[derive(Clone, Debug, Default)]
pub struct BestCheck {
    /// Instances checked.
    pub checked: usize,
    /// Instances skipped (over the FLOP cap).
    pub skipped: usize,
    /// `instance: reason` for every instance whose kernel failed or was wrong.
    pub failures: Vec<String>,
}

/// Check the best micro-kernel of every instance of `report` with at most `max_flops`
/// useful FLOPs (the reference is a plain f64 loop nest: large instances take long).
pub fn check_best<K: Tunable>(
    workload: &Workload,
    target: &K::Target,
    strategy: PaddingStrategy,
    report: &TuneReport<K>,
    measurer: &Measurer,
    max_flops: f64,
) -> Result<BestCheck> {
    let program = |mk: K| Program::symbolic(workload, mk, strategy);
    let mks: BTreeSet<K> = report.best.iter().map(|b| b.micro_kernel).collect();
    let programs: Vec<Program<K>> = mks.iter().map(|&mk| program(mk)).collect();
    let lib = measurer.builder.build_programs(target, &programs)?;
    lib.require_all()?;
    let mut v = BestCheck::default();
    let mut cands = Vec::new();
    for b in &report.best {
        let flops = workload.flops(&workload.bind(&b.bindings)?);
        if flops > max_flops {
            v.skipped += 1;
            continue;
        }
        cands.push(Candidate {
            symbol: program(b.micro_kernel).symbol(target),
            workload: workload.clone(),
            bindings: b.bindings.clone(),
            check: true,
            gpu: b.micro_kernel.launch(),
        });
    }
    let outcomes = measurer.runner.measure(&lib.kernels(), &cands)?;
    for (c, o) in cands.iter().zip(outcomes) {
        v.checked += 1;
        match o {
            Outcome::Measured(m) if m.check.as_ref().is_some_and(|c| c.passed) => {}
            Outcome::Measured(m) => v
                .failures
                .push(format!("{}: wrong result ({:?})", c.bindings, m.check)),
            Outcome::Failed(why) | Outcome::Interrupted(why) => {
                v.failures.push(format!("{}: {why}", c.bindings))
            }
        }
    }
    Ok(v)
}
