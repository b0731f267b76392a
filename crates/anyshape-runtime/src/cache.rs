//! A decoder's key/value caches kept across runs ([`CacheState`]): one buffer per cache
//! of the plan ([`anyshape_plan::Cache`]), with room for a given number of positions
//! along its growing axis, allocated once. A run that keeps them ([`crate::Model::run_cached`])
//! binds the past length to what they hold and the rows to spare
//! ([`anyshape_ir::CACHE_RESERVE`]) to the room left, appends its new rows in place of
//! the plan's `Concat` (copying those rows only), and its kernels read the caches where
//! they are.
use crate::error::internal;
use crate::{Result, RuntimeError};
use anyshape_ir::{Bindings, Expr};
use anyshape_plan::Plan;

/// A decoder's caches between runs.
#[derive(Debug)]
pub struct CacheState {
    /// The positions they hold.
    len: usize,
    /// The positions they have room for.
    capacity: usize,
    /// Each cache's shape (its axis at the capacity) and elements, in the plan's order.
    buffers: Vec<(Vec<usize>, Vec<f32>)>,
}

impl CacheState {
    /// Empty caches of `plan` with room for `capacity` positions, their other dims at
    /// `dims` (the batch); the memory checked against the machine's first.
    pub(crate) fn new(plan: &Plan, dims: &Bindings, capacity: usize) -> Result<CacheState> {
        if plan.caches.is_empty() {
            return Err(RuntimeError::Decoder(
                "its plan keeps no cache across runs (a step other than its attention reads one)"
                    .into(),
            ));
        }
        let first = &plan.caches[0];
        let past = &plan.inputs[first.past].0.shape[first.axis];
        if plan
            .caches
            .iter()
            .any(|c| &plan.inputs[c.past].0.shape[c.axis] != past)
        {
            return Err(RuntimeError::Decoder(
                "its caches do not all grow along one past length".into(),
            ));
        }
        let mut shapes = Vec::with_capacity(plan.caches.len());
        let mut bytes = 0u128;
        for c in &plan.caches {
            let spec = &plan.inputs[c.past].0;
            let mut shape = Vec::with_capacity(spec.shape.len());
            for (k, e) in spec.shape.iter().enumerate() {
                let d = if k == c.axis {
                    Some(capacity)
                } else {
                    e.eval(dims).ok().and_then(|v| usize::try_from(v).ok())
                };
                shape.push(d.ok_or_else(|| {
                    RuntimeError::Options(format!(
                        "the cache `{}` has a dim `{e}` that {dims} does not set",
                        spec.name
                    ))
                })?);
            }
            bytes = shape
                .iter()
                .fold(4u128, |n, &d| n.saturating_mul(d as u128))
                .saturating_add(bytes);
            shapes.push(shape);
        }
        anyshape_abi::check_fits(bytes, "the key/value caches").map_err(|e| {
            RuntimeError::Memory(format!("{e}: generate fewer tokens or for fewer rows"))
        })?;
        let buffers = shapes
            .into_iter()
            .map(|s| {
                let n = s.iter().product();
                (s, vec![0.0; n])
            })
            .collect();
        Ok(CacheState {
            len: 0,
            capacity,
            buffers,
        })
    }

    /// The positions the caches hold.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether they hold none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The positions they have room for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bind the dims a run on them sets: the past length to what they hold, and the
    /// rows to spare to the room left after the run (its present's length). The
    /// positions the run appends.
    pub(crate) fn bind(&self, plan: &Plan, b: &mut Bindings) -> Result<usize> {
        let c = &plan.caches[0];
        let Expr::Var(past) = &plan.inputs[c.past].0.shape[c.axis] else {
            return Err(internal("a cache's past length is no dim"));
        };
        b.update(past, self.len as i64);
        let present = plan.outputs[c.present].1;
        let total = plan.values[present].shape[c.axis].eval(b)?;
        let total = usize::try_from(total).map_err(|_| internal("a negative cache length"))?;
        if total > self.capacity {
            return Err(RuntimeError::Options(format!(
                "the caches hold {} positions and have room for {}: this run would make {total}",
                self.len, self.capacity
            )));
        }
        b.update(anyshape_ir::CACHE_RESERVE, (self.capacity - total) as i64);
        for (k, (s, _)) in plan.caches.iter().zip(&self.buffers) {
            let shape = &plan.values[plan.outputs[k.present].1].shape;
            let mut fits = s.len() == shape.len();
            for (d, e) in shape.iter().enumerate() {
                if fits && d != k.axis {
                    fits = e.eval(b)? == s[d] as i64;
                }
            }
            if !fits {
                let shape = plan.shape_at(plan.outputs[k.present].1, b)?;
                return Err(RuntimeError::Options(format!(
                    "the caches were made {s:?} (axis {} the room); this run's are {shape:?}: make them for its dims",
                    k.axis
                )));
            }
        }
        Ok(total.saturating_sub(self.len))
    }

    /// The shape of cache `c`'s buffer.
    pub(crate) fn shape(&self, c: usize) -> &[usize] {
        &self.buffers[c].0
    }

    /// Where cache `c`'s elements start (for kernels, which read it in place).
    pub(crate) fn data(&self, c: usize) -> *const f32 {
        self.buffers[c].1.as_ptr()
    }

    /// Write `new` (rows along `axis` of a tensor of shape `shape`, the buffer's but
    /// along the axis) after the positions held, into cache `c`.
    pub(crate) fn append(
        &mut self,
        c: usize,
        axis: usize,
        shape: &[usize],
        new: &[f32],
    ) -> Result<()> {
        let (len, capacity) = (self.len, self.capacity);
        let buffer = &mut self.buffers[c].1;
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let rows = shape[axis];
        if len + rows > capacity
            || new.len() != outer * rows * inner
            || buffer.len() != outer * capacity * inner
        {
            return Err(internal("new rows that do not fit their cache"));
        }
        for o in 0..outer {
            let at = (o * capacity + len) * inner;
            buffer[at..at + rows * inner]
                .copy_from_slice(&new[o * rows * inner..(o + 1) * rows * inner]);
        }
        Ok(())
    }

    /// The past length's dim (the caches' growing axis).
    pub(crate) fn past_dim(plan: &Plan) -> Option<&str> {
        let c = plan.caches.first()?;
        match &plan.inputs[c.past].0.shape[c.axis] {
            Expr::Var(v) => Some(v),
            _ => None,
        }
    }

    /// The run that appended `rows` positions finished.
    pub(crate) fn grow(&mut self, rows: usize) {
        self.len += rows;
    }
}
