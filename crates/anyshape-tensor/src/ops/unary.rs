//! Elementwise ops of one input: activations (`Relu`, `Gelu`, `Erf`, `Tanh`,
//! `Softplus`, `HardSwish`, `Swish`, …), trigonometric and hyperbolic functions (rotary position
//! embeddings), rounding, `Neg`/`Abs`/`Sign` (also on the shape plumbing's integer
//! vectors, `Neg` as expressions), tests (`IsNaN`, `IsInf`, `Not`), `Identity` (and
//! `OptionalGetElement`, `OptionalHasElement` of tensors),
//! `Dropout` (at inference: the input, and a mask of all true), `Cast` and `CastLike`;
//! and `Trilu` (a triangle of the last two axes kept: causal masks), which takes one
//! tensor and a constant.
use super::{eval_via, fail, req, shaped, OpSpec};
use crate::node::Node;
use crate::Workers;
use crate::{DType, Data, DataRef, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "Not",
        since: 1,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Sqrt",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Exp",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Log",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Erf",
        since: 9,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Tanh",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Relu",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Sigmoid",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Gelu",
        since: 20,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Neg",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Abs",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Reciprocal",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Sin",
        since: 7,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Cos",
        since: 7,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Tan",
        since: 7,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Asin",
        since: 7,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Acos",
        since: 7,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Atan",
        since: 7,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Sinh",
        since: 9,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Cosh",
        since: 9,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Asinh",
        since: 9,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Acosh",
        since: 9,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Atanh",
        since: 9,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Softplus",
        since: 1,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Softsign",
        since: 1,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "HardSigmoid",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Swish",
        since: 24,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "HardSwish",
        since: 14,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Sign",
        since: 9,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Floor",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Ceil",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Round",
        since: 11,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Trilu",
        since: 14,
        infer: infer_unary,
        eval: eval_trilu,
        eval_into: None,
    },
    OpSpec {
        name: "IsNaN",
        since: 9,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "IsInf",
        since: 10,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Identity",
        since: 1,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    // An optional that holds a tensor is that tensor (optional types are out of scope).
    OpSpec {
        name: "OptionalGetElement",
        since: 18,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "OptionalHasElement",
        since: 18,
        infer: infer_has_element,
        eval: eval_has_element,
        eval_into: None,
    },
    OpSpec {
        name: "Cast",
        since: 6,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "CastLike",
        since: 15,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
    OpSpec {
        name: "Dropout",
        // Opsets 7 to 11 (a `ratio` attribute, no training mode) are the identity at
        // inference too.
        since: 7,
        infer: infer_unary,
        eval: eval_unary,
        eval_into: Some(eval_unary_into),
    },
];

/// The `to` type of a `Cast` (`like`: a `CastLike`'s second input's type).
fn cast_to(node: &Node, like: Option<DType>) -> Result<DType> {
    if node.op == "CastLike" {
        return like.ok_or_else(|| node.error("input 1 is missing"));
    }
    let code = node.int("to", 0)?;
    DType::from_onnx(code as i32)
        .ok_or_else(|| node.error(format!("Cast to element type {code} is not supported")))
}

fn infer_unary(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let like = ins.get(1).copied().flatten().map(|f| f.dtype);
    Ok(match node.op.as_str() {
        "Dropout" => {
            let mode = ins.get(2).copied().flatten();
            training(
                node,
                mode.is_some(),
                mode.and_then(|f| f.value.as_ref()?.as_bool().ok()),
            )?;
            let mut outs = vec![x.clone()];
            if node.outputs.len() > 1 {
                outs.push(Fact::new(DType::Bool, x.shape.to_vec()));
            }
            return Ok(outs);
        }
        _ => vec![unary_fact(node, x, like)?],
    })
}

/// `Dropout`'s `training_mode` input (not `given`: inference), which must be false
/// and known at compile time (`value`).
fn training(node: &Node, given: bool, value: Option<&[bool]>) -> Result<()> {
    match (given, value) {
        (false, _) => Ok(()),
        (true, Some(v)) if v.iter().all(|b| !b) => Ok(()),
        (true, Some(_)) => fail(node, "training mode (random dropout) is not supported"),
        (true, None) => fail(node, "training_mode must be a boolean constant"),
    }
}

/// What a one-input op's output is.
fn unary_fact(node: &Node, x: &Fact, like: Option<DType>) -> Result<Fact> {
    Ok(match node.op.as_str() {
        "Identity" | "OptionalGetElement" => x.clone(),
        "Cast" | "CastLike" => {
            let to = cast_to(node, like)?;
            if to == DType::I64 && x.dtype == DType::I64 {
                x.clone()
            } else {
                Fact::new(to, x.shape.to_vec())
            }
        }
        "Neg" if x.sym.is_some() && x.dtype == DType::I64 => Fact::symbolic(
            x.sym
                .as_ref()
                .expect("checked")
                .iter()
                .map(|e| Expr::Const(0) - e.clone())
                .collect(),
            x.rank(),
        ),
        "IsNaN" | "IsInf" | "Not" => Fact::new(DType::Bool, x.shape.to_vec()),
        _ => Fact::new(x.dtype, x.shape.to_vec()),
    })
}

fn eval_unary(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    eval_via(node, ins, eval_unary_into)
}

fn eval_unary_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = req(node, ins, 0)?;
    let op = node.op.as_str();
    if op == "Dropout" {
        let mode = ins.get(2).copied().flatten();
        training(node, mode.is_some(), mode.and_then(|t| t.as_bool().ok()))?;
        if node.outputs.len() > 1 {
            shaped(node, outs, 1, x.shape)?.bool_mut()?.fill(true);
        }
    }
    let o = shaped(node, outs, 0, x.shape)?;
    match (op, &x.data, &mut o.data) {
        ("Identity" | "OptionalGetElement" | "Dropout", d, _) => match o.data.as_mut_of(*d) {
            Some(mut p) => p.copy(0, 0, x.len()),
            None => return fail(node, "the output's type is not the input's"),
        },
        ("Cast" | "CastLike", d, out) => {
            let to = cast_to(node, ins.get(1).copied().flatten().map(|t| t.dtype()))?;
            if to != out.dtype() {
                return fail(node, "the output's type is not the cast's");
            }
            match (d, out) {
                (DataRef::F32(v), Data::F32(o)) => o.copy_from_slice(v),
                (DataRef::F32(v), Data::I64(o)) => workers.map(v, o, |f| f as i64),
                (DataRef::F32(v), Data::Bool(o)) => workers.map(v, o, |f| f != 0.0),
                (DataRef::I64(v), Data::F32(o)) => workers.map(v, o, |i| i as f32),
                (DataRef::I64(v), Data::I64(o)) => o.copy_from_slice(v),
                (DataRef::I64(v), Data::Bool(o)) => workers.map(v, o, |i| i != 0),
                (DataRef::Bool(v), Data::F32(o)) => workers.map(v, o, |b| b as i32 as f32),
                (DataRef::Bool(v), Data::I64(o)) => workers.map(v, o, |b| b as i64),
                (DataRef::Bool(v), Data::Bool(o)) => o.copy_from_slice(v),
            }
        }
        ("Not", DataRef::Bool(v), Data::Bool(o)) => workers.map(v, o, |b| !b),
        ("IsNaN", DataRef::F32(v), Data::Bool(o)) => workers.map(v, o, f32::is_nan),
        ("IsInf", DataRef::F32(v), Data::Bool(o)) => {
            let (neg, pos) = (
                node.int("detect_negative", 1)? != 0,
                node.int("detect_positive", 1)? != 0,
            );
            workers.map(v, o, |f| {
                (pos && f == f32::INFINITY) || (neg && f == f32::NEG_INFINITY)
            });
        }
        ("Neg", DataRef::I64(v), Data::I64(o)) => workers.map(v, o, i64::wrapping_neg),
        ("Abs", DataRef::I64(v), Data::I64(o)) => workers.map(v, o, i64::wrapping_abs),
        ("Sign", DataRef::I64(v), Data::I64(o)) => workers.map(v, o, i64::signum),
        ("Swish", DataRef::F32(v), Data::F32(o)) => {
            let alpha = node.float("alpha", 1.0)?;
            workers.map(v, o, |x| x / (1.0 + (-alpha * x).exp()));
        }
        ("HardSigmoid", DataRef::F32(v), Data::F32(o)) => {
            let (alpha, beta) = (node.float("alpha", 0.2)?, node.float("beta", 0.5)?);
            workers.map(v, o, |x| (alpha * x + beta).clamp(0.0, 1.0));
        }
        (_, DataRef::F32(v), Data::F32(o)) => {
            let f: fn(f32) -> f32 = match op {
                "Sqrt" => f32::sqrt,
                "Exp" => f32::exp,
                "Log" => f32::ln,
                "Erf" => libm::erff,
                "Tanh" => f32::tanh,
                "Relu" => |x| if x > 0.0 { x } else { 0.0 },
                "Sigmoid" => |x| 1.0 / (1.0 + (-x).exp()),
                "Neg" => |x| -x,
                "Abs" => f32::abs,
                "Reciprocal" => |x| 1.0 / x,
                "Sin" => f32::sin,
                "Cos" => f32::cos,
                "Tan" => f32::tan,
                "Asin" => f32::asin,
                "Acos" => f32::acos,
                "Atan" => f32::atan,
                "Sinh" => f32::sinh,
                "Cosh" => f32::cosh,
                "Asinh" => f32::asinh,
                "Acosh" => f32::acosh,
                "Atanh" => f32::atanh,
                // ln(1 + e^x) without overflow for large x.
                "Softplus" => |x| x.max(0.0) + (-x.abs()).exp().ln_1p(),
                "Softsign" => |x| x / (1.0 + x.abs()),
                "HardSwish" => |x| x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
                // Zero stays zero (and keeps its sign); NaN stays NaN.
                "Sign" => |x| {
                    if x == 0.0 || x.is_nan() {
                        x
                    } else {
                        x.signum()
                    }
                },
                "Floor" => f32::floor,
                "Ceil" => f32::ceil,
                "Round" => f32::round_ties_even,
                "Gelu" => {
                    if node.string("approximate", "none")? == "tanh" {
                        |x| 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())
                    } else {
                        |x| 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
                    }
                }
                _ => return fail(node, "unsupported for float"),
            };
            workers.map(v, o, f);
        }
        (_, d, o) => {
            return fail(
                node,
                format!("unsupported for {} (into {})", d.dtype(), o.dtype()),
            )
        }
    }
    Ok(())
}

