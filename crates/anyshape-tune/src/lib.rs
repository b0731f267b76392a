//! Joint tuning of a dynamic-shape workload for all its instances at once (DietCode):
//! the shape-generic search space, program features, the micro-kernel cost model, the
//! joint evolutionary search and the records it appends to, the votes and the dispatch
//! tree (trained by our own CART), and writing the module (kernels + dispatcher +
//! manifest) that the runtime loads.
//!
//! The search is generic over a [`Backend`]: one implementation ([`SketchBackend`]) serves
//! every sketch on every device (the CPU's C kernels, the GPU's CUDA kernels): its
//! space, features, adaptation to instances and measurement; tests use synthetic ones.
//! It builds on codegen (sketches, programs), measure (builders, runner) and the
//! module format (`anyshape-abi`, read back by the runtime).
#![deny(missing_docs)]

mod backend;
mod between;
mod check;
mod cost_model;
mod curve;
mod database;
mod error;
mod exploit;
mod explore;
mod family;
mod features;
mod instances;
mod journal;
mod model;
mod module;
mod output;
mod pipeline;
mod records;
mod report;
mod schedule;
mod scores;
mod search;
mod space;
mod task;
mod tree;
mod trust_region;
mod vote_round;
mod votes;

pub use anyshape_codegen::Factors;
pub use backend::{Backend, CpuBackend, GpuBackend, SketchBackend, Trial, TrialBatch};
pub use between::between;
pub use check::{check_best, BestCheck};
pub use cost_model::{spearman, Adaptation, CostModel, Sample};
pub use curve::{CurvePoint, TuningLog, TUNING_FILE};
pub use database::{DatabaseSummary, Reuse, RunKey, TuningDb, DATABASE_FILE};
pub use error::{Result, TuneError};
pub use family::{family_of, family_quality, DatabaseQuality, FamilyQuality, Offer};
pub use features::{extract, feature_names, Tunable};
pub use instances::{instance_count, instances, Instance, MAX_INSTANCES};
pub use journal::ResumeSummary;
pub use model::{compile_model, CompiledModel, ModelOptions, MEASURE_REPEATS, MEASURE_SECONDS};
pub use module::{write_module, ModuleSpec, Specialize};
pub use output::{check_distinct, check_out_dir, check_outputs};
pub use pipeline::{tune_workload, Observer, Packaged, PipelineOptions, Stage, Tuned};
pub use records::{measured_under, Record, RecordLog, TrialResult};
pub use report::{
    InstanceBest, RoundSummary, SearchStrategy, StopReason, TimeBreakdown, TuneOptions, TuneReport,
};
pub use schedule::{Allotment, Scheduler, Slice};
pub use scores::ScoreTable;
pub use search::Tuner;
pub use space::SearchSpace;
pub use tree::{accuracy, train_tree};
pub use votes::{cover, elect, vote, VoteOptions, Votes};
