//! Running a plan ([`Executor`]): the inputs bound (the dims they imply), the run
//! prepared for those dims (every value's shape, the arena's slots, each task's
//! shape-var values — once per binding, with the sizes checked at the instance and the
//! memory the run needs checked first), then each step in order — a kernel step calls
//! its task's kernels ([`TaskKernels`]) on buffers in place (the caller's inputs, the
//! constants in the mapped plan, the arena), a host step evaluates its op on borrowed
//! views of the same — and the outputs copied out. A decoder's run may keep its
//! caches in a [`CacheState`] instead ([`Executor::run_cached`]): its new rows appended
//! there, its kernels reading them in place.
use crate::arena::{Arena, Prepared};
use crate::error::internal;
use crate::{CacheState, Result, RuntimeError};
use anyshape_ir::{Bindings, CACHE_RESERVE};
use anyshape_plan::{Plan, PlanFile, Step, Storage};
use anyshape_tensor::{bind, DType, DataRef, Tensor, TensorError, TensorRef, TensorSpec, ValueId};
use std::sync::Mutex;
use std::time::Instant;

/// What runs a plan's kernel steps: a model's task modules, or (in tests) the
/// workloads' reference.
pub trait TaskKernels {
    /// Compute task `task` at `vars` (its workload's shape vars' values, in the
    /// workload's order) from `ins` into `out`.
    ///
    /// # Safety
    /// As [`crate::Module::call`]: the buffers hold the bound workload's tensors.
    unsafe fn call(
        &self,
        task: usize,
        vars: &[i64],
        ins: &[*const f32],
        out: *mut f32,
    ) -> Result<()>;
}

/// A plan ready to run any number of times, from several threads at once: its
/// constants in place, what runs need precomputed, and the arenas of finished runs kept
/// for the next (a run takes one, or makes one).
pub struct Executor {
    plan: PlanFile,
    inputs: Vec<TensorSpec>,
    /// Each task's shape vars, in its workload's order.
    task_vars: Vec<Vec<String>>,
    /// The last step that reads each value (see [`Plan::last_uses`]).
    last_uses: Vec<usize>,
    /// Whether a task reads a cache with rows to spare ([`CACHE_RESERVE`], 0 in a
    /// plain run).
    reserve: bool,
    arenas: Mutex<Vec<Arena>>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

impl Executor {
    /// An executor of `plan` (verified when it was made or opened).
    pub fn new(plan: PlanFile) -> Executor {
        let p = plan.plan();
        Executor {
            task_vars: p.tasks.iter().map(|t| t.workload.shape_vars()).collect(),
            inputs: p.inputs.iter().map(|(s, _)| s.clone()).collect(),
            last_uses: p.last_uses(),
            reserve: p
                .tasks
                .iter()
                .any(|t| t.workload.shape_vars().iter().any(|v| v == CACHE_RESERVE)),
            arenas: Mutex::new(Vec::new()),
            plan,
        }
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        self.plan.plan()
    }

    /// The inputs a run takes.
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    /// Run the plan on `inputs` (by name), its kernel steps by `kernels`; with `seconds`
    /// (one per step), add each step's wall time. The outputs in the plan's order.
    pub fn run(
        &self,
        kernels: &dyn TaskKernels,
        inputs: &[(&str, TensorRef)],
        seconds: Option<&mut [f64]>,
    ) -> Result<Vec<Tensor>> {
        let (given, mut b) = bind(&self.inputs, inputs)?;
        if self.reserve {
            b.set(CACHE_RESERVE, 0);
        }
        let given: Vec<Option<TensorRef>> = given.into_iter().map(Some).collect();
        let outputs = self.on_arena(kernels, &b, &given, seconds, None)?;
        Ok(outputs.into_iter().flatten().collect())
    }

    /// Empty caches for [`Executor::run_cached`] with room for `capacity` positions,
    /// their other dims (the batch) at `dims`.
    pub fn cache_state(&self, dims: &Bindings, capacity: usize) -> Result<CacheState> {
        CacheState::new(self.plan(), dims, capacity)
    }

