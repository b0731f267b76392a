//! A loaded model module ([`Model`]): the source model imported and fused again (the
//! same steps the compiler made), each task's module loaded and checked, and `run` for
//! any binding of the model's dims — in the compiled range or past it — with the
//! inputs checked (names, element types, ranks, dims that agree).
use crate::manifest::{check_file, read_model_manifest};
use crate::{Module, Result, RuntimeError};
use anyshape_abi::{ModelManifest, MANIFEST_FILE, MODEL_FILE, MODEL_SOURCE};
use anyshape_graph::{exec::Plan, onnx, Graph, GraphError, StepKind, Tensor};
use anyshape_ir::{Bindings, Workload};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A model module, loaded.
pub struct Model {
    dir: PathBuf,
    manifest: ModelManifest,
    plan: Plan,
    /// Each task's module.
    modules: Vec<Module>,
    /// Per step of the plan, for kernel steps: its task's module (an index into
    /// `modules`) and the task's shape vars — resolved once, not on every call.
    step_modules: Vec<Option<(usize, Vec<String>)>>,
}

impl Model {
    /// Load the model module in `dir`: format, its manifest's checksum, every file it
    /// lists (size and checksum, the source model's and its external data's included),
    /// every task module (their own checks), and that fusing the source gives the same
    /// tasks.
    pub fn load(dir: impl AsRef<Path>) -> Result<Model> {
        let dir = dir.as_ref().to_path_buf();
        let manifest = read_model_manifest(&dir)?;
        let path = dir.join(MODEL_FILE);
        let bad = |reason: String| RuntimeError::BadManifest {
            path: path.display().to_string(),
            reason,
        };
        let Some(source_entry) = manifest.files.get(MODEL_SOURCE) else {
            return Err(bad(format!("it lists no {MODEL_SOURCE}")));
        };
        for (name, entry) in &manifest.files {
            if name != MODEL_SOURCE {
                check_file(&dir, name, entry)?;
            }
        }
        let bytes = check_file(&dir, MODEL_SOURCE, source_entry)?;
        let graph = onnx::decode(&bytes, Some(&dir)).map_err(model_error)?;
        let plan = Plan::new(graph).map_err(model_error)?;
        let mut by_workload = HashMap::new();
        let mut modules = Vec::new();
        for t in &manifest.tasks {
            if !manifest
                .files
                .contains_key(&format!("{}/{MANIFEST_FILE}", t.module))
            {
                return Err(bad(format!(
                    "the task module `{}` is not among its files",
                    t.module
                )));
            }
            let m = Module::load(dir.join(&t.module))?;
            let w = Workload::parse(&t.workload)?.to_string();
            if m.workload().to_string() != w {
                return Err(bad(format!(
                    "task module `{}` computes {}, not {w}",
                    t.module,
                    m.workload()
                )));
            }
            by_workload.insert(w, modules.len());
            modules.push(m);
        }
        let step_modules = plan
            .fusion()
            .steps
            .iter()
            .map(|step| match &step.kind {
                StepKind::Kernel(text) => {
                    let Some(&m) = by_workload.get(text) else {
                        return Err(bad(format!(
                            "no module for the task {text} (compiled by another fusion? compile the model again)"
                        )));
                    };
                    let vars = Workload::parse(text)?.shape_vars();
                    Ok(Some((m, vars)))
                }
                _ => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(Model {
            dir,
            manifest,
            plan,
            modules,
            step_modules,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &ModelManifest {
        &self.manifest
    }

    /// The directory it was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The imported graph.
    pub fn graph(&self) -> &Graph {
        self.plan.graph()
    }

    /// Run the model on `inputs` (by input name); returns the outputs in the model's
    /// order.
    /// The memory the run needs (computed from the inputs' dims) is checked against
    /// what the machine has before anything is allocated.
    pub fn run(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<Tensor>> {
        self.execute(inputs, None)
    }

    /// Where a run on `inputs` spends its time: per kind of step (a task's workload,
    /// a host op), its number of steps and total seconds, slowest first.
    pub fn profile(&self, inputs: &[(&str, Tensor)]) -> Result<Vec<(String, usize, f64)>> {
        let n = self.plan.fusion().steps.len();
        let mut seconds = vec![0.0; n];
        self.execute(inputs, Some(&mut seconds))?;
        let mut by_label: Vec<(String, usize, f64)> = Vec::new();
        for (k, s) in seconds.iter().enumerate() {
            let label = self.plan.step_label(k);
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

    fn execute(
        &self,
        inputs: &[(&str, Tensor)],
        seconds: Option<&mut [f64]>,
    ) -> Result<Vec<Tensor>> {
        let bytes = self.plan.run_bytes(inputs).map_err(model_error)?;
        anyshape_abi::check_fits(bytes, "the run's tensors").map_err(|e| {
            RuntimeError::Memory(format!(
                "{e}: run the model at smaller dims (the inputs' shapes set them)"
            ))
        })?;
        let mut kernel = |k: usize,
                          w: &Workload,
                          b: &Bindings,
                          _: &anyshape_ir::BoundWorkload,
                          ins: &[&[f32]],
                          out: &mut [f32]|
         -> anyshape_graph::Result<()> {
            let Some((m, vars)) = &self.step_modules[k] else {
                return Err(GraphError::Unsupported(format!(
                    "no module for the task {w}"
                )));
            };
            let own = Bindings::from_pairs(b.iter().filter(|(n, _)| vars.iter().any(|v| v == n)));
            self.modules[*m]
                .run(&own, ins, &mut [out])
                .map_err(|e| GraphError::Shape(format!("{w}: {e}")))
        };
        match seconds {
            Some(s) => self.plan.run_profiled(inputs, &mut kernel, s),
            None => self.plan.run(inputs, &mut kernel),
        }
        .map_err(model_error)
    }
}

fn model_error(e: GraphError) -> RuntimeError {
    RuntimeError::Model(e)
}
