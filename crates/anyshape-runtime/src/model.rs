//! A loaded model module ([`Model`]): its manifest checked (sealed, of this version,
//! every listed file present at its size), its compiled plan mapped and verified, each
//! task's module loaded and checked to compute its task's workload — nothing imported,
//! inferred or fused at load — and `run` for any binding of the model's dims, in the
//! compiled range or past it.
use crate::{CacheState, Executor, Module, Result, RuntimeError, TaskKernels, Threads};
use anyshape_abi::{
    check_file, read_model_manifest, ModelManifest, ModuleError, MODEL_FILE, MODEL_PLAN,
};
use anyshape_ir::{Bindings, ShapeVar};
use anyshape_plan::{Plan, PlanFile};

use anyshape_tensor::{Tensor, TensorRef, TensorSpec, Workers};
use std::path::{Path, PathBuf};

/// A model module, loaded.
pub struct Model {
    dir: PathBuf,
    manifest: ModelManifest,
    executor: Executor,
    /// Each task's module, in the plan's task order.
    modules: TaskModules,
}

/// A model's task modules, which run its plan's kernel steps, and the threads their
/// kernels run on (lent to the host steps).
struct TaskModules(Vec<Module>, Option<Threads>);

impl TaskKernels for TaskModules {
    unsafe fn call(
        &self,
        task: usize,
        vars: &[i64],
        ins: &[*const f32],
        out: *mut f32,
    ) -> Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.0[task].call(vars, ins, out) }
    }

    fn workers(&self) -> Workers<'_> {
        match &self.1 {
            Some(threads) => Workers::new(threads),
            None => Workers::SERIAL,
        }
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("dir", &self.dir)
            .field("tasks", &self.modules.0.len())
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Load the model module in `dir`: its manifest (seal, format, version), every file
    /// it lists present at its size, the plan (mapped; its checksums and invariants),
    /// and every task module (its own checks) computing its task's workload. The
    /// SHA-256 of every file is [`Model::verify_files`]'s (what `anyshape inspect`
    /// reports), too slow for every load of a large model.
    pub fn load(dir: impl AsRef<Path>) -> Result<Model> {
        let dir = dir.as_ref().to_path_buf();
        let manifest = read_model_manifest(&dir)?;
        let bad = |reason: String| {
            RuntimeError::Module(ModuleError::BadManifest {
                path: dir.join(MODEL_FILE).display().to_string(),
                reason,
            })
        };
        for (name, entry) in &manifest.files {
            let len = anyshape_files::regular_file_len(&dir.join(name)).map_err(|e| {
                if e.is_missing() {
                    RuntimeError::Module(ModuleError::Missing {
                        path: dir.display().to_string(),
                        file: name.clone(),
                    })
                } else {
                    RuntimeError::Module(ModuleError::File(e))
                }
            })?;
            if len != entry.bytes {
                return Err(RuntimeError::Module(ModuleError::CorruptFile {
                    path: dir.join(name).display().to_string(),
                    reason: format!("{len} bytes, the manifest says {}", entry.bytes),
                }));
            }
        }
        if !manifest.files.contains_key(MODEL_PLAN) {
            return Err(bad(format!("it lists no {MODEL_PLAN}")));
        }
        let plan = PlanFile::open(&dir.join(MODEL_PLAN))?;
        let tasks = &plan.plan().tasks;
        if tasks.len() != manifest.tasks.len() {
            return Err(bad(format!(
                "{} tasks, its plan has {}",
                manifest.tasks.len(),
                tasks.len()
            )));
        }
        let mut modules = Vec::with_capacity(tasks.len());
        for (t, task) in manifest.tasks.iter().zip(tasks) {
            if !manifest.files.contains_key(&format!(
                "{}/{}",
                t.module,
                anyshape_abi::MANIFEST_FILE
            )) {
                return Err(bad(format!(
                    "the task module `{}` is not among its files",
                    t.module
                )));
            }
            let m = Module::load(dir.join(&t.module))?;
            if m.workload() != &task.workload || t.workload != task.workload.to_string() {
                return Err(bad(format!(
                    "task module `{}` computes {}, the plan's task is {}",
                    t.module,
                    m.workload(),
                    task.workload
                )));
            }
            modules.push(m);
        }
        // Every task's kernels run on the same threads (one target's cores).
        let threads = modules.iter().find_map(Module::threads);
        Ok(Model {
            dir,
            manifest,
            executor: Executor::new(plan),
            modules: TaskModules(modules, threads),
        })
    }

    /// Check every file of the module against its SHA-256 in the manifest.
    pub fn verify_files(&self) -> Result<()> {
        for (name, entry) in &self.manifest.files {
            check_file(&self.dir, name, entry)?;
        }
        Ok(())
    }

    /// The manifest.
    pub fn manifest(&self) -> &ModelManifest {
        &self.manifest
    }

    /// The directory it was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The compiled plan.
    pub fn plan(&self) -> &Plan {
        self.executor.plan()
    }

    /// The model's dims with the domains they were compiled for.
    pub fn dims(&self) -> &[ShapeVar] {
        &self.manifest.dims
    }

    /// The threads its host steps split their work over: those its kernels run on
    /// (one thread for modules built before the parallel loop).
    pub fn workers(&self) -> Workers<'_> {
        self.modules.workers()
    }

    /// The inputs a run takes: names, element types, dims over the model's dims.
    pub fn inputs(&self) -> &[TensorSpec] {
        self.executor.inputs()
    }

    /// The outputs a run gives, in order.
    pub fn outputs(&self) -> Vec<&TensorSpec> {
        self.plan().outputs.iter().map(|(s, _)| s).collect()
    }

    /// Run the model on `inputs` (by input name): the outputs in the model's order.
    /// The inputs' dims set the model's dims (in the compiled range or past it); the
    /// memory the run needs is checked against what the machine has before anything
    /// is allocated. Runs may go on from several threads at once (each takes its own
    /// arena).
    pub fn run(&self, inputs: &[(&str, TensorRef)]) -> Result<Vec<Tensor>> {
        self.executor.run(&self.modules, inputs, None)
    }

    /// [`Model::run`] writing the outputs into `outputs` (one per model output, in its
    /// order): a tensor there is reused where it has room, so that a loop of runs that
    /// passes the last run's outputs back allocates none (a large model's fresh
    /// outputs cost their page faults on every run: GPT-2's at sequence 512, 140 MB of
    /// logits and caches, ~15 % of its run).
    pub fn run_into(
        &self,
        inputs: &[(&str, TensorRef)],
        outputs: &mut [Option<Tensor>],
    ) -> Result<()> {
        self.executor.run_into(&self.modules, inputs, outputs, None)
    }

    /// Empty key/value caches for [`Model::run_cached`], with room for `capacity`
    /// positions, their other dims (the batch) at `dims`; refused where the model keeps
    /// no cache across runs (not a decoder, or a step other than its attention reads a
    /// cache).
    pub fn cache_state(&self, dims: &Bindings, capacity: usize) -> Result<CacheState> {
        self.executor.cache_state(dims, capacity)
    }

    /// Run a decoder keeping its caches in `state`: `inputs` without the `past…`
    /// caches (their length is what `state` holds), whose new rows are appended to
    /// `state` in place. The outputs in the model's order, each `present…` cache `None`
    /// (it stays in `state`).
    pub fn run_cached(
        &self,
        inputs: &[(&str, TensorRef)],
        state: &mut CacheState,
    ) -> Result<Vec<Option<Tensor>>> {
        let mut outputs = vec![None; self.plan().outputs.len()];
        self.run_cached_into(inputs, state, &mut outputs)?;
        Ok(outputs)
    }

    /// [`Model::run_cached`] writing the outputs into `outputs` (one per model output):
    /// a tensor there is reused where it has room, so that a decoder's loop that
    /// passes the last step's outputs back allocates nothing in a step (a
    /// [`crate::Decoder`]'s does so).
    pub fn run_cached_into(
        &self,
        inputs: &[(&str, TensorRef)],
        state: &mut CacheState,
        outputs: &mut [Option<Tensor>],
    ) -> Result<()> {
        self.executor
            .run_cached(&self.modules, inputs, state, outputs, None)
    }

    /// A run on `inputs` timed step by step: the seconds of each of the plan's steps.
    pub fn step_seconds(&self, inputs: &[(&str, TensorRef)]) -> Result<Vec<f64>> {
        let mut seconds = vec![0.0; self.plan().steps.len()];
        self.executor
            .run(&self.modules, inputs, Some(&mut seconds))?;
        Ok(seconds)
    }

    /// Where a run on `inputs` spends its time: per kind of step (a task's workload,
    /// a host op), its number of steps and total seconds, slowest first.
    pub fn profile(&self, inputs: &[(&str, TensorRef)]) -> Result<Vec<(String, usize, f64)>> {
        let plan = self.plan();
        let seconds = self.step_seconds(inputs)?;
        let mut by_label: Vec<(String, usize, f64)> = Vec::new();
        for (k, s) in seconds.iter().enumerate() {
            let label = plan.step_label(k);
            match by_label.iter_mut().find(|(l, _, _)| *l == label) {
                Some(e) => {
                    e.1 += 1;
                    e.2 += s;
                }
                None => by_label.push((label, 1, *s)),
            }
        }
        by_label.sort_by(|a, b| b.2.total_cmp(&a.2));
        Ok(by_label)
    }
}
