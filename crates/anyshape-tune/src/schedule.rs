//! The task scheduler of a model's tuning (after Ansor §6 and FamilySeer): the tasks
//! share one trial budget, given out a slice at a time. Every task first gets one slice
//! (so each has a measured latency; a smaller one for a task whose family foresees its
//! candidates, see [`Scheduler::first_slices`]); then each slice goes to the task whose
//! next slice is expected to cut the model's latency most: the task's runs per model call times
//! the mean drop of its weighted latency over its last three slices, but at least a
//! small fraction of its current latency that shrinks as the task gets trials (a
//! search's returns diminish; without the decay, the task with the largest share would
//! take every slice once the drops are noise). A task whose search stalls (nothing new
//! to measure) gets no more.
//!
//! With equal shares (the baseline FamilySeer compares with: independent per-task
//! tuning), the slices go round the tasks instead, each task getting the same trials.
//!
//! The model's expected latency is `Σ count · weighted latency` over the tasks, each
//! task's latency the mean over its tuned instances (measured where measured, the cost
//! model's prediction elsewhere): what the scheduler minimizes, and what progress shows.
//! [`schedule`] runs a model's task searches as the scheduler gives out the slices,
//! moving the families' offers between their members, and records the tuning curve.
use crate::task::TaskSearch;
use crate::{
    family_quality, CurvePoint, ModelOptions, Observer, Offer, Result, TimeBreakdown, TuningLog,
};
use anyshape_ir::Workload;

/// The least a task's next slice is expected to gain, as a fraction of its latency,
/// after its first slice; divided by its slices since.
const OPTIMISM: f64 = 0.02;

/// Slices whose drops the expected gain averages.
const WINDOW: usize = 3;

/// What the scheduler knows of one task.
#[derive(Clone, Debug)]
struct TaskState {
    /// Runs per model call.
    count: usize,
    /// Trials given to it (its search runs until its records hold this many).
    budget: usize,
    /// Its first slice.
    first: usize,
    /// Its weighted latency after its last slice (seconds); `None` before its first.
    latency: Option<f64>,
    /// The drops of that latency over its last slices (at most [`WINDOW`]).
    drops: Vec<f64>,
    /// Its search stalled: it gets no more slices.
    stalled: bool,
}

/// Gives out a model's trial budget, slice by slice (see the module doc).
#[derive(Clone, Debug)]
pub struct Scheduler {
    tasks: Vec<TaskState>,
    slice: usize,
    total: usize,
    /// Round the tasks, the same trials each, instead of by expected gain.
    equal: bool,
}

/// A slice given to a task.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Allotment {
    /// The task (index).
    pub task: usize,
    /// The trials its records reach with this slice.
    pub budget: usize,
}

impl Scheduler {
    /// `total` trials for tasks run `counts` times per model call, `slice` at a time;
    /// `trials` are those each task's records already hold (a resumed run), counted
    /// against the total.
    pub fn new(counts: &[usize], trials: &[usize], slice: usize, total: usize) -> Scheduler {
        Scheduler {
            tasks: counts
                .iter()
                .zip(trials)
                .map(|(&count, &budget)| TaskState {
                    count,
                    budget,
                    first: slice.max(1),
                    latency: None,
                    drops: Vec::new(),
                    stalled: false,
                })
                .collect(),
            slice: slice.max(1),
            total,
            equal: false,
        }
    }

    /// The same scheduler giving every task the same share, a slice at a time in turn.
    pub fn equal_shares(self) -> Scheduler {
        Scheduler {
            equal: true,
            ..self
        }
    }

    /// The same scheduler giving task `i` a first slice of `first[i]` trials (at most
    /// a slice). A family's later members start from what the earlier ones measured:
    /// the shared cost model and their best micro-kernels foresee the member's
    /// candidates, so a few trials measure the promising ones, and the model's latency
    /// is known (every task measured) that much sooner.
    pub fn first_slices(mut self, first: &[usize]) -> Scheduler {
        for (t, &f) in self.tasks.iter_mut().zip(first) {
            t.first = f.clamp(1, self.slice);
        }
        self
    }

    /// Trials given out so far.
    pub fn given(&self) -> usize {
        self.tasks.iter().map(|t| t.budget).sum()
    }

