//! Losses: `NegativeLogLikelihoodLoss` and `SoftmaxCrossEntropyLoss` (the same
//! gather of each item's target class, after a log-softmax over the classes), with
//! per-class weights, an ignored class and the `none` / `sum` / `mean` reductions, as
//! ONNX's reference computes them. A target class outside `[0, C)` that is not the
//! ignored one is an error, never a read elsewhere.
use super::{fail, req, sized, OpSpec};
use crate::node::Node;
use crate::{DType, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "NegativeLogLikelihoodLoss",
        since: 12,
        infer: infer_loss,
        eval: eval_loss,
        eval_into: None,
    },
    OpSpec {
        name: "SoftmaxCrossEntropyLoss",
        since: 12,
        infer: infer_loss,
        eval: eval_loss,
        eval_into: None,
    },
];

/// How the per-element losses become the output.
#[derive(Clone, Copy, PartialEq)]
enum Reduction {
    /// Each element's loss, in the target's shape.
    None,
    /// Their sum.
    Sum,
    /// Their weighted mean: the sum over the weights of the targets not ignored (their
    /// count without weights).
    Mean,
}

fn reduction(node: &Node) -> Result<Reduction> {
    match node.string("reduction", "mean")?.as_str() {
        "none" => Ok(Reduction::None),
        "sum" => Ok(Reduction::Sum),
        "mean" => Ok(Reduction::Mean),
        other => fail(node, format!("reduction `{other}` is not one ONNX defines")),
    }
}

/// The loss (the target's shape, or a scalar when reduced) and, for
/// `SoftmaxCrossEntropyLoss`'s second output, the log-probabilities (the scores' shape).
fn infer_loss(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, t) = (req(node, ins, 0)?, req(node, ins, 1)?);
    if x.rank() < 2 || t.rank() + 1 != x.rank() {
        return fail(
            node,
            "the input must be [N, C, d1, …] and the target [N, d1, …]",
        );
    }
    if t.dtype != DType::I64 {
        return fail(node, "the target must hold int64 class indices");
    }
    let shape: Vec<Expr> = match reduction(node)? {
        Reduction::None => t.shape.to_vec(),
        Reduction::Sum | Reduction::Mean => vec![],
    };
    let mut outs = vec![Fact::new(x.dtype, shape)];
    if node.outputs.len() > 1 {
        if node.op != "SoftmaxCrossEntropyLoss" {
            return fail(node, "the op has one output");
        }
        outs.push(Fact::new(x.dtype, x.shape.to_vec()));
    }
    Ok(outs)
}

fn eval_loss(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, t) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let how = reduction(node)?;
    let xs = x.as_f32().map_err(|e| node.error(e))?;
    let targets = t.as_i64().map_err(|e| node.error(e))?;
    let weights = match ins.get(2).copied().flatten() {
        Some(w) => Some(w.as_f32().map_err(|e| node.error(e))?),
        None => None,
    };
    let ignored = match node.attrs.contains_key("ignore_index") {
        true => Some(node.int("ignore_index", 0)?),
        false => None,
    };
    if x.shape.len() < 2 || t.shape.len() + 1 != x.shape.len() {
        return fail(
            node,
            "the input must be [N, C, d1, …] and the target [N, d1, …]",
        );
    }
    let (n, c) = (x.shape[0], x.shape[1]);
    let d: usize = x.shape[2..].iter().product();
    if t.shape[0] != n || t.shape[1..] != x.shape[2..] {
        return fail(
            node,
            format!(
                "the target's shape {:?} does not match the input's {:?}",
                t.shape, x.shape
            ),
        );
    }
    if weights.is_some_and(|w| w.len() != c) {
        return fail(
            node,
            format!("the weights must have one element per class ({c})"),
        );
    }
    sized(node, x.shape)?;
    // The log-probabilities over the classes (axis 1) where the op takes scores.
    let log_prob = match node.op == "SoftmaxCrossEntropyLoss" {
        true => Some(log_softmax(xs, n, c, d)),
        false => None,
    };
    let logs = log_prob.as_deref().unwrap_or(xs);
    let mut losses = vec![0f32; n * d];
    let (mut sum, mut weight_sum) = (0f64, 0f64);
    for i in 0..n {
        for j in 0..d {
            let class = targets[i * d + j];
            if Some(class) == ignored {
                continue;
            }
            if !(0..c as i64).contains(&class) {
                return fail(
                    node,
                    format!(
                        "target class {class} is out of range [0, {c}) (and not the ignored one)"
                    ),
                );
            }
            let k = class as usize;
            let w = weights.map_or(1.0, |w| w[k]);
            let loss = -logs[(i * c + k) * d + j] * w;
            losses[i * d + j] = loss;
            sum += loss as f64;
            weight_sum += w as f64;
        }
    }
    let loss = match how {
        Reduction::None => Tensor::f32(t.shape.to_vec(), losses)?,
        Reduction::Sum => Tensor::f32(vec![], vec![sum as f32])?,
        // Without weights or an ignored class, ONNX's reference takes the plain mean
        // (every element counts, as here); otherwise the sum over the weights kept.
        Reduction::Mean => Tensor::f32(vec![], vec![(sum / weight_sum) as f32])?,
    };
    let mut outs = vec![loss];
    if node.outputs.len() > 1 {
        let lp = log_prob.ok_or_else(|| node.error("the op has one output"))?;
        outs.push(Tensor::f32(x.shape.to_vec(), lp)?);
    }
    Ok(outs)
}

