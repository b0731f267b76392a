//! The cuBLAS baseline on the GPU: SGEMM, or strided-batched SGEMM for a batch axis, as a
//! builtin GPU kernel of the worker ([`GPU_BUILTINS`], symbol [`CUBLAS_SYMBOL`]). cuBLAS is
//! loaded at run time (`cudarc`); where it is missing, its candidates fail with the
//! reason.
use anyshape_codegen::{GemmOperand, StridedGemm};
use anyshape_ir::{BoundWorkload, Workload};
use anyshape_measure::{GpuBuffers, GpuBuiltin, GpuCall};
use cudarc::cublas::sys::cublasOperation_t as Op;
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// The cuBLAS baseline's symbol.
pub const CUBLAS_SYMBOL: &str = "cublas_sgemm";

/// The GPU baselines, for the worker (`anyshape __worker`).
pub static GPU_BUILTINS: &[GpuBuiltin] = &[GpuBuiltin {
    symbol: CUBLAS_SYMBOL,
    prepare,
}];

fn prepare(
    stream: &Arc<CudaStream>,
    w: &Workload,
    bound: &BoundWorkload,
) -> Result<GpuCall, String> {
    if !w.epilogue.is_empty() {
        return Err("the cuBLAS baseline takes no epilogue".into());
    }
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { cudarc::cublas::sys::is_culib_present() } {
        return Err("cuBLAS (libcublas.so, CUDA 12 or 13) is not installed".into());
    }
    let g = StridedGemm::of(w, bound).map_err(|e| e.to_string())?;
    let cfg = cublas_config(&g)?;
    let blas = CudaBlas::new(stream.clone()).map_err(|e| format!("cuBLAS: {e:?}"))?;
    Ok(Box::new(move |buffers: GpuBuffers| {
        if let Some(cfg) = cfg {
            let (a, b) = (&buffers.inputs[0], &buffers.inputs[1]);
            // SAFETY: the configuration comes from the bound instance's strides (cuBLAS's
            // column-major view of the row-major C = A·B), within the buffers.
            unsafe { blas.gemm_strided_batched(cfg, b, a, buffers.output) }
                .map_err(|e| format!("cuBLAS SGEMM: {e:?}"))?;
        }
        Ok(())
    }))
}

/// cuBLAS's view of a row-major `C = A · B`: column-major `Cᵀ = Bᵀ · Aᵀ`, each operand
/// transposed or not by which of its axes has unit stride. `None` for an empty instance.
fn cublas_config(g: &StridedGemm) -> Result<Option<StridedBatchedConfig<f32>>, String> {
    if g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0 {
        return Ok(None);
    }
    if [g.a.offset, g.b.offset, g.c.offset] != [0, 0, 0] || g.c.col != 1 {
        return Err("cuBLAS baseline: the output must be row-major from offset 0".into());
    }
    let int = |x: i64| i32::try_from(x).map_err(|_| format!("{x} is past cuBLAS's int range"));
    // An operand X (p × q in the row-major view) is wanted as Xᵀ (q × p) in column
    // major: its memory is Xᵀ with leading dimension `row` where columns are unit-stride,
    // else X with leading dimension `col`, to be transposed.
    let operand = |o: &GemmOperand, p: usize, q: usize| {
        if o.col == 1 && o.row >= q.max(1) as i64 {
            Ok((Op::CUBLAS_OP_N, int(o.row)?))
        } else if o.row == 1 && o.col >= p.max(1) as i64 {
            Ok((Op::CUBLAS_OP_T, int(o.col)?))
        } else {
            Err("cuBLAS baseline: an input with no unit-stride axis".to_string())
        }
    };
    let (transa, lda) = operand(&g.b, g.k, g.n)?;
    let (transb, ldb) = operand(&g.a, g.m, g.k)?;
    Ok(Some(StridedBatchedConfig {
        gemm: GemmConfig {
            transa,
            transb,
            m: int(g.n as i64)?,
            n: int(g.m as i64)?,
            k: int(g.k as i64)?,
            alpha: 1.0,
            lda,
            ldb,
            beta: 0.0,
            ldc: int(g.c.row.max(1))?,
        },
        batch_size: int(g.batch as i64)?,
        stride_a: g.b.batch,
        stride_b: g.a.batch,
        stride_c: g.c.batch,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_ir::Bindings;
    use anyshape_measure::{check_output, random_inputs, reference_output};

    /// cuBLAS's configuration of the three layouts, checked by evaluating the
    /// column-major product it describes on the host.
    #[test]
    fn cublas_sees_the_row_major_product() {
        for (w, t) in [
            ("dense(M=T,N=5,K=3)", 4),
            ("batch_matmul_nt(B=2,M=T,N=T,K=3)", 3),
            ("batch_matmul_nn(B=2,M=T,N=4,K=T)", 5),
        ] {
            let w = Workload::parse(w).unwrap();
            let bound = w.bind(&Bindings::from_pairs([("T", t)])).unwrap();
            let inputs = random_inputs(&w, &bound, 7);
            let views: Vec<&[f32]> = inputs.iter().map(|v| v.as_slice()).collect();
            let reference = reference_output(&w, &bound, &views);
            let g = StridedGemm::of(&w, &bound).unwrap();
            let cfg = cublas_config(&g).unwrap().unwrap();
            // Column-major C'(i, j) = Σ_l op(P)(i, l) · op(Q)(l, j), P = in1, Q = in0.
            let at = |x: &[f32], op: Op, ld: i32, r: usize, c: usize| match op {
                Op::CUBLAS_OP_N => x[r + c * ld as usize],
                _ => x[c + r * ld as usize],
            };
            let mut out = vec![0.0f32; bound.lens[2]];
            let c = cfg.gemm;
            for item in 0..cfg.batch_size as usize {
                let p = &inputs[1][item * cfg.stride_a as usize..];
                let q = &inputs[0][item * cfg.stride_b as usize..];
                for i in 0..c.m as usize {
                    for j in 0..c.n as usize {
                        let s: f32 = (0..c.k as usize)
                            .map(|l| at(p, c.transa, c.lda, i, l) * at(q, c.transb, c.ldb, l, j))
                            .sum();
                        out[item * cfg.stride_c as usize + i + j * c.ldc as usize] = s;
                    }
                }
            }
            assert!(check_output(&out, &reference).passed, "{w}");
        }
        let w = Workload::parse("dense(M=T,N=5,K=3)").unwrap();
        let bound = w.bind(&Bindings::from_pairs([("T", 0)])).unwrap();
        assert!(cublas_config(&StridedGemm::of(&w, &bound).unwrap())
            .unwrap()
            .is_none());
    }
}
