//! A pool for independent jobs of uneven length (compiling kernels, building a model's
//! task modules): a few threads, each taking the next job as soon as it is done.

use std::sync::atomic::{AtomicUsize, Ordering};

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
