//! Subgraph families (FamilySeer §3): a model's tasks grouped by their core operator and
//! the shape vars they range over — the QKV, attention-output and both feed-forward
//! projections of a transformer are one `dense_packed[sequence]` family. The members of
//! a family share what their searches learn:
//!
//! - **one cost model**: each member's `f_MK` is trained on its own records and every
//!   other member's ([`Shared::samples`]; a sample's features are the micro-kernel's on
//!   its own member's workload, so the trees see the difference between members);
//! - **foreseen candidates**: the micro-kernels that are best somewhere on another
//!   member join the member's candidates ([`Shared::kernels`]); the shared model scores
//!   them on the member's instances and only the promising ones are measured there.
//!
//! A task the tuning database has no run of takes its family's **other workloads**
//! there (other models' layers of other sizes) as samples of its cost model from the
//! first round ([`Tuner::database_samples`]); [`Tuner::database_quality`] says how well
//! they rank the task's own trials.
//!
//! The model's compile moves [`Offer`]s between the members after every slice of the
//! task scheduler (`model.rs`); [`family_quality`] says how well a family's model ranks
//! held-out trials, against a model trained on the member's records alone.
use crate::journal::BackendRecord;
use crate::{spearman, Backend, CostModel, Sample, Tuner};
use anyshape_ir::{Bindings, Workload};
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

/// The family of a workload: its operator and the shape vars it ranges over, e.g.
/// `dense_packed[sequence]`. Members of one family share one sketch.
pub fn family_of(workload: &Workload) -> String {
    format!("{}[{}]", workload.op, workload.shape_vars().join(","))
}

/// What a task's family shares with it.
#[derive(Clone, Debug)]
pub(crate) struct Shared<K> {
    /// The other members' measured trials, as their cost models see them.
    pub samples: Vec<Sample>,
    /// Micro-kernels best somewhere on another member: candidates in every round.
    pub kernels: Vec<K>,
}

impl<K> Default for Shared<K> {
    fn default() -> Self {
        Shared {
            samples: Vec::new(),
            kernels: Vec::new(),
        }
    }
}

/// What one member offers its family, whatever its sketch: its samples, and its best
/// micro-kernels (a `Vec` of the sketch's micro-kernel type).
pub struct Offer {
    /// Every successful trial of the member, as a cost-model sample.
    pub samples: Vec<Sample>,
    /// The member's best micro-kernel on each of its instances (distinct).
    pub kernels: Box<dyn Any>,
}

impl<B: Backend> Tuner<B> {
    /// What this task offers its family: its trials as samples and its best
    /// micro-kernels (the best measured one of each instance).
    pub fn offer(&mut self) -> Offer {
        let records = self.journal.records.clone();
        let samples = self.samples(&records);
        let kernels: BTreeSet<B::MicroKernel> = self
            .measured_best()
            .into_iter()
            .flatten()
            .map(|(_, mk)| mk)
            .collect();
        Offer {
            samples,
            kernels: Box::new(kernels.into_iter().collect::<Vec<_>>()),
        }
    }

    /// Take what the other members of this task's family offer (replacing what they
    /// offered before): the cost model trains on their samples too, and their best
    /// micro-kernels are candidates. Offers of another sketch are ignored (a family
    /// has one sketch; see [`family_of`]).
    pub fn adopt(&mut self, offers: &[&Offer]) {
        let mut shared = Shared::default();
        for o in offers {
            if let Some(kernels) = o.kernels.downcast_ref::<Vec<B::MicroKernel>>() {
                shared.samples.extend(o.samples.iter().cloned());
                shared.kernels.extend(kernels.iter().copied());
            }
        }
        self.shared = shared;
    }

    /// Samples of this task's own trials and of its family's (in the model, then in
    /// the tuning database), in that order.
    pub(crate) fn with_shared(&self, own: Vec<Sample>) -> Vec<Sample> {
        let mut all = own;
        all.extend(self.shared.samples.iter().cloned());
        all.extend(self.database.iter().cloned());
        all
    }

