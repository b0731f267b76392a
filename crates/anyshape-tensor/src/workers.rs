//! The threads a host op may split its work over ([`Workers`]): at run time the
//! kernels' own thread pool (a model's task modules lend it, so that host steps and
//! kernels share one set of threads instead of competing with threads that spin
//! between kernel calls), serial in the reference and where none is lent.

/// Runs the parts of a split piece of work.
///
/// # Safety
/// `split` calls `part(i)` exactly once for every `i` in `0..parts` and returns when
/// every call has returned: the parts of [`Workers::chunks_mut`] write disjoint chunks
/// of one slice through that promise.
pub unsafe trait Split: Sync {
    /// Call `part(i)` for every `i` in `0..parts`, over the threads, in contiguous runs
    /// of `i` per thread; return when every part is done.
    fn split(&self, parts: usize, part: &(dyn Fn(usize) + Sync));
}

/// The fewest elements a part of [`Workers::chunks_mut`] writes (chunks are grouped
/// up to it): smaller parts cost more in handing out than they save (a ResNet's
/// patch layouts at 96 x 96 are 1,536 parts of 27 elements).
const MIN_PART: usize = 1 << 14;

/// Elements per chunk that an op of one element at a time hands the workers (`map`,
/// the elementwise ops' zip): small enough to balance, the workers group them into
/// parts of at least [`MIN_PART`].
pub(crate) const CHUNK: usize = 4096;

/// A slice's start, shared by the parts that write its disjoint chunks.
struct Base<T>(*mut T);
// SAFETY: each part reaches only its own chunks (see `Workers::chunks_mut`).
unsafe impl<T: Send> Sync for Base<T> {}

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

    /// `out[i] = f(input[i])` for each element of `out` (as long as `input`), in
    /// chunks split as [`Workers::chunks_mut`] splits them.
    pub fn map<A: Copy + Sync, B: Send>(
        &self,
        input: &[A],
        out: &mut [B],
        f: impl Fn(A) -> B + Sync,
    ) {
        self.chunks_mut(out, CHUNK, |i, out| {
            let input = input.get(i * CHUNK..).unwrap_or_default();
            for (o, &x) in out.iter_mut().zip(input) {
                *o = f(x);
            }
        });
    }

    /// `f(i, chunk)` for each of `data`'s chunks of `len` elements (the last may be
    /// shorter; `len` 0 counts as 1), each chunk written by one thread; consecutive
    /// chunks go to one thread together up to `MIN_PART` (16K) elements, so that work too
    /// small to share stays on the caller's.
    pub fn chunks_mut<T: Send>(
        &self,
        data: &mut [T],
        len: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        self.chunks_mut_weighted(data, len, 1, f)
    }

    /// [`Workers::chunks_mut`] where each element written costs `weight` elements'
    /// work (a reduction's output: the run it sums), which the grouping counts.
    pub fn chunks_mut_weighted<T: Send>(
        &self,
        data: &mut [T],
        len: usize,
        weight: usize,
        f: impl Fn(usize, &mut [T]) + Sync,
    ) {
        let len = len.max(1);
        let chunks = data.len().div_ceil(len);
        let group = MIN_PART.div_ceil(len.saturating_mul(weight.max(1)));
        match self.split {
            Some(s) if chunks > group => {
                let (total, base) = (data.len(), Base(data.as_mut_ptr()));
                let base = &base;
                s.split(chunks.div_ceil(group), &|p| {
                    for i in p * group..((p + 1) * group).min(chunks) {
                        let start = i * len;
                        // SAFETY: chunk `i` lies inside `data` (borrowed mutably for
                        // the call) and is written by part `i / group` alone, which
                        // `split` runs once (its contract).
                        let chunk = unsafe {
                            std::slice::from_raw_parts_mut(
                                base.0.add(start),
                                len.min(total - start),
                            )
                        };
                        f(i, chunk)
                    }
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

/// Parts on two scoped threads, each a contiguous half: the split of the tests.
#[cfg(test)]
pub(crate) struct Two;

// SAFETY: every part once, all joined before returning.
#[cfg(test)]
unsafe impl Split for Two {
    fn split(&self, parts: usize, part: &(dyn Fn(usize) + Sync)) {
        let half = parts.div_ceil(2);
        std::thread::scope(|s| {
            s.spawn(|| (0..half).for_each(part));
            (half..parts).for_each(part);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_is_written_once_by_its_index() {
        for workers in [Workers::SERIAL, Workers::new(&Two)] {
            let big = MIN_PART * 3 + 5;
            for (n, len) in [
                (0, 3),
                (1, 3),
                (7, 3),
                (5, 0),
                (4, 10),
                (big, 7),
                (big, MIN_PART),
            ] {
                let mut data = vec![usize::MAX; n];
                workers.chunks_mut(&mut data, len, |i, chunk| {
                    for (j, x) in chunk.iter_mut().enumerate() {
                        *x = i * len.max(1) + j;
                    }
                });
                assert_eq!(data, (0..n).collect::<Vec<_>>(), "{workers:?} {n} {len}");
                // Each element as costly as a part: every chunk a part of its own.
                let mut weighed = vec![usize::MAX; n];
                workers.chunks_mut_weighted(&mut weighed, len, MIN_PART, |i, chunk| {
                    for (j, x) in chunk.iter_mut().enumerate() {
                        *x = i * len.max(1) + j;
                    }
                });
                assert_eq!(weighed, data, "{workers:?} {n} {len} weighted");
                let mut doubled = vec![0; n];
                workers.map(&data, &mut doubled, |x| 2 * x);
                assert!(doubled.iter().enumerate().all(|(i, &x)| x == 2 * i));
            }
        }
    }
}
