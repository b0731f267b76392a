//! The pure-Rust `gemm` crate as a baseline: [`Builtin`] kernels compiled into the
//! `anyshape` executable, run by its worker like any kernel (same isolation, checks and
//! timing). `gemm`: one call per batch item, parallel inside (rayon, all cores);
//! `gemm-par`: a rayon loop over the batch with one-threaded calls.
use anyshape_codegen::GemmView;
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

/// One matrix of the GEMM: offset, batch stride, row and column strides (elements).
#[derive(Clone, Copy)]
struct Operand {
    offset: isize,
    batch: isize,
    row: isize,
    col: isize,
}

/// The instance as a strided batched GEMM.
#[derive(Clone, Copy)]
struct Shape {
    nb: usize,
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    c: Operand,
}

fn shape(w: &Workload, bound: &BoundWorkload) -> Result<Shape, String> {
    let g = GemmView::of(w).map_err(|e| e.to_string())?;
    if g.batch.len() > 1 || w.epilogue != anyshape_ir::Epilogue::None {
        return Err(format!(
            "{w}: the gemm baseline needs at most one batch axis and no epilogue"
        ));
    }
    let operand = |t: usize, [r, c]: [usize; 2]| Operand {
        offset: bound.offsets[t] as isize,
        batch: g.batch.first().map_or(0, |&x| bound.axis_strides[t][x]) as isize,
        row: bound.axis_strides[t][r] as isize,
        col: bound.axis_strides[t][c] as isize,
    };
    let out = w.inputs.len();
    Ok(Shape {
        nb: g.batch.first().map_or(1, |&x| bound.extents[x]) as usize,
        m: bound.extents[g.m] as usize,
        n: bound.extents[g.n] as usize,
        k: bound.extents[g.k] as usize,
        a: operand(0, [g.m, g.k]),
        b: operand(1, [g.k, g.n]),
        c: operand(out, [g.m, g.n]),
    })
}

/// `c[item] = a[item] · b[item]` for one batch item.
///
/// # Safety
/// The pointers hold the tensors of the bound workload `s` was made from.
unsafe fn item(s: &Shape, a: *const f32, b: *const f32, c: *mut f32, i: usize, par: Parallelism) {
    let at = |o: &Operand| o.offset + i as isize * o.batch;
    // SAFETY: offsets and strides come from the bound workload, within its buffers.
    // `gemm` computes dst = alpha·dst + beta·lhs·rhs (alpha and beta swapped vs BLAS).
    unsafe {
        gemm::gemm(
            s.m,
            s.n,
            s.k,
            c.offset(at(&s.c)),
            s.c.col,
            s.c.row,
            false,
            a.offset(at(&s.a)),
            s.a.col,
            s.a.row,
            b.offset(at(&s.b)),
            s.b.col,
            s.b.row,
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
            (0..s.nb).into_par_iter().for_each(|i| {
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
            for i in 0..s.nb {
                // SAFETY: the worker passes the bound workload's buffers.
                unsafe { item(&s, *a, *b, out, i, Parallelism::Rayon(threads)) }
            }
        }
        Ok(())
    }))
}
