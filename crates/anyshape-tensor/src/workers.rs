//! The threads a host op may split its work over ([`Workers`]): at run time the
//! kernels' own thread pool (a model's task modules lend it, so that host steps and
//! kernels share one set of threads instead of competing with threads that spin
//! between kernel calls), serial in the reference and where none is lent.
use std::sync::Mutex;

/// Runs the parts of a split piece of work.
pub trait Split: Sync {
    /// Call `part(i)` for every `i` in `0..parts`, over the threads, in contiguous runs
    /// of `i` per thread; return when every part is done.
    fn split(&self, parts: usize, part: &(dyn Fn(usize) + Sync));
}

/// What a host op may split its work over.
#[derive(Clone, Copy)]
pub struct Workers<'a> {
    split: Option<&'a dyn Split>,
}

impl std::fmt::Debug for Workers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("parallel", &self.is_parallel())
            .finish()
    }
}

impl Workers<'static> {
    /// One thread: the caller's.
    pub const SERIAL: Workers<'static> = Workers { split: None };
}

impl<'a> Workers<'a> {
    /// The threads `split` runs parts on.
    pub fn new(split: &'a dyn Split) -> Workers<'a> {
        Workers { split: Some(split) }
    }

    /// Whether the work is split over more than the caller's thread.
    pub fn is_parallel(&self) -> bool {
        self.split.is_some()
    }

    /// `f(i, chunk)` for each of `data`'s chunks of `len` elements (the last may be
    /// shorter; `len` 0 counts as 1), each chunk written by one thread.
    pub fn chunks_mut<T: Send>(
        &self,
        data: &mut [T],
        len: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let len = len.max(1);
        match self.split {
            Some(s) if data.len() > len => {
                let chunks: Vec<Mutex<&mut [T]>> = data.chunks_mut(len).map(Mutex::new).collect();
                s.split(chunks.len(), &|i| {
                    let mut chunk = chunks[i].lock().unwrap_or_else(|e| e.into_inner());
                    f(i, &mut chunk)
                });
            }
            _ => {
                for (i, chunk) in data.chunks_mut(len).enumerate() {
                    f(i, chunk)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parts on two scoped threads, each a contiguous half.
    struct Two;
    impl Split for Two {
        fn split(&self, parts: usize, part: &(dyn Fn(usize) + Sync)) {
            let half = parts.div_ceil(2);
            std::thread::scope(|s| {
                s.spawn(|| (0..half).for_each(part));
                (half..parts).for_each(part);
            });
        }
    }

    #[test]
    fn every_chunk_is_written_once_by_its_index() {
        for workers in [Workers::SERIAL, Workers::new(&Two)] {
            for (n, len) in [(0, 3), (1, 3), (7, 3), (9, 3), (5, 0), (4, 10)] {
                let mut data = vec![usize::MAX; n];
                workers.chunks_mut(&mut data, len, |i, chunk| {
                    for (j, x) in chunk.iter_mut().enumerate() {
                        *x = i * len.max(1) + j;
                    }
                });
                assert_eq!(data, (0..n).collect::<Vec<_>>(), "{workers:?} {n} {len}");
            }
        }
    }
}
