//! The worker process: reads one job (library + candidates) as a JSON line on standard
//! input, runs each candidate and reports events as JSON lines on standard output.
//! It is started by [`crate::Runner`] through `anyshape __worker` or `anyshape-worker`.
use crate::runner::{Event, Job};
use crate::{
    check_output, random_inputs, reference_output, Candidate, MeasureOptions, Measurement, Outcome,
    Reference,
};
use anyshape_codegen::c;
use anyshape_ir::BoundWorkload;
use anyshape_runtime::{load_library, status_message, KernelFn};
use std::io::{BufRead, Write};
use std::time::Instant;

/// Serve one job from standard input; returns the process exit code.
pub fn serve() -> i32 {
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return 2;
    }
    let job: Job = match serde_json::from_str(&line) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("anyshape worker: bad job: {e}");
            return 2;
        }
    };
    // SAFETY: the library is one the builder produced from generated C; loading runs no
    // constructors of ours beyond the C runtime's.
    let library = unsafe { load_library(&job.library) };
    let mut out = std::io::stdout().lock();
    let mut emit = |ev: Event| {
        let line = serde_json::to_string(&ev).expect("events serialize");
        // The runner is gone (killed): stop instead of measuring for nobody.
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            std::process::exit(3);
        }
    };
    let mut instance: Option<Instance> = None;
    for (i, cand) in job.candidates.iter().enumerate() {
        let outcome = match &library {
            Err(e) => Err(format!("cannot load {}: {e}", job.library.display())),
            Ok(lib) => prepare(cand, &mut instance).and_then(|(inputs, reference, bound)| {
                // SAFETY: every generated kernel has the `KernelFn` signature.
                let f = unsafe { lib.get::<KernelFn>(cand.symbol.as_bytes()) }
                    .map_err(|e| format!("symbol {} not found: {e}", cand.symbol))?;
                emit(Event::Start(i));
                run_candidate(*f, cand, inputs, reference, bound, &job.options)
            }),
        };
        emit(Event::Done(i, outcome.unwrap_or_else(Outcome::Failed)));
    }
    0
}

type Prepared<'a> = (&'a [Vec<f32>], Option<&'a Reference>, &'a BoundWorkload);

/// Data of the instance last prepared, reused by the next candidate on the same instance.
struct Instance {
    key: String,
    inputs: Vec<Vec<f32>>,
    reference: Option<Reference>,
    bound: BoundWorkload,
}

/// Inputs and reference for the candidate's instance, reused across candidates of one instance.
fn prepare<'a>(cand: &Candidate, cache: &'a mut Option<Instance>) -> Result<Prepared<'a>, String> {
    let key = format!("{}|{}", cand.workload, cand.bindings);
    let bound = cand
        .workload
        .bind(&cand.bindings)
        .map_err(|e| e.to_string())?;
    let stale = cache
        .as_ref()
        .is_none_or(|c| c.key != key || (cand.check && c.reference.is_none()));
    if stale {
        *cache = None;
        // Inputs and output in f32, the reference and its magnitudes in f64.
        let out_len = bound.lens[cand.workload.inputs.len()];
        let bytes = bound.lens.iter().map(|&n| n as u128 * 4).sum::<u128>()
            + if cand.check { out_len as u128 * 16 } else { 0 };
        let mut probe: Vec<u8> = Vec::new();
        if usize::try_from(bytes).map_or(true, |b| probe.try_reserve_exact(b).is_err()) {
            return Err(format!(
                "cannot allocate {:.1} GiB for the instance's buffers",
                bytes as f64 / (1u64 << 30) as f64
            ));
        }
        drop(probe);
        let inputs = random_inputs(&bound, cand.workload.inputs.len(), 42);
        let reference = cand.check.then(|| {
            let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
            reference_output(&cand.workload, &bound, &views)
        });
        *cache = Some(Instance {
            key,
            inputs,
            reference,
            bound,
        });
    }
    let c = cache.as_ref().expect("filled above");
    Ok((
        &c.inputs,
        if cand.check {
            c.reference.as_ref()
        } else {
            None
        },
        &c.bound,
    ))
}

fn run_candidate(
    f: KernelFn,
    cand: &Candidate,
    inputs: &[Vec<f32>],
    reference: Option<&Reference>,
    bound: &BoundWorkload,
    opts: &MeasureOptions,
) -> Result<Outcome, String> {
    let vars: Vec<i64> = cand
        .workload
        .shape_vars()
        .iter()
        .map(|v| cand.bindings.get(v).unwrap_or(0))
        .collect();
    let ins: Vec<*const f32> = inputs.iter().map(|v| v.as_ptr()).collect();
    let mut output = vec![f32::NAN; bound.lens[cand.workload.inputs.len()]];
    let outs = [output.as_mut_ptr()];
    let call = || -> Result<f64, String> {
        let t0 = Instant::now();
        // SAFETY: buffers have the lengths the bound workload gives for these shape vars.
        let status = unsafe { f(vars.as_ptr(), ins.as_ptr(), outs.as_ptr()) };
        let dt = t0.elapsed().as_secs_f64();
        if status == c::STATUS_OK {
            Ok(dt)
        } else {
            Err(format!("kernel returned {}", status_message(status)))
        }
    };
    call()?;
    let check = reference.map(|r| check_output(&output, r));
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < opts.min_repeats
        || (start.elapsed().as_secs_f64() < opts.min_seconds && times.len() < opts.max_repeats)
    {
        times.push(call()?);
    }
    times.sort_by(f64::total_cmp);
    Ok(Outcome::Measured(Measurement {
        min_seconds: times[0],
        median_seconds: times[times.len() / 2],
        repeats: times.len(),
        check,
    }))
}
