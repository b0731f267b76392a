//! Recurrent layers: `RNN`, `GRU` and `LSTM` as ONNX defines them — forward, reverse or
//! both directions, the sequence first (`layout` 0) or the batch first (1), optional
//! biases, initial states, sequence lengths and (LSTM) peepholes, the activations
//! named by attribute, `clip` — as reference loops (a host step per layer; FP32 sums).
use super::{fail, req, OpSpec};
use crate::node::{Attr, Node};
use crate::{DType, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "RNN",
        since: 14,
        infer: infer_recurrent,
        eval: eval_recurrent,
        eval_into: None,
    },
    OpSpec {
        name: "GRU",
        since: 14,
        infer: infer_recurrent,
        eval: eval_recurrent,
        eval_into: None,
    },
    OpSpec {
        name: "LSTM",
        since: 14,
        infer: infer_recurrent,
        eval: eval_recurrent,
        eval_into: None,
    },
];

/// The layer's kind: its gates (in ONNX's order within `W`, `R` and `B`) and default
/// activations.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// One gate, `f` (Tanh).
    Rnn,
    /// `z`, `r`, `h`; `f` (Sigmoid), `g` (Tanh).
    Gru,
    /// `i`, `o`, `f`, `c`; `f` (Sigmoid), `g` (Tanh), `h` (Tanh).
    Lstm,
}

impl Kind {
    fn of(node: &Node) -> Kind {
        match node.op.as_str() {
            "GRU" => Kind::Gru,
            "LSTM" => Kind::Lstm,
            _ => Kind::Rnn,
        }
    }

