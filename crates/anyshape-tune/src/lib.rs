//! Joint tuning of a dynamic-shape workload for all its instances at once (DietCode):
//! the shape-generic search space, program features, the micro-kernel cost model, the
//! joint evolutionary search and the records it appends to,
//! the votes and the dispatch tree, and writing the module (kernels + dispatcher +
//! manifest) that the runtime loads.
//!
//! The search is generic over a [`Backend`] (the CPU's C kernels, or the GPU's CUDA
//! kernels): its space, features, adaptation to instances and measurement. It builds on
//! codegen (programs), measure (builders, runner) and the runtime's module format.
#![deny(missing_docs)]

mod backend;
mod cost_model;
mod error;
mod features;
mod gpu;
mod module;
mod output;
mod records;
mod search;
mod space;
mod verify;
mod votes;

pub use backend::{Backend, CpuBackend, Trial, TrialBatch};
pub use cost_model::{spearman, Adaptation, CostModel, Sample};
pub use error::{Result, TuneError};
pub use features::{extract, feature_names};
pub use gpu::GpuBackend;
pub use module::{write_module, ModuleSpec, Specialize};
pub use output::{check_distinct, check_out_dir, check_outputs, normalized};
pub use records::{Record, RecordLog, TrialResult};
pub use search::{
    instances, Instance, InstanceBest, ResumeSummary, RoundSummary, ScoreTable, TimeBreakdown,
    TuneOptions, TuneReport, Tuner, MAX_INSTANCES,
};
pub use space::{Factors, SearchSpace};
pub use verify::{verify, Verification};
pub use votes::{cover, elect, train_tree, vote, VoteOptions, Votes};
