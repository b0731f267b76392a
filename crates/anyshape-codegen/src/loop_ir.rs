//! The loop IR that every sketch lowers to, on every device, and that the renderer
//! (C and CUDA) and the cost model's feature extraction read.
//!
//! Invariants (checked by `verify.rs`, which lists them in full):
//! - loops run their variable from 0 to `extent - 1`; index and extent expressions are
//!   [`Expr`]s over shape vars (named `sv_<name>`), loop vars and `Let` names;
//! - every buffer is either a kernel argument (`in0`, `in1`, ... and `out0`) or introduced
//!   by an [`Stmt::Alloc`] before use; a `Reg` is declared before it is assigned;
//! - a [`Value`] with `lanes > 1` reads or writes `lanes` contiguous elements (a load or
//!   store with a `count`, only the first `count` of them: the vector edge of a tensor);
//! - GPU constructs (thread and block indices, barriers, shared memory) appear only in
//!   functions for a GPU ([`Func::threads`] set), parallel loops only in CPU ones.
use anyshape_ir::Expr;

/// How a loop is executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopKind {
    /// In order.
    Serial,
    /// Iterations spread over the target's cores.
    Parallel,
    /// Unrolled by the given factor (in C `#pragma GCC unroll N`, so 1 keeps a loop
    /// rolled that the compiler would unroll whole; CUDA unrolls it whole).
    Unrolled(usize),
}

/// How many per-thread scratch slots a CPU kernel has (`Scope::Scratch`'s slot numbers
/// are below it).
pub const SCRATCH_SLOTS: u8 = 16;

/// Where an allocated buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A per-thread scratch buffer that persists across calls (slot number, below
    /// [`SCRATCH_SLOTS`]; CPU).
    Scratch(u8),
    /// A fixed-size array of the thread (the stack on CPU, registers on GPU).
    Stack,
    /// A fixed-size array shared by a block's threads (GPU shared memory).
    Shared,
}

/// A GPU thread's coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuIndex {
    /// The thread's index in its block (x only).
    Thread,
    /// The block's index in the grid along dimension 0 (x), 1 (y) or 2 (z).
    Block(u8),
}

/// A boolean condition on integers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cond {
    /// `a < b`.
    Lt(Expr, Expr),
    /// `a <= b`.
    Le(Expr, Expr),
    /// `a == b`.
    Eq(Expr, Expr),
    /// Both hold.
    And(Box<Cond>, Box<Cond>),
    /// True when this thread's scratch slot does not yet hold the data for `key` in the
    /// current kernel call; evaluating it claims the slot for `key` (the caller then fills
    /// it). Reallocating the slot drops the claim.
    Claim {
        /// The scratch slot.
        slot: u8,
        /// What the slot is to hold.
        key: Expr,
    },
}

impl Cond {
    /// `a && b`.
    pub fn and(a: Cond, b: Cond) -> Cond {
        Cond::And(Box::new(a), Box::new(b))
    }
}

/// An elementwise function of one value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    /// `max(x, 0)`.
    Relu,
    /// `tanh(x)`.
    Tanh,
    /// GELU, erf form.
    Gelu,
    /// GELU, tanh form.
    GeluTanh,
    /// `exp(x)`.
    Exp,
    /// `√x`.
    Sqrt,
    /// `0` where `x` is NaN, else `x`.
    NanToZero,
    /// SiLU: `x · sigmoid(x)`.
    Silu,
}

impl From<anyshape_ir::Unary> for UnaryOp {
    fn from(u: anyshape_ir::Unary) -> UnaryOp {
        match u {
            anyshape_ir::Unary::Relu => UnaryOp::Relu,
            anyshape_ir::Unary::Tanh => UnaryOp::Tanh,
            anyshape_ir::Unary::Gelu => UnaryOp::Gelu,
            anyshape_ir::Unary::GeluTanh => UnaryOp::GeluTanh,
            anyshape_ir::Unary::NanToZero => UnaryOp::NanToZero,
            anyshape_ir::Unary::Silu => UnaryOp::Silu,
        }
    }
}

/// An elementwise function of two values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// `max(a, b)`.
    Max,
}

impl From<anyshape_ir::Binary> for BinaryOp {
    fn from(b: anyshape_ir::Binary) -> BinaryOp {
        match b {
            anyshape_ir::Binary::Add => BinaryOp::Add,
            anyshape_ir::Binary::Mul => BinaryOp::Mul,
        }
    }
}

