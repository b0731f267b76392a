//! Activations with parameters: `LeakyRelu`, `Elu`, `Selu`, `Celu`, `ThresholdedRelu`,
//! `Shrink`, `Mish`, `Clip` (its bounds optional scalar inputs, also on integers),
//! `PRelu` (its slope a tensor broadcast to the input) and `SwiGLU` (a gate's Swish
//! times a value of the same shape: a gated MLP). Each on
//! `f32`; the parameters are the attributes ONNX defines, with its defaults.
use super::{broadcast_indices, broadcast_out, fail, infer_same, req, OpSpec};
use crate::node::Node;
use crate::{Data, DataRef, Result, Tensor, TensorRef};

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "SwiGLU",
        since: 28,
        infer: infer_swiglu,
        eval: eval_swiglu,
        eval_into: None,
    },
    OpSpec {
        name: "LeakyRelu",
        since: 6,
        infer: infer_same,
        eval: eval_activation,
        eval_into: None,
    },
    OpSpec {
        name: "Elu",
        since: 6,
        infer: infer_same,
        eval: eval_activation,
        eval_into: None,
    },
    OpSpec {
        name: "Selu",
        since: 6,
        infer: infer_same,
        eval: eval_activation,
        eval_into: None,
    },
    OpSpec {
        name: "Celu",
        since: 12,
        infer: infer_same,
        eval: eval_activation,
        eval_into: None,
    },
    OpSpec {
        name: "ThresholdedRelu",
        since: 10,
        infer: infer_same,
        eval: eval_activation,
        eval_into: None,
    },
    OpSpec {
        name: "Shrink",
        since: 9,
        infer: infer_same,
        eval: eval_activation,
        eval_into: None,
    },
    OpSpec {
        name: "Mish",
        since: 18,
        infer: infer_same,
        eval: eval_activation,
        eval_into: None,
    },
    OpSpec {
        name: "Clip",
        since: 11,
        infer: infer_same,
        eval: eval_clip,
        eval_into: None,
    },
    OpSpec {
        name: "PRelu",
        since: 9,
        infer: infer_prelu,
        eval: eval_prelu,
        eval_into: None,
    },
];

fn eval_activation(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let alpha = |default| node.float("alpha", default);
    let out: Vec<f32> = match node.op.as_str() {
        "LeakyRelu" => {
            let a = alpha(0.01)?;
            v.iter().map(|&x| if x < 0.0 { a * x } else { x }).collect()
        }
        "Elu" => {
            let a = alpha(1.0)?;
            v.iter()
                .map(|&x| if x < 0.0 { a * x.exp_m1() } else { x })
                .collect()
        }
        "Selu" => {
            let (a, g) = (alpha(1.673_263_2)?, node.float("gamma", 1.050_701)?);
            v.iter()
                .map(|&x| g * if x <= 0.0 { a * x.exp_m1() } else { x })
                .collect()
        }
        "Celu" => {
            let a = alpha(1.0)?;
            v.iter()
                .map(|&x| x.max(0.0) + (a * (x / a).exp_m1()).min(0.0))
                .collect()
        }
        "ThresholdedRelu" => {
            let a = alpha(1.0)?;
            v.iter().map(|&x| if x > a { x } else { 0.0 }).collect()
        }
        "Shrink" => {
            let (bias, lambd) = (node.float("bias", 0.0)?, node.float("lambd", 0.5)?);
            v.iter()
                .map(|&x| {
                    if x < -lambd {
                        x + bias
                    } else if x > lambd {
                        x - bias
                    } else {
                        0.0
                    }
                })
                .collect()
        }
        // x · tanh(softplus(x)), softplus without overflow.
        "Mish" => v
            .iter()
            .map(|&x| x * (x.max(0.0) + (-x.abs()).exp().ln_1p()).tanh())
            .collect(),
        _ => return fail(node, "unsupported"),
    };
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

fn infer_prelu(node: &Node, ins: &[Option<&crate::Fact>]) -> Result<Vec<crate::Fact>> {
    let (x, s) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let shape = crate::broadcast(&x.shape, &s.shape).map_err(|e| node.error(e))?;
    if shape != x.shape {
        return fail(node, "the slope must broadcast to the input");
    }
    infer_same(node, ins)
}

/// `PRelu(x, slope)`: `x` where it is not negative, `slope · x` where it is, the slope
/// broadcast to the input (unidirectionally).
fn eval_prelu(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, s) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if broadcast_out(node, x.shape, s.shape)? != x.shape {
        return fail(node, "the slope must broadcast to the input");
    }
    let (v, slope) = (
        x.as_f32().map_err(|e| node.error(e))?,
        s.as_f32().map_err(|e| node.error(e))?,
    );
    let out = v
        .iter()
        .zip(broadcast_indices(s.shape, x.shape))
        .map(|(&x, i)| if x < 0.0 { slope[i] * x } else { x })
        .collect();
    Ok(vec![Tensor::f32(x.shape.to_vec(), out)?])
}