/// `Trilu(x, k)`: the elements of each matrix of the last two axes on or above (`upper`,
/// the default) or on or below the `k`-th diagonal kept, the others zero.
fn eval_trilu(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let r = x.shape.len();
    if r < 2 {
        return fail(node, "an input of rank 2 or more");
    }
    let k = match ins.get(1).copied().flatten() {
        None => 0,
        Some(t) => match t.as_i64().map_err(|e| node.error(e))? {
            [k] => *k,
            v => return fail(node, format!("k must be one integer, not {}", v.len())),
        },
    };
    let upper = node.int("upper", 1)? != 0;
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    let keep = |i: usize| {
        let (row, col) = (
            ((i / cols.max(1)) % rows.max(1)) as i64,
            (i % cols.max(1)) as i64,
        );
        if upper {
            col - row >= k
        } else {
            col - row <= k
        }
    };
    let data = match x.data {
        DataRef::F32(v) => Data::F32(
            v.iter()
                .enumerate()
                .map(|(i, &e)| if keep(i) { e } else { 0.0 })
                .collect(),
        ),
        DataRef::I64(v) => Data::I64(
            v.iter()
                .enumerate()
                .map(|(i, &e)| if keep(i) { e } else { 0 })
                .collect(),
        ),
        DataRef::Bool(v) => Data::Bool(v.iter().enumerate().map(|(i, &e)| keep(i) && e).collect()),
    };
    Ok(vec![Tensor::new(x.shape.to_vec(), data)?])
}

/// Whether `OptionalHasElement`'s input is given: known when the model is read.
fn has_element(node: &Node) -> Result<Tensor> {
    Tensor::bool(vec![], vec![node.optional_input(0).is_some()])
}

fn infer_has_element(node: &Node, _: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    Ok(vec![Fact::known(has_element(node)?)])
}

fn eval_has_element(node: &Node, _: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    Ok(vec![has_element(node)?])
}