    /// The next slice, or `None` when the budget is spent or every task stalled. A task
    /// without a latency yet comes first (in order), its first slice topping up what a
    /// resumed run's records already hold; then the largest expected gain.
    pub fn next_slice(&mut self) -> Option<Allotment> {
        let left = self.total.saturating_sub(self.given());
        let first = self
            .tasks
            .iter()
            .position(|t| !t.stalled && t.latency.is_none());
        let (pick, more) = match first {
            // Even past the total (records of an earlier, larger run): every task is
            // searched before its module is built.
            Some(i) => (i, self.tasks[i].first.saturating_sub(self.tasks[i].budget)),
            None if left == 0 => return None,
            None if self.equal => {
                let share = self.total.div_ceil(self.tasks.len().max(1));
                let i = self
                    .tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !t.stalled && t.budget < share)
                    .min_by_key(|(_, t)| t.budget)?
                    .0;
                (i, self.slice.min(left).min(share - self.tasks[i].budget))
            }
            None => {
                let i = self
                    .tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| !t.stalled)
                    .max_by(|(_, a), (_, b)| self.gain(a).total_cmp(&self.gain(b)))?
                    .0;
                (i, self.slice.min(left))
            }
        };
        let t = &mut self.tasks[pick];
        t.budget += more;
        Some(Allotment {
            task: pick,
            budget: t.budget,
        })
    }

    /// The expected gain of a task's next slice, seconds per model call.
    fn gain(&self, t: &TaskState) -> f64 {
        let latency = t.latency.unwrap_or(f64::INFINITY);
        let slices = (t.budget as f64 / self.slice as f64).max(1.0);
        let drop = t.drops.iter().sum::<f64>() / t.drops.len().max(1) as f64;
        t.count as f64 * drop.max(OPTIMISM * latency / slices)
    }

    /// The task's search after its slice: its weighted latency, and whether it stalled.
    pub fn record(&mut self, task: usize, latency: f64, stalled: bool) {
        let t = &mut self.tasks[task];
        if let Some(l) = t.latency {
            if t.drops.len() == WINDOW {
                t.drops.remove(0);
            }
            t.drops.push((l - latency).max(0.0));
        }
        t.latency = Some(latency);
        t.stalled = stalled;
    }

    /// Whether every task has a latency (the expected latency covers the model).
    pub fn measured_all(&self) -> bool {
        self.tasks.iter().all(|t| t.latency.is_some())
    }

    /// The model's expected latency: `Σ count · latency` over the tasks with one.
    pub fn expected_latency(&self) -> f64 {
        self.tasks
            .iter()
            .filter_map(|t| t.latency.map(|l| t.count as f64 * l))
            .sum()
    }
}

/// A slice of a model's trial budget, as the task scheduler gives it out.
#[derive(Clone, Debug)]
pub struct Slice<'a> {
    /// The task (index).
    pub task: usize,
    /// Its workload.
    pub workload: &'a Workload,
    /// Its search runs until its records hold this many trials.
    pub budget: usize,
    /// The model's trials given out so far, this slice's included.
    pub given: usize,
    /// The model's trial budget.
    pub total: usize,
    /// The model's expected latency before this slice, seconds per call (the tasks with
    /// a measured latency; see [`Scheduler::expected_latency`]).
    pub expected_seconds: f64,
}