/// Input `i` of a `Clip`: a scalar bound, or none (absent or empty).
fn clip_bound<'a>(
    node: &Node,
    ins: &[Option<TensorRef<'a>>],
    i: usize,
) -> Result<Option<DataRef<'a>>> {
    match ins.get(i).copied().flatten() {
        Some(t) if t.shape.iter().product::<usize>() > 1 => {
            fail(node, "min and max must be scalars")
        }
        Some(t) if t.shape.iter().product::<usize>() == 1 => Ok(Some(t.data)),
        _ => Ok(None),
    }
}

/// `Clip(x, min, max)`: each bound an optional scalar input (absent or empty: none).
/// NaN stays NaN.
fn eval_clip(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let (lo, hi) = (clip_bound(node, ins, 1)?, clip_bound(node, ins, 2)?);
    let data = match x.data {
        DataRef::F32(v) => {
            let get = |b: Option<DataRef>, none: f32| match b {
                Some(DataRef::F32(b)) => Ok(b[0]),
                None => Ok(none),
                Some(_) => fail(node, "bounds of another type than the input"),
            };
            let (lo, hi) = (get(lo, f32::NEG_INFINITY)?, get(hi, f32::INFINITY)?);
            // max(min(x, hi), lo) as onnxruntime computes it (lo wins where lo > hi).
            Data::F32(
                v.iter()
                    .map(|&x| if x.is_nan() { x } else { x.min(hi).max(lo) })
                    .collect(),
            )
        }
        DataRef::I64(v) => {
            let get = |b: Option<DataRef>, none: i64| match b {
                Some(DataRef::I64(b)) => Ok(b[0]),
                None => Ok(none),
                Some(_) => fail(node, "bounds of another type than the input"),
            };
            let (lo, hi) = (get(lo, i64::MIN)?, get(hi, i64::MAX)?);
            Data::I64(v.iter().map(|&x| x.min(hi).max(lo)).collect())
        }
        DataRef::Bool(_) => return fail(node, "unsupported for bool"),
    };
    Ok(vec![Tensor::new(x.shape.to_vec(), data)?])
}

fn infer_swiglu(node: &Node, ins: &[Option<&crate::Fact>]) -> Result<Vec<crate::Fact>> {
    let (a, b) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if a.rank() != b.rank() || a.dtype != b.dtype {
        return fail(node, "a gate and a value of different ranks or types");
    }
    if let Some((x, y)) = a
        .shape
        .iter()
        .zip(&b.shape)
        .find(|(x, y)| matches!((x.as_const(), y.as_const()), (Some(p), Some(q)) if p != q))
    {
        return fail(
            node,
            format!("a gate dim {x} where the value's is {y} (no broadcasting)"),
        );
    }
    Ok(vec![crate::Fact::new(a.dtype, a.shape.to_vec())])
}

/// `SwiGLU(A, B) = A · sigmoid(alpha · A) · B` (same shapes, no broadcasting).
fn eval_swiglu(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (a, b) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if a.shape != b.shape {
        return fail(
            node,
            format!(
                "a gate {:?} and a value {:?} (no broadcasting)",
                a.shape, b.shape
            ),
        );
    }
    let alpha = node.float("alpha", 1.0)?;
    let (x, y) = (
        a.as_f32().map_err(|e| node.error(e))?,
        b.as_f32().map_err(|e| node.error(e))?,
    );
    let out = x
        .iter()
        .zip(y)
        .map(|(&g, &v)| g / (1.0 + (-alpha * g).exp()) * v)
        .collect();
    Ok(vec![Tensor::f32(a.shape.to_vec(), out)?])
}
