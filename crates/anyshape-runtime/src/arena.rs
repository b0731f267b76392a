//! The arena a plan's kernels write into, reused from run to run: one block of memory
//! starting on a cache line, grown when a run needs more; what a run at given dims
//! needs besides — each value's shape, the slots' offsets, each task's shape-var values
//! — computed once per binding of the dims, not on every run, into vectors that are
//! reused; and the host steps' tensors kept for the next run (so that a decoder's step,
//! whose dims change every token, allocates nothing).
use anyshape_ir::{Bindings, BoundWorkload};
use anyshape_plan::ArenaLayout;
use anyshape_tensor::Tensor;
use std::alloc::Layout;
use std::ptr::NonNull;

/// A block of memory on a cache line.
struct Block {
    ptr: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the block is plain memory owned by the arena; runs take an arena from the
// model's pool, so one thread uses it at a time.
unsafe impl Send for Block {}

impl Block {
    const ALIGN: usize = 64;

    fn layout(bytes: usize) -> Layout {
        Layout::from_size_align(bytes.max(Self::ALIGN), Self::ALIGN).expect("a valid layout")
    }

    /// A block of `bytes` (uninitialized: every value is written before it is read).
    fn new(bytes: usize) -> Option<Block> {
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(Self::layout(bytes)) })?;
        Some(Block { ptr, bytes })
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: allocated by `Block::new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.bytes)) }
    }
}

/// What a run at one binding of the dims needs.
#[derive(Default)]
pub(crate) struct Prepared {
    /// Whether the rest is whole (a preparation that failed half-way is not).
    pub valid: bool,
    /// The dims.
    pub bindings: Bindings,
    /// Each value's shape.
    pub shapes: Vec<Vec<usize>>,
    /// The arena's slots.
    pub layout: ArenaLayout,
    /// Each task's shape-var values, in its workload's order.
    pub vars: Vec<Vec<i64>>,
    /// Each task's workload bound at the dims (the sizes checked).
    pub bound: Vec<BoundWorkload>,
}

/// An arena, the run it was last prepared for, and what a run binds and keeps.
#[derive(Default)]
pub(crate) struct Arena {
    block: Option<Block>,
    pub prepared: Prepared,
    /// The dims the run being started binds.
    pub bindings: Bindings,
    /// For each input the binder declares, its index among the given tensors.
    pub at: Vec<usize>,
    /// For each of the plan's inputs, its index among the given tensors (`None`: a
    /// kept cache's past).
    pub given: Vec<Option<usize>>,
    /// Host steps' tensors and evaluated shape plumbing, by value; those of ops that
    /// evaluate into given outputs stay here from run to run.
    pub owned: Vec<Option<Tensor>>,
    /// The most bytes a run's tensors were checked to fit the machine's memory.
    pub checked: u128,
    /// The positions of the caches it was last made room for.
    pub room: usize,
}

impl Arena {
    /// Whether it is prepared for `bindings`.
    pub fn is_for(&self, bindings: &Bindings) -> bool {
        self.prepared.valid && &self.prepared.bindings == bindings
    }

    /// Make the block hold at least `bytes`; false if the allocator refuses.
    pub fn reserve(&mut self, bytes: usize) -> bool {
        if self.block.as_ref().is_some_and(|b| b.bytes >= bytes) {
            return true;
        }
        self.block = None; // freed before the larger one is taken
        self.block = Block::new(bytes);
        self.block.is_some()
    }

    /// The block's start (reserved before every run).
    pub fn base(&self) -> *mut u8 {
        self.block
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.ptr.as_ptr())
    }
}
