//! The arena a plan's kernels write into, reused from run to run: one block of memory
//! starting on a cache line, grown when a run needs more; and what a run at given dims
//! needs besides — each value's shape, the slots' offsets, each task's shape-var values
//! — computed once per binding of the dims, not on every run.
use anyshape_ir::Bindings;
use anyshape_plan::ArenaLayout;
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
pub(crate) struct Prepared {
    /// The dims.
    pub bindings: Bindings,
    /// Each value's shape.
    pub shapes: Vec<Vec<usize>>,
    /// The arena's slots.
    pub layout: ArenaLayout,
    /// Each task's shape-var values, in its workload's order.
    pub vars: Vec<Vec<i64>>,
}

/// An arena and the run it was last prepared for.
#[derive(Default)]
pub(crate) struct Arena {
    block: Option<Block>,
    pub prepared: Option<Prepared>,
}

impl Arena {
    /// Whether it is prepared for `bindings`.
    pub fn is_for(&self, bindings: &Bindings) -> bool {
        self.prepared
            .as_ref()
            .is_some_and(|p| &p.bindings == bindings)
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
