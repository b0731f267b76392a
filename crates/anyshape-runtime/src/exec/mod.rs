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
//! allocates nothing. Preparing a run is `prepare.rs`'s; where its values are and a
//! host step on them, `values.rs`'s.
mod prepare;
mod values;

use crate::arena::Arena;
use crate::error::internal;
use crate::{CacheState, Result};
use anyshape_ir::{Bindings, Expr, CACHE_RESERVE};
use anyshape_plan::{Plan, PlanFile, Step, Storage};
use anyshape_tensor::ops::OpSpec;
use anyshape_tensor::{
    Binder, DType, DataRef, Tensor, TensorError, TensorRef, TensorSpec, ValueId, Workers,
};
use smallvec::SmallVec;
use std::sync::Mutex;
use std::time::Instant;
use values::{Late, Values};

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

    /// The threads the kernels run on, lent to the host steps between them (one thread
    /// where none are lent).
    fn workers(&self) -> Workers<'_> {
        Workers::SERIAL
    }
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
    /// Per value, whether its shape has run-time dims (`Expr::runtime_dim`); empty
    /// where none has.
    late: Vec<bool>,
    /// Per step, a host step's op (looked up once, not per run).
    ops: Vec<Option<&'static OpSpec>>,
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
        let ops: Vec<Option<&'static OpSpec>> = p
            .steps
            .iter()
            .map(|step| match step {
                Step::Host(node) => anyshape_tensor::ops::op(&node.op),
                Step::Kernel { .. } => None,
            })
            .collect();
        let mut keeps = vec![false; p.values.len()];
        for (step, op) in p.steps.iter().zip(&ops) {
            if let (
                Step::Host(node),
                Some(OpSpec {
                    eval_into: Some(_), ..
                }),
            ) = (step, op)
            {
                for &v in &node.outputs {
                    keeps[v] = true;
                }
            }
        }
        let late: Vec<bool> = p
            .values
            .iter()
            .map(|v| v.shape.iter().any(Expr::has_runtime_dims))
            .collect();
        Executor {
            late: match late.contains(&true) {
                true => late,
                false => Vec::new(),
            },
            keeps,
            ops,
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
        self.run_into(kernels, inputs, &mut outputs, seconds)?;
        Ok(outputs.into_iter().flatten().collect())
    }

    /// [`Executor::run`] writing the outputs into `outputs` (one per plan output; a
    /// tensor there is reused where it has room, so that a loop of runs that passes
    /// the last run's outputs back allocates none: fresh outputs of a large model
    /// cost their page faults on every run).
    pub fn run_into(
        &self,
        kernels: &dyn TaskKernels,
        inputs: &[(&str, TensorRef)],
        outputs: &mut [Option<Tensor>],
        seconds: Option<&mut [f64]>,
    ) -> Result<()> {
        if outputs.len() != self.plan().outputs.len() {
            return Err(internal("outputs that are not the plan's"));
        }
        self.with_arena(|arena| {
            self.binder
                .bind(inputs, &mut arena.bindings, &mut arena.at)?;
            if self.reserve {
                arena.bindings.update(CACHE_RESERVE, 0);
            }
            arena.given.clear();
            arena.given.extend(arena.at.iter().map(|&g| Some(g)));
            self.prepare(arena, None)?;
            self.steps(kernels, arena, inputs, seconds, None, outputs)
        })
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
            late: (!self.late.is_empty()).then(|| Late {
                values: &self.late,
                bindings: prepared.bindings.clone(),
                shapes: vec![Vec::new(); plan.values.len()],
            }),
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
                Step::Host(node) => {
                    let op = self.ops[k].ok_or_else(|| {
                        internal("a host step whose op is not registered (the plan was verified)")
                    })?;
                    values.host(node, op, kernels.workers())?
                }
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
            let shape = values.shape(v);
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
                    t.shape = values.shape(v).to_vec();
                    t
                }
                None => values.view(v)?.to_tensor(),
            });
        }
        Ok(())
    }
}
