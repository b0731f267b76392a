//! Elementwise ops of several inputs with numpy broadcasting: arithmetic (`f32` and
//! `i64`, `Mod` with either sign rule, `BitShift` of `i64`, the variadic `Sum`, `Mean`, `Max`, `Min`; on the
//! shape plumbing's integer vectors also as expressions), comparisons and logic (to
//! `bool`) and `Where`. Ops of one input are `unary.rs`'s.
use super::{
    broadcast_out, broadcast_strides, broadcasts_to, eval_via, fail, for_each_row, for_rows, req,
    OpSpec,
};
use crate::fact::{broadcast, equal};
use crate::node::Node;
use crate::workers::CHUNK;
use crate::Workers;
use crate::{DType, Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "BitShift",
        since: 11,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Add",
        since: 7,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Sub",
        since: 7,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Mul",
        since: 7,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Div",
        since: 7,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Pow",
        since: 7,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Mod",
        since: 10,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Sum",
        since: 8,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Mean",
        since: 8,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Max",
        since: 8,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Min",
        since: 8,
        infer: infer_arith,
        eval: eval_arith,
        eval_into: Some(eval_arith_into),
    },
    OpSpec {
        name: "Equal",
        since: 7,
        infer: infer_compare,
        eval: eval_compare,
        eval_into: Some(eval_compare_into),
    },
    OpSpec {
        name: "Greater",
        since: 7,
        infer: infer_compare,
        eval: eval_compare,
        eval_into: Some(eval_compare_into),
    },
    OpSpec {
        name: "GreaterOrEqual",
        since: 12,
        infer: infer_compare,
        eval: eval_compare,
        eval_into: Some(eval_compare_into),
    },
    OpSpec {
        name: "Less",
        since: 7,
        infer: infer_compare,
        eval: eval_compare,
        eval_into: Some(eval_compare_into),
    },
    OpSpec {
        name: "LessOrEqual",
        since: 12,
        infer: infer_compare,
        eval: eval_compare,
        eval_into: Some(eval_compare_into),
    },
    OpSpec {
        name: "And",
        since: 7,
        infer: infer_compare,
        eval: eval_compare,
        eval_into: Some(eval_compare_into),
    },
    OpSpec {
        name: "Or",
        since: 7,
        infer: infer_compare,
        eval: eval_compare,
        eval_into: Some(eval_compare_into),
    },
    OpSpec {
        name: "Xor",
        since: 7,
        infer: infer_compare,
        eval: eval_compare,
        eval_into: Some(eval_compare_into),
    },
    OpSpec {
        name: "Where",
        since: 9,
        infer: infer_where,
        eval: eval_where,
        eval_into: Some(eval_where_into),
    },
];

/// The broadcast shape of every input, or an error naming the node.
fn shapes(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Expr>> {
    let mut out: Vec<Expr> = Vec::new();
    for f in ins.iter().flatten() {
        out = broadcast(&out, &f.shape).map_err(|e| node.error(e))?;
    }
    Ok(out)
}

/// Integer vectors of shape plumbing, broadcast to one length.
fn syms<'a>(ins: &'a [Option<&Fact>]) -> Option<Vec<&'a Vec<Expr>>> {
    let v: Option<Vec<&Vec<Expr>>> = ins.iter().map(|f| f.and_then(|f| f.sym.as_ref())).collect();
    v.filter(|v| !v.is_empty())
}

fn sym_at(v: &[Expr], i: usize) -> Expr {
    if v.len() == 1 {
        v[0].clone()
    } else {
        v[i].clone()
    }
}

