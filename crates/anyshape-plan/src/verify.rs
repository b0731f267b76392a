//! The plan verifier: every invariant listed on the plan's types (see `plan.rs`),
//! checked after lowering (a bug in fusion or lowering is caught at compile time, not
//! as a wrong answer) and after loading (a damaged or tampered plan is refused); and
//! the sizes again at each instance ([`check_instance`]), before a run at new dims.
//! Statically, sizes are compared symbolically and a plan is refused where they
//! provably differ; where symbols cannot decide (`(h - 16) / 16 + 1` against `h / 16`
//! for `h ≥ 16`), the instance check decides, evaluated, before any kernel runs.
use crate::plan::numel;
use crate::{ConstantLayout, Plan, PlanError, Result, Step, Storage};
use anyshape_ir::{Bindings, Expr, CACHE_RESERVE};
use anyshape_tensor::{equal, DType};

fn invalid<T>(message: String) -> Result<T> {
    Err(PlanError::Invalid(message))
}

/// Whether two sizes may be equal (not provably different; see the module doc).
fn same(a: &Expr, b: &Expr) -> bool {
    equal(a, b) != Some(false)
}

/// Check `plan`, whose constants' data holds `data_bytes` bytes.
pub fn verify(plan: &Plan, data_bytes: u64) -> Result<()> {
    let n = plan.values.len();
    let plain = Bindings::from_pairs([(CACHE_RESERVE, 0)]);
    let name = |v: usize| plan.values.get(v).map_or("?", |x| x.name.as_str());
    let in_range = |v: usize, what: &str| {
        if v < n {
            Ok(())
        } else {
            invalid(format!("{what} names value {v}, of {n}"))
        }
    };
    // Storage: references in range, views acyclic and of their source's size; a value
    // with run-time dims a host step's own tensor (nothing sized before the run).
    for (v, value) in plan.values.iter().enumerate() {
        if value.storage != Storage::Owned && value.shape.iter().any(Expr::has_runtime_dims) {
            return invalid(format!(
                "`{}` has run-time dims but is not a host step's own tensor",
                value.name
            ));
        }
        match &value.storage {
            Storage::Input(i) if *i >= plan.inputs.len() || plan.inputs[*i].1 != v => {
                return invalid(format!("`{}` is not input {i}", value.name))
            }
            Storage::Constant(c) => {
                let Some(k) = plan.constants.get(*c) else {
                    return invalid(format!("`{}` names constant {c}", value.name));
                };
                let stored: usize = k.shape.iter().product();
                let elements: i64 = value
                    .shape
                    .iter()
                    .map(|e| e.as_const().unwrap_or(-1))
                    .product();
                if k.layout == ConstantLayout::RowMajor && elements != stored as i64 {
                    return invalid(format!(
                        "`{}` has {elements} elements, its constant {stored}",
                        value.name
                    ));
                }
                if k.dtype != value.dtype {
                    return invalid(format!("`{}` is not of its constant's type", value.name));
                }
            }
            Storage::Plumbing(x) => {
                if value.dtype != DType::I64 || value.shape.len() > 1 {
                    return invalid(format!(
                        "`{}`: shape plumbing is int64 scalars and vectors",
                        value.name
                    ));
                }
                if value.shape.len() == 1 && value.shape[0].as_const() != Some(x.len() as i64) {
                    return invalid(format!(
                        "`{}` has {} elements of plumbing",
                        value.name,
                        x.len()
                    ));
                }
            }
            Storage::View(src) => {
                in_range(*src, &format!("the view `{}`", value.name))?;
                if plan.root(v) == v
                    || matches!(plan.values[plan.root(v)].storage, Storage::View(_))
                {
                    return invalid(format!("the view `{}` is part of a cycle", value.name));
                }
                if !same(&numel(&value.shape), &numel(&plan.values[*src].shape)) {
                    return invalid(format!(
                        "the view `{}` ({:?}) has another size than `{}`",
                        value.name,
                        value
                            .shape
                            .iter()
                            .map(|e| e.to_string())
                            .collect::<Vec<_>>(),
                        name(*src)
                    ));
                }
                if value.dtype != plan.values[*src].dtype {
                    return invalid(format!(
                        "the view `{}` changes the element type",
                        value.name
                    ));
                }
            }
            Storage::Arena(s) if *s >= plan.memory.slots.len() => {
                return invalid(format!(
                    "`{}` is in slot {s}, of {}",
                    value.name,
                    plan.memory.slots.len()
                ))
            }
            _ => {}
        }
    }
    for (i, (spec, v)) in plan.inputs.iter().enumerate() {
        in_range(*v, &format!("input `{}`", spec.name))?;
        if plan.values[*v].storage != Storage::Input(i) || plan.values[*v].dtype != spec.dtype {
            return invalid(format!("input `{}` is not its value", spec.name));
        }
    }
    for (spec, v) in &plan.outputs {
        in_range(*v, &format!("output `{}`", spec.name))?;
        if plan.values[*v].dtype != spec.dtype || plan.values[*v].shape != spec.shape {
            return invalid(format!(
                "output `{}` is not its value's type and shape",
                spec.name
            ));
        }
    }
    // Steps: read after written, each arena or owned value written once.
    let mut written = vec![false; n];
    for (v, value) in plan.values.iter().enumerate() {
        written[v] = matches!(
            value.storage,
            Storage::Input(_) | Storage::Constant(_) | Storage::Plumbing(_)
        );
    }
    let ready = |v: usize, written: &[bool]| written[plan.root(v)];
    for (k, step) in plan.steps.iter().enumerate() {
        for v in step.reads() {
            in_range(v, &format!("step {k}"))?;
            if !ready(v, &written) {
                return invalid(format!("step {k} reads `{}` before it is written", name(v)));
            }
        }
        match step {
            Step::Kernel {
                task,
                inputs,
                output,
            } => {
                let Some(t) = plan.tasks.get(*task) else {
                    return invalid(format!(
                        "step {k} runs task {task}, of {}",
                        plan.tasks.len()
                    ));
                };
                let w = &t.workload;
                in_range(*output, &format!("step {k}"))?;
                if inputs.len() != w.inputs.len() {
                    return invalid(format!(
                        "step {k} gives {w} {} inputs, it takes {}",
                        inputs.len(),
                        w.inputs.len()
                    ));
                }
                for (i, (&v, t)) in inputs.iter().zip(&w.inputs).enumerate() {
                    let value = &plan.values[v];
                    let want = match t.panels {
                        // Panels hold whole panels of rows: ⌈R/w⌉·w·C (per item).
                        Some(_) => numel(&t.stored_shape()),
                        // A plain run's caches have no room to spare.
                        None => numel(&t.shape).substitute(&plain),
                    };
                    let got = match (&value.storage, t.panels) {
                        (Storage::Constant(c), Some(_)) => {
                            Expr::Const(plan.constants[*c].shape.iter().product::<usize>() as i64)
                        }
                        _ => numel(&value.shape),
                    };
                    if value.dtype != DType::F32 || !same(&got, &want) {
                        return invalid(format!(
                            "step {k}: input {i} of {w} is `{}` ({} {got} elements), the kernel reads {want} floats",
                            value.name, value.dtype
                        ));
                    }
                }
                let out = &plan.values[*output];
                if !matches!(out.storage, Storage::Arena(_))
                    || out.dtype != DType::F32
                    || !same(&numel(&out.shape), &numel(&w.output.shape))
                {
                    return invalid(format!(
                        "step {k}: {w} writes `{}`, which is not an arena value of its output's size",
                        out.name
                    ));
                }
            }
            Step::Host(node) => {
                if anyshape_tensor::ops::op(&node.op).is_none() {
                    return invalid(format!(
                        "step {k} runs op {}, which anyshape does not know",
                        node.op
                    ));
                }
                for &v in &node.outputs {
                    in_range(v, &format!("step {k}"))?;
                    if plan.values[v].storage != Storage::Owned {
                        return invalid(format!(
                            "step {k} ({}) writes `{}`, which is not its own",
                            node.op,
                            name(v)
                        ));
                    }
                }
            }
        }
        for v in step.writes() {
            if written[v] {
                return invalid(format!("`{}` is written twice", name(v)));
            }
            written[v] = true;
        }
    }
    for (spec, v) in &plan.outputs {
        if !ready(*v, &written) {
            return invalid(format!("output `{}` is never written", spec.name));
        }
    }
    // Arena: values sharing a slot never alive at once; each fits its slot.
    let last = plan.last_uses();
    let mut holder: Vec<Option<usize>> = vec![None; plan.memory.slots.len()];
    for (k, step) in plan.steps.iter().enumerate() {
        for v in step.writes() {
            if let Storage::Arena(s) = plan.values[v].storage {
                if let Some(prev) = holder[s].filter(|&p| last[p] >= k) {
                    return invalid(format!(
                        "`{}` and `{}` share arena slot {s} while both are alive",
                        name(prev),
                        name(v)
                    ));
                }
                if !same(&plan.memory.slots[s], &numel(&plan.values[v].shape)) {
                    return invalid(format!("`{}` is not of its arena slot's size", name(v)));
                }
                holder[s] = Some(v);
            }
        }
    }
    caches(plan)?;
    // Constants: inside the data, on cache lines, as large as their shapes.
    for c in &plan.constants {
        let want = c.shape.iter().product::<usize>() as u64 * c.dtype.size_bytes() as u64;
        if c.offset % 64 != 0
            || c.bytes != want
            || c.offset.checked_add(c.bytes).is_none_or(|e| e > data_bytes)
        {
            return invalid(format!(
                "constant `{}`: {} bytes at {} (its shape takes {want}; the data holds {data_bytes})",
                c.name, c.bytes, c.offset
            ));
        }
    }
    Ok(())
}

