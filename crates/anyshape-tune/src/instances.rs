//! The instances of a workload's domain: every binding of its shape vars (the cartesian
//! product of their domains, bounded by [`MAX_INSTANCES`]), each with its normalized
//! weight, bound shapes and useful work.
use crate::{Result, TuneError};
use anyshape_ir::{Bindings, BoundWorkload, ShapeVar, Workload};

/// One instance of the workload's domain, with its normalized weight.
#[derive(Clone, Debug)]
pub struct Instance {
    /// Shape-var values.
    pub bindings: Bindings,
    /// Weight (all weights sum to 1).
    pub weight: f64,
    /// Bound shapes.
    pub bound: BoundWorkload,
    /// Useful floating-point operations.
    pub flops: f64,
}

/// The most instances one joint search takes (the cartesian product of the domains).
/// Every instance is bound, scored and voted on, so this bounds memory and time; a
/// larger range is better served by a list of representative values (`T=1,2,4,8,...`),
/// since the dispatcher covers the values between them.
pub const MAX_INSTANCES: u64 = 65_536;

/// How many instances the domains of `vars` hold (their cartesian product; `u64::MAX`
/// where that overflows).
pub fn instance_count(vars: &[ShapeVar]) -> u64 {
    vars.iter()
        .try_fold(1u64, |acc, v| acc.checked_mul(v.domain.len()))
        .unwrap_or(u64::MAX)
}

/// Every instance of the domains of `vars` (their cartesian product), weighted by the
/// product of the vars' weights and normalized. Every shape var of the workload needs a
/// domain, every domain must name a shape var of the workload (once), and there may be
/// at most [`MAX_INSTANCES`].
pub fn instances(w: &Workload, vars: &[ShapeVar]) -> Result<Vec<Instance>> {
    let needed = w.shape_vars();
    for (i, v) in vars.iter().enumerate() {
        if vars[..i].iter().any(|u| u.name == v.name) {
            return Err(TuneError::Options(format!(
                "shape var `{}` has two domains; give it one",
                v.name
            )));
        }
    }
    for v in &needed {
        if !vars.iter().any(|s| &s.name == v) {
            return Err(TuneError::Options(format!(
                "shape var `{v}` needs a domain, e.g. `--range {v}=1..128`"
            )));
        }
    }
    if let Some(extra) = vars.iter().find(|s| !needed.contains(&s.name)) {
        return Err(TuneError::Options(format!(
            "`{}` is not a shape var of {w} (its shape vars: {})",
            extra.name,
            needed.join(", ")
        )));
    }
    let count = instance_count(vars);
    if count > MAX_INSTANCES {
        return Err(TuneError::Options(format!(
            "the domains hold {} instances; one joint search takes at most {MAX_INSTANCES} \
             (list representative values instead, e.g. `T=1,2,4,8,16,...`)",
            if count == u64::MAX {
                "more than 2^64".to_string()
            } else {
                count.to_string()
            }
        )));
    }
    let mut points: Vec<(Bindings, f64)> = vec![(Bindings::default(), 1.0)];
    for v in vars {
        let values: Vec<i64> = v.domain.iter().collect();
        // Each var's weights relative to its largest, so products cannot overflow.
        let scale = match &v.weights {
            Some(ws) => {
                if ws.len() != values.len() || ws.iter().any(|x| !x.is_finite() || *x < 0.0) {
                    return Err(TuneError::Options(format!(
                        "weights of `{}`: need {} finite non-negative numbers",
                        v.name,
                        values.len()
                    )));
                }
                ws.iter().copied().fold(0.0, f64::max)
            }
            None => 1.0,
        };
        let mut next = Vec::new();
        for (b, w0) in &points {
            for (i, &x) in values.iter().enumerate() {
                let mut b = b.clone();
                b.set(v.name.clone(), x);
                let wi =
                    v.weights
                        .as_ref()
                        .map_or(1.0, |ws| if scale > 0.0 { ws[i] / scale } else { 0.0 });
                next.push((b, w0 * wi));
            }
        }
        points = next;
    }
    let total: f64 = points.iter().map(|p| p.1).sum();
    if total.is_nan() || total <= 0.0 {
        return Err(TuneError::Options("the weights are all zero".into()));
    }
    points
        .into_iter()
        .map(|(bindings, weight)| {
            let bound = w.bind(&bindings)?;
            let flops = w.flops(&bound);
            Ok(Instance {
                bindings,
                weight: weight / total,
                bound,
                flops,
            })
        })
        .collect()
}
