//! tract (`tract-onnx`, pure Rust) as a peer: the model optimized once with its
//! symbolic dims where tract can; where it cannot (some exports' shape plumbing), once
//! per input shape with the dims made concrete. tract runs on one thread.
use super::{time_loop, Case, Peer};
use crate::error::{BenchError, Result};
use anyshape_tensor::{Data, Tensor};
use std::collections::HashMap;
use std::path::Path;
use tract_onnx::prelude::*;

type Runnable = Box<dyn Fn(TVec<TValue>) -> TractResult<TVec<TValue>>>;

/// The model optimized and made runnable; a panic inside tract is an error here.
fn runnable(model: InferenceModel) -> std::result::Result<Runnable, String> {
    let plan = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        model.into_optimized()?.into_runnable()
    }))
    .map_err(|_| "tract panicked while optimizing the model".to_string())?
    .map_err(|e| format!("{e:#}"))?;
    Ok(Box::new(move |inputs| plan.run(inputs)))
}

/// tract on one model.
pub(crate) struct Tract {
    model: InferenceModel,
    symbolic: Option<Runnable>,
    /// Per input shapes, where the symbolic model failed to optimize.
    concrete: HashMap<Vec<Vec<usize>>, Runnable>,
    /// Why the symbolic model was not used.
    pub why_concrete: Option<String>,
}

fn env(what: impl std::fmt::Display) -> BenchError {
    BenchError::Environment(format!("tract: {what}"))
}

impl Tract {
    /// Load `model` (an `.onnx` file).
    pub fn load(model: &Path) -> Result<Tract> {
        let m = tract_onnx::onnx()
            .model_for_path(model)
            .map_err(|e| env(format!("{e:#}")))?;
        let (symbolic, why_concrete) = match runnable(m.clone()) {
            Ok(r) => (Some(r), None),
            Err(e) => (
                None,
                Some(format!("{e:#}").lines().next().unwrap_or("").to_string()),
            ),
        };
        Ok(Tract {
            model: m,
            symbolic,
            concrete: HashMap::new(),
            why_concrete,
        })
    }

    fn plan(&mut self, case: &Case) -> Result<&Runnable> {
        if let Some(r) = &self.symbolic {
            return Ok(r);
        }
        let shapes: Vec<Vec<usize>> = case.tensors.iter().map(|(_, t)| t.shape.clone()).collect();
        if !self.concrete.contains_key(&shapes) {
            let mut m = self.model.clone();
            for (i, (_, t)) in case.tensors.iter().enumerate() {
                let dt = match t.data {
                    Data::F32(_) => f32::datum_type(),
                    Data::I64(_) => i64::datum_type(),
                    Data::Bool(_) => bool::datum_type(),
                };
                m = m
                    .with_input_fact(i, InferenceFact::dt_shape(dt, &t.shape))
                    .map_err(|e| env(format!("{e:#}")))?;
            }
            let r = runnable(m).map_err(env)?;
            self.concrete.insert(shapes.clone(), r);
        }
        Ok(&self.concrete[&shapes])
    }
}

fn to_tract(t: &Tensor) -> Result<TValue> {
    let shape = &t.shape[..];
    let bad = |e: tract_ndarray::ShapeError| env(e);
    let tensor = match &t.data {
        Data::F32(v) => tract_ndarray::ArrayD::from_shape_vec(shape, v.clone())
            .map_err(bad)?
            .into_tensor(),
        Data::I64(v) => tract_ndarray::ArrayD::from_shape_vec(shape, v.clone())
            .map_err(bad)?
            .into_tensor(),
        Data::Bool(v) => tract_ndarray::ArrayD::from_shape_vec(shape, v.clone())
            .map_err(bad)?
            .into_tensor(),
    };
    Ok(tensor.into())
}

fn from_tract(v: &TValue) -> Result<Tensor> {
    let view = v
        .to_plain_array_view::<f32>()
        .map_err(|e| env(format!("{e:#}")))?;
    Tensor::f32(view.shape().to_vec(), view.iter().copied().collect())
        .map_err(|e| env(e.to_string()))
}

impl Peer for Tract {
    fn name(&self) -> String {
        let how = if self.symbolic.is_some() {
            "symbolic dims"
        } else {
            "optimized per shape"
        };
        format!("tract 0.23 (1 thread, {how})")
    }

    fn time(
        &mut self,
        case: &Case,
        seconds: f64,
        outputs: bool,
    ) -> Result<(Vec<f64>, Option<Vec<Tensor>>)> {
        let inputs: TVec<TValue> = case
            .tensors
            .iter()
            .map(|(_, t)| to_tract(t))
            .collect::<Result<_>>()?;
        let plan = self.plan(case)?;
        // tract asserts on some models (seen: a packing assertion on a GPT-2 export):
        // a panic fails this peer at this instance, never the benchmark.
        let run = |inputs: TVec<TValue>| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| plan(inputs)))
                .map_err(|_| env("panicked (see above)"))?
                .map_err(|e| env(format!("{e:#}")))
        };
        let (times, first) = time_loop(seconds, || run(inputs.clone()))?;
        let outs = if outputs {
            Some(first.iter().map(from_tract).collect::<Result<_>>()?)
        } else {
            None
        };
        Ok((times, outs))
    }
}
