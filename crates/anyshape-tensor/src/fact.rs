//! What is known of a value before the model runs ([`Fact`]): its element type, its
//! shape as expressions over the shape vars, and its content where known — a constant
//! tensor (weights, folded constants) or, for the small integer tensors of shape
//! plumbing (`Shape → Gather → Concat → Reshape`), each element as an expression
//! ([`Fact::sym`]). Shape propagation (`infer.rs`) makes one per value.
use crate::{DType, Data, Result, Tensor, TensorError};
use anyshape_ir::{Bindings, Expr};

/// What is known of a value.
#[derive(Clone, Debug, PartialEq)]
pub struct Fact {
    /// The element type.
    pub dtype: DType,
    /// The shape, outermost first.
    pub shape: Vec<Expr>,
    /// The elements, where every one is known.
    pub value: Option<Tensor>,
    /// The elements of an integer tensor of rank 0 or 1, as expressions.
    pub sym: Option<Vec<Expr>>,
}

/// Constant tensors up to this many elements are folded at compile time.
pub const FOLD_LIMIT: usize = 1 << 16;

impl Fact {
    /// A value of `dtype` and `shape`, its elements unknown.
    pub fn new(dtype: DType, shape: Vec<Expr>) -> Fact {
        Fact {
            dtype,
            shape,
            value: None,
            sym: None,
        }
    }

    /// A known tensor (integer tensors of rank ≤ 1 also get their `sym` form).
    pub fn known(t: Tensor) -> Fact {
        let sym = match (&t.data, t.shape.len()) {
            (Data::I64(v), 0 | 1) => Some(v.iter().map(|&x| Expr::Const(x)).collect()),
            _ => None,
        };
        Fact {
            dtype: t.dtype(),
            shape: t.shape.iter().map(|&d| Expr::Const(d as i64)).collect(),
            value: Some(t),
            sym,
        }
    }

    /// An `i64` tensor of rank `rank` (0 or 1) whose elements are `sym`; known where
    /// they are all constants.
    pub fn symbolic(sym: Vec<Expr>, rank: usize) -> Fact {
        let sym: Vec<Expr> = sym.iter().map(|e| e.simplify()).collect();
        let shape = if rank == 0 {
            vec![]
        } else {
            vec![Expr::Const(sym.len() as i64)]
        };
        let consts: Option<Vec<i64>> = sym.iter().map(|e| e.as_const()).collect();
        Fact {
            dtype: DType::I64,
            value: consts.map(|c| Tensor {
                shape: if rank == 0 { vec![] } else { vec![c.len()] },
                data: Data::I64(c),
            }),
            shape,
            sym: Some(sym),
        }
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The shape with every dim a constant, if it is.
    pub fn const_shape(&self) -> Option<Vec<usize>> {
        self.shape
            .iter()
            .map(|d| d.as_const().and_then(|c| usize::try_from(c).ok()))
            .collect()
    }

    /// The shape at an instance.
    pub fn shape_at(&self, b: &Bindings) -> Result<Vec<usize>> {
        self.shape
            .iter()
            .map(|d| {
                let v = d.eval(b)?;
                usize::try_from(v).map_err(|_| {
                    TensorError::Shape(format!("the dim {d} is {v} at {b}, below zero"))
                })
            })
            .collect()
    }
}

/// The broadcast of two symbolic shapes (numpy rules). Dims that differ symbolically
/// are taken as equal (the runtime checks them at every call); constants that differ
/// and are not 1 are an error.
pub fn broadcast(a: &[Expr], b: &[Expr]) -> std::result::Result<Vec<Expr>, String> {
    let n = a.len().max(b.len());
    let one = Expr::Const(1);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let x = if i + a.len() >= n {
            &a[i + a.len() - n]
        } else {
            &one
        };
        let y = if i + b.len() >= n {
            &b[i + b.len() - n]
        } else {
            &one
        };
        out.push(match (x.as_const(), y.as_const()) {
            _ if x == y => x.clone(),
            (Some(1), _) => y.clone(),
            (_, Some(1)) => x.clone(),
            (Some(p), Some(q)) => {
                return Err(format!(
                    "shapes {} and {} do not broadcast ({p} against {q})",
                    shape_text(a),
                    shape_text(b)
                ))
            }
            (None, _) => x.clone(),
            (_, None) => y.clone(),
        });
    }
    Ok(out)
}