/// A floating-point value (scalar or vector of `lanes`).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Zero in every lane.
    Zero {
        /// Lanes.
        lanes: usize,
    },
    /// A constant in every lane.
    Const {
        /// The value.
        value: f64,
        /// Lanes.
        lanes: usize,
    },
    /// Load `lanes` contiguous elements of `buf` from `index`.
    Load {
        /// The buffer.
        buf: String,
        /// First element.
        index: Expr,
        /// Lanes.
        lanes: usize,
        /// With a count (a vector load), only the first `count` lanes are read (clamped
        /// to `0..=lanes`; nothing past them is touched), the others are zero.
        count: Option<Expr>,
    },
    /// A register's value.
    Reg {
        /// Register name.
        name: String,
        /// Its lanes.
        lanes: usize,
    },
    /// One lane of a vector register.
    Lane(String, Expr),
    /// An integer expression's value as a float scalar (a row's length, to divide a
    /// sum by).
    Count(Expr),
    /// A function of one value, lane by lane.
    Unary(UnaryOp, Box<Value>),
    /// A function of two values, lane by lane (a scalar operand is broadcast).
    Binary(BinaryOp, Box<Value>, Box<Value>),
    /// `a * b + c`, with `b` of `a`'s lanes or a scalar broadcast over them.
    Fma(Box<Value>, Box<Value>, Box<Value>),
    /// The sum (`Add`) or maximum (`Max`) of a vector's lanes, a scalar.
    Horizontal(BinaryOp, Box<Value>),
    /// `cond ? a : b`, evaluating only the chosen side.
    Select(Cond, Box<Value>, Box<Value>),
    /// Elements `index` and `index + 1` of `buf` rounded to bfloat16 (nearest, ties to
    /// even) and packed into one 32-bit word, the first in its low half: a scalar whose
    /// bits are that word (the first operand of a bf16 contraction, read in pairs).
    PairBf16 {
        /// The buffer.
        buf: String,
        /// The first element.
        index: Expr,
    },
    /// `c + lo(a)·lo(b) + hi(a)·hi(b)` lane by lane, `a` and `b` words of two bfloat16
    /// values (`vdpbf16ps`), `b` of `a`'s lanes or a scalar broadcast over them, `c` of
    /// `a`'s lanes, in f32.
    DotBf16(Box<Value>, Box<Value>, Box<Value>),
    /// `c + Σ_e u8(a_e) · s8(b_e)` lane by lane in 32-bit integers, `a` words of four
    /// unsigned bytes, `b` of four signed ones (`vpdpbusd`), `b` of `a`'s lanes or a
    /// scalar broadcast over them, `c` of `a`'s lanes; every value's bits carried in
    /// floats (an `i8` contraction: `a` the weights' quads, each byte plus 128).
    DotI8(Box<Value>, Box<Value>, Box<Value>),
    /// The lanes of `x`, 32-bit integers carried in float bits, converted to `f32`.
    IntToFloat(Box<Value>),
}

impl Value {
    /// A scalar load.
    pub fn load(buf: &str, index: Expr) -> Value {
        Value::Load {
            buf: buf.into(),
            index,
            lanes: 1,
            count: None,
        }
    }

    /// A vector load.
    pub fn vload(buf: &str, index: Expr, lanes: usize) -> Value {
        Value::Load {
            buf: buf.into(),
            index,
            lanes,
            count: None,
        }
    }

    /// A vector load of the first `count` lanes (clamped to `0..=lanes`), zero in the
    /// others.
    pub fn vload_first(buf: &str, index: Expr, lanes: usize, count: Expr) -> Value {
        Value::Load {
            buf: buf.into(),
            index,
            lanes,
            count: Some(count),
        }
    }

    /// `a + b`.
    pub fn sum(a: Value, b: Value) -> Value {
        Value::binary(BinaryOp::Add, a, b)
    }

    /// `op(a, b)`.
    pub fn binary(op: BinaryOp, a: Value, b: Value) -> Value {
        Value::Binary(op, Box::new(a), Box::new(b))
    }

    /// `op(x)`.
    pub fn unary(op: UnaryOp, x: Value) -> Value {
        Value::Unary(op, Box::new(x))
    }

    /// A register of `lanes`.
    pub fn reg(name: &str, lanes: usize) -> Value {
        Value::Reg {
            name: name.into(),
            lanes,
        }
    }

