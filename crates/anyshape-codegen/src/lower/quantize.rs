//! What an `i8` contraction ([`anyshape_ir::Precision::I8`]) adds to the usual
//! variant's nest: before the tasks, every row of A quantized once, in parallel, into
//! words of four 8-bit values (`Aq`, row-major, a row's quads contiguous) with its scale
//! and correction (`Sq`: `Stmt::QuantizeRow`), the whole kernel then reading `Aq` as
//! its A (packed, transposed in registers, as an f32 A is); and at write-back each
//! register tile's 32-bit integer sums converted to `f32`: plus the row's correction
//! (-128 times its 8-bit values' sum, for the weights' bytes each hold their value plus
//! 128) in the first reduction slice, times the row's scale.
//!
//! Quantizing in the packing of each task instead would repeat a row's quantization for
//! every N tile (a tenth of the products' time at 192-column tiles), and a row's scale
//! needs the whole row.
use super::compute::acc;
use super::contraction::{Nest, Operand};
use super::{c, renamed, v};
use crate::loop_ir::{for_, BinaryOp, Cond, LoopKind, QuantizeRow, Scope, Stmt, Value};
use anyshape_ir::Expr;

/// The quantized rows of A: `e_m` rows of `e_k` words.
const ROWS: &str = "Aq";
/// Each row's scale and correction.
const SCALES: &str = "Sq";
/// Scratch slots of [`ROWS`] and [`SCALES`] (the calling thread's, before the parallel
/// tasks; the usual variant's panels take 0, 1 and 5, global padding 2 to 4).
const SLOTS: [u8; 2] = [6, 7];

impl Nest<'_> {
    /// The statements before the tasks: the quantized rows' buffers and the parallel
    /// loop that fills them (A's operand `a`, its rows `sa_m` apart, its quads
    /// contiguous).
    pub(super) fn quantize_rows(&self, a: &anyshape_ir::TensorRef) -> Vec<Stmt> {
        let row = v("qr");
        vec![
            Stmt::Alloc {
                buf: ROWS.into(),
                len: v("e_m") * v("e_k"),
                scope: Scope::Scratch(SLOTS[0]),
            },
            Stmt::Alloc {
                buf: SCALES.into(),
                len: v("e_m") * c(2),
                scope: Scope::Scratch(SLOTS[1]),
            },
            for_(
                "qr",
                v("e_m"),
                LoopKind::Parallel,
                vec![Stmt::QuantizeRow(Box::new(QuantizeRow {
                    dst: ROWS.into(),
                    dst_index: row.clone() * v("e_k"),
                    src: "in0".into(),
                    src_index: renamed(&a.base_offset()) + row.clone() * v("sa_m"),
                    words: v("e_k"),
                    scale: SCALES.into(),
                    scale_index: row * c(2),
                }))],
            ),
        ]
    }

    /// A's operand as the tasks read it: the quantized rows.
    pub(super) fn quantized_operand() -> Operand {
        Operand {
            buf: ROWS,
            base: c(0),
            s_row: v("e_k"),
            s_col: c(1),
            panels: None,
        }
    }

    /// Accumulator `(i, j)`'s integer sums as `f32`: corrected in the first slice,
    /// scaled, row `mi + i` (clamped to the tensor: a tile's rows past it are never
    /// stored).
    fn converted(&self, sums: Value, i: Expr) -> Value {
        let row = Expr::min(v("mi") + i, v("e_m") - c(1)) * c(2);
        let correction = Value::Select(
            Cond::Eq(v("kt"), c(0)),
            Box::new(Value::load(SCALES, row.clone() + c(1))),
            Box::new(Value::Zero { lanes: 1 }),
        );
        let corrected = Value::sum(Value::IntToFloat(Box::new(sums)), correction);
        Value::binary(BinaryOp::Mul, corrected, Value::load(SCALES, row))
    }

    /// The vector register tile's accumulators (`rows` of `nv` vectors) converted in
    /// place, before they are stored.
    pub(super) fn convert_tile(&self, rows: usize, nv: usize) -> Vec<Stmt> {
        (0..rows)
            .flat_map(|i| (0..nv).map(move |j| (i, j)))
            .map(|(i, j)| Stmt::Assign {
                reg: acc(i, j),
                value: self.converted(Value::reg(&acc(i, j), self.lanes), c(i)),
            })
            .collect()
    }

    /// The checked tile's accumulator element `(i, j)` (`acc[i·nr + j]`), converted.
    pub(super) fn converted_element(&self, element: Value) -> Value {
        self.converted(element, v("i"))
    }
}