    /// Run the plan keeping a decoder's caches in `state`: `inputs` without the caches'
    /// pasts (the past length is what `state` holds); the new rows appended to `state`.
    /// The outputs in the plan's order, the caches' presents `None` (they stay in
    /// `state`).
    pub fn run_cached(
        &self,
        kernels: &dyn TaskKernels,
        inputs: &[(&str, TensorRef)],
        state: &mut CacheState,
        seconds: Option<&mut [f64]>,
    ) -> Result<Vec<Option<Tensor>>> {
        let plan = self.plan();
        let pasts: Vec<usize> = plan.caches.iter().map(|c| c.past).collect();
        let declared: Vec<TensorSpec> = (0..self.inputs.len())
            .filter(|i| !pasts.contains(i))
            .map(|i| self.inputs[i].clone())
            .collect();
        let (some, mut b) = bind(&declared, inputs)?;
        let rows = state.bind(plan, &mut b)?;
        // The inputs' dims again with the past bound (a mask's past + sequence).
        for (d, t) in declared.iter().zip(&some) {
            for (e, &v) in d.shape.iter().zip(t.shape) {
                let want = e.eval(&b)?;
                if want != v as i64 {
                    return Err(TensorError::Shape(format!(
                        "input `{}`: a dim is {v} where the model's {e} gives {want} with the {} positions the caches hold",
                        d.name,
                        state.len()
                    ))
                    .into());
                }
            }
        }
        let mut some = some.into_iter();
        let given: Vec<Option<TensorRef>> = (0..self.inputs.len())
            .map(|i| {
                if pasts.contains(&i) {
                    None
                } else {
                    some.next()
                }
            })
            .collect();
        let outputs = self.on_arena(kernels, &b, &given, seconds, Some(&mut *state))?;
        state.grow(rows);
        Ok(outputs)
    }

    /// A run at `b` on an arena from the pool (returned to it after).
    fn on_arena(
        &self,
        kernels: &dyn TaskKernels,
        b: &Bindings,
        given: &[Option<TensorRef>],
        seconds: Option<&mut [f64]>,
        state: Option<&mut CacheState>,
    ) -> Result<Vec<Option<Tensor>>> {
        let mut arena = self
            .arenas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        let result = self
            .prepare(&mut arena, b, state.as_deref())
            .and_then(|()| self.steps(kernels, &arena, given, seconds, state));
        self.arenas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(arena);
        result
    }

    /// Prepare `arena` for a run at `b`: shapes (a kept cache's present: its buffer's,
    /// with the rows to spare), slots and the tasks' shape-var values; the sizes
    /// checked at this instance, the arena and the host steps' tensors checked against
    /// the machine's memory, and the arena grown to size.
    fn prepare(&self, arena: &mut Arena, b: &Bindings, state: Option<&CacheState>) -> Result<()> {
        if arena.is_for(b) {
            return Ok(());
        }
        let plan = self.plan();
        let mut shapes = (0..plan.values.len())
            .map(|v| plan.shape_at(v, b))
            .collect::<anyshape_plan::Result<Vec<_>>>()?;
        if let Some(state) = state {
            for (i, c) in plan.caches.iter().enumerate() {
                shapes[plan.outputs[c.present].1] = state.shape(i).to_vec();
            }
        }
        let layout = plan.memory.layout(b)?;
        anyshape_plan::check_instance(plan, &shapes, &layout.sizes, b)?;
        let owned = owned_peak(plan, &shapes, &self.last_uses);
        let memory = |e: String| {
            RuntimeError::Memory(format!(
                "{e}: run the model at smaller dims (the inputs' shapes set them)"
            ))
        };
        anyshape_abi::check_fits(layout.bytes as u128 + owned, "the run's tensors")
            .map_err(memory)?;
        if !arena.reserve(layout.bytes) {
            return Err(memory(format!(
                "the run's arena needs {:.2} GiB, which the allocator refuses",
                anyshape_abi::gib(layout.bytes as u128)
            )));
        }
        let vars = self
            .task_vars
            .iter()
            .map(|names| names.iter().map(|n| b.get(n).unwrap_or(0)).collect())
            .collect();
        arena.prepared = Some(Prepared {
            bindings: b.clone(),
            shapes,
            layout,
            vars,
        });
        Ok(())
    }