fn infer_arith(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let first = req(node, ins, 0)?;
    let shape = shapes(node, ins)?;
    if first.dtype == DType::I64 && shape.len() <= 1 {
        if let Some(vs) = syms(ins) {
            let n = vs.iter().map(|v| v.len()).max().unwrap_or(1);
            if vs.iter().all(|v| v.len() == n || v.len() == 1) {
                let mut out = Vec::with_capacity(n);
                for i in 0..n {
                    let mut acc = sym_at(vs[0], i);
                    for v in &vs[1..] {
                        let x = sym_at(v, i);
                        acc = match node.op.as_str() {
                            "Add" | "Sum" => acc + x,
                            "Sub" => acc - x,
                            "Mul" => acc * x,
                            // ONNX integer division truncates; shapes are not negative.
                            "Div" => Expr::floor_div(acc, x),
                            "Max" => Expr::max(acc, x),
                            "Min" => Expr::min(acc, x),
                            _ => return Ok(vec![Fact::new(first.dtype, shape)]),
                        };
                    }
                    out.push(acc);
                }
                return Ok(vec![Fact::symbolic(out, shape.len())]);
            }
        }
    }
    Ok(vec![Fact::new(first.dtype, shape)])
}

/// `f` over the broadcast of `a` and `b` into `v` (of shape `out`), row by row along
/// the innermost axis, blocks of rows split over the `workers`.
#[allow(clippy::too_many_arguments)]
fn zip_into<A: Copy + Sync, B: Copy + Sync, C: Send>(
    a: &[A],
    sa: &[usize],
    b: &[B],
    sb: &[usize],
    out: &[usize],
    v: &mut [C],
    workers: Workers,
    f: impl Fn(A, B) -> C + Sync,
) {
    // Chunks of `CHUNK` elements (whole rows where rows are shorter).
    if sa == out && sb == out {
        workers.chunks_mut(v, CHUNK, |i, v| {
            let (a, b) = (&a[i * CHUNK..], &b[i * CHUNK..]);
            for ((o, &x), &y) in v.iter_mut().zip(a).zip(b) {
                *o = f(x, y);
            }
        });
        return;
    }
    let r = out.len();
    if r == 0 {
        v[0] = f(a[0], b[0]);
        return;
    }
    let (ta, tb) = (broadcast_strides(sa, r), broadcast_strides(sb, r));
    let (inner, ia, ib) = (out[r - 1], ta[r - 1], tb[r - 1]);
    if inner == 0 {
        return;
    }
    let rows_per_chunk = CHUNK.div_ceil(inner);
    workers.chunks_mut(v, rows_per_chunk * inner, |i, v| {
        let first = i * rows_per_chunk;
        let mut at = 0;
        // Rows read whole or as one broadcast element take slice loops (they vectorize).
        for_rows(
            out,
            [&ta, &tb],
            first..first + v.len() / inner,
            |[oa, ob]| {
                let row = &mut v[at..at + inner];
                at += inner;
                match (ia, ib) {
                    (1, 1) => {
                        for ((o, &x), &y) in row
                            .iter_mut()
                            .zip(&a[oa..oa + inner])
                            .zip(&b[ob..ob + inner])
                        {
                            *o = f(x, y);
                        }
                    }
                    (1, 0) => {
                        let y = b[ob];
                        for (o, &x) in row.iter_mut().zip(&a[oa..oa + inner]) {
                            *o = f(x, y);
                        }
                    }
                    (0, 1) => {
                        let x = a[oa];
                        for (o, &y) in row.iter_mut().zip(&b[ob..ob + inner]) {
                            *o = f(x, y);
                        }
                    }
                    _ => {
                        for (j, o) in row.iter_mut().enumerate() {
                            *o = f(a[oa + j * ia], b[ob + j * ib]);
                        }
                    }
                }
            },
        );
    });
}

