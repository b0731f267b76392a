//! A pool for independent jobs of uneven length (compiling kernels, building a model's
//! task modules): a few threads, each taking the next job as soon as it is done; and
//! [`Slots`], a limit on how many of a kind of job run at once across pools (a pool's
//! jobs that start pools of their own would otherwise run threads² of them).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// A count of jobs running at once, which [`Slots::take`] holds under a limit.
pub(crate) struct Slots {
    busy: Mutex<usize>,
    freed: Condvar,
}

/// A job's place in [`Slots`], given back when dropped.
pub(crate) struct Slot<'a>(&'a Slots);

impl Slots {
    /// No job running.
    pub(crate) const fn new() -> Slots {
        Slots {
            busy: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    fn busy(&self) -> MutexGuard<'_, usize> {
        // The count stays right through a panic elsewhere: nothing to recover.
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place once fewer than `limit` (at least 1) jobs hold one, waiting until then.
    pub(crate) fn take(&self, limit: usize) -> Slot<'_> {
        let mut busy = self.busy();
        while *busy >= limit.max(1) {
            busy = self.freed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy += 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.busy() -= 1;
        self.0.freed.notify_one();
    }
}

/// `work(i)` for every `i < n` on up to `threads` threads, each taking the next index as
/// soon as it is done; `started(i)` runs on the calling thread as job `i` begins (a
/// progress line). The results in index order.
pub fn each_on_threads<T: Send>(
    n: usize,
    threads: usize,
    mut started: impl FnMut(usize),
    work: impl Fn(usize) -> T + Sync,
) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<T>> = (0..n).map(|_| None).collect();
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..threads.clamp(1, n.max(1)) {
            let (tx, next, work) = (tx.clone(), &next, &work);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n || tx.send((i, None)).is_err() {
                    break;
                }
                if tx.send((i, Some(work(i)))).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, done) in rx {
            match done {
                None => started(i),
                Some(r) => results[i] = Some(r),
            }
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every job is done (a worker that panics panics the pool)"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pools inside a pool's jobs run no more than the limit's jobs at once.
    #[test]
    fn slots_bound_nested_pools() {
        let (slots, running, most) = (Slots::new(), AtomicUsize::new(0), AtomicUsize::new(0));
        each_on_threads(
            4,
            4,
            |_| {},
            |_| {
                each_on_threads(
                    4,
                    4,
                    |_| {},
                    |_| {
                        let _slot = slots.take(3);
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        running.fetch_sub(1, Ordering::SeqCst);
                    },
                )
            },
        );
        assert!((1..=3).contains(&most.load(Ordering::SeqCst)));
        assert_eq!(*slots.busy(), 0);
    }

    /// Every job runs once, its result in its place, each start seen before its end
    /// by the caller, with more threads than jobs and with none.
    #[test]
    fn every_job_once_in_order() {
        for threads in [0, 1, 3, 16] {
            let mut seen = Vec::new();
            let out = each_on_threads(10, threads, |i| seen.push(i), |i| i * i);
            assert_eq!(out, (0..10).map(|i| i * i).collect::<Vec<_>>());
            seen.sort_unstable();
            assert_eq!(seen, (0..10).collect::<Vec<_>>());
        }
        assert!(each_on_threads(0, 2, |_| {}, |i| i).is_empty());
    }
}
