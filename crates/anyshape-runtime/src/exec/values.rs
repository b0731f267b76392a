//! Where a run's values are ([`Values`]: the caller's inputs, the plan's mapped
//! constants, the arena's slots, the host steps' own tensors), as borrowed views, and
//! a host step evaluated on them — binding the run-time dims of what it makes.
use crate::error::internal;
use crate::{Result, RuntimeError};
use anyshape_ir::{is_runtime_dim, Bindings, Expr};
use anyshape_plan::{Plan, PlanFile, Storage};
use anyshape_tensor::ops::OpSpec;
use anyshape_tensor::{Data, DataRef, Node, Tensor, TensorError, TensorRef, Workers};
use smallvec::SmallVec;

/// Where a run's values are.
pub(super) struct Values<'a> {
    pub(super) plan: &'a Plan,
    pub(super) file: &'a PlanFile,
    /// The tensors the caller gave.
    pub(super) inputs: &'a [(&'a str, TensorRef<'a>)],
    /// For each of the plan's inputs, its index among `inputs`.
    pub(super) given: &'a [Option<usize>],
    pub(super) prepared: &'a crate::arena::Prepared,
    pub(super) base: *mut u8,
    /// Host steps' tensors and evaluated shape plumbing, by value.
    pub(super) owned: &'a mut Vec<Option<Tensor>>,
    /// Where the plan has values with run-time dims: the run's dims with those bound
    /// so far, and those values' shapes as the steps that made them made them.
    pub(super) late: Option<Late<'a>>,
}

/// A run's run-time dims ([`anyshape_ir::Expr::runtime_dim`]), bound step by step.
pub(super) struct Late<'a> {
    /// Per value, whether its shape has run-time dims.
    pub(super) values: &'a [bool],
    /// The run's dims and the run-time dims bound so far.
    pub(super) bindings: Bindings,
    /// The shapes of the values with run-time dims made so far.
    pub(super) shapes: Vec<Vec<usize>>,
}

impl Late<'_> {
    /// Bind the run-time dims of value `v` (of `plan`) from `shape`, which its step
    /// made, and check its other dims: a shape that disagrees is an error.
    fn bind(&mut self, plan: &Plan, v: usize, shape: &[usize]) -> Result<()> {
        let value = &plan.values[v];
        let wrong = |what: String| {
            Err(TensorError::Shape(format!(
                "`{}` was made with the shape {shape:?} where the plan has [{}]: {what}",
                value.name,
                value
                    .shape
                    .iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .into())
        };
        if value.shape.len() != shape.len() {
            return wrong("another rank".into());
        }
        for (e, &d) in value.shape.iter().zip(shape) {
            if let Expr::Var(n) = e {
                if is_runtime_dim(n) && self.bindings.get(n).is_none() {
                    self.bindings.set(n.as_str(), d as i64);
                }
            }
            let want = e.eval(&self.bindings)?;
            if want != d as i64 {
                return wrong(format!("{e} is {want}"));
            }
        }
        self.shapes[v].clear();
        self.shapes[v].extend_from_slice(shape);
        Ok(())
    }
}

impl Values<'_> {
    /// Value `v` as a tensor in place (its root's elements under its own shape).
    pub(super) fn view(&self, v: usize) -> Result<TensorRef<'_>> {
        let r = self.plan.root(v);
        let shape = self.shape(v);
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

    /// The shape of value `v` in this run (a value with run-time dims: as its step made
    /// it).
    pub(super) fn shape(&self, v: usize) -> &[usize] {
        match &self.late {
            Some(l) if l.values[v] => &l.shapes[v],
            _ => &self.prepared.shapes[v],
        }
    }

    /// Evaluate host step `node`: into the tensors its outputs kept from the last run
    /// where its op can (fitted to this run's shapes), else into new ones checked
    /// against the plan's shapes.
    pub(super) fn host(&mut self, node: &Node, op: &OpSpec, workers: Workers) -> Result<()> {
        let makes_late = self
            .late
            .as_ref()
            .is_some_and(|l| node.outputs.iter().any(|&v| l.values[v]));
        if let (Some(into), false) = (op.eval_into, makes_late) {
            let mut outs: SmallVec<[Tensor; 4]> = SmallVec::new();
            for &v in &node.outputs {
                let mut t = self.owned[v].take().unwrap_or_else(|| Tensor {
                    shape: Vec::new(),
                    data: Data::zeros(self.plan.values[v].dtype, 0),
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
                into(node, &ins, &mut outs, workers)
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
            if let Some(late) = self.late.as_mut().filter(|l| l.values[v]) {
                late.bind(self.plan, v, &t.shape)?;
            } else if t.shape != self.prepared.shapes[v] {
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
