//! The machine's memory read bandwidth, measured: what a decode step, which streams
//! every weight once, is held against.
use std::time::Instant;

/// Bytes read per measurement: far past any last-level cache.
const BYTES: usize = 1 << 30;

/// The best read bandwidth (bytes per second) of `threads` threads summing disjoint
/// parts of a 1 GiB buffer, over `repeats` passes (at least one).
pub fn read_bandwidth(threads: usize, repeats: usize) -> f64 {
    let data = vec![1.0f32; BYTES / 4];
    let threads = threads.max(1);
    let part = data.len().div_ceil(threads);
    let mut best = 0.0f64;
    for _ in 0..repeats.max(1) {
        let start = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let handles: Vec<_> = data.chunks(part).map(|c| s.spawn(move || sum(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        let seconds = start.elapsed().as_secs_f64();
        // The sum is used, so the reads are not optimized away.
        if total.is_finite() && seconds > 0.0 {
            best = best.max(BYTES as f64 / seconds);
        }
    }
    best
}

/// The sum of `x` in 16 independent lanes (which the compiler keeps in vectors).
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_every_element() {
        let x: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        assert_eq!(super::sum(&x), 499_500.0);
    }
}