/// `x` (`[n, c, d]`, row-major) minus the log of each `[i, :, j]` column's sum of
/// exponentials, in f64 from each column's maximum.
fn log_softmax(x: &[f32], n: usize, c: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for i in 0..n {
        for j in 0..d {
            let at = |k: usize| (i * c + k) * d + j;
            let max = (0..c)
                .map(|k| x[at(k)] as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = (0..c).map(|k| (x[at(k)] as f64 - max).exp()).sum();
            for k in 0..c {
                out[at(k)] = (x[at(k)] as f64 - max - sum.ln()) as f32;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;

    fn node(op: &str, attrs: &[(&str, Attr)], outputs: usize) -> Node {
        Node {
            name: "loss".into(),
            op: op.into(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: (0..outputs).collect(),
            attrs: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    /// Against values worked by hand: input [N=2, C=3], targets 2 and 0.
    #[test]
    fn nll_reductions_weights_and_an_ignored_class() {
        let x = Tensor::f32(vec![2, 3], vec![0.1, 0.2, 0.7, 0.5, 0.3, 0.2]).unwrap();
        let t = Tensor::new(vec![2], crate::Data::I64(vec![2, 0])).unwrap();
        let w = Tensor::f32(vec![3], vec![1.0, 2.0, 4.0]).unwrap();
        let run = |attrs: &[(&str, Attr)], weights: bool| {
            let n = node("NegativeLogLikelihoodLoss", attrs, 1);
            let ins = [Some(x.view()), Some(t.view()), weights.then(|| w.view())];
            eval_loss(&n, &ins).unwrap()[0].as_f32().unwrap().to_vec()
        };
        let none = Attr::Str("none".into());
        assert_eq!(run(&[("reduction", none.clone())], false), [-0.7, -0.5]);
        assert_eq!(
            run(&[("reduction", Attr::Str("sum".into()))], false),
            [-1.2]
        );
        assert_eq!(run(&[], false), [-0.6]);
        // Weighted mean: (-0.7 * 4 - 0.5 * 1) / (4 + 1).
        let mean = run(&[], true)[0];
        assert!((mean - (-3.3 / 5.0)).abs() < 1e-6, "{mean}");
        // Class 0 ignored: the second item counts for nothing, in the sum and the mean.
        let ignore = ("ignore_index", Attr::Int(0));
        assert_eq!(
            run(&[ignore.clone(), ("reduction", none)], false),
            [-0.7, 0.0]
        );
        assert_eq!(run(&[ignore], false), [-0.7]);
    }

    #[test]
    fn softmax_cross_entropy_takes_log_probabilities() {
        let x = Tensor::f32(vec![1, 2], vec![0.0, 0.0]).unwrap();
        let t = Tensor::new(vec![1], crate::Data::I64(vec![1])).unwrap();
        let n = node("SoftmaxCrossEntropyLoss", &[], 2);
        let outs = eval_loss(&n, &[Some(x.view()), Some(t.view()), None]).unwrap();
        let ln2 = std::f32::consts::LN_2;
        assert!((outs[0].as_f32().unwrap()[0] - ln2).abs() < 1e-6);
        assert_eq!(outs[1].shape, [1, 2]);
        assert!(outs[1]
            .as_f32()
            .unwrap()
            .iter()
            .all(|&v| (v + ln2).abs() < 1e-6));
    }

    #[test]
    fn a_target_out_of_range_is_an_error() {
        let x = Tensor::f32(vec![1, 2], vec![0.0, 0.0]).unwrap();
        let t = Tensor::new(vec![1], crate::Data::I64(vec![2])).unwrap();
        let n = node("NegativeLogLikelihoodLoss", &[], 1);
        let e = eval_loss(&n, &[Some(x.view()), Some(t.view()), None]).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
    }
}
