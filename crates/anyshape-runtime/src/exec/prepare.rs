//! Preparing a run ([`Executor`]'s half that runs before the steps): for its dims,
//! every value's shape, the arena's slots and each task's shape-var values, the sizes
//! checked at the instance and the memory the run needs checked against the machine's
//! (`prepare`, into the last preparation's vectors); and, before a decoder's first run
//! with a cache of some capacity, the arena, the host steps' kept tensors and the
//! memory check sized once for the longest run that capacity allows (`make_room`).
use super::Executor;
use crate::arena::Arena;
use crate::{CacheState, Result, RuntimeError};
use anyshape_ir::CACHE_RESERVE;
use anyshape_plan::{Plan, Step};
use anyshape_tensor::{Data, Tensor, ValueId};

impl Executor {
    /// Before a run that appends `rows` positions to `state`: where the arena was not
    /// made for caches this large, reserve it and the host steps' kept tensors for the
    /// longest run `state` has room for (the same new rows at the last past; a dim of
    /// the past and the new rows together at the capacity), so that the runs up to it
    /// allocate nothing as the past grows.
    pub(super) fn make_room(
        &self,
        arena: &mut Arena,
        state: &CacheState,
        rows: usize,
    ) -> Result<()> {
        let plan = self.plan();
        let Some(past) = CacheState::past_dim(plan) else {
            return Ok(());
        };
        if arena.room >= state.capacity() {
            return Ok(());
        }
        let b = &mut arena.bindings;
        let now = b.clone();
        // A dim bound to the past and the new rows together that the caches' shapes
        // are not made of (a mask's own length, where the export names no sums) grows
        // with the past.
        let total = (state.len() + rows) as i64;
        let own: Vec<String> = plan
            .caches
            .iter()
            .flat_map(|c| &plan.values[plan.outputs[c.present].1].shape)
            .flat_map(|e| e.vars())
            .collect();
        let grown: Vec<String> = now
            .iter()
            .filter(|&(n, v)| v == total && n != CACHE_RESERVE && !own.iter().any(|o| o == n))
            .map(|(n, _)| n.to_string())
            .collect();
        for n in &grown {
            b.update(n, state.capacity() as i64);
        }
        b.update(past, state.capacity().saturating_sub(rows) as i64);
        b.update(CACHE_RESERVE, 0);
        // The arena's bytes and every value's shape there.
        let sizes = (|| -> Result<(usize, Vec<Vec<usize>>)> {
            let shapes = (0..plan.values.len())
                .map(|v| plan.shape_at(v, b))
                .collect::<anyshape_plan::Result<_>>()?;
            Ok((plan.memory.bytes(b)?, shapes))
        })();
        b.assign(&now);
        let (bytes, shapes) = sizes?;
        // Checked as `prepare` checks a run, so that the runs up to it check nothing.
        let total = bytes as u128 + owned_peak(plan, &shapes, &self.frees, &self.keeps);
        anyshape_abi::check_fits(total, "the run's tensors at the caches' length")
            .map_err(|e| RuntimeError::Memory(format!("{e}: generate fewer tokens")))?;
        arena.checked = arena.checked.max(total);
        // The tensors the host steps keep, at their largest.
        let mut kept = Vec::new();
        for (k, step) in plan.steps.iter().enumerate() {
            let Step::Host(node) = step else { continue };
            if plan.caches.iter().any(|c| c.step == k)
                || self.ops[k].and_then(|o| o.eval_into).is_none()
            {
                continue;
            }
            kept.extend(
                node.outputs
                    .iter()
                    .map(|&v| (v, shapes[v].iter().product::<usize>())),
            );
        }
        if !arena.reserve(bytes) {
            return Err(RuntimeError::Memory(format!(
                "the run's arena needs {:.2} GiB, which the allocator refuses",
                anyshape_abi::gib(bytes as u128)
            )));
        }
        arena.owned.resize_with(plan.values.len(), || None);
        for (v, n) in kept {
            arena.owned[v]
                .get_or_insert_with(|| Tensor {
                    shape: Vec::with_capacity(plan.values[v].shape.len()),
                    data: Data::zeros(plan.values[v].dtype, 0),
                })
                .reserve(n);
        }
        arena.room = state.capacity();
        Ok(())
    }