    /// Cost-model samples of records of the family's other workloads (from the tuning
    /// database): each trial's features on its own workload (the representative
    /// instance the middle of that workload's recorded ones), each workload weighing
    /// as much in all as a task's instances do. Records whose workload does not parse
    /// or bind are left out. Counts as search time.
    pub(crate) fn database_samples(&mut self, records: &[BackendRecord<B>]) -> Vec<Sample> {
        let t0 = Instant::now();
        let mut by_workload: BTreeMap<&str, Vec<&BackendRecord<B>>> = BTreeMap::new();
        for r in records {
            by_workload.entry(&r.workload).or_default().push(r);
        }
        let mut out = Vec::new();
        for (text, group) in by_workload {
            let Ok(w) = Workload::parse(text) else {
                continue;
            };
            let instances: BTreeSet<&Bindings> = group.iter().map(|r| &r.bindings).collect();
            let rep = (*instances
                .iter()
                .nth(instances.len() / 2)
                .expect("a group has records"))
            .clone();
            let weight = 1.0 / instances.len() as f64;
            let mut features: HashMap<B::MicroKernel, Vec<f64>> = HashMap::new();
            for r in group {
                let (Ok(bound), Some(latency)) = (w.bind(&r.bindings), r.latency()) else {
                    continue;
                };
                let f = features
                    .entry(r.micro_kernel)
                    .or_insert_with(|| {
                        self.backend
                            .features(&w, &r.micro_kernel, self.options.strategy, &rep)
                    })
                    .clone();
                out.push(Sample {
                    features: f,
                    adaptation: self.backend.adaptation(&w, &r.micro_kernel, &bound),
                    throughput: w.flops(&bound) / latency,
                    weight,
                });
            }
        }
        self.time.search += t0.elapsed().as_secs_f64();
        out
    }

    /// How well a cost model trained on the tuning database's samples ranks this
    /// task's trials — a workload it never saw — beside one trained on the task's own;
    /// none without database samples or with under 20 measured trials.
    pub fn database_quality(&mut self) -> Option<DatabaseQuality> {
        let ok: Vec<BackendRecord<B>> = self
            .journal
            .records
            .iter()
            .filter(|r| r.latency().is_some() && !r.reused)
            .cloned()
            .collect();
        if self.database.is_empty() || ok.len() < 20 {
            return None;
        }
        // The same split as the search's held-out figure: the last fifth held out.
        let cut = ok.len() * 4 / 5;
        let held = self.samples(&ok[cut..]);
        let own = self.samples(&ok[..cut]);
        let mut both = own.clone();
        both.extend(self.database.iter().cloned());
        let truth: Vec<f64> = held.iter().map(|s| s.throughput).collect();
        let rank = |samples: &[Sample]| {
            let model = CostModel::fit(samples, 1);
            let feats: Vec<Vec<f64>> = held.iter().map(|s| s.features.clone()).collect();
            let pred: Vec<f64> = model
                .ln_f_mk(&feats)
                .into_iter()
                .zip(&held)
                .map(|(l, s)| model.throughput(l, s.adaptation))
                .collect();
            spearman(&pred, &truth)
        };
        Some(DatabaseQuality {
            workload: self.workload.to_string(),
            samples: self.database.len(),
            held_out: held.len(),
            spearman_database: rank(&self.database),
            spearman_alone: rank(&own),
            spearman_both: rank(&both),
        })
    }
}

/// How well the tuning database's samples of a family's other workloads rank a new
/// workload's trials (the last fifth of its measured trials, held out), against its
/// own earlier trials.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatabaseQuality {
    /// The workload, never seen by the database's model.
    pub workload: String,
    /// Database samples (trials of the family's other workloads).
    pub samples: usize,
    /// The workload's trials held out.
    pub held_out: usize,
    /// Spearman of the model trained on the database's samples alone.
    pub spearman_database: f64,
    /// Spearman of the model trained on the workload's other trials alone.
    pub spearman_alone: f64,
    /// Spearman of the model trained on both.
    pub spearman_both: f64,
}

/// How well a family's shared cost model ranks trials it was not trained on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FamilyQuality {
    /// The family ([`family_of`]).
    pub family: String,
    /// Its members (task indices).
    pub members: Vec<usize>,
    /// Successful trials over every member.
    pub samples: usize,
    /// Spearman correlation of predicted and measured throughput on every fifth trial of
    /// each member, the model trained on the rest of the family's trials.
    pub spearman: Option<f64>,
    /// The same held-out trials, each member's model trained on its own other trials
    /// only (what a task learns without its family).
    pub spearman_alone: Option<f64>,
}