/// Each cache: its past an input and its present an output, which a host `Concat` of
/// the past (or a view of it) and one more value makes, the one step to read the past; read by no host step and no view, only by
/// kernels whose workloads take the rows it holds past its end ([`CACHE_RESERVE`]),
/// so that a run may hold it in a buffer with room to grow.
fn caches(plan: &Plan) -> Result<()> {
    for (i, c) in plan.caches.iter().enumerate() {
        if let Err(PlanError::Invalid(why)) = check_cache(plan, c) {
            return invalid(format!("cache {i}: {why}"));
        }
    }
    Ok(())
}

/// Check one cache of `plan` (see `caches`); lowering keeps the caches that pass.
pub fn check_cache(plan: &Plan, c: &crate::Cache) -> Result<()> {
    {
        let bad = |why: &str| invalid(why.to_string());
        let (Some(&(_, past)), Some(&(_, present))) =
            (plan.inputs.get(c.past), plan.outputs.get(c.present))
        else {
            return bad("its past or present is out of range");
        };
        match plan.steps.get(c.step) {
            Some(Step::Host(node))
                if node.op == "Concat"
                    && node.inputs.len() == 2
                    && node.inputs[0].map(|v| plan.root(v)) == Some(past)
                    && node.inputs[1].is_some()
                    && node.outputs == [present] => {}
            _ => return bad("its step is no `Concat` of its past into its present"),
        }
        if c.axis >= plan.values[present].shape.len() {
            return bad("its axis is past its rank");
        }
        for (k, step) in plan.steps.iter().enumerate() {
            if k != c.step && step.reads().iter().any(|&v| plan.root(v) == past) {
                return bad("a step other than its `Concat` reads its past");
            }
            if !step.reads().contains(&present) {
                continue;
            }
            match step {
                Step::Kernel { task, .. }
                    if plan.tasks[*task]
                        .workload
                        .shape_vars()
                        .iter()
                        .any(|v| v == CACHE_RESERVE) => {}
                _ => return bad("a step reads it that cannot read it with room to spare"),
            }
        }
        if plan
            .values
            .iter()
            .any(|v| v.storage == Storage::View(present))
        {
            return bad("a view reads it");
        }
    }
    Ok(())
}

