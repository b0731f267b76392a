//! Where kernels find their buffers: a global allocator that starts every allocation
//! of a page or more on a cache line, and counts the allocations it makes
//! ([`allocations`]: how a decoder's step is checked to allocate nothing).
//!
//! A kernel's vector loads and stores cost more where they straddle two cache lines,
//! and how many do depends on where its buffers start: the system allocator starts
//! large blocks 16 bytes past a line (after its header) or anywhere its heap happens
//! to be. On an Emerald Rapids Xeon, one `batch_matmul_nn` kernel at T = 22 ran 21 %
//! slower with its buffers 16, 32 or 48 bytes past a line than on one, another 7 %:
//! which of two kernels was faster turned on the heap's state, and so changed from one
//! measuring process to the next (the votes chose by one process's alignment, the
//! dispatch-loss run measured another's). Every process that measures, tunes or runs
//! kernels (`anyshape` and `anyshape-worker`) declares this allocator, so that every
//! buffer it hands a kernel starts on a line — as a framework's tensors do (PyTorch's
//! and onnxruntime's CPU allocators align to 64 bytes).
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Allocations (and reallocations) made through [`CacheLineAllocator`] so far.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// How many allocations and reallocations the process has made through
/// [`CacheLineAllocator`] (0 where it is not the global allocator): the difference
/// between two reads is what the code between them allocated, on any thread.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// The alignment given to large allocations: a cache line, also one AVX-512 vector.
pub const BUFFER_ALIGN: usize = 64;

/// Allocations of at least this many bytes start on a line ([`BUFFER_ALIGN`]); smaller
/// ones keep the system allocator's placement, which costs no padding.
pub const ALIGN_FROM_BYTES: usize = 4096;

/// The system allocator, with allocations of [`ALIGN_FROM_BYTES`] or more aligned to
/// [`BUFFER_ALIGN`]. Declare it with `#[global_allocator]` in a binary.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheLineAllocator;

/// The layout the system allocator is asked for in place of `layout`.
fn widened(layout: Layout) -> Layout {
    if layout.size() >= ALIGN_FROM_BYTES && layout.align() < BUFFER_ALIGN {
        // A power of two at most the size; the size stays a valid size for it.
        Layout::from_size_align(layout.size(), BUFFER_ALIGN).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every block is allocated and freed by `System` with the same widened layout
// (a pure function of the caller's layout), and the widened layout's alignment is at
// least the caller's.
unsafe impl GlobalAlloc for CacheLineAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc(widened(layout))
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        System.alloc_zeroed(widened(layout))
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, widened(layout))
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        let old = widened(layout);
        let Ok(new) = Layout::from_size_align(new_size, layout.align()).map(widened) else {
            return std::ptr::null_mut();
        };
        if old.align() == new.align() {
            return System.realloc(ptr, old, new_size);
        }
        // Crossing the threshold: the system's realloc would keep the old alignment.
        let moved = System.alloc(new);
        if !moved.is_null() {
            std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
            System.dealloc(ptr, old);
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of `size` bytes from `a`, filled with its indices.
    fn filled(a: &CacheLineAllocator, size: usize) -> *mut u8 {
        // SAFETY: `size` is not zero; the block is `size` bytes long.
        unsafe {
            let p = a.alloc(Layout::from_size_align(size, 4).unwrap());
            assert!(!p.is_null());
            for i in 0..size {
                *p.add(i) = i as u8;
            }
            p
        }
    }

    fn on_a_line_if_large(p: *mut u8, size: usize) {
        assert_eq!(p as usize % 4, 0);
        if size >= ALIGN_FROM_BYTES {
            assert_eq!(p as usize % BUFFER_ALIGN, 0, "{size} bytes at {p:p}");
        }
    }

    #[test]
    fn large_blocks_start_on_a_line_and_keep_their_data() {
        let a = CacheLineAllocator;
        for size in [1, 17, 4095, 4096, 4100, 1 << 20, 3 << 20] {
            // Grown across the threshold, shrunk under it, and within its class.
            for new_size in [size * 3 + 5000, 100, size + 1] {
                let p = filled(&a, size);
                on_a_line_if_large(p, size);
                // SAFETY: `p` holds `size` bytes allocated with this layout; the
                // block is freed with the layout of its new size.
                unsafe {
                    let q = a.realloc(p, Layout::from_size_align(size, 4).unwrap(), new_size);
                    assert!(!q.is_null());
                    on_a_line_if_large(q, new_size);
                    for i in 0..size.min(new_size) {
                        assert_eq!(*q.add(i), i as u8);
                    }
                    a.dealloc(q, Layout::from_size_align(new_size, 4).unwrap());
                }
            }
            // SAFETY: as above; zeroed blocks read as zeros.
            unsafe {
                let layout = Layout::from_size_align(size, 4).unwrap();
                let z = a.alloc_zeroed(layout);
                on_a_line_if_large(z, size);
                assert!((0..size).all(|i| *z.add(i) == 0));
                a.dealloc(z, layout);
            }
        }
    }
}