    /// How many lanes the value has.
    pub fn lanes(&self) -> usize {
        match self {
            Value::Zero { lanes }
            | Value::Const { lanes, .. }
            | Value::Load { lanes, .. }
            | Value::Reg { lanes, .. } => *lanes,
            Value::Lane(..) | Value::Count(..) | Value::Horizontal(..) | Value::PairBf16 { .. } => {
                1
            }
            Value::Binary(_, a, b)
            | Value::Fma(a, _, b)
            | Value::DotBf16(a, _, b)
            | Value::DotI8(a, _, b)
            | Value::Select(_, a, b) => a.lanes().max(b.lanes()),
            Value::Unary(_, x) | Value::IntToFloat(x) => x.lanes(),
        }
    }
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `for var in 0..extent`.
    For {
        /// Loop variable.
        var: String,
        /// Trip count.
        extent: Expr,
        /// How it runs.
        kind: LoopKind,
        /// Body.
        body: Vec<Stmt>,
    },
    /// A conditional.
    If {
        /// Condition.
        cond: Cond,
        /// Taken when true.
        then: Vec<Stmt>,
        /// Taken when false.
        otherwise: Vec<Stmt>,
    },
    /// An immutable integer name.
    Let {
        /// Name.
        var: String,
        /// Value.
        value: Expr,
    },
    /// A local buffer of `len` elements.
    Alloc {
        /// Name.
        buf: String,
        /// Elements.
        len: Expr,
        /// Where it lives.
        scope: Scope,
    },
    /// Declare a register (scalar or vector) with an initial value.
    Reg {
        /// Name.
        name: String,
        /// Lanes.
        lanes: usize,
        /// Initial value.
        init: Value,
    },
    /// Assign a register.
    Assign {
        /// Register.
        reg: String,
        /// New value.
        value: Value,
    },
    /// Store a value (of its lanes) at `buf[index..]`.
    Store {
        /// Buffer.
        buf: String,
        /// First element.
        index: Expr,
        /// Value.
        value: Value,
        /// With a count (a vector store), only the first `count` lanes are written
        /// (clamped to `0..=lanes`; nothing past them is touched).
        count: Option<Expr>,
    },
    /// An immutable integer name for a GPU thread coordinate.
    GpuIndex {
        /// Name.
        var: String,
        /// Which coordinate.
        index: GpuIndex,
    },
    /// Wait until every thread of the block reaches this point (GPU).
    Barrier,
    /// Ask the caches for the line holding `buf[index]` (CPU): a hint, never a read,
    /// so the index may lie past the buffer's end.
    Prefetch {
        /// Buffer.
        buf: String,
        /// Element.
        index: Expr,
        /// Into L2 only (`prefetcht1`): for lines that come from memory and are read
        /// many steps later, which would evict what L1 holds for the steps between;
        /// otherwise into every level (`prefetcht0`).
        l2: bool,
        /// For a line about to be written (`prefetchw`: fetched ready to be modified).
        write: bool,
    },
    /// Transpose a tile of at most `lanes x lanes` elements in vector registers (CPU;
    /// `lanes` the target's vector width): see [`Transpose`].
    Transpose(Box<Transpose>),
    /// Products of bfloat16 tiles on AMX (CPU with AMX-BF16): see [`TileProduct`].
    TileProduct(Box<TileProduct>),
    /// A run of consecutive pairs rounded to bfloat16 into words (CPU): see
    /// [`RoundPairs`].
    RoundPairs(Box<RoundPairs>),
    /// A row quantized to 8 bits into words of quads, with its scale and sum (CPU): see
    /// [`QuantizeRow`].
    QuantizeRow(Box<QuantizeRow>),
}

/// A register tile of AMX output tiles (CPU with AMX-BF16): `a_index.len() x
/// b_index.len()` tiles of 16 x 16 f32, each the sum over `steps` reduction steps of an
/// A tile times a B tile, every buffer read and written as 32-bit words. A tile `i` at
/// step `s` is 16 rows of 16 words (32 bfloat16 along the reduction), row `r` at
/// `a[a_index[i] + r * a_stride + 16 * s ..]`; B tile `j` at step `s` is 16 rows (pairs
/// along the reduction) of 16 words (two bfloat16 of one column), row `r` at
/// `b[b_index[j] + 256 * s + 16 * r ..]` (a weight panel of 16 columns). Output tile
/// `(i, j)` is stored, not added, row `r` at `c[c_index + (16 * i + r) * c_stride + 16
/// * j ..]`. At most eight tiles in all (outputs, A's and B's).
#[derive(Clone, Debug, PartialEq)]
pub struct TileProduct {
    /// A's buffer.
    pub a: String,
    /// Where each A tile starts (one per row of output tiles).
    pub a_index: Vec<Expr>,
    /// Words between A's rows.
    pub a_stride: Expr,
    /// B's buffer.
    pub b: String,
    /// Where each B tile starts (one per column of output tiles).
    pub b_index: Vec<Expr>,
    /// Reduction steps of 16 words.
    pub steps: Expr,
    /// The output's buffer.
    pub c: String,
    /// Where output tile `(0, 0)` starts.
    pub c_index: Expr,
    /// Elements between the output's rows.
    pub c_stride: Expr,
}

/// A run of consecutive pairs rounded to bfloat16 into words (CPU): `dst[dst_index + w]`
/// = the pair `(src[src_index + 2w], src[src_index + 2w + 1])` for `w < words`, each
/// rounded to nearest, ties to even (as `Value::PairBf16`). With AVX512_BF16 and 16
/// lanes, 16 words are one `vcvtne2ps2bf16` (which reads subnormal floats as zero) where
/// GCC made ~20 integer operations of the element-wise rounding.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundPairs {
    /// Destination buffer (words).
    pub dst: String,
    /// Destination of word 0.
    pub dst_index: Expr,
    /// Source buffer (floats).
    pub src: String,
    /// Source of the first pair's first element.
    pub src_index: Expr,
    /// Words written.
    pub words: Expr,
}

