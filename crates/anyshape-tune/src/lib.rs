//! Joint tuning of a dynamic-shape workload for all its instances at once (DietCode):
//! the shape-generic search space, program features, the micro-kernel cost model, the
//! joint evolutionary search and the records it appends to.
//!
//! It builds on codegen (programs) and measure (builder, runner); it knows nothing of
//! modules or dispatch, which read its report and records.
#![deny(missing_docs)]

mod cost_model;
mod error;
mod features;
mod records;
mod search;
mod space;
mod verify;

pub use cost_model::{spearman, Adaptation, CostModel, Sample};
pub use error::{Result, TuneError};
pub use features::{extract, feature_names};
pub use records::{Record, RecordLog, TrialResult};
pub use search::{
    instances, Instance, InstanceBest, RoundSummary, TimeBreakdown, TuneOptions, TuneReport, Tuner,
};
pub use space::SearchSpace;
pub use verify::{verify, Verification};