/// `a` op `b` into `o` (shaped as their broadcast, checked by the caller).
fn binary_into(
    node: &Node,
    a: TensorRef,
    b: TensorRef,
    o: &mut Tensor,
    workers: Workers,
) -> Result<()> {
    let op = node.op.as_str();
    let out = std::mem::take(&mut o.shape);
    let done = match (&a.data, &b.data, &mut o.data) {
        (DataRef::F32(x), DataRef::F32(y), Data::F32(v)) => {
            // One monomorphized loop per op (a function pointer would not vectorize).
            macro_rules! op {
                ($f:expr) => {
                    zip_into(x, a.shape, y, b.shape, &out, v, workers, $f)
                };
            }
            match op {
                "Add" | "Sum" | "Mean" => op!(|p: f32, q: f32| p + q),
                "Sub" => op!(|p: f32, q: f32| p - q),
                "Mul" => op!(|p: f32, q: f32| p * q),
                "Div" => op!(|p: f32, q: f32| p / q),
                "Pow" => op!(|p: f32, q: f32| if q == 2.0 { p * p } else { p.powf(q) }),
                // fmod=1: C's fmod (the dividend's sign); 0 (floats from opset 26):
                // the divisor's sign, as NumPy's `mod` (a zero takes the divisor's sign).
                "Mod" if node.int("fmod", 0)? != 0 => op!(|p: f32, q: f32| p % q),
                "Mod" => op!(|p: f32, q: f32| {
                    let r = p % q;
                    if r == 0.0 {
                        0f32.copysign(q)
                    } else if (r < 0.0) != (q < 0.0) {
                        r + q
                    } else {
                        r
                    }
                }),
                "Max" => op!(|p: f32, q: f32| if p.is_nan() || q.is_nan() {
                    f32::NAN
                } else {
                    p.max(q)
                }),
                "Min" => op!(|p: f32, q: f32| if p.is_nan() || q.is_nan() {
                    f32::NAN
                } else {
                    p.min(q)
                }),
                _ => return fail(node, "unsupported for float"),
            }
            Ok(())
        }
        (DataRef::F32(x), DataRef::I64(y), Data::F32(v)) if op == "Pow" => {
            zip_into(x, a.shape, y, b.shape, &out, v, workers, |p, q| {
                p.powi(q as i32)
            });
            Ok(())
        }
        // An integer base keeps its type (computed in f64 and truncated, as
        // onnxruntime does).
        (DataRef::I64(x), DataRef::F32(y), Data::I64(v)) if op == "Pow" => {
            zip_into(x, a.shape, y, b.shape, &out, v, workers, |p, q| {
                (p as f64).powf(q as f64) as i64
            });
            Ok(())
        }
        (DataRef::I64(x), DataRef::I64(y), Data::I64(v)) => {
            let f: fn(i64, i64) -> Option<i64> = match op {
                "Add" | "Sum" => i64::checked_add,
                "Sub" => i64::checked_sub,
                "Mul" => i64::checked_mul,
                "Div" => i64::checked_div,
                "Pow" => |p, q| u32::try_from(q).ok().and_then(|q| p.checked_pow(q)),
                // fmod=1: the dividend's sign (C); 0: the divisor's (Python).
                "Mod" if node.int("fmod", 0)? != 0 => i64::checked_rem,
                "Mod" => |p, q| {
                    let r = p.checked_rem(q)?;
                    Some(if r != 0 && (r < 0) != (q < 0) {
                        r + q
                    } else {
                        r
                    })
                },
                "Max" => |p, q| Some(p.max(q)),
                "Min" => |p, q| Some(p.min(q)),
                // Opset 28's signed shifts: bits shifted past the width are gone, a
                // right shift keeps the sign.
                "BitShift" if node.string("direction", "")? == "LEFT" => |p, q| {
                    Some(
                        u32::try_from(q)
                            .ok()
                            .filter(|&q| q < 64)
                            .map_or(0, |q| p << q),
                    )
                },
                "BitShift" if node.string("direction", "")? == "RIGHT" => {
                    |p, q| Some(p >> u32::try_from(q).unwrap_or(63).min(63))
                }
                "BitShift" => return fail(node, "direction must be LEFT or RIGHT"),
                _ => return fail(node, "unsupported for int64"),
            };
            // Overflow or a zero divisor sets `bad` (the element is written 0) and fails.
            let bad = std::sync::atomic::AtomicBool::new(false);
            zip_into(x, a.shape, y, b.shape, &out, v, workers, |p, q| {
                f(p, q).unwrap_or_else(|| {
                    bad.store(true, std::sync::atomic::Ordering::Relaxed);
                    0
                })
            });
            match bad.into_inner() {
                true => Err(node.error("integer overflow or division by zero")),
                false => Ok(()),
            }
        }
        (x, y, _) => fail(
            node,
            format!("element types {} and {} do not match", x.dtype(), y.dtype()),
        ),
    };
    o.shape = out;
    done
}