    /// The steps of a run prepared in `arena`, on `given` (the inputs in the plan's
    /// order).
    fn steps(
        &self,
        kernels: &dyn TaskKernels,
        arena: &Arena,
        given: &[Option<TensorRef>],
        mut seconds: Option<&mut [f64]>,
        mut state: Option<&mut CacheState>,
    ) -> Result<Vec<Option<Tensor>>> {
        let plan = self.plan();
        let prepared = arena.prepared.as_ref().expect("prepared before the run");
        let mut values = Values {
            plan,
            file: &self.plan,
            given,
            prepared,
            base: arena.base(),
            owned: vec![None; plan.values.len()],
        };
        for (v, value) in plan.values.iter().enumerate() {
            if let Storage::Plumbing(x) = &value.storage {
                let elements = x
                    .iter()
                    .map(|e| e.eval(&prepared.bindings))
                    .collect::<anyshape_ir::Result<Vec<i64>>>()?;
                values.owned[v] = Some(Tensor::i64(prepared.shapes[v].clone(), elements)?);
            }
        }
        let last = &self.last_uses;
        // The kept caches' presents and appending steps.
        let kept: Vec<(ValueId, usize)> = match state {
            Some(_) => plan
                .caches
                .iter()
                .map(|c| (plan.outputs[c.present].1, c.step))
                .collect(),
            None => Vec::new(),
        };
        for (k, step) in plan.steps.iter().enumerate() {
            let started = seconds.is_some().then(Instant::now);
            let append = kept.iter().position(|&(_, s)| s == k);
            match step {
                Step::Host(node) if append.is_some() => {
                    let (c, state) = (append.unwrap_or(0), state.as_deref_mut());
                    let new = node.inputs[1]
                        .ok_or_else(|| internal("a cache's step without its new rows"))?;
                    let new = values.view(new)?;
                    let axis = plan.caches[c].axis;
                    state
                        .ok_or_else(|| internal("kept caches without their state"))?
                        .append(c, axis, new.shape, new.as_f32()?)?;
                }
                Step::Kernel {
                    task,
                    inputs,
                    output,
                } => {
                    let ins = inputs
                        .iter()
                        .map(
                            |&v| match kept.iter().position(|&(p, _)| p == plan.root(v)) {
                                Some(c) => state
                                    .as_deref()
                                    .map(|s| s.data(c))
                                    .ok_or_else(|| internal("kept caches without their state")),
                                None => Ok(values.view(v)?.as_f32()?.as_ptr()),
                            },
                        )
                        .collect::<Result<Vec<*const f32>>>()?;
                    let Storage::Arena(slot) = plan.values[*output].storage else {
                        unreachable!("verified: a kernel writes an arena value")
                    };
                    // SAFETY: the output slot lies in the reserved arena and holds the
                    // output's elements at this run's shapes; the inputs are the
                    // workload's tensors at those shapes (checked at this instance);
                    // the memory plan never gives a kernel's output the slot of a value
                    // it reads.
                    unsafe {
                        let out = values.base.add(prepared.layout.offsets[slot]).cast::<f32>();
                        kernels.call(*task, &prepared.vars[*task], &ins, out)?;
                    }
                }
                Step::Host(node) => {
                    let outs = {
                        let ins = node
                            .inputs
                            .iter()
                            .map(|i| i.map(|v| values.view(v)).transpose())
                            .collect::<Result<Vec<_>>>()?;
                        let op = anyshape_tensor::ops::op(&node.op)
                            .expect("verified: every host op is registered");
                        (op.eval)(node, &ins)?
                    };
                    for (&v, t) in node.outputs.iter().zip(outs) {
                        if t.shape != prepared.shapes[v] {
                            return Err(TensorError::Shape(format!(
                                "node `{}` ({}) made `{}` of shape {:?} where the plan has {:?} (a shape rule differs from the op's evaluation)",
                                node.name, node.op, plan.values[v].name, t.shape, prepared.shapes[v]
                            ))
                            .into());
                        }
                        values.owned[v] = Some(t);
                    }
                }
            }
            if let (Some(t), Some(s)) = (started, seconds.as_deref_mut()) {
                s[k] += t.elapsed().as_secs_f64();
            }
            // Host tensors no later step reads are freed.
            for v in step.reads().into_iter().chain(step.writes()) {
                let r = plan.root(v);
                if last[r] == k && plan.values[r].storage == Storage::Owned {
                    values.owned[r] = None;
                }
            }
        }
        // A host step's tensor is handed out, not copied, to the last output that
        // reads it (a decoder's caches: the whole cache each step); the rest are copied.
        let mut outputs = Vec::with_capacity(plan.outputs.len());
        for (i, &(_, v)) in plan.outputs.iter().enumerate() {
            let r = plan.root(v);
            if kept.iter().any(|&(p, _)| p == r) {
                outputs.push(None);
                continue;
            }
            let later = plan.outputs[i + 1..]
                .iter()
                .any(|&(_, w)| plan.root(w) == r);
            let handed = (plan.values[r].storage == Storage::Owned && !later)
                .then(|| values.owned[r].take())
                .flatten();
            outputs.push(Some(match handed {
                Some(mut t) => {
                    t.shape.clone_from(&prepared.shapes[v]);
                    t
                }
                None => values.view(v)?.to_tensor(),
            }));
        }
        Ok(outputs)
    }
}

/// Bytes of one element of `dtype`.
fn width(dtype: DType) -> u128 {
    match dtype {
        DType::F32 => 4,
        DType::I64 => 8,
        DType::Bool => 1,
    }
}

/// The most bytes the host steps' own tensors take at once at these shapes: each
/// step's outputs from the step that makes them to the last that reads them, and while
/// a step runs twice its outputs besides (the index walks of broadcasts and gathers).
fn owned_peak(plan: &Plan, shapes: &[Vec<usize>], last: &[usize]) -> u128 {
    let size = |v: usize| -> u128 {
        shapes[v]
            .iter()
            .fold(1u128, |n, &d| n.saturating_mul(d as u128))
            .saturating_mul(width(plan.values[v].dtype))
    };
    let (mut live, mut peak) = (0u128, 0u128);
    let mut held: Vec<usize> = Vec::new();
    for (k, step) in plan.steps.iter().enumerate() {
        if let Step::Host(node) = step {
            let made: u128 = node.outputs.iter().map(|&v| size(v)).sum();
            live = live.saturating_add(made);
            peak = peak.max(live.saturating_add(made.saturating_mul(2)));
            held.extend(&node.outputs);
        }
        held.retain(|&v| {
            let dead = last[v] <= k;
            if dead {
                live = live.saturating_sub(size(v));
            }
            !dead
        });
    }
    peak
}

/// Where a run's values are.
struct Values<'a> {
    plan: &'a Plan,
    file: &'a PlanFile,
    given: &'a [Option<TensorRef<'a>>],
    prepared: &'a Prepared,
    base: *mut u8,
    /// Host steps' tensors and evaluated shape plumbing, by value.
    owned: Vec<Option<Tensor>>,
}