/// A row quantized to 8 bits into words of quads (CPU), as an `i8` contraction's first
/// operand is: its scale from its largest magnitude (`anyshape_ir::i8_row_scale`, a NaN
/// passed over), then byte `e` of `dst[dst_index + w]` = `src[src_index + 4w + e]`
/// quantized (`anyshape_ir::i8_quantize`: times the inverse scale, rounded to nearest
/// even, clamped to `[-127, 127]`, a NaN to 0) for `w < words`; the scale stored at
/// `scale[scale_index]` and the sum of the row's 8-bit values times -128 (the
/// correction of the weights' bytes, each its value plus 128) at `scale[scale_index +
/// 1]`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizeRow {
    /// Destination buffer (words).
    pub dst: String,
    /// Destination of word 0.
    pub dst_index: Expr,
    /// Source buffer (floats).
    pub src: String,
    /// Source of the row's first element.
    pub src_index: Expr,
    /// Words written (quads read).
    pub words: Expr,
    /// Where the scale and the correction go.
    pub scale: String,
    /// The scale's element (the correction's is the next).
    pub scale_index: Expr,
}

/// A register-level transpose (CPU): element `(r, k)` of the source, at
/// `src[src_index + r * src_stride + k]`, lands at `dst[dst_index + k * dst_stride + r]`.
/// The source rectangle read is `rows x cols` (`rows` clamped to `0..=width`, `cols`
/// to `0..=lanes`; nothing past it touched); the destination rectangle written is
/// `outs` rows (clamped to `0..=lanes`) of `width` elements (`1..=lanes`), zero where
/// it lies outside the source rectangle. Vector targets only. The packing of an
/// operand whose reduction axis is contiguous (`fetch.rs`) runs on it: a few shuffles
/// per vector where a scalar copy moves one element per load and store.
#[derive(Clone, Debug, PartialEq)]
pub struct Transpose {
    /// Destination buffer.
    pub dst: String,
    /// Destination of element `(0, 0)`.
    pub dst_index: Expr,
    /// Elements between consecutive destination rows (consecutive `k`).
    pub dst_stride: Expr,
    /// Source buffer.
    pub src: String,
    /// Source of element `(0, 0)`.
    pub src_index: Expr,
    /// Elements between consecutive source rows (consecutive `r`).
    pub src_stride: Expr,
    /// Source rows read.
    pub rows: Expr,
    /// Elements read from each source row.
    pub cols: Expr,
    /// Destination rows written.
    pub outs: Expr,
    /// Elements written in each destination row.
    pub width: usize,
}

/// A lowered kernel: one C-ABI function.
#[derive(Clone, Debug, PartialEq)]
pub struct Func {
    /// Exported symbol.
    pub name: String,
    /// Shape vars in argument order (`vars[i]`), by their workload names.
    pub shape_vars: Vec<String>,
    /// For specialized kernels, the values the kernel was built for (checked at entry).
    pub specialized: Option<Vec<i64>>,
    /// Number of input buffers.
    pub inputs: usize,
    /// For a GPU kernel, the threads of a block (`None` for a CPU function).
    pub threads: Option<u32>,
    /// Body.
    pub body: Vec<Stmt>,
}

/// `for var in 0..extent { body }`.
pub fn for_(var: &str, extent: Expr, kind: LoopKind, body: Vec<Stmt>) -> Stmt {
    Stmt::For {
        var: var.into(),
        extent,
        kind,
        body,
    }
}

/// `let var = value`.
pub fn let_(var: &str, value: Expr) -> Stmt {
    Stmt::Let {
        var: var.into(),
        value,
    }
}

/// `if cond { then }`.
pub fn if_(cond: Cond, then: Vec<Stmt>) -> Stmt {
    Stmt::If {
        cond,
        then,
        otherwise: vec![],
    }
}

/// `buf[index] = value`.
pub fn store(buf: &str, index: Expr, value: Value) -> Stmt {
    Stmt::Store {
        buf: buf.into(),
        index,
        value,
        count: None,
    }
}

/// The first `count` lanes (clamped to `0..=lanes`) of a vector `value` stored at
/// `buf[index..]`.
pub fn store_first(buf: &str, index: Expr, value: Value, count: Expr) -> Stmt {
    Stmt::Store {
        buf: buf.into(),
        index,
        value,
        count: Some(count),
    }
}

/// The name a shape var has inside lowered code.
pub fn shape_var_name(name: &str) -> String {
    format!("sv_{name}")
}
