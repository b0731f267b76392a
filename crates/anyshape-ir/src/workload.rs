//! Workloads: contractions with affine index maps over symbolic axes, an optional
//! elementwise epilogue, the built-in operator library, and binding to an instance.
//!
//! Invariants of a [`Workload`] (checked by [`Workload::validate`]):
//! - every index term names an existing axis;
//! - the output is indexed by spatial axes only, each spatial axis exactly once, with
//!   coefficient 1 and offset 0;
//! - every tensor's index map has one entry per dimension of its shape.
use crate::{parse_expr, split_top_level, Bindings, Expr, IrError, ParseError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// Element type of a workload's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
        }
    }

    /// The C type name.
    pub fn c_type(self) -> &'static str {
        match self {
            DType::F32 => "float",
        }
    }
}

/// Whether an axis indexes the output (spatial) or is summed over (reduction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AxisKind {
    /// Indexes the output.
    Spatial,
    /// Summed over.
    Reduction,
}

/// A loop axis of a contraction.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Axis {
    /// Its name, e.g. `m`.
    pub name: String,
    /// Its extent, an expression over shape vars.
    pub extent: Expr,
    /// Spatial or reduction.
    pub kind: AxisKind,
}

/// One dimension's index: `sum(coeff * axis) + offset`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AffineIndex {
    /// `(axis position, coefficient)` pairs.
    pub terms: Vec<(usize, i64)>,
    /// Constant offset.
    pub offset: i64,
}

impl AffineIndex {
    /// The index `axis`.
    pub fn axis(axis: usize) -> AffineIndex {
        AffineIndex {
            terms: vec![(axis, 1)],
            offset: 0,
        }
    }

    /// The coefficient of `axis` (0 when absent).
    pub fn coeff(&self, axis: usize) -> i64 {
        self.terms.iter().filter(|t| t.0 == axis).map(|t| t.1).sum()
    }
}

/// A tensor operand: its shape and how the axes index it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorRef {
    /// Its name, e.g. `X`.
    pub name: String,
    /// Its shape, row-major (last dimension contiguous).
    pub shape: Vec<Expr>,
    /// One affine index per dimension.
    pub index: Vec<AffineIndex>,
}

impl TensorRef {
    /// Row-major strides of each dimension, in elements.
    pub fn strides(&self) -> Vec<Expr> {
        let mut strides = vec![Expr::Const(1); self.shape.len()];
        for d in (0..self.shape.len().saturating_sub(1)).rev() {
            strides[d] = &strides[d + 1] * &self.shape[d + 1];
        }
        strides
    }

    /// How far one step along `axis` moves in memory, in elements.
    pub fn axis_stride(&self, axis: usize) -> Expr {
        self.strides()
            .into_iter()
            .zip(&self.index)
            .fold(Expr::Const(0), |acc, (s, ix)| acc + s * ix.coeff(axis))
    }

    /// The element offset of the point where every axis is 0.
    pub fn base_offset(&self) -> Expr {
        self.strides()
            .into_iter()
            .zip(&self.index)
            .fold(Expr::Const(0), |acc, (s, ix)| acc + s * ix.offset)
    }

    /// Whether the tensor is indexed by `axis`.
    pub fn uses_axis(&self, axis: usize) -> bool {
        self.index.iter().any(|ix| ix.coeff(axis) != 0)
    }
}

/// An elementwise function applied to each output element after the reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Epilogue {
    /// No epilogue.
    None,
    /// `max(x, 0)`.
    Relu,
}

impl Epilogue {
    /// Apply to one value (the reference semantics).
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Epilogue::None => x,
            Epilogue::Relu => x.max(0.0),
        }
    }
}

/// A tensor operator over shape vars: `output[spatial] = epilogue(sum over reduction axes
/// of the product of the inputs)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Workload {
    /// Operator name, e.g. `dense`.
    pub op: String,
    /// Named arguments it was built from, for display (`M=16*T`).
    pub args: Vec<(String, Expr)>,
    /// Element type.
    pub dtype: DType,
    /// The loop axes.
    pub axes: Vec<Axis>,
    /// Input tensors (their product is summed).
    pub inputs: Vec<TensorRef>,
    /// The output tensor.
    pub output: TensorRef,
    /// Elementwise function on the result.
    pub epilogue: Epilogue,
}

