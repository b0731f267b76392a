//! Running a plan ([`Executor`]): the inputs bound (the dims they imply), the run
//! prepared for those dims (every value's shape, the arena's slots, each task's
//! shape-var values — once per binding, with the sizes checked at the instance and the
//! memory the run needs checked first), then each step in order — a kernel step calls
//! its task's kernels ([`TaskKernels`]) on buffers in place (the caller's inputs, the
//! constants in the mapped plan, the arena), a host step evaluates its op on borrowed
//! views of the same (into the tensors it kept from the last run where the op can) —
//! and the outputs copied out. A decoder's run may keep its caches in a [`CacheState`]
//! instead ([`Executor::run_cached`]): its new rows appended there, its kernels
//! reading them in place; given the last step's outputs to write into, such a step
//! allocates nothing.
use crate::arena::Arena;
use crate::error::internal;
use crate::{CacheState, Result, RuntimeError};
use anyshape_ir::{Bindings, CACHE_RESERVE};
use anyshape_plan::{Plan, PlanFile, Step, Storage};
use anyshape_tensor::{
    Binder, DType, DataRef, Tensor, TensorError, TensorRef, TensorSpec, ValueId,
};
use smallvec::SmallVec;
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
    /// Whether a task reads a cache with rows to spare ([`CACHE_RESERVE`], 0 in a
    /// plain run).
    reserve: bool,
    /// Binds a run's inputs.
    binder: Binder,
    /// Binds a run's inputs without the kept caches' pasts ([`Executor::run_cached`]).
    cached: Binder,
    /// The plan's index of each input `cached` binds.
    cached_inputs: Vec<usize>,
    /// Per step, the host steps' values no later step reads.
    frees: Vec<Vec<ValueId>>,
    /// Per value, whether its tensor stays from run to run (an op that evaluates into
    /// given outputs makes it).
    keeps: Vec<bool>,
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
        let inputs: Vec<TensorSpec> = p.inputs.iter().map(|(s, _)| s.clone()).collect();
        let cached_inputs: Vec<usize> = (0..inputs.len())
            .filter(|&i| !p.caches.iter().any(|c| c.past == i))
            .collect();
        let cached_specs: Vec<TensorSpec> =
            cached_inputs.iter().map(|&i| inputs[i].clone()).collect();
        let last_uses = p.last_uses();
        let frees = p
            .steps
            .iter()
            .enumerate()
            .map(|(k, step)| {
                let mut dead: Vec<ValueId> = step
                    .reads()
                    .into_iter()
                    .chain(step.writes())
                    .map(|v| p.root(v))
                    .filter(|&r| last_uses[r] == k && p.values[r].storage == Storage::Owned)
                    .collect();
                dead.sort_unstable();
                dead.dedup();
                dead
            })
            .collect();
        let mut keeps = vec![false; p.values.len()];
        for step in &p.steps {
            if let Step::Host(node) = step {
                if host_into(node).is_some() {
                    for &v in &node.outputs {
                        keeps[v] = true;
                    }
                }
            }
        }
        Executor {
            keeps,
            task_vars: p.tasks.iter().map(|t| t.workload.shape_vars()).collect(),
            binder: Binder::new(&inputs),
            cached: Binder::new(&cached_specs),
            cached_inputs,
            frees,
            inputs,
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
        let mut outputs: Vec<Option<Tensor>> = Vec::new();
        outputs.resize_with(self.plan().outputs.len(), || None);
        self.with_arena(|arena| {
            self.binder
                .bind(inputs, &mut arena.bindings, &mut arena.at)?;
            if self.reserve {
                arena.bindings.update(CACHE_RESERVE, 0);
            }
            arena.given.clear();
            arena.given.extend(arena.at.iter().map(|&g| Some(g)));
            self.prepare(arena, None)?;
            self.steps(kernels, arena, inputs, seconds, None, &mut outputs)
        })?;
        Ok(outputs.into_iter().flatten().collect())
    }

    /// Empty caches for [`Executor::run_cached`] with room for `capacity` positions,
    /// their other dims (the batch) at `dims`.
    pub fn cache_state(&self, dims: &Bindings, capacity: usize) -> Result<CacheState> {
        CacheState::new(self.plan(), dims, capacity)
    }

    /// Run the plan keeping a decoder's caches in `state`: `inputs` without the caches'
    /// pasts (the past length is what `state` holds); the new rows appended to `state`.
    /// The outputs are written into `outputs` (one per plan output; a tensor there is
    /// reused where it has room, so that a decoder's loop that passes the last step's
    /// outputs allocates nothing), the caches' presents `None` (they stay in `state`).
    pub fn run_cached(
        &self,
        kernels: &dyn TaskKernels,
        inputs: &[(&str, TensorRef)],
        state: &mut CacheState,
        outputs: &mut [Option<Tensor>],
        seconds: Option<&mut [f64]>,
    ) -> Result<()> {
        let plan = self.plan();
        if outputs.len() != plan.outputs.len() {
            return Err(internal("outputs that are not the plan's"));
        }
        self.with_arena(|arena| {
            self.cached.bind(inputs, &mut arena.bindings, &mut arena.at)?;
            let b = &mut arena.bindings;
            let rows = state.bind(plan, b)?;
            // The inputs' dims again with the past bound (a mask's past + sequence).
            for (d, &g) in self.cached.declared().iter().zip(&arena.at) {
                for (e, &v) in d.shape.iter().zip(inputs[g].1.shape) {
                    let want = e.eval(b)?;
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
            arena.given.clear();
            arena.given.resize(self.inputs.len(), None);
            for (&i, &g) in self.cached_inputs.iter().zip(&arena.at) {
                arena.given[i] = Some(g);
            }
            self.make_room(arena, state, rows)?;
            self.prepare(arena, Some(state))?;
            self.steps(kernels, arena, inputs, seconds, Some(&mut *state), outputs)?;
            state.grow(rows);
            Ok(())
        })
    }

    /// `f` on an arena from the pool (returned to it after).
    fn with_arena<T>(&self, f: impl FnOnce(&mut Arena) -> Result<T>) -> Result<T> {
        let mut arena = self
            .arenas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        let result = f(&mut arena);
        self.arenas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(arena);
        result
    }

    /// Before a run that appends `rows` positions to `state`: where the arena was not
    /// made for caches this large, reserve it and the host steps' kept tensors for the
    /// longest run `state` has room for (the same new rows at the last past; a dim of
    /// the past and the new rows together at the capacity), so that the runs up to it
    /// allocate nothing as the past grows.
    fn make_room(&self, arena: &mut Arena, state: &CacheState, rows: usize) -> Result<()> {
        let plan = self.plan();
        let Some(past) = CacheState::past_dim(plan) else {
            return Ok(());
        };
        if arena.room >= state.capacity() {
            return Ok(());
        }
        let b = &mut arena.bindings;
        let now = b.clone();
        // A dim bound to the past and the new rows together that the caches' shapes
        // are not made of (a mask's own length, where the export names no sums) grows
        // with the past.
        let total = (state.len() + rows) as i64;
        let own: Vec<String> = plan
            .caches
            .iter()
            .flat_map(|c| &plan.values[plan.outputs[c.present].1].shape)
            .flat_map(|e| e.vars())
            .collect();
        let grown: Vec<String> = now
            .iter()
            .filter(|&(n, v)| v == total && n != CACHE_RESERVE && !own.iter().any(|o| o == n))
            .map(|(n, _)| n.to_string())
            .collect();
        for n in &grown {
            b.update(n, state.capacity() as i64);
        }
        b.update(past, state.capacity().saturating_sub(rows) as i64);
        b.update(CACHE_RESERVE, 0);
        // The arena's bytes and every value's shape there.
        let sizes = (|| -> Result<(usize, Vec<Vec<usize>>)> {
            let shapes = (0..plan.values.len())
                .map(|v| plan.shape_at(v, b))
                .collect::<anyshape_plan::Result<_>>()?;
            Ok((plan.memory.bytes(b)?, shapes))
        })();
        b.assign(&now);
        let (bytes, shapes) = sizes?;
        // Checked as `prepare` checks a run, so that the runs up to it check nothing.
        let total = bytes as u128 + owned_peak(plan, &shapes, &self.frees, &self.keeps);
        anyshape_abi::check_fits(total, "the run's tensors at the caches' length")
            .map_err(|e| RuntimeError::Memory(format!("{e}: generate fewer tokens")))?;
        arena.checked = arena.checked.max(total);
        // The tensors the host steps keep, at their largest.
        let mut kept = Vec::new();
        for (k, step) in plan.steps.iter().enumerate() {
            let Step::Host(node) = step else { continue };
            if plan.caches.iter().any(|c| c.step == k) || host_into(node).is_none() {
                continue;
            }
            kept.extend(
                node.outputs
                    .iter()
                    .map(|&v| (v, shapes[v].iter().product::<usize>())),
            );
        }
        if !arena.reserve(bytes) {
            return Err(RuntimeError::Memory(format!(
                "the run's arena needs {:.2} GiB, which the allocator refuses",
                anyshape_abi::gib(bytes as u128)
            )));
        }
        arena.owned.resize_with(plan.values.len(), || None);
        for (v, n) in kept {
            arena.owned[v]
                .get_or_insert_with(|| Tensor {
                    shape: Vec::with_capacity(plan.values[v].shape.len()),
                    data: empty(plan.values[v].dtype),
                })
                .reserve(n);
        }
        arena.room = state.capacity();
        Ok(())
    }

    /// Prepare `arena` for a run at its bindings: shapes (a kept cache's present: its
    /// buffer's, with the rows to spare), slots and the tasks' shape-var values; the
    /// sizes checked at this instance, the arena and the host steps' tensors checked
    /// against the machine's memory, and the arena grown to size. Into the vectors of
    /// the last preparation: nothing is allocated where they have room.
    fn prepare(&self, arena: &mut Arena, state: Option<&CacheState>) -> Result<()> {
        if arena.is_for(&arena.bindings) {
            return Ok(());
        }
        let plan = self.plan();
        let b = &arena.bindings;
        let p = &mut arena.prepared;
        p.valid = false;
        p.bindings.assign(b);
        p.shapes.resize_with(plan.values.len(), Vec::new);
        for (v, shape) in p.shapes.iter_mut().enumerate() {
            plan.shape_into(v, b, shape)?;
        }
        if let Some(state) = state {
            for (i, c) in plan.caches.iter().enumerate() {
                let shape = &mut p.shapes[plan.outputs[c.present].1];
                shape.clear();
                shape.extend_from_slice(state.shape(i));
            }
        }
        plan.memory.layout_into(b, &mut p.layout)?;
        anyshape_plan::check_instance(plan, &p.shapes, &p.layout.sizes, b, &mut p.bound)?;
        let owned = owned_peak(plan, &p.shapes, &self.frees, &self.keeps);
        let memory = |e: String| {
            RuntimeError::Memory(format!(
                "{e}: run the model at smaller dims (the inputs' shapes set them)"
            ))
        };
        let total = p.layout.bytes as u128 + owned;
        if total > arena.checked {
            anyshape_abi::check_fits(total, "the run's tensors").map_err(memory)?;
            arena.checked = total;
        }
        let bytes = p.layout.bytes;
        p.vars.resize_with(self.task_vars.len(), Vec::new);
        for (vars, names) in p.vars.iter_mut().zip(&self.task_vars) {
            vars.clear();
            vars.extend(names.iter().map(|n| b.get(n).unwrap_or(0)));
        }
        if !arena.reserve(bytes) {
            return Err(memory(format!(
                "the run's arena needs {:.2} GiB, which the allocator refuses",
                anyshape_abi::gib(bytes as u128)
            )));
        }
        arena.prepared.valid = true;
        Ok(())
    }

    /// The steps of a run prepared in `arena`, on `inputs` (`arena.given` says which
    /// is the plan's each input), the outputs written into `outputs`.
    fn steps(
        &self,
        kernels: &dyn TaskKernels,
        arena: &mut Arena,
        inputs: &[(&str, TensorRef)],
        mut seconds: Option<&mut [f64]>,
        mut state: Option<&mut CacheState>,
        outputs: &mut [Option<Tensor>],
    ) -> Result<()> {
        let plan = self.plan();
        let base = arena.base();
        let Arena {
            prepared,
            given,
            owned,
            ..
        } = arena;
        owned.resize_with(plan.values.len(), || None);
        let mut values = Values {
            plan,
            file: &self.plan,
            inputs,
            given,
            prepared,
            base,
            owned,
        };
        for (v, value) in plan.values.iter().enumerate() {
            if let Storage::Plumbing(x) = &value.storage {
                let t = values.owned[v].get_or_insert_with(|| Tensor::scalar_i64(0));
                t.fit(DType::I64, &prepared.shapes[v])?;
                for (o, e) in t.i64_mut()?.iter_mut().zip(x) {
                    *o = e.eval(&prepared.bindings)?;
                }
            }
        }
        // A kept cache's present (its index among the caches) and its appending step.
        let keeping = state.is_some();
        let kept = |v: ValueId| match keeping {
            true => plan
                .caches
                .iter()
                .position(|c| plan.outputs[c.present].1 == plan.root(v)),
            false => None,
        };
        for (k, step) in plan.steps.iter().enumerate() {
            let started = seconds.is_some().then(Instant::now);
            let append = match state {
                Some(_) => plan.caches.iter().position(|c| c.step == k),
                None => None,
            };
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
                        .map(|&v| match kept(v) {
                            Some(c) => state
                                .as_deref()
                                .map(|s| s.data(c))
                                .ok_or_else(|| internal("kept caches without their state")),
                            None => Ok(values.view(v)?.as_f32()?.as_ptr()),
                        })
                        .collect::<Result<SmallVec<[*const f32; 8]>>>()?;
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
                Step::Host(node) => values.host(node)?,
            }
            if let (Some(t), Some(s)) = (started, seconds.as_deref_mut()) {
                s[k] += t.elapsed().as_secs_f64();
            }
            // Host tensors no later step reads are freed (those of ops that evaluate
            // into given outputs stay for the next run).
            for &r in &self.frees[k] {
                if !self.keeps[r] {
                    values.owned[r] = None;
                }
            }
        }
        // A host step's tensor is handed out, not copied, to the last output that
        // reads it where the caller gives no tensor to write into (a decoder's caches:
        // the whole cache each step); the rest are copied.
        for (i, &(_, v)) in plan.outputs.iter().enumerate() {
            let r = plan.root(v);
            if kept(v).is_some() {
                outputs[i] = None;
                continue;
            }
            let shape = &prepared.shapes[v];
            if let Some(t) = outputs[i].as_mut() {
                let view = values.view(v)?;
                t.fit(view.dtype(), shape)?;
                match (view.data, &mut t.data) {
                    (DataRef::F32(x), anyshape_tensor::Data::F32(y)) => y.copy_from_slice(x),
                    (DataRef::I64(x), anyshape_tensor::Data::I64(y)) => y.copy_from_slice(x),
                    (DataRef::Bool(x), anyshape_tensor::Data::Bool(y)) => y.copy_from_slice(x),
                    _ => return Err(internal("an output's type changed")),
                }
                continue;
            }
            let later = plan.outputs[i + 1..]
                .iter()
                .any(|&(_, w)| plan.root(w) == r);
            let handed = (plan.values[r].storage == Storage::Owned && !later)
                .then(|| values.owned[r].take())
                .flatten();
            outputs[i] = Some(match handed {
                Some(mut t) => {
                    t.shape.clone_from(shape);
                    t
                }
                None => values.view(v)?.to_tensor(),
            });
        }
        Ok(())
    }
}

