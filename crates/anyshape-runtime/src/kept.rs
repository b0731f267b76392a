//! A model's outputs kept from run to run ([`KeptOutputs`]) for a front end that copies
//! them out to its caller's buffers (the C API's handle, the Python package's
//! `run(out=…)`): each run writes over the last's (`Model::run_into`) instead of
//! allocating and faulting in fresh outputs.
use crate::Model;
use anyshape_tensor::Tensor;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

/// The last run's outputs, shared by the runs of one model (any thread).
#[derive(Debug, Default)]
pub struct KeptOutputs(Mutex<Vec<Option<Tensor>>>);

/// The outputs one run writes into: the kept ones, or fresh ones where another
/// thread's run holds them (or one panicked while holding them).
pub enum Outputs<'a> {
    /// The kept outputs, held for this run.
    Kept(MutexGuard<'a, Vec<Option<Tensor>>>),
    /// Outputs of this run alone.
    Fresh(Vec<Option<Tensor>>),
}

impl KeptOutputs {
    /// The outputs for one run of `model`: one per model output (`None` until a run
    /// writes it), the kept ones where no other run holds them.
    pub fn for_run(&self, model: &Model) -> Outputs<'_> {
        let mut outs = match self.0.try_lock() {
            Ok(kept) => Outputs::Kept(kept),
            Err(_) => Outputs::Fresh(Vec::new()),
        };
        outs.resize_with(model.outputs().len(), || None);
        outs
    }
}

impl Deref for Outputs<'_> {
    type Target = Vec<Option<Tensor>>;
    fn deref(&self) -> &Self::Target {
        match self {
            Outputs::Kept(kept) => kept,
            Outputs::Fresh(fresh) => fresh,
        }
    }
}

impl DerefMut for Outputs<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self {
            Outputs::Kept(kept) => kept,
            Outputs::Fresh(fresh) => fresh,
        }
    }
}