    /// Prepare `arena` for a run at its bindings: shapes (a kept cache's present: its
    /// buffer's, with the rows to spare), slots and the tasks' shape-var values; the
    /// sizes checked at this instance, the arena and the host steps' tensors checked
    /// against the machine's memory, and the arena grown to size. Into the vectors of
    /// the last preparation: nothing is allocated where they have room.
    pub(super) fn prepare(&self, arena: &mut Arena, state: Option<&CacheState>) -> Result<()> {
        if arena.is_for(&arena.bindings) {
            return Ok(());
        }
        let plan = self.plan();
        let b = &arena.bindings;
        let p = &mut arena.prepared;
        p.valid = false;
        p.bindings.assign(b);
        p.shapes.resize_with(plan.values.len(), Vec::new);
        for (v, shape) in p.shapes.iter_mut().enumerate() {
            match self.late.get(v) {
                // Told by the step that makes it.
                Some(true) => shape.clear(),
                _ => plan.shape_into(v, b, shape)?,
            }
        }
        if let Some(state) = state {
            for (i, c) in plan.caches.iter().enumerate() {
                let shape = &mut p.shapes[plan.outputs[c.present].1];
                shape.clear();
                shape.extend_from_slice(state.shape(i));
            }
        }
        plan.memory.layout_into(b, &mut p.layout)?;
        anyshape_plan::check_instance(plan, &p.shapes, &p.layout.sizes, b, &mut p.bound)?;
        let owned = owned_peak(plan, &p.shapes, &self.frees, &self.keeps);
        let memory = |e: String| {
            RuntimeError::Memory(format!(
                "{e}: run the model at smaller dims (the inputs' shapes set them)"
            ))
        };
        let total = p.layout.bytes as u128 + owned;
        if total > arena.checked {
            anyshape_abi::check_fits(total, "the run's tensors").map_err(memory)?;
            arena.checked = total;
        }
        let bytes = p.layout.bytes;
        p.vars.resize_with(self.task_vars.len(), Vec::new);
        for (vars, names) in p.vars.iter_mut().zip(&self.task_vars) {
            vars.clear();
            vars.extend(names.iter().map(|n| b.get(n).unwrap_or(0)));
        }
        if !arena.reserve(bytes) {
            return Err(memory(format!(
                "the run's arena needs {:.2} GiB, which the allocator refuses",
                anyshape_abi::gib(bytes as u128)
            )));
        }
        arena.prepared.valid = true;
        Ok(())
    }
}

/// The most bytes the host steps' own tensors take at once at these shapes: each
/// step's outputs from the step that makes them to the last that reads them (`frees`:
/// per step, those that die after it; kept for the whole run where the op evaluates
/// into kept tensors), and while a step runs twice its outputs besides (the index
/// walks of broadcasts and gathers).
fn owned_peak(plan: &Plan, shapes: &[Vec<usize>], frees: &[Vec<ValueId>], keeps: &[bool]) -> u128 {
    let size = |v: usize| -> u128 {
        shapes[v]
            .iter()
            .fold(1u128, |n, &d| n.saturating_mul(d as u128))
            .saturating_mul(plan.values[v].dtype.size_bytes() as u128)
    };
    let (mut live, mut peak) = (0u128, 0u128);
    for (k, step) in plan.steps.iter().enumerate() {
        if let Step::Host(node) = step {
            let made: u128 = node.outputs.iter().map(|&v| size(v)).sum();
            live = live.saturating_add(made);
            peak = peak.max(live.saturating_add(made.saturating_mul(2)));
        }
        for &v in &frees[k] {
            if !keeps[v] {
                live = live.saturating_sub(size(v));
            }
        }
    }
    peak
}