impl Values<'_> {
    /// Value `v` as a tensor in place (its root's elements under its own shape).
    fn view(&self, v: usize) -> Result<TensorRef<'_>> {
        let r = self.plan.root(v);
        let shape = &self.prepared.shapes[v];
        let data = match &self.plan.values[r].storage {
            Storage::Input(i) => {
                self.given[*i]
                    .ok_or_else(|| internal("a kept cache's past read on the host"))?
                    .data
            }
            Storage::Constant(c) => self.file.constant(*c).data,
            Storage::Arena(s) => {
                let n: usize = shape.iter().product();
                let at = self.prepared.layout.offsets[*s];
                // SAFETY: the slot holds `n` floats at this run's shapes (checked at
                // the instance; the arena was reserved to the layout), written by the
                // step that made the value (verified: values are written before they
                // are read), and no kernel writes it while this view lives.
                DataRef::F32(unsafe {
                    std::slice::from_raw_parts(self.base.add(at).cast::<f32>(), n)
                })
            }
            Storage::Owned | Storage::Plumbing(_) => self.owned[r]
                .as_ref()
                .ok_or_else(|| {
                    RuntimeError::Plan(anyshape_plan::PlanError::Invalid(format!(
                        "`{}` is read after it was freed",
                        self.plan.values[r].name
                    )))
                })?
                .data
                .view(),
            Storage::View(_) => unreachable!("a root is no view"),
        };
        Ok(TensorRef::new(shape, data)?)
    }
}