/// The tasks' searches, as the task scheduler gives out the model's budget; the
/// families' offers moved between their members before every slice. Returns the tuning
/// log.
pub(crate) fn schedule(
    runs: &mut [Box<dyn TaskSearch + '_>],
    tasks: &[anyshape_plan::Task],
    families: &[String],
    options: &ModelOptions,
    observer: &mut dyn Observer,
) -> Result<TuningLog> {
    let start = std::time::Instant::now();
    let counts: Vec<usize> = tasks.iter().map(|t| t.count).collect();
    let held: Vec<usize> = runs.iter().map(|r| r.trials()).collect();
    let resumed_seconds: f64 = runs.iter().map(|r| r.tuning_seconds()).sum();
    // A quarter of a task's average share a slice: the first slices measure every
    // task, the rest go where they cut the model's latency most (or round the tasks).
    let slice = (options.trials / 4).max(1);
    let total = options.trials * tasks.len();
    let mut scheduler = Scheduler::new(&counts, &held, slice, total);
    if options.equal_shares {
        scheduler = scheduler.equal_shares();
    }
    if options.families {
        // A family's first member gets a whole first slice, the later ones one foreseen
        // micro-kernel measured on the instances a search round gives each kernel.
        let first: Vec<usize> = (0..tasks.len())
            .map(|j| match families[..j].contains(&families[j]) {
                true => options.tune.instances_per_kernel,
                false => slice,
            })
            .collect();
        scheduler = scheduler.first_slices(&first);
    }
    // A resumed run's members offer what their records hold from the start.
    let mut offers: Vec<Option<Offer>> = runs
        .iter_mut()
        .zip(&held)
        .map(|(r, &n)| (options.families && n > 0).then(|| r.offer()))
        .collect();
    let mut curve = Vec::new();
    while let Some(a) = scheduler.next_slice() {
        observer.slice(&Slice {
            task: a.task,
            workload: &tasks[a.task].workload,
            budget: a.budget,
            given: scheduler.given(),
            total,
            expected_seconds: scheduler.expected_latency(),
        });
        if options.families {
            let others: Vec<&Offer> = (0..runs.len())
                .filter(|&j| j != a.task && families[j] == families[a.task])
                .filter_map(|j| offers[j].as_ref())
                .collect();
            runs[a.task].adopt(&others);
        }
        let (latency, stalled) = runs[a.task].search_to(a.budget, observer)?;
        scheduler.record(a.task, latency, stalled);
        if options.families {
            offers[a.task] = Some(runs[a.task].offer());
        }
        curve.push(CurvePoint {
            seconds: resumed_seconds + start.elapsed().as_secs_f64(),
            trials: runs.iter().map(|r| r.trials()).sum(),
            expected_seconds: scheduler
                .measured_all()
                .then(|| scheduler.expected_latency()),
        });
    }
    observer.scheduled(scheduler.given(), scheduler.expected_latency());
    let mut time = TimeBreakdown::default();
    for r in runs.iter() {
        time += r.time();
    }
    let mut names: Vec<&String> = families.iter().collect();
    names.sort();
    names.dedup();
    let mut qualities = Vec::new();
    for name in names {
        let members: Vec<usize> = (0..runs.len()).filter(|&j| &families[j] == name).collect();
        if members.len() > 1 {
            let samples: Vec<_> = members.iter().map(|&j| runs[j].offer().samples).collect();
            qualities.push(family_quality(name, &members, &samples));
        }
    }
    let database = runs.iter().any(|r| r.reused() + r.database_samples() > 0);
    Ok(TuningLog {
        mode: format!(
            "{}{}{}{}",
            if options.equal_shares {
                "equal shares"
            } else {
                "scheduler"
            },
            if options.families { " + families" } else { "" },
            if database { " + tuning database" } else { "" },
            match options.tune.search {
                crate::SearchStrategy::Evolutionary => "",
                crate::SearchStrategy::TrustRegion => " + trust-region search",
            }
        ),
        trials_per_task: options.trials,
        tasks: tasks.len(),
        curve,
        time,
        wall_seconds: start.elapsed().as_secs_f64(),
        new_trials: runs.iter().map(|r| r.trials()).sum::<usize>() - held.iter().sum::<usize>(),
        reused_trials: runs.iter().map(|r| r.reused()).sum(),
        database: runs
            .iter_mut()
            .filter_map(|r| r.database_quality())
            .collect(),
        families: qualities,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the scheduler on tasks whose latency falls by `drops[task]` per slice.
    fn run(
        counts: &[usize],
        start: &[f64],
        drops: &[f64],
        slice: usize,
        total: usize,
    ) -> Vec<usize> {
        let mut s = Scheduler::new(counts, &vec![0; counts.len()], slice, total);
        let mut lat = start.to_vec();
        let mut order = Vec::new();
        while let Some(a) = s.next_slice() {
            order.push(a.task);
            lat[a.task] = (lat[a.task] - drops[a.task]).max(0.0);
            s.record(a.task, lat[a.task], false);
        }
        assert_eq!(s.given(), total);
        order
    }

    #[test]
    fn every_task_first_then_the_largest_gain() {
        // Task 1 runs 12x and keeps improving; task 2 runs once.
        let order = run(&[1, 12, 1], &[1.0, 1.0, 1.0], &[0.01, 0.05, 0.2], 10, 100);
        assert_eq!(&order[..3], &[0, 1, 2]);
        let to_1 = order[3..].iter().filter(|&&t| t == 1).count();
        assert!(to_1 >= 5, "{order:?}");
        // The budget is spent exactly, the last slice cut to what is left.
        let order = run(&[1, 1], &[1.0, 1.0], &[0.1, 0.1], 30, 100);
        assert_eq!(order.len(), 4);
    }

    #[test]
    fn foreseen_tasks_start_with_a_smaller_slice() {
        let mut s = Scheduler::new(&[1, 1, 1], &[0; 3], 16, 96).first_slices(&[16, 4, 40]);
        let mut firsts = Vec::new();
        for _ in 0..3 {
            let a = s.next_slice().unwrap();
            firsts.push(a.budget);
            s.record(a.task, 1.0, false);
        }
        // At most a slice.
        assert_eq!(firsts, [16, 4, 16]);
        assert!(s.measured_all());
        // Later slices are whole ones, up to the total.
        assert_eq!(s.next_slice().map(|a| a.budget - firsts[a.task]), Some(16));
    }

    #[test]
    fn equal_shares_go_round_the_tasks() {
        let mut s = Scheduler::new(&[1, 12, 1], &[0; 3], 10, 90).equal_shares();
        let mut order = Vec::new();
        while let Some(a) = s.next_slice() {
            order.push(a.task);
            // Task 1 keeps improving; equal shares ignore it.
            s.record(a.task, 1.0 / (order.len() as f64), false);
        }
        assert_eq!(order, [0, 1, 2, 0, 1, 2, 0, 1, 2]);
        assert_eq!(s.given(), 90);
    }

    #[test]
    fn a_large_task_that_stopped_improving_does_not_take_every_slice() {
        // Task 0: 12 runs of 4 s; task 1: 36 runs of 1 s; neither improves.
        let order = run(&[12, 36], &[4.0, 1.0], &[0.0, 0.0], 10, 200);
        let to_0 = order.iter().filter(|&&t| t == 0).count();
        assert!((8..=12).contains(&to_0), "{order:?}");
    }

    #[test]
    fn stalled_tasks_get_nothing_more_and_resumed_trials_count() {
        let mut s = Scheduler::new(&[5, 1], &[40, 0], 20, 100);
        // The resumed task's first slice is the trials it holds.
        assert_eq!(
            s.next_slice(),
            Some(Allotment {
                task: 0,
                budget: 40
            })
        );
        s.record(0, 1.0, true);
        assert_eq!(
            s.next_slice(),
            Some(Allotment {
                task: 1,
                budget: 20
            })
        );
        s.record(1, 1.0, false);
        // Task 0 stalled: every further slice goes to task 1, up to the total.
        let mut last = None;
        while let Some(a) = s.next_slice() {
            assert_eq!(a.task, 1);
            s.record(1, 0.9, false);
            last = Some(a.budget);
        }
        assert_eq!(last, Some(60));
        assert!((s.expected_latency() - (5.0 + 0.9)).abs() < 1e-12);
        // Records past the total: every task still gets its first slice, then nothing.
        let mut s = Scheduler::new(&[1, 1], &[100, 0], 20, 100);
        assert_eq!(
            s.next_slice(),
            Some(Allotment {
                task: 0,
                budget: 100
            })
        );
        s.record(0, 1.0, false);
        assert_eq!(
            s.next_slice(),
            Some(Allotment {
                task: 1,
                budget: 20
            })
        );
        s.record(1, 1.0, false);
        assert_eq!(s.next_slice(), None);
        // Every task stalled: nothing more, whatever is left.
        let mut s = Scheduler::new(&[1], &[0], 10, 100);
        assert!(s.next_slice().is_some());
        s.record(0, 1.0, true);
        assert_eq!(s.next_slice(), None);
    }
}