/// Built-in workloads: name, argument names, description.
pub const BUILTIN_WORKLOADS: &[(&str, &[&str], &str)] = &[
    ("dense", &["M", "N", "K"], "Y[m,n] = sum_k X[m,k] * W[n,k]"),
    (
        "batch_matmul_nt",
        &["B", "M", "N", "K"],
        "Y[b,m,n] = sum_k X[b,m,k] * W[b,n,k]",
    ),
    (
        "batch_matmul_nn",
        &["B", "M", "N", "K"],
        "Y[b,m,n] = sum_k X[b,m,k] * W[b,k,n]",
    ),
];

/// A workload with every shape var bound: concrete extents, shapes and strides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundWorkload {
    /// Extent of each axis.
    pub extents: Vec<i64>,
    /// Shape of each input, then the output.
    pub shapes: Vec<Vec<i64>>,
    /// Per tensor (inputs, then output): element stride of each axis.
    pub axis_strides: Vec<Vec<i64>>,
    /// Per tensor: element offset at the origin.
    pub offsets: Vec<i64>,
    /// Per tensor: number of elements.
    pub lens: Vec<usize>,
}

fn product(name: &str, dims: &[i64]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d as usize))
        .filter(|&n| n <= (isize::MAX as usize) / 16)
        .ok_or_else(|| IrError::TooLarge(name.to_string()))
}

impl Workload {
    fn contraction(
        op: &str,
        args: Vec<(String, Expr)>,
        axes: Vec<Axis>,
        inputs: Vec<TensorRef>,
        output: TensorRef,
    ) -> Workload {
        Workload {
            op: op.to_string(),
            args,
            dtype: DType::F32,
            axes,
            inputs,
            output,
            epilogue: Epilogue::None,
        }
    }

    /// `dense(M, N, K)`: `Y[m,n] = sum_k X[m,k] * W[n,k]`.
    pub fn dense(m: Expr, n: Expr, k: Expr) -> Workload {
        let axes = vec![spatial("m", &m), spatial("n", &n), reduction("k", &k)];
        let x = tensor("X", &[&m, &k], &[0, 2]);
        let w = tensor("W", &[&n, &k], &[1, 2]);
        let y = tensor("Y", &[&m, &n], &[0, 1]);
        Workload::contraction(
            "dense",
            named(&["M", "N", "K"], [m, n, k]),
            axes,
            vec![x, w],
            y,
        )
    }

    /// `batch_matmul_nt(B, M, N, K)`: `Y[b,m,n] = sum_k X[b,m,k] * W[b,n,k]`.
    pub fn batch_matmul_nt(b: Expr, m: Expr, n: Expr, k: Expr) -> Workload {
        let axes = vec![
            spatial("b", &b),
            spatial("m", &m),
            spatial("n", &n),
            reduction("k", &k),
        ];
        let x = tensor("X", &[&b, &m, &k], &[0, 1, 3]);
        let w = tensor("W", &[&b, &n, &k], &[0, 2, 3]);
        let y = tensor("Y", &[&b, &m, &n], &[0, 1, 2]);
        Workload::contraction(
            "batch_matmul_nt",
            named(&["B", "M", "N", "K"], [b, m, n, k]),
            axes,
            vec![x, w],
            y,
        )
    }

    /// `batch_matmul_nn(B, M, N, K)`: `Y[b,m,n] = sum_k X[b,m,k] * W[b,k,n]`.
    pub fn batch_matmul_nn(b: Expr, m: Expr, n: Expr, k: Expr) -> Workload {
        let axes = vec![
            spatial("b", &b),
            spatial("m", &m),
            spatial("n", &n),
            reduction("k", &k),
        ];
        let x = tensor("X", &[&b, &m, &k], &[0, 1, 3]);
        let w = tensor("W", &[&b, &k, &n], &[0, 3, 2]);
        let y = tensor("Y", &[&b, &m, &n], &[0, 1, 2]);
        Workload::contraction(
            "batch_matmul_nn",
            named(&["B", "M", "N", "K"], [b, m, n, k]),
            axes,
            vec![x, w],
            y,
        )
    }