/// A symbolic shape in words: `[batch, sequence, 64]`.
pub fn shape_text(shape: &[Expr]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

/// Whether `e` is at least 1 for every binding of shape vars that are at least 1
/// (conservative: `false` where it cannot tell).
pub fn positive(e: &Expr) -> bool {
    match e {
        Expr::Const(c) => *c > 0,
        Expr::Var(_) => true,
        Expr::Add(a, b) | Expr::Mul(a, b) => positive(a) && positive(b),
        Expr::CeilDiv(a, b) => positive(a) && b.as_const().is_some_and(|c| c > 0),
        Expr::Max(a, b) => positive(a) || positive(b),
        Expr::Min(a, b) => positive(a) && positive(b),
        _ => false,
    }
}

/// Whether `e` is at least 0 for every binding of shape vars that are at least 1
/// (conservative: `false` where it cannot tell): what a floor division of a dim can
/// be, `height / 16` at a height under 16.
fn non_negative(e: &Expr) -> bool {
    let by_positive = |d: &Expr| d.as_const().is_some_and(|c| c > 0);
    match e {
        Expr::Const(c) => *c >= 0,
        Expr::Add(a, b) | Expr::Mul(a, b) | Expr::Min(a, b) => non_negative(a) && non_negative(b),
        Expr::FloorDiv(a, d) | Expr::CeilDiv(a, d) => non_negative(a) && by_positive(d),
        Expr::Mod(_, d) => by_positive(d),
        Expr::Max(a, b) => non_negative(a) || non_negative(b),
        _ => positive(e),
    }
}

/// Whether `a == b` for every binding, where it can tell.
pub fn equal(a: &Expr, b: &Expr) -> Option<bool> {
    let (a, b) = (vacuous_max(&a.simplify()), vacuous_max(&b.simplify()));
    // The same expression, or products of the same factors in another order.
    if a == b
        || exact_quotient(std::slice::from_ref(&a), std::slice::from_ref(&b))
            == Some(Expr::Const(1))
    {
        return Some(true);
    }
    match (a.as_const(), b.as_const()) {
        (Some(x), Some(y)) => Some(x == y),
        (Some(c), None) if c <= 0 && positive(&b) => Some(false),
        (None, Some(c)) if c <= 0 && positive(&a) => Some(false),
        _ => None,
    }
}

/// `e` without the bounds `max(x, c)` that cannot bind — `x` at least 0, `c ≤ 0` (shape
/// inference clamps dims at 0, e.g. `Expand`'s and `Range`'s) — anywhere in it,
/// simplified.
fn vacuous_max(e: &Expr) -> Expr {
    let b = |x: &Expr| Box::new(vacuous_max(x));
    match e {
        Expr::Max(x, c) | Expr::Max(c, x)
            if c.as_const().is_some_and(|c| c <= 0) && non_negative(x) =>
        {
            vacuous_max(x)
        }
        Expr::Const(_) | Expr::Var(_) => e.clone(),
        Expr::Add(x, y) => Expr::Add(b(x), b(y)),
        Expr::Sub(x, y) => Expr::Sub(b(x), b(y)),
        Expr::Mul(x, y) => Expr::Mul(b(x), b(y)),
        Expr::FloorDiv(x, y) => Expr::FloorDiv(b(x), b(y)),
        Expr::CeilDiv(x, y) => Expr::CeilDiv(b(x), b(y)),
        Expr::Mod(x, y) => Expr::Mod(b(x), b(y)),
        Expr::Min(x, y) => Expr::Min(b(x), b(y)),
        Expr::Max(x, y) => Expr::Max(b(x), b(y)),
    }
    .simplify()
}

/// The factors of a product, flattened.
fn factors(e: &Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::Mul(a, b) => {
            factors(a, out);
            factors(b, out);
        }
        other => out.push(other.clone()),
    }
}

/// `Π num / Π den` where the division is known to be exact: common factors cancel,
/// constants divide. `None` if it cannot be shown exact.
pub fn exact_quotient(num: &[Expr], den: &[Expr]) -> Option<Expr> {
    let mut n = Vec::new();
    for e in num {
        factors(&e.simplify(), &mut n);
    }
    let mut d = Vec::new();
    for e in den {
        factors(&e.simplify(), &mut d);
    }
    let mut cn: i64 = 1;
    let mut cd: i64 = 1;
    n.retain(|e| match e.as_const() {
        Some(c) => {
            cn = cn.saturating_mul(c);
            false
        }
        None => true,
    });
    d.retain(|e| match e.as_const() {
        Some(c) => {
            cd = cd.saturating_mul(c);
            false
        }
        None => true,
    });
    for f in d {
        let i = n.iter().position(|x| *x == f)?;
        n.remove(i);
    }
    if cd == 0 || cn % cd != 0 {
        return None;
    }
    Some(
        n.into_iter()
            .fold(Expr::Const(cn / cd), |acc, f| acc * f)
            .simplify(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_ir::parse_expr;

    /// A clamp at 0 of a dim that cannot be negative is the dim (ViT's mask, whose
    /// `Range` clamps `height / 16 * (width / 16) + 1` at 0); of one that can, unknown.
    #[test]
    fn a_clamp_that_cannot_bind_is_the_dim() {
        let e = |s: &str| parse_expr(s).unwrap();
        let tokens = e("height / 16 * (width / 16) + 1");
        assert_eq!(
            equal(&Expr::max(tokens.clone(), Expr::Const(0)), &tokens),
            Some(true)
        );
        assert_eq!(
            equal(&e("max(height / 16, 0)"), &e("height / 16")),
            Some(true)
        );
        assert_eq!(
            equal(&e("max(height % 3, -2)"), &e("height % 3")),
            Some(true)
        );
        let can_be_negative = e("height / 16 - 1");
        assert_eq!(
            equal(
                &Expr::max(can_be_negative.clone(), Expr::Const(0)),
                &can_be_negative
            ),
            None
        );
    }
}