fn eval_arith(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    eval_via(node, ins, eval_arith_into)
}

/// The inputs' shapes, for the broadcast check of an elementwise op's output.
fn in_shapes<'a>(ins: &'a [Option<TensorRef>]) -> smallvec::SmallVec<[&'a [usize]; 4]> {
    ins.iter().flatten().map(|t| t.shape).collect()
}

/// An error unless output 0 is the broadcast of the inputs.
fn broadcast_output(node: &Node, ins: &[Option<TensorRef>], outs: &[Tensor]) -> Result<()> {
    let shapes = in_shapes(ins);
    match outs.first() {
        Some(o) if broadcasts_to(&o.shape, &shapes) => Ok(()),
        Some(o) => fail(
            node,
            format!(
                "the output is given the shape {:?}, which is not the broadcast of its inputs' {shapes:?}",
                o.shape
            ),
        ),
        None => fail(node, "no output given"),
    }
}

fn eval_arith_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    broadcast_output(node, ins, outs)?;
    let first = req(node, ins, 0)?;
    let rest: smallvec::SmallVec<[TensorRef; 4]> = ins[1..].iter().flatten().copied().collect();
    let o = &mut outs[0];
    match rest.as_slice() {
        [] => {
            if first.dtype() != o.dtype() {
                return fail(node, "the output's type is not the input's");
            }
            o.data = first.data.to_data();
        }
        [second] => binary_into(node, first, *second, o, workers)?,
        // Three or more (`Sum`, `Mean`, `Max`, `Min`): through temporaries.
        [second, more @ ..] => {
            let step = |acc: TensorRef, t: TensorRef| -> Result<Tensor> {
                let mut next =
                    Tensor::zeros(acc.dtype(), broadcast_out(node, acc.shape, t.shape)?)?;
                binary_into(node, acc, t, &mut next, workers)?;
                Ok(next)
            };
            let mut acc = step(first, *second)?;
            for t in more {
                acc = step(acc.view(), *t)?;
            }
            o.data = acc.data;
        }
    }
    if node.op == "Mean" {
        let n = 1 + rest.len();
        for s in o.f32_mut().map_err(|e| node.error(e))? {
            *s /= n as f32;
        }
    }
    Ok(())
}

fn infer_compare(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let shape = shapes(node, ins)?;
    // Equality of shape expressions, where it can be decided.
    if node.op == "Equal" && shape.len() <= 1 {
        if let Some(vs) = syms(ins).filter(|v| v.len() == 2) {
            let n = vs[0].len().max(vs[1].len());
            if vs.iter().any(|v| v.len() != n && v.len() != 1) {
                return fail(node, "vectors of different lengths");
            }
            let decided: Option<Vec<bool>> = (0..n)
                .map(|i| equal(&sym_at(vs[0], i), &sym_at(vs[1], i)))
                .collect();
            if let Some(d) = decided {
                let dims = if shape.is_empty() { vec![] } else { vec![n] };
                return Ok(vec![Fact::known(Tensor::bool(dims, d)?)]);
            }
        }
    }
    Ok(vec![Fact::new(DType::Bool, shape)])
}

fn eval_compare(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    eval_via(node, ins, eval_compare_into)
}

