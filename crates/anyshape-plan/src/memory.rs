//! The memory plan: the arena the kernels' outputs share. Each kernel output lives in a
//! slot from the step that writes it to the last step that reads it (or a view of it);
//! a slot is reused by a later output of the same size once its value is dead. Slot
//! sizes are expressions over the shape vars, so the arena's size — the peak of the
//! kernels' outputs — is one too; at a run, the slots' offsets follow from the
//! instance's dims, each on a cache line.
use crate::plan::numel;
use crate::{text, Plan, Result, Step, Storage};
use anyshape_ir::{Bindings, Expr};
use serde::{Deserialize, Serialize};

/// The arena's slots.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// Each slot's size in 32-bit elements, over the shape vars.
    #[serde(with = "text::exprs")]
    pub slots: Vec<Expr>,
}

/// The arena at one instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ArenaLayout {
    /// Each slot's offset in bytes (a multiple of 64).
    pub offsets: Vec<usize>,
    /// Each slot's size in 32-bit elements.
    pub sizes: Vec<usize>,
    /// The arena's bytes.
    pub bytes: usize,
}

/// Bytes from one slot to the next at least: a cache line.
const ALIGN: usize = 64;

impl MemoryPlan {
    /// Give every kernel output of `plan` a slot (their storage must be
    /// `Storage::Arena(_)`, any index): in step order, an output takes a free slot of
    /// the same size (for every binding) or a new one; a value's slot is free after the
    /// last step that reads it. Sets `plan.memory`.
    pub fn assign(plan: &mut Plan) {
        let last = plan.last_uses();
        let mut slots: Vec<Expr> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut alive: Vec<(usize, usize)> = Vec::new(); // (value, slot)
        for (k, step) in plan.steps.iter().enumerate() {
            if let Step::Kernel { output, .. } = step {
                let size = numel(&plan.values[*output].shape);
                let reuse = free
                    .iter()
                    .position(|&s| anyshape_tensor::equal(&slots[s], &size) == Some(true));
                let slot = match reuse {
                    Some(i) => free.remove(i),
                    None => {
                        slots.push(size);
                        slots.len() - 1
                    }
                };
                plan.values[*output].storage = Storage::Arena(slot);
                alive.push((*output, slot));
            }
            // Free what no later step reads.
            alive.retain(|&(v, slot)| {
                let dead = last[v] <= k;
                if dead {
                    free.push(slot);
                }
                !dead
            });
        }
        plan.memory = MemoryPlan { slots };
    }

    /// The arena's layout at `bindings`.
    pub fn layout(&self, bindings: &Bindings) -> Result<ArenaLayout> {
        let mut layout = ArenaLayout::default();
        self.layout_into(bindings, &mut layout)?;
        Ok(layout)
    }

    /// [`MemoryPlan::layout`] into `layout` (its vectors reused: nothing allocated
    /// where they have room).
    pub fn layout_into(&self, bindings: &Bindings, layout: &mut ArenaLayout) -> Result<()> {
        layout.offsets.clear();
        layout.sizes.clear();
        layout.bytes = self.walk(bindings, |at, n| {
            layout.offsets.push(at);
            layout.sizes.push(n);
        })?;
        Ok(())
    }

    /// The arena's bytes at `bindings` (what [`MemoryPlan::layout`] gives as
    /// `bytes`), computed without allocating.
    pub fn bytes(&self, bindings: &Bindings) -> Result<usize> {
        self.walk(bindings, |_, _| {})
    }

    /// Each slot's offset and elements in order, to `slot`; the arena's bytes.
    fn walk(&self, bindings: &Bindings, mut slot: impl FnMut(usize, usize)) -> Result<usize> {
        let mut at = 0usize;
        for s in &self.slots {
            let n = usize::try_from(s.eval(bindings)?).unwrap_or(0);
            slot(at, n);
            at = n
                .checked_mul(4)
                .and_then(|b| b.checked_next_multiple_of(ALIGN))
                .and_then(|b| at.checked_add(b))
                .ok_or_else(|| {
                    crate::PlanError::Invalid(format!("the arena overflows at {bindings}"))
                })?;
        }
        Ok(at)
    }

    /// The arena's bytes over the shape vars (each slot's 4-byte elements; every slot
    /// also rounds up to a cache line, at most 64 bytes more).
    pub fn peak(&self) -> Expr {
        self.slots
            .iter()
            .fold(Expr::Const(0), |acc, s| acc + s.clone())
            .simplify()
            * Expr::Const(4)
    }
}