    /// Parse the command-line form: `dense(M=16*T,N=2304,K=768)`, positional
    /// `dense(16*T,2304,768)`, optionally followed by `+relu`.
    pub fn parse(text: &str) -> Result<Workload> {
        let perr = |pos: usize, message: String| {
            IrError::Parse(ParseError {
                text: text.to_string(),
                pos,
                message,
            })
        };
        let (call, epilogue) = match split_top_level(text, '+').as_slice() {
            [(_, call)] => (*call, Epilogue::None),
            [(_, call), (at, epi)] => match epi.trim() {
                "relu" => (*call, Epilogue::Relu),
                other => {
                    return Err(perr(
                        *at,
                        format!("unknown epilogue `{other}` (known: relu)"),
                    ))
                }
            },
            [_, _, (at, _), ..] => return Err(perr(*at, "at most one epilogue".into())),
            [] => unreachable!("split yields at least one piece"),
        };
        let open = call.find('(').ok_or_else(|| {
            perr(
                call.len(),
                "expected `NAME(ARGS)`, e.g. `dense(M=16*T,N=2304,K=768)`".into(),
            )
        })?;
        let name = call[..open].trim();
        let close = call
            .rfind(')')
            .filter(|&c| c > open)
            .ok_or_else(|| perr(call.len(), "missing `)`".into()))?;
        if !call[close + 1..].trim().is_empty() {
            return Err(perr(close + 1, "unexpected text after `)`".into()));
        }
        let (_, arg_names, _) =
            BUILTIN_WORKLOADS
                .iter()
                .find(|w| w.0 == name)
                .ok_or_else(|| IrError::UnknownWorkload {
                    name: name.to_string(),
                    known: BUILTIN_WORKLOADS
                        .iter()
                        .map(|w| w.0)
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
        let mut values: Vec<Option<Expr>> = vec![None; arg_names.len()];
        let inner = &call[open + 1..close];
        if !inner.trim().is_empty() {
            for (i, (at, part)) in split_top_level(inner, ',').into_iter().enumerate() {
                let at = open + 1 + at;
                let (slot, expr_text, expr_at) = match part.split_once('=') {
                    Some((k, v)) => {
                        let k = k.trim();
                        let slot = arg_names.iter().position(|n| *n == k).ok_or_else(|| {
                            perr(
                                at,
                                format!(
                                    "`{name}` has no argument `{k}` (arguments: {})",
                                    arg_names.join(", ")
                                ),
                            )
                        })?;
                        (slot, v, at + part.len() - v.len())
                    }
                    None if i < arg_names.len() => (i, part, at),
                    None => {
                        return Err(perr(
                            at,
                            format!("`{name}` takes {} arguments", arg_names.len()),
                        ))
                    }
                };
                if values[slot].is_some() {
                    return Err(perr(
                        at,
                        format!("argument `{}` given twice", arg_names[slot]),
                    ));
                }
                let e = parse_expr(expr_text).map_err(|e| perr(expr_at + e.pos, e.message))?;
                values[slot] = Some(e);
            }
        }
        let missing: Vec<_> = arg_names
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect();
        if !missing.is_empty() {
            return Err(IrError::BadArguments {
                name: name.to_string(),
                message: format!("missing argument(s) {}", missing.join(", ")),
            });
        }
        let v: Vec<Expr> = values.into_iter().flatten().collect();
        let mut w = match (name, v.as_slice()) {
            ("dense", [m, n, k]) => Workload::dense(m.clone(), n.clone(), k.clone()),
            ("batch_matmul_nt", [b, m, n, k]) => {
                Workload::batch_matmul_nt(b.clone(), m.clone(), n.clone(), k.clone())
            }
            ("batch_matmul_nn", [b, m, n, k]) => {
                Workload::batch_matmul_nn(b.clone(), m.clone(), n.clone(), k.clone())
            }
            _ => unreachable!("argument count checked against BUILTIN_WORKLOADS"),
        };
        w.epilogue = epilogue;
        w.validate()?;
        Ok(w)
    }

    /// Check the invariants listed in the module doc.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(IrError::InvalidWorkload(m));
        for t in self.inputs.iter().chain([&self.output]) {
            if t.index.len() != t.shape.len() {
                return bad(format!(
                    "tensor {} has {} dims but {} indices",
                    t.name,
                    t.shape.len(),
                    t.index.len()
                ));
            }
            if t.index
                .iter()
                .flat_map(|ix| &ix.terms)
                .any(|&(a, _)| a >= self.axes.len())
            {
                return bad(format!(
                    "tensor {} names an axis that does not exist",
                    t.name
                ));
            }
        }
        let mut seen = BTreeSet::new();
        for ix in &self.output.index {
            match ix.terms.as_slice() {
                [(a, 1)]
                    if ix.offset == 0
                        && self.axes[*a].kind == AxisKind::Spatial
                        && seen.insert(*a) => {}
                _ => return bad("output indices must be distinct spatial axes".into()),
            }
        }
        if seen.len()
            != self
                .axes
                .iter()
                .filter(|a| a.kind == AxisKind::Spatial)
                .count()
        {
            return bad("every spatial axis must index the output".into());
        }
        Ok(())
    }

    /// The shape vars this workload mentions, sorted by name (the order kernels take them in).
    pub fn shape_vars(&self) -> Vec<String> {
        let exprs = self.axes.iter().map(|a| &a.extent).chain(
            self.inputs
                .iter()
                .chain([&self.output])
                .flat_map(|t| &t.shape),
        );
        exprs
            .flat_map(Expr::vars)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// All tensors: inputs, then the output.
    pub fn tensors(&self) -> impl Iterator<Item = &TensorRef> {
        self.inputs.iter().chain([&self.output])
    }

    /// Bind every shape var: evaluate extents, shapes and strides and check that every
    /// access stays inside its tensor.
    pub fn bind(&self, bindings: &Bindings) -> Result<BoundWorkload> {
        // Unbound vars are reported by `eval`; nothing here allocates on success, since
        // binding sits on every module call.
        if let Some((name, value)) = bindings.iter().find(|(_, v)| *v < 0) {
            return Err(IrError::NegativeVar {
                name: name.to_string(),
                value,
            });
        }
        // The message is built only on failure: binding sits on the module's call path.
        let nonneg = |what: &dyn Fn() -> String, e: &Expr| -> Result<i64> {
            let v = e.eval(bindings)?;
            if v < 0 {
                return Err(IrError::NegativeExtent {
                    what: format!("{} = {e}", what()),
                    value: v,
                });
            }
            Ok(v)
        };
        let extents = self
            .axes
            .iter()
            .map(|a| nonneg(&|| format!("extent of axis {}", a.name), &a.extent))
            .collect::<Result<Vec<_>>>()?;
        let empty = extents.contains(&0);
        let (mut shapes, mut axis_strides, mut offsets, mut lens) =
            (vec![], vec![], vec![], vec![]);
        for t in self.tensors() {
            let shape = t
                .shape
                .iter()
                .enumerate()
                .map(|(d, e)| nonneg(&|| format!("{}.shape[{d}]", t.name), e))
                .collect::<Result<Vec<_>>>()?;
            let len = product(&t.name, &shape)?;
            for (d, ix) in t.index.iter().enumerate() {
                let (mut lo, mut hi) = (ix.offset, ix.offset);
                for &(a, c) in &ix.terms {
                    let reach = c
                        .checked_mul(extents[a].saturating_sub(1))
                        .ok_or_else(|| IrError::TooLarge(t.name.clone()))?;
                    if reach < 0 {
                        lo += reach
                    } else {
                        hi += reach
                    }
                }
                if !empty && (lo < 0 || hi >= shape[d]) {
                    return Err(IrError::OutOfBounds {
                        tensor: t.name.clone(),
                        dim: d,
                        index: if lo < 0 { lo } else { hi },
                        extent: shape[d],
                    });
                }
            }
            // Numerically from the bound shape (the same values `axis_stride` and
            // `base_offset` give symbolically, without building expressions).
            let mut strides = vec![1i64; shape.len()];
            for d in (0..shape.len().saturating_sub(1)).rev() {
                strides[d] = strides[d + 1] * shape[d + 1];
            }
            let dot = |f: &dyn Fn(&AffineIndex) -> i64| -> Result<i64> {
                strides.iter().zip(&t.index).try_fold(0i64, |acc, (s, ix)| {
                    s.checked_mul(f(ix))
                        .and_then(|x| acc.checked_add(x))
                        .ok_or_else(|| IrError::TooLarge(t.name.clone()))
                })
            };
            axis_strides.push(
                (0..self.axes.len())
                    .map(|a| dot(&|ix| ix.coeff(a)))
                    .collect::<Result<Vec<_>>>()?,
            );
            offsets.push(dot(&|ix| ix.offset)?);
            shapes.push(shape);
            lens.push(len);
        }
        Ok(BoundWorkload {
            extents,
            shapes,
            axis_strides,
            offsets,
            lens,
        })
    }

    /// Floating-point operations of an instance (a multiply and an add per point).
    pub fn flops(&self, bound: &BoundWorkload) -> f64 {
        2.0 * bound.extents.iter().map(|&e| e as f64).product::<f64>()
    }
}

impl fmt::Display for Workload {
    /// The form [`Workload::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let args: Vec<_> = self
            .args
            .iter()
            .map(|(k, v)| format!("{k}={}", v.to_string().replace(' ', "")))
            .collect();
        write!(f, "{}({})", self.op, args.join(","))?;
        match self.epilogue {
            Epilogue::None => Ok(()),
            Epilogue::Relu => write!(f, "+relu"),
        }
    }
}

fn spatial(name: &str, extent: &Expr) -> Axis {
    Axis {
        name: name.into(),
        extent: extent.clone(),
        kind: AxisKind::Spatial,
    }
}

fn reduction(name: &str, extent: &Expr) -> Axis {
    Axis {
        name: name.into(),
        extent: extent.clone(),
        kind: AxisKind::Reduction,
    }
}

fn tensor(name: &str, shape: &[&Expr], axes: &[usize]) -> TensorRef {
    TensorRef {
        name: name.into(),
        shape: shape.iter().map(|&e| e.clone()).collect(),
        index: axes.iter().map(|&a| AffineIndex::axis(a)).collect(),
    }
}

fn named<const N: usize>(names: &[&str], values: [Expr; N]) -> Vec<(String, Expr)> {
    names.iter().map(|n| n.to_string()).zip(values).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_builtins() {
        let w = Workload::parse("dense(M=16*T,N=2304,K=768)").unwrap();
        assert_eq!(w.to_string(), "dense(M=16*T,N=2304,K=768)");
        assert_eq!(w.shape_vars(), vec!["T"]);
        let w2 = Workload::parse(" dense( 16*T , 2304, K = 768 ) ").unwrap();
        assert_eq!(w, w2);
        let w = Workload::parse("batch_matmul_nn(B=192,M=T,N=64,K=T)+relu").unwrap();
        assert_eq!(Workload::parse(&w.to_string()).unwrap(), w);
        assert_eq!(w.epilogue, Epilogue::Relu);
    }

    #[test]
    fn binds_instances() {
        let w = Workload::parse("batch_matmul_nn(B=2,M=T,N=64,K=T)").unwrap();
        let b = w.bind(&Bindings::from_pairs([("T", 5)])).unwrap();
        assert_eq!(b.extents, vec![2, 5, 64, 5]);
        // W[b,k,n]: strides b = 5*64, k = 64, n = 1.
        assert_eq!(b.axis_strides[1], vec![320, 0, 1, 64]);
        assert_eq!(b.lens, vec![50, 640, 640]);
        assert_eq!(w.flops(&b), 2.0 * 2.0 * 5.0 * 64.0 * 5.0);
    }

    #[test]
    fn rejects_bad_input_clearly() {
        let w = Workload::parse("dense(M=16*T,N=2304,K=768)").unwrap();
        assert_eq!(
            w.bind(&Bindings::default()),
            Err(IrError::Unbound("T".into()))
        );
        assert!(matches!(
            w.bind(&Bindings::from_pairs([("T", -1)])),
            Err(IrError::NegativeVar { .. })
        ));
        let w = Workload::parse("dense(M=T-10,N=4,K=4)").unwrap();
        assert!(matches!(
            w.bind(&Bindings::from_pairs([("T", 3)])),
            Err(IrError::NegativeExtent { .. })
        ));
        for bad in [
            "dense(M=16*T,N=2304)",
            "dense(M=16*,N=1,K=1)",
            "conv(1,2)",
            "dense(M=1,N=1,K=1,Q=2)",
            "dense(M=1,M=2,K=3)",
            "dense M=1",
            "dense(1,2,3)+gelu",
            "dense(1,2,3) x",
            "dense(1,2,3,4)",
        ] {
            let e = Workload::parse(bad).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        let e = Workload::parse("dense(M=16*,N=1,K=1)").unwrap_err();
        match e {
            IrError::Parse(p) => assert_eq!(p.pos, 11),
            other => panic!("{other}"),
        }
    }
}