/// Check the sizes of `plan` at one instance: `shapes` are its values' shapes and
/// `slots` its arena slots' sizes in elements at the instance's `bindings`. Every view
/// has its source's elements, every kernel's buffers the lengths its bound workload
/// takes, every arena value fits its slot. `bound` holds each task's workload bound at
/// the instance after (its vectors reused: checking the next instance of a run
/// allocates nothing).
pub fn check_instance(
    plan: &Plan,
    shapes: &[Vec<usize>],
    slots: &[usize],
    bindings: &anyshape_ir::Bindings,
    bound: &mut Vec<anyshape_ir::BoundWorkload>,
) -> Result<()> {
    let count = |v: usize| shapes[v].iter().product::<usize>();
    let at = |what: String| invalid(format!("at {bindings}: {what}"));
    for (v, value) in plan.values.iter().enumerate() {
        match value.storage {
            Storage::View(src) if count(v) != count(src) => {
                return at(format!(
                    "the view `{}` has {} elements, `{}` {}",
                    value.name,
                    count(v),
                    plan.values[src].name,
                    count(src)
                ))
            }
            Storage::Arena(s) if count(v) > slots[s] => {
                return at(format!(
                    "`{}` has {} elements, its arena slot {}",
                    value.name,
                    count(v),
                    slots[s]
                ))
            }
            _ => {}
        }
    }
    bound.resize_with(plan.tasks.len(), Default::default);
    for (t, b) in plan.tasks.iter().zip(bound.iter_mut()) {
        t.workload.bind_into(bindings, b)?;
    }
    for (k, step) in plan.steps.iter().enumerate() {
        if let Step::Kernel {
            task,
            inputs,
            output,
        } = step
        {
            let w = &plan.tasks[*task].workload;
            let bound = &bound[*task];
            for (i, &v) in inputs.iter().chain([output]).enumerate() {
                let len = match plan.values[plan.root(v)].storage {
                    Storage::Constant(c) => plan.constants[c].shape.iter().product(),
                    _ => count(v),
                };
                if len != bound.lens[i] {
                    return at(format!(
                        "step {k}: {w} takes {} elements in its tensor {i}, `{}` has {len}",
                        bound.lens[i], plan.values[v].name
                    ));
                }
            }
        }
    }
    Ok(())
}
