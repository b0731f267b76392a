//! Lowering: a [`Program`] to a loop-IR [`Func`], by the sketch of its workload's class.
//!
//! - `contraction.rs`: the CPU contraction sketch's loop nest (tasks, cache tiles,
//!   register tiles), whose stages each have a file: `tiles.rs` (the usual variant's
//!   task body: reduction slices and register tiles), `fetch.rs` (packing),
//!   `compute.rs` (register tiles), `writeback.rs` (stores), `global_pad.rs` (the
//!   copies of global padding), `epilogue.rs` (the fused epilogue), `dot.rs` (the
//!   dot variant's task body: vectors along K, operands read in place), `amx.rs` (the
//!   AMX variant's task body: products of bf16 tiles), `quantize.rs` (an i8
//!   contraction's rows quantized before the tasks, its sums converted at write-back);
//! - `rows.rs`: the row-wise (normalization) sketch;
//! - `attention.rs`: the fused attention sketch (`attention_amx.rs`: its AMX variant,
//!   `attention_softmax.rs`: the softmax of a row of its scores);
//! - what a padding strategy does in each stage comes from its policy
//!   ([`crate::padding`]), never from matching the strategy here.
//!
//! Every lowered function passes the loop-IR verifier in debug builds and tests.
mod amx;
mod attention;
mod attention_amx;
mod attention_softmax;
mod attention_tiles;
mod compute;
mod contraction;
mod dot;
mod epilogue;
pub(crate) mod fetch;
mod global_pad;
mod gpu;
mod quantize;
mod rows;
mod tiles;
mod writeback;

use crate::loop_ir::{shape_var_name, Func};
use crate::{CodegenError, KernelMode, Program, Result, Sketch};
use anyshape_ir::Expr;

pub(crate) use attention::lower as attention;
pub(crate) use contraction::lower as contraction;
pub(crate) use gpu::lower as gpu_contraction;
pub(crate) use rows::lower as rows;

/// A named integer in lowered code.
pub(crate) fn v(name: &str) -> Expr {
    Expr::var(name)
}

/// An integer constant.
pub(crate) fn c(x: usize) -> Expr {
    Expr::Const(x as i64)
}

/// An expression over shape vars, renamed as lowered code names them.
pub(crate) fn renamed(e: &Expr) -> Expr {
    e.map_vars(&mut |name| v(&shape_var_name(name)))
}

/// The shape vars of a program in argument order and, for a specialized kernel, the
/// values it is built for.
pub(crate) fn shape_vars<K>(p: &Program<K>) -> Result<(Vec<String>, Option<Vec<i64>>)> {
    let w = &p.workload;
    let shape_vars = w.shape_vars();
    let specialized = match p.mode {
        KernelMode::Symbolic => None,
        KernelMode::Specialized => {
            w.bind(&p.bindings)?;
            let values = shape_vars.iter().map(|s| {
                p.bindings
                    .get(s)
                    .ok_or_else(|| CodegenError::Unspecialized(format!("`{s}` has no value")))
            });
            Some(values.collect::<Result<Vec<_>>>()?)
        }
    };
    Ok((shape_vars, specialized))
}

/// Lower a program by its micro-kernel's sketch: the workload must be one the sketch
/// serves; the function is verified in debug builds.
pub fn lower<K: Sketch>(p: &Program<K>, target: &K::Target) -> Result<Func> {
    p.workload.validate()?;
    K::applies(&p.workload)?;
    let func = K::lower(p, target)?;
    if cfg!(debug_assertions) {
        crate::verify::verify(&func).map_err(|e| CodegenError::Internal(e.to_string()))?;
    }
    Ok(func)
}