fn eval_compare_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    broadcast_output(node, ins, outs)?;
    let (a, b) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let o = &mut outs[0];
    let out = std::mem::take(&mut o.shape);
    let v = o.bool_mut().map_err(|e| node.error(e))?;
    let op = node.op.as_str();
    fn cmp<T: PartialOrd + Copy>(op: &str) -> Option<fn(T, T) -> bool> {
        Some(match op {
            "Equal" => |p, q| p == q,
            "Greater" => |p, q| p > q,
            "GreaterOrEqual" => |p, q| p >= q,
            "Less" => |p, q| p < q,
            "LessOrEqual" => |p, q| p <= q,
            _ => return None,
        })
    }
    let done = match (&a.data, &b.data) {
        (DataRef::F32(x), DataRef::F32(y)) => match cmp::<f32>(op) {
            Some(f) => {
                zip_into(x, a.shape, y, b.shape, &out, v, workers, f);
                Ok(())
            }
            None => fail(node, "unsupported for float"),
        },
        (DataRef::I64(x), DataRef::I64(y)) => match cmp::<i64>(op) {
            Some(f) => {
                zip_into(x, a.shape, y, b.shape, &out, v, workers, f);
                Ok(())
            }
            None => fail(node, "unsupported for int64"),
        },
        (DataRef::Bool(x), DataRef::Bool(y)) => {
            let f: Option<fn(bool, bool) -> bool> = match op {
                "And" => Some(|p, q| p && q),
                "Or" => Some(|p, q| p || q),
                "Xor" => Some(|p, q| p != q),
                "Equal" => Some(|p, q| p == q),
                _ => None,
            };
            match f {
                Some(f) => {
                    zip_into(x, a.shape, y, b.shape, &out, v, workers, f);
                    Ok(())
                }
                None => fail(node, "unsupported for bool"),
            }
        }
        (x, y) => fail(
            node,
            format!("element types {} and {} do not match", x.dtype(), y.dtype()),
        ),
    };
    o.shape = out;
    done
}

fn infer_where(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (c, x) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let shape = shapes(node, ins)?;
    // Shape plumbing: a known condition picks between two integer vectors.
    if let (Some(cond), Some(vs)) = (&c.value, syms(&ins[1..])) {
        if shape.len() <= 1 && vs.len() == 2 {
            let cond = cond.as_bool().map_err(|e| node.error(e))?;
            let n = vs[0].len().max(vs[1].len()).max(cond.len());
            if vs
                .iter()
                .map(|v| v.len())
                .chain([cond.len()])
                .any(|l| l != n && l != 1)
            {
                return fail(node, "vectors of different lengths");
            }
            let pick = |i: usize| {
                let ci = if cond.len() == 1 { cond[0] } else { cond[i] };
                if ci {
                    sym_at(vs[0], i)
                } else {
                    sym_at(vs[1], i)
                }
            };
            return Ok(vec![Fact::symbolic(
                (0..n).map(pick).collect(),
                shape.len(),
            )]);
        }
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_where(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    eval_via(node, ins, eval_where_into)
}

fn eval_where_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    _: Workers,
) -> Result<()> {
    broadcast_output(node, ins, outs)?;
    let (c, x, y) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let cond = c.as_bool().map_err(|e| node.error(e))?;
    let o = &mut outs[0];
    let out = std::mem::take(&mut o.shape);
    let r = out.len();
    let strides = [&c.shape, &x.shape, &y.shape].map(|s| broadcast_strides(s, r));
    let s3 = [&strides[0][..], &strides[1][..], &strides[2][..]];
    fn pick<T: Copy>(
        out: &[usize],
        cond: &[bool],
        a: &[T],
        b: &[T],
        s: [&[usize]; 3],
        v: &mut [T],
    ) {
        let Some(&inner) = out.last() else {
            v[0] = if cond[0] { a[0] } else { b[0] };
            return;
        };
        let step = s.map(|st| st[st.len() - 1]);
        let mut at = 0;
        // The common rows (a whole condition row, branches whole or broadcast) as
        // slice loops.
        for_each_row(out, s, |[oc, oa, ob]| {
            let row = &mut v[at..at + inner];
            at += inner;
            let c = &cond[oc..];
            match step {
                [1, 1, 1] => {
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = if c[j] { a[oa + j] } else { b[ob + j] };
                    }
                }
                [1, 0, 1] => {
                    let x = a[oa];
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = if c[j] { x } else { b[ob + j] };
                    }
                }
                [1, 1, 0] => {
                    let y = b[ob];
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = if c[j] { a[oa + j] } else { y };
                    }
                }
                [1, 0, 0] => {
                    let (x, y) = (a[oa], b[ob]);
                    for (o, &k) in row.iter_mut().zip(&c[..inner]) {
                        *o = if k { x } else { y };
                    }
                }
                _ => {
                    for (j, o) in row.iter_mut().enumerate() {
                        *o = if cond[oc + j * step[0]] {
                            a[oa + j * step[1]]
                        } else {
                            b[ob + j * step[2]]
                        };
                    }
                }
            }
        });
    }
    let done = match (&x.data, &y.data, &mut o.data) {
        (DataRef::F32(a), DataRef::F32(b), Data::F32(v)) => {
            pick(&out, cond, a, b, s3, v);
            Ok(())
        }
        (DataRef::I64(a), DataRef::I64(b), Data::I64(v)) => {
            pick(&out, cond, a, b, s3, v);
            Ok(())
        }
        (DataRef::Bool(a), DataRef::Bool(b), Data::Bool(v)) => {
            pick(&out, cond, a, b, s3, v);
            Ok(())
        }
        _ => fail(node, "the two branches have different element types"),
    };
    o.shape = out;
    done
}

