//! The pure-Rust `gemm` crate as a baseline: [`Builtin`] kernels compiled into the
//! `anyshape` executable, run by its worker like any kernel (same isolation, checks and
//! timing). `gemm`: one call per batch item, parallel inside (rayon, all cores);
//! `gemm-par`: a rayon loop over the batch with one-threaded calls.
use anyshape_codegen::{GemmOperand, StridedGemm};
use anyshape_ir::{BoundWorkload, Workload};
use anyshape_measure::{Builtin, PreparedKernel};
use gemm::Parallelism;
use rayon::prelude::*;

/// The `gemm` crate's kernels, for the worker (`anyshape __worker`).
pub static BUILTINS: &[Builtin] = &[
    Builtin {
        symbol: "gemm",
        prepare: |w, b| prepare(w, b, false),
    },
    Builtin {
        symbol: "gemm_par",
        prepare: |w, b| prepare(w, b, true),
    },
];

fn shape(w: &Workload, bound: &BoundWorkload) -> Result<StridedGemm, String> {
    if !w.epilogue.is_empty() {
        return Err(format!("{w}: the gemm baseline takes no epilogue"));
    }
    StridedGemm::of(w, bound).map_err(|e| e.to_string())
}

/// `c[item] = a[item] · b[item]` for one batch item.
///
/// # Safety
/// The pointers hold the tensors of the bound workload `s` was made from.
unsafe fn item(
    s: &StridedGemm,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    i: usize,
    par: Parallelism,
) {
    let at = |o: &GemmOperand| (o.offset + i as i64 * o.batch) as isize;
    // SAFETY: offsets and strides come from the bound workload, within its buffers.
    // `gemm` computes dst = alpha·dst + beta·lhs·rhs (alpha and beta swapped vs BLAS).
    unsafe {
        gemm::gemm(
            s.m,
            s.n,
            s.k,
            c.offset(at(&s.c)),
            s.c.col as isize,
            s.c.row as isize,
            false,
            a.offset(at(&s.a)),
            s.a.col as isize,
            s.a.row as isize,
            b.offset(at(&s.b)),
            s.b.col as isize,
            s.b.row as isize,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        )
    }
}

fn prepare(
    w: &Workload,
    bound: &BoundWorkload,
    batch_parallel: bool,
) -> Result<PreparedKernel, String> {
    let s = shape(w, bound)?;
    let threads = rayon::current_num_threads();
    Ok(Box::new(move |ins: &[*const f32], out: *mut f32| {
        let [a, b] = ins else {
            return Err(format!(
                "the gemm baseline takes 2 inputs, got {}",
                ins.len()
            ));
        };
        if batch_parallel {
            // Raw pointers are not `Send`; the items write disjoint parts of the output.
            let (a, b, c) = (*a as usize, *b as usize, out as usize);
            (0..s.batch).into_par_iter().for_each(|i| {
                // SAFETY: as in `item`; batch items do not overlap in the output.
                unsafe {
                    item(
                        &s,
                        a as *const f32,
                        b as *const f32,
                        c as *mut f32,
                        i,
                        Parallelism::None,
                    )
                }
            });
        } else {
            for i in 0..s.batch {
                // SAFETY: the worker passes the bound workload's buffers.
                unsafe { item(&s, *a, *b, out, i, Parallelism::Rayon(threads)) }
            }
        }
        Ok(())
    }))
}