/// The op's evaluation into given outputs, where it has one.
fn host_into(node: &anyshape_tensor::Node) -> Option<anyshape_tensor::ops::EvalIntoFn> {
    anyshape_tensor::ops::op(&node.op).and_then(|o| o.eval_into)
}

/// No elements of `dtype`.
fn empty(dtype: DType) -> anyshape_tensor::Data {
    match dtype {
        DType::F32 => anyshape_tensor::Data::F32(Vec::new()),
        DType::I64 => anyshape_tensor::Data::I64(Vec::new()),
        DType::Bool => anyshape_tensor::Data::Bool(Vec::new()),
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
/// step's outputs from the step that makes them to the last that reads them (`frees`:
/// per step, those that die after it; kept for the whole run where the op evaluates
/// into kept tensors), and while a step runs twice its outputs besides (the index
/// walks of broadcasts and gathers).
fn owned_peak(plan: &Plan, shapes: &[Vec<usize>], frees: &[Vec<ValueId>], keeps: &[bool]) -> u128 {
    let size = |v: usize| -> u128 {
        shapes[v]
            .iter()
            .fold(1u128, |n, &d| n.saturating_mul(d as u128))
            .saturating_mul(width(plan.values[v].dtype))
    };
    let (mut live, mut peak) = (0u128, 0u128);
    for (k, step) in plan.steps.iter().enumerate() {
        if let Step::Host(node) = step {
            let made: u128 = node.outputs.iter().map(|&v| size(v)).sum();
            live = live.saturating_add(made);
            peak = peak.max(live.saturating_add(made.saturating_mul(2)));
        }
        for &v in &frees[k] {
            if !keeps[v] {
                live = live.saturating_sub(size(v));
            }
        }
    }
    peak
}

/// Where a run's values are.
struct Values<'a> {
    plan: &'a Plan,
    file: &'a PlanFile,
    /// The tensors the caller gave.
    inputs: &'a [(&'a str, TensorRef<'a>)],
    /// For each of the plan's inputs, its index among `inputs`.
    given: &'a [Option<usize>],
    prepared: &'a crate::arena::Prepared,
    base: *mut u8,
    /// Host steps' tensors and evaluated shape plumbing, by value.
    owned: &'a mut Vec<Option<Tensor>>,
}

impl Values<'_> {
    /// Value `v` as a tensor in place (its root's elements under its own shape).
    fn view(&self, v: usize) -> Result<TensorRef<'_>> {
        let r = self.plan.root(v);
        let shape = &self.prepared.shapes[v];
        let data = match &self.plan.values[r].storage {
            Storage::Input(i) => {
                let g = self.given[*i]
                    .ok_or_else(|| internal("a kept cache's past read on the host"))?;
                self.inputs[g].1.data
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

    /// Evaluate host step `node`: into the tensors its outputs kept from the last run
    /// where its op can (fitted to this run's shapes), else into new ones checked
    /// against the plan's shapes.
    fn host(&mut self, node: &anyshape_tensor::Node) -> Result<()> {
        let op = anyshape_tensor::ops::op(&node.op).expect("verified: every host op is registered");
        if let Some(into) = op.eval_into {
            let mut outs: SmallVec<[Tensor; 4]> = SmallVec::new();
            for &v in &node.outputs {
                let mut t = self.owned[v].take().unwrap_or_else(|| Tensor {
                    shape: Vec::new(),
                    data: empty(self.plan.values[v].dtype),
                });
                t.fit(self.plan.values[v].dtype, &self.prepared.shapes[v])?;
                outs.push(t);
            }
            let done = {
                let ins = node
                    .inputs
                    .iter()
                    .map(|i| i.map(|v| self.view(v)).transpose())
                    .collect::<Result<SmallVec<[_; 8]>>>()?;
                into(node, &ins, &mut outs)
            };
            for (&v, t) in node.outputs.iter().zip(outs) {
                self.owned[v] = Some(t);
            }
            return Ok(done?);
        }
        let outs = {
            let ins = node
                .inputs
                .iter()
                .map(|i| i.map(|v| self.view(v)).transpose())
                .collect::<Result<Vec<_>>>()?;
            (op.eval)(node, &ins)?
        };
        for (&v, t) in node.outputs.iter().zip(outs) {
            if t.shape != self.prepared.shapes[v] {
                return Err(TensorError::Shape(format!(
                    "node `{}` ({}) made `{}` of shape {:?} where the plan has {:?} (a shape rule differs from the op's evaluation)",
                    node.name, node.op, self.plan.values[v].name, t.shape, self.prepared.shapes[v]
                ))
                .into());
            }
            self.owned[v] = Some(t);
        }
        Ok(())
    }
}