#[cfg(test)]
mod tests {
    use super::super::{broadcast_indices, broadcast_shape};
    use super::*;

    /// The row walk of `zip` reads what the index vectors of plain broadcasting read,
    /// for every pair of shapes that broadcast (ranks 0–3, dims 1–3, either side).
    #[test]
    fn zip_matches_index_broadcasting() {
        let mut shapes: Vec<Vec<usize>> = vec![vec![]];
        for r in 1..=3 {
            let mut grown = Vec::new();
            for s in shapes.iter().filter(|s| s.len() == r - 1) {
                for d in [1, 2, 3] {
                    let mut t = s.clone();
                    t.push(d);
                    grown.push(t);
                }
            }
            shapes.extend(grown);
        }
        let mut checked = 0;
        for sa in &shapes {
            for sb in &shapes {
                let Some(out) = broadcast_shape(sa, sb) else {
                    continue;
                };
                let a: Vec<i64> = (0..sa.iter().product::<usize>() as i64).collect();
                let b: Vec<i64> = (0..sb.iter().product::<usize>() as i64)
                    .map(|x| x * 1000)
                    .collect();
                let mut got = vec![0; out.iter().product()];
                zip_into(&a, sa, &b, sb, &out, &mut got, Workers::SERIAL, |x, y| {
                    x + y
                });
                let (ia, ib) = (broadcast_indices(sa, &out), broadcast_indices(sb, &out));
                let want: Vec<i64> = ia.iter().zip(&ib).map(|(&i, &j)| a[i] + b[j]).collect();
                assert_eq!(got, want, "{sa:?} with {sb:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 940);
    }

    /// Split over two threads, the row walk of `zip` still reads what index
    /// broadcasting reads: shapes large enough to split, broadcast along each axis.
    #[test]
    fn zip_split_over_threads_matches_index_broadcasting() {
        let pairs: [(&[usize], &[usize]); 6] = [
            (&[64, 70, 30], &[64, 70, 30]),
            (&[64, 1, 300], &[1, 70, 300]),
            (&[64, 70, 300], &[300]),
            (&[64, 70, 1], &[64, 70, 30]),
            (&[7, 1], &[1, 5001]),
            (&[3, 5000, 2], &[3, 1, 2]),
        ];
        for (sa, sb) in pairs {
            let out = broadcast_shape(sa, sb).unwrap();
            let a: Vec<i64> = (0..sa.iter().product::<usize>() as i64).collect();
            let b: Vec<i64> = (0..sb.iter().product::<usize>() as i64)
                .map(|x| x * 1_000_000)
                .collect();
            let mut got = vec![0; out.iter().product()];
            let two = crate::workers::Two;
            zip_into(
                &a,
                sa,
                &b,
                sb,
                &out,
                &mut got,
                Workers::new(&two),
                |x, y| x + y,
            );
            let (ia, ib) = (broadcast_indices(sa, &out), broadcast_indices(sb, &out));
            let want: Vec<i64> = ia.iter().zip(&ib).map(|(&i, &j)| a[i] + b[j]).collect();
            assert!(got == want, "{sa:?} with {sb:?}");
        }
    }
}
