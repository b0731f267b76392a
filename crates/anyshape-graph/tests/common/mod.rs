//! Helpers shared by the graph crate's tests.
use anyshape_ir::{Bindings, BoundWorkload, Workload};

/// Kernel steps computed by the workloads' own reference
/// (`anyshape_measure::reference_output`), for `exec::Plan::run`.
pub fn reference_kernel(
    _: usize,
    w: &Workload,
    _: &Bindings,
    bound: &BoundWorkload,
    ins: &[&[f32]],
    out: &mut [f32],
) -> anyshape_graph::Result<()> {
    let r = anyshape_measure::reference_output(w, bound, ins);
    for (y, x) in out.iter_mut().zip(&r.output) {
        *y = *x as f32;
    }
    Ok(())
}
