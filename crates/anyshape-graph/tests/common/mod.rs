//! Helpers shared by the graph crate's tests.
use anyshape_graph::{fuse, infer, lower, rotate_half, winograd, Graph};
use anyshape_ir::{Bindings, Precision, Workload};
use anyshape_runtime::{Executor, Result, TaskKernels};
use anyshape_tensor::{Tensor, TensorRef};

/// Kernel steps computed by the workloads' own reference
/// (`anyshape_measure::reference_output`): a plan runs without compiled kernels.
pub struct Reference(pub Vec<Workload>);

impl TaskKernels for Reference {
    unsafe fn call(
        &self,
        task: usize,
        vars: &[i64],
        ins: &[*const f32],
        out: *mut f32,
    ) -> Result<()> {
        let w = &self.0[task];
        let b = Bindings::from_pairs(
            w.shape_vars()
                .iter()
                .map(|v| v.as_str())
                .zip(vars.iter().copied()),
        );
        let bound = w.bind(&b)?;
        // SAFETY: the executor hands each tensor's buffer at its bound length.
        let views: Vec<&[f32]> = ins
            .iter()
            .zip(&bound.lens)
            .map(|(&p, &n)| unsafe { std::slice::from_raw_parts(p, n) })
            .collect();
        let r = anyshape_measure::reference_output(w, &bound, &views);
        // SAFETY: as above, for the output.
        let out = unsafe { std::slice::from_raw_parts_mut(out, bound.lens[ins.len()]) };
        for (y, x) in out.iter_mut().zip(&r.output) {
            *y = *x as f32;
        }
        Ok(())
    }
}

/// `g` rewritten as `anyshape compile` does (rotary embeddings into one pass, 3 x 3
/// convolutions by Winograd's transforms, their tiles chosen as if the dims' smallest
/// values were those of `inputs`), fused (dense layers over weights in `precision`), lowered to a plan and
/// run on `inputs`, kernel steps by the reference.
pub fn run_plan(
    g: &Graph,
    inputs: &[(&str, Tensor)],
    precision: Precision,
) -> anyshape_runtime::Result<Vec<Tensor>> {
    let mut g = g.clone();
    let facts = infer(&g).unwrap();
    let facts = rotate_half(&mut g, facts).unwrap();
    let views: Vec<(&str, TensorRef)> = inputs.iter().map(|(n, t)| (*n, t.view())).collect();
    let (_, least) = anyshape_tensor::bind(&g.input_specs(), &views).unwrap();
    let facts = winograd(&mut g, facts, &least).unwrap();
    let g = &g;
    let plan = lower(g, &facts, &fuse(g, &facts, precision)).unwrap();
    let tasks = plan
        .plan()
        .tasks
        .iter()
        .map(|t| t.workload.clone())
        .collect();
    Executor::new(plan).run(&Reference(tasks), &views, None)
}