    fn gates(self) -> usize {
        match self {
            Kind::Rnn => 1,
            Kind::Gru => 3,
            Kind::Lstm => 4,
        }
    }

    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Kind::Rnn => &["Tanh"],
            Kind::Gru => &["Sigmoid", "Tanh"],
            Kind::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// An activation of `(x, alpha, beta)`.
type ActivationFn = fn(f32, f32, f32) -> f32;

/// One of the activations ONNX names for recurrent layers, with its `alpha`/`beta`.
#[derive(Clone, Copy)]
struct Activation {
    f: ActivationFn,
    alpha: f32,
    beta: f32,
}

impl Activation {
    fn apply(&self, x: f32) -> f32 {
        (self.f)(x, self.alpha, self.beta)
    }
}

/// The activations per direction (`activations`, `activation_alpha`,
/// `activation_beta`; the defaults where absent).
fn activations(node: &Node, kind: Kind, directions: usize) -> Result<Vec<Vec<Activation>>> {
    let per = kind.default_activations().len();
    let names: Vec<String> = match node.attrs.get("activations") {
        Some(Attr::Strs(v)) => v.clone(),
        Some(other) => return fail(node, format!("activations {other:?}: strings expected")),
        None => (0..directions)
            .flat_map(|_| kind.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    if names.len() != per * directions {
        return fail(
            node,
            format!(
                "{} activations where {} makes {per} per direction",
                names.len(),
                node.op
            ),
        );
    }
    let floats = |name: &str| -> Result<Vec<f32>> {
        match node.attrs.get(name) {
            Some(Attr::Floats(v)) => Ok(v.clone()),
            Some(other) => fail(node, format!("{name} {other:?}: floats expected")),
            None => Ok(Vec::new()),
        }
    };
    let (alphas, betas) = (floats("activation_alpha")?, floats("activation_beta")?);
    // The alphas and betas are listed for the activations that take them, in order.
    let (mut a, mut b) = (alphas.iter(), betas.iter());
    let mut all = Vec::new();
    for name in &names {
        let (f, alpha, beta): (ActivationFn, Option<f32>, Option<f32>) = match name.as_str() {
            "Tanh" => (|x, _, _| x.tanh(), None, None),
            "Sigmoid" => (|x, _, _| 1.0 / (1.0 + (-x).exp()), None, None),
            "Relu" => (|x, _, _| x.max(0.0), None, None),
            "Softsign" => (|x, _, _| x / (1.0 + x.abs()), None, None),
            "Softplus" => (|x, _, _| x.max(0.0) + (-x.abs()).exp().ln_1p(), None, None),
            "Affine" => (|x, a, b| a * x + b, Some(1.0), Some(0.0)),
            "LeakyRelu" => (|x, a, _| if x >= 0.0 { x } else { a * x }, Some(0.01), None),
            "ThresholdedRelu" => (|x, a, _| if x > a { x } else { 0.0 }, Some(1.0), None),
            "ScaledTanh" => (|x, a, b| a * (b * x).tanh(), Some(1.0), Some(1.0)),
            "HardSigmoid" => (|x, a, b| (a * x + b).clamp(0.0, 1.0), Some(0.2), Some(0.5)),
            "Elu" => (
                |x, a, _| if x >= 0.0 { x } else { a * (x.exp() - 1.0) },
                Some(1.0),
                None,
            ),
            other => {
                return fail(
                    node,
                    format!("activation `{other}` is not one ONNX defines for recurrent layers"),
                )
            }
        };
        all.push(Activation {
            f,
            alpha: alpha.map_or(0.0, |d| a.next().copied().unwrap_or(d)),
            beta: beta.map_or(0.0, |d| b.next().copied().unwrap_or(d)),
        });
    }
    Ok(all.chunks(per).map(|c| c.to_vec()).collect())
}

/// The number of directions (`direction`).
fn directions(node: &Node) -> Result<usize> {
    match node.string("direction", "forward")?.as_str() {
        "forward" | "reverse" => Ok(1),
        "bidirectional" => Ok(2),
        d => fail(node, format!("direction `{d}` is not one ONNX defines")),
    }
}

fn infer_recurrent(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, r) = (req(node, ins, 0)?, req(node, ins, 2)?);
    let dirs = directions(node)?;
    if x.rank() != 3 || r.rank() != 3 {
        return fail(node, "an input X of rank 3 and a recurrence R of rank 3");
    }
    let hidden = match node.int("hidden_size", 0)? {
        h if h > 0 => Expr::Const(h),
        _ => r.shape[2].clone(),
    };
    let batch_first = node.int("layout", 0)? != 0;
    let (seq, batch) = match batch_first {
        true => (x.shape[1].clone(), x.shape[0].clone()),
        false => (x.shape[0].clone(), x.shape[1].clone()),
    };
    let d = Expr::Const(dirs as i64);
    let y = match batch_first {
        true => vec![batch.clone(), seq, d.clone(), hidden.clone()],
        false => vec![seq, d.clone(), batch.clone(), hidden.clone()],
    };
    let state = match batch_first {
        true => vec![batch, d, hidden],
        false => vec![d, batch, hidden],
    };
    let mut outs = vec![
        Fact::new(DType::F32, y),
        Fact::new(DType::F32, state.clone()),
    ];
    if Kind::of(node) == Kind::Lstm {
        outs.push(Fact::new(DType::F32, state));
    }
    outs.truncate(node.outputs.len());
    Ok(outs)
}

/// `X·Wᵀ` rows for one time step: `out[g] = Σ_k x[k] · w[g, k]`, into `out`.
fn matvec(x: &[f32], w: &[f32], out: &mut [f32]) {
    let k = x.len();
    for (o, row) in out.iter_mut().zip(w.chunks_exact(k.max(1))) {
        *o += x.iter().zip(row).map(|(a, b)| a * b).sum::<f32>();
    }
}

fn eval_recurrent(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let kind = Kind::of(node);
    let (x, w, r) = (req(node, ins, 0)?, req(node, ins, 1)?, req(node, ins, 2)?);
    let dirs = directions(node)?;
    let reverse = node.string("direction", "forward")? == "reverse";
    let batch_first = node.int("layout", 0)? != 0;
    let g = kind.gates();
    if x.shape.len() != 3 || w.shape.len() != 3 || r.shape.len() != 3 {
        return fail(node, "X, W and R of rank 3");
    }
    let (seq, batch, input) = match batch_first {
        true => (x.shape[1], x.shape[0], x.shape[2]),
        false => (x.shape[0], x.shape[1], x.shape[2]),
    };
    let hidden = r.shape[2];
    if node.int("hidden_size", hidden as i64)? != hidden as i64
        || w.shape != [dirs, g * hidden, input]
        || r.shape != [dirs, g * hidden, hidden]
    {
        return fail(
            node,
            format!(
                "W {:?} and R {:?} are not [{dirs}, {g}·hidden, input {input} / hidden] for hidden size {hidden}",
                w.shape, r.shape
            ),
        );
    }
    let f32s = |i: usize, n: usize, what: &str| -> Result<Option<&[f32]>> {
        match ins.get(i).copied().flatten() {
            None => Ok(None),
            Some(t) => {
                let v = t.as_f32().map_err(|e| node.error(e))?;
                if v.len() != n {
                    return fail(
                        node,
                        format!("{what} of {} elements where {n} are needed", v.len()),
                    );
                }
                Ok(Some(v))
            }
        }
    };
    let xv = x.as_f32().map_err(|e| node.error(e))?;
    let (wv, rv) = (
        w.as_f32().map_err(|e| node.error(e))?,
        r.as_f32().map_err(|e| node.error(e))?,
    );
    let bias = f32s(3, dirs * 2 * g * hidden, "B")?;
    let lens: Option<Vec<usize>> = match ins.get(4).copied().flatten() {
        None => None,
        Some(t) => {
            let v = t.as_i64().map_err(|e| node.error(e))?;
            if v.len() != batch || v.iter().any(|&l| l < 0 || l as usize > seq) {
                return fail(
                    node,
                    format!("sequence_lens {v:?} for {batch} sequences of {seq}"),
                );
            }
            Some(v.iter().map(|&l| l as usize).collect())
        }
    };
    // A state's place: [dirs, batch, hidden], or with the batch first [batch, dirs,
    // hidden] (the initial states as Y_h and Y_c).
    let state_at = |d: usize, b: usize| match batch_first {
        true => (b * dirs + d) * hidden,
        false => (d * batch + b) * hidden,
    };
    let h0 = f32s(5, dirs * batch * hidden, "initial_h")?;
    let c0 = match kind {
        Kind::Lstm => f32s(6, dirs * batch * hidden, "initial_c")?,
        _ => None,
    };
    let peep = match kind {
        Kind::Lstm => f32s(7, dirs * 3 * hidden, "P")?,
        _ => None,
    };
    let clip = node.float("clip", 0.0)?;
    let clip = |v: f32| if clip > 0.0 { v.clamp(-clip, clip) } else { v };
    let acts = activations(node, kind, dirs)?;
    let before_reset = node.int("linear_before_reset", 0)? != 0;
    let input_forget = node.int("input_forget", 0)? != 0;
    let y_at = |t: usize, d: usize, b: usize| match batch_first {
        true => ((b * seq + t) * dirs + d) * hidden,
        false => ((t * dirs + d) * batch + b) * hidden,
    };
    let mut y = vec![0f32; seq * dirs * batch * hidden];
    let mut yh = vec![0f32; dirs * batch * hidden];
    let mut yc = vec![0f32; dirs * batch * hidden];
    let gh = g * hidden;
    let (mut xw, mut hr) = (vec![0f32; gh], vec![0f32; gh]);
    for d in 0..dirs {
        let (wd, rd) = (
            &wv[d * gh * input..][..gh * input],
            &rv[d * gh * hidden..][..gh * hidden],
        );
        let (wb, rb) = match bias {
            Some(b) => (&b[d * 2 * gh..][..gh], &b[d * 2 * gh + gh..][..gh]),
            None => (&[][..], &[][..]),
        };
        let a = &acts[d];
        let backward = d == 1 || reverse;
        for b in 0..batch {
            let len = lens.as_ref().map_or(seq, |l| l[b]);
            let s = state_at(d, b);
            let mut h: Vec<f32> = h0.map_or(vec![0.0; hidden], |v| v[s..s + hidden].to_vec());
            let mut c: Vec<f32> = c0.map_or(vec![0.0; hidden], |v| v[s..s + hidden].to_vec());
            for step in 0..len {
                let t = if backward { len - 1 - step } else { step };
                let xt = match batch_first {
                    true => &xv[(b * seq + t) * input..][..input],
                    false => &xv[(t * batch + b) * input..][..input],
                };
                xw.iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = wb.get(i).copied().unwrap_or(0.0));
                hr.iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = rb.get(i).copied().unwrap_or(0.0));
                matvec(xt, wd, &mut xw);
                match kind {
                    Kind::Rnn => {
                        matvec(&h, rd, &mut hr);
                        for j in 0..hidden {
                            h[j] = a[0].apply(clip(xw[j] + hr[j]));
                        }
                    }
                    Kind::Gru => {
                        // z and r from the whole recurrence; h's from r ⊙ h (or r ⊙ (h·Rᵀ)).
                        let (rz, rh) = rd.split_at(2 * hidden * hidden);
                        matvec(&h, rz, &mut hr[..2 * hidden]);
                        let z: Vec<f32> = (0..hidden)
                            .map(|j| a[0].apply(clip(xw[j] + hr[j])))
                            .collect();
                        let rg: Vec<f32> = (0..hidden)
                            .map(|j| a[0].apply(clip(xw[hidden + j] + hr[hidden + j])))
                            .collect();
                        let hh = &mut hr[2 * hidden..];
                        if before_reset {
                            matvec(&h, rh, hh);
                            for j in 0..hidden {
                                hh[j] *= rg[j];
                            }
                        } else {
                            let gated: Vec<f32> = h.iter().zip(&rg).map(|(p, q)| p * q).collect();
                            matvec(&gated, rh, hh);
                        }
                        for j in 0..hidden {
                            let cand = a[1].apply(clip(xw[2 * hidden + j] + hh[j]));
                            h[j] = (1.0 - z[j]) * cand + z[j] * h[j];
                        }
                    }
                    Kind::Lstm => {
                        matvec(&h, rd, &mut hr);
                        let p = |k: usize, j: usize| {
                            peep.map_or(0.0, |p| p[d * 3 * hidden + k * hidden + j])
                        };
                        for j in 0..hidden {
                            let pre = |k: usize| xw[k * hidden + j] + hr[k * hidden + j];
                            let i = a[0].apply(clip(pre(0) + p(0, j) * c[j]));
                            let f = match input_forget {
                                true => 1.0 - i,
                                false => a[0].apply(clip(pre(2) + p(2, j) * c[j])),
                            };
                            let cand = a[1].apply(clip(pre(3)));
                            c[j] = f * c[j] + i * cand;
                            let o = a[0].apply(clip(pre(1) + p(1, j) * c[j]));
                            h[j] = o * a[2].apply(c[j]);
                        }
                    }
                }
                y[y_at(t, d, b)..][..hidden].copy_from_slice(&h);
            }
            yh[s..s + hidden].copy_from_slice(&h);
            yc[s..s + hidden].copy_from_slice(&c);
        }
    }
    let y_shape = match batch_first {
        true => vec![batch, seq, dirs, hidden],
        false => vec![seq, dirs, batch, hidden],
    };
    let state_shape = match batch_first {
        true => vec![batch, dirs, hidden],
        false => vec![dirs, batch, hidden],
    };
    let mut outs = vec![Tensor::f32(y_shape, y)?];
    outs.push(Tensor::f32(state_shape.clone(), yh)?);
    if kind == Kind::Lstm {
        outs.push(Tensor::f32(state_shape, yc)?);
    }
    outs.truncate(node.outputs.len());
    Ok(outs)
}
