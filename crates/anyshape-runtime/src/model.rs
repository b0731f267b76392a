//! A loaded model module ([`Model`]): the source model imported and fused again (the
//! same steps the compiler made), each task's module loaded and checked, and `run` for
//! any binding of the model's dims — in the compiled range or past it — with the
//! inputs checked (names, element types, ranks, dims that agree).
use crate::{Module, Result, RuntimeError};
use anyshape_abi::{sha256_hex, ModelManifest, MODEL_FILE, MODEL_FORMAT, MODEL_SOURCE};
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
    /// Load the model module in `dir`: format, the source model's checksum, every task
    /// module (their own checks), and that fusing the source gives the same tasks.
    pub fn load(dir: impl AsRef<Path>) -> Result<Model> {
        let dir = dir.as_ref().to_path_buf();
        let path = dir.join(MODEL_FILE);
        let bad = |reason: String| RuntimeError::BadManifest {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|source| RuntimeError::NotAModule {
            path: dir.display().to_string(),
            source,
        })?;
        let manifest: ModelManifest =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a model manifest: {e}")))?;
        if manifest.format != MODEL_FORMAT {
            return Err(bad(format!(
                "model format {} (this anyshape reads {MODEL_FORMAT}); compile the model again",
                manifest.format
            )));
        }
        let source = dir.join(MODEL_SOURCE);
        let bytes = std::fs::read(&source).map_err(|source_err| RuntimeError::NotAModule {
            path: source.display().to_string(),
            source: source_err,
        })?;
        if sha256_hex(&bytes) != manifest.source.sha256 {
            return Err(bad(format!(
                "{MODEL_SOURCE} was changed since the model was compiled"
            )));
        }
        let graph = onnx::decode(&bytes, Some(&dir)).map_err(model_error)?;
        let plan = Plan::new(graph).map_err(model_error)?;
        let mut by_workload = HashMap::new();
        let mut modules = Vec::new();
        for t in &manifest.tasks {
            if t.module.contains("..") || Path::new(&t.module).is_absolute() {
                return Err(bad(format!(
                    "task module `{}` lies outside the model",
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