/// Held-out quality of a family's cost model: `members[i]` holds member `i`'s samples.
/// Needs at least 20 trials in the family.
pub fn family_quality(family: &str, tasks: &[usize], members: &[Vec<Sample>]) -> FamilyQuality {
    let samples = members.iter().map(Vec::len).sum();
    let held = |j: usize| j % 5 == 4;
    let mut quality = FamilyQuality {
        family: family.to_string(),
        members: tasks.to_vec(),
        samples,
        spearman: None,
        spearman_alone: None,
    };
    if samples < 20 {
        return quality;
    }
    let train: Vec<Sample> = members
        .iter()
        .flat_map(|m| m.iter().enumerate().filter(|(j, _)| !held(*j)))
        .map(|(_, s)| s.clone())
        .collect();
    let family_model = CostModel::fit(&train, 1);
    let (mut truth, mut pred, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for m in members {
        let own: Vec<Sample> = m
            .iter()
            .enumerate()
            .filter(|(j, _)| !held(*j))
            .map(|(_, s)| s.clone())
            .collect();
        let own_model = CostModel::fit(&own, 1);
        for s in m.iter().enumerate().filter(|(j, _)| held(*j)).map(|x| x.1) {
            let f = std::slice::from_ref(&s.features);
            truth.push(s.throughput);
            pred.push(family_model.throughput(family_model.ln_f_mk(f)[0], s.adaptation));
            alone.push(own_model.throughput(own_model.ln_f_mk(f)[0], s.adaptation));
        }
    }
    if truth.len() >= 4 {
        quality.spearman = Some(spearman(&pred, &truth));
        quality.spearman_alone = Some(spearman(&alone, &truth));
    }
    quality
}

impl std::fmt::Display for DatabaseQuality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (new to the tuning database): its family's {} samples there rank its {} held-out trials with Spearman {:.3} (its own other trials: {:.3}; both: {:.3})",
            self.workload,
            self.samples,
            self.held_out,
            self.spearman_database,
            self.spearman_alone,
            self.spearman_both
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Adaptation;

    #[test]
    fn families_group_by_operator_and_shape_vars() {
        let w = |s: &str| Workload::parse(s).unwrap();
        let qkv = w("dense_packed(M=sequence,N=2304,K=768,P=16)+bias");
        let ffn = w("dense_packed(M=sequence,N=3072,K=768,P=16)+bias+gelu");
        let pooler = w("dense_packed(M=batch,N=768,K=768,P=16)+bias+tanh");
        let scores = w("batch_matmul_nt(B=12,M=sequence,N=sequence,K=64)");
        assert_eq!(family_of(&qkv), "dense_packed[sequence]");
        assert_eq!(family_of(&qkv), family_of(&ffn));
        assert_ne!(family_of(&qkv), family_of(&pooler));
        assert_eq!(family_of(&scores), "batch_matmul_nt[sequence]");
    }

    #[test]
    fn a_family_model_learns_what_a_member_alone_cannot() {
        // Throughput depends on feature 0; member 1 saw only a few values of it, which
        // the other members cover.
        let sample = |f: f64, g: f64| Sample {
            features: vec![f, g],
            adaptation: Adaptation {
                tasks: 8.0,
                slots: 2.0,
                pad: 1.0,
            },
            throughput: 1e9 * (1.0 + f) * (1.0 + 0.1 * g),
            weight: 1.0,
        };
        let wide: Vec<Sample> = (0..40).map(|i| sample((i % 20) as f64, 0.0)).collect();
        let narrow: Vec<Sample> = (0..10)
            .map(|i| sample((i % 2) as f64 * 19.0, 1.0))
            .collect();
        let q = family_quality("f", &[0, 1], &[wide.clone(), narrow.clone()]);
        assert_eq!(q.samples, 50);
        assert!(q.spearman.unwrap() > 0.9, "{q:?}");
        // Too few trials: no figure.
        let q = family_quality("f", &[0], &[wide[..10].to_vec()]);
        assert_eq!(q.spearman, None);
    }
}
