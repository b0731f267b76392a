//! Contractions (`MatMul`, `Gemm`, `Conv`) as backbones: which operand is a weight laid
//! out in panels, the workload (`dense_packed`, `dense_bf16`, `dense_i8` and its
//! channels' scales, `batch_matmul_nn`,
//! `batch_matmul_packed` over a constant batch of matrices, or `conv_packed` over the
//! input's patches), and the elementwise ops after it that
//! become its epilogue while they fit (a bias, GELU, SiLU and a gate, a mask or a
//! residual, scales, tanh, ReLU).
use super::{numel, Fuser, Layout, Step, StepKind, PANEL_WIDTH};
use crate::fact;
use anyshape_ir::{Binary, Expr, Precision, Unary, Workload};
use anyshape_tensor::{DType, ValueId};

impl Fuser<'_> {
    /// A dense layer over the constant weight `weight` `[n, k]` (`[k, n]` where
    /// `transposed`): its workload in the fusion's precision where it can (bf16 pairs
    /// need an even constant K, i8 quads a multiple of 4), else `dense_packed`; the
    /// weight pushed onto `inputs` with how it is read, and in i8 its output channels'
    /// scales after it, the workload multiplying by them first in its epilogue.
    fn dense(
        &self,
        m: Expr,
        (n, k): (&Expr, &Expr),
        (weight, transposed): (ValueId, bool),
        inputs: &mut Vec<(ValueId, Layout)>,
    ) -> Option<Workload> {
        let panel = Expr::Const(PANEL_WIDTH as i64);
        let precision = match (self.precision, k.as_const()) {
            (p, Some(k)) if !p.is_f32() && k % p.group() == 0 => p,
            _ => Precision::F32,
        };
        let op = match precision {
            Precision::F32 => "dense_packed",
            Precision::Bf16 => "dense_bf16",
            Precision::I8 => "dense_i8",
        };
        let w = Workload::of(op, &[m, n.clone(), k.clone(), panel]).ok()?;
        inputs.push((weight, Layout::panels(transposed, precision)));
        if precision != Precision::I8 {
            return Some(w);
        }
        inputs.push((weight, Layout::I8Scales { transposed }));
        let last = *w.output_axes().last()?;
        w.then_with(Binary::Mul, &[last]).ok()
    }

    /// A 2-D convolution `Conv(X, W, B)` over constant filters `W` `[co, ci, kh, kw]`
    /// (and bias), one group: `conv_packed` (the filters in panels, rows `co`) over
    /// `X`'s patches — `X` itself where the filters are 1x1 with no stride, pad or
    /// dilation (`[n, ci, h·w]` is already its columns), else the columns a host step
    /// lays out; the layouts of the filters and of `X`.
    fn convolution(&self, k: usize) -> Option<(Workload, Layout, Layout)> {
        let node = &self.g.nodes[k];
        let (x, w) = (node.input(0).ok()?, node.input(1).ok()?);
        let filters = self.constant(w)?;
        let [co, ci, kh, kw] = filters.shape[..] else {
            return None;
        };
        if node.int("group", 1).ok()? != 1
            || node
                .optional_input(2)
                .is_some_and(|c| self.constant(c).is_none())
            || self.shape(x).len() != 4
        {
            return None;
        }
        let y = self.shape(node.outputs[0]);
        let [n, _, oh, ow] = y else { return None };
        let window = anyshape_tensor::ops::Window::of(node).ok()?;
        let pointwise = kh == 1
            && kw == 1
            && window.strides[..] == [1, 1]
            && window.dilations[..] == [1, 1]
            && window.pads.iter().all(|&p| p == 0);
        let layout = if pointwise {
            Layout::AsIs
        } else {
            Layout::Columns { conv: k }
        };
        let args = [
            n.clone(),
            Expr::Const(co as i64),
            (oh.clone() * ow.clone()).simplify(),
            Expr::Const((ci * kh * kw) as i64),
            Expr::Const(PANEL_WIDTH as i64),
        ];
        let filters = Layout::panels(false, Precision::F32);
        Some((Workload::of("conv_packed", &args).ok()?, filters, layout))
    }

    /// A backbone and its epilogue.
    pub(super) fn contraction(&self, k: usize) -> Option<Step> {
        let node = &self.g.nodes[k];
        let a = node.input(0).ok()?;
        let b = node.input(1).ok()?;
        let (sa, sb) = (self.shape(a), self.shape(b));
        if fact(self.facts, a).dtype != DType::F32 {
            return None;
        }
        let mut inputs = vec![(a, Layout::AsIs)];
        let mut extra = Vec::new();
        let mut y = node.outputs[0];
        let mut w = if let Some(att) = self.attention.get(&k) {
            inputs = att.inputs.iter().map(|&v| (v, Layout::AsIs)).collect();
            extra = att.nodes.clone();
            y = att.output;
            match att.scale {
                1.0 => att.workload.clone(),
                s => att.workload.clone().then_scale(s as f64).ok()?,
            }
        } else if node.op == "Conv" {
            let (w, filters, columns) = self.convolution(k)?;
            inputs = vec![(b, filters), (a, columns)];
            match node.optional_input(2) {
                Some(c) => {
                    inputs.push((c, Layout::AsIs));
                    let m = w.output_axes()[1];
                    w.then_with(Binary::Add, &[m]).ok()?
                }
                None => w,
            }
        } else if node.op == "Gemm" {
            if node.int("transA", 0).ok()? != 0
                || node.float("alpha", 1.0).ok()? != 1.0
                || self.constant(b).is_none()
                || sa.len() != 2
            {
                return None;
            }
            let trans_b = node.int("transB", 0).ok()? != 0;
            let (n, kk) = if trans_b {
                (&sb[0], &sb[1])
            } else {
                (&sb[1], &sb[0])
            };
            let w = self.dense(sa[0].clone(), (n, kk), (b, !trans_b), &mut inputs)?;
            match node.optional_input(2) {
                Some(c) => {
                    let cs = self.shape(c);
                    if node.float("beta", 1.0).ok()? != 1.0
                        || cs.len() != 1
                        || self.constant(c).is_none()
                    {
                        return None;
                    }
                    inputs.push((c, Layout::AsIs));
                    let last = *w.output_axes().last()?;
                    w.then_with(Binary::Add, &[last]).ok()?
                }
                None => w,
            }
        } else if (self.constant(b).is_some() || self.transposed.contains_key(&b))
            && sb.len() == 2
            && sa.len() >= 2
        {
            let m = numel(&sa[..sa.len() - 1]);
            let (src, transposed) = match self.transposed.get(&b) {
                Some(&(src, t)) => {
                    extra.push(t);
                    (src, false)
                }
                None => (b, true),
            };
            self.dense(m, (&sb[1], &sb[0]), (src, transposed), &mut inputs)?
        } else if sa.len() >= 3 && sa.len() == sb.len() && sa[..sa.len() - 2] == sb[..sb.len() - 2]
        {
            let r = sa.len();
            inputs.push((b, Layout::AsIs));
            let args = [
                numel(&sa[..r - 2]),
                sa[r - 2].clone(),
                sb[r - 1].clone(),
                sa[r - 1].clone(),
            ];
            // A constant batch of matrices (Winograd's transformed filters) is read
            // from panels, as a convolution's filters are.
            if r == 3 && self.constant(a).is_some() {
                inputs[0].1 = Layout::batch_panels();
                let panel = Expr::Const(PANEL_WIDTH as i64);
                Workload::of("batch_matmul_packed", &[&args[..], &[panel]].concat()).ok()?
            } else {
                Workload::of("batch_matmul_nn", &args).ok()?
            }
        } else {
            return None;
        };
        let mut nodes = extra;
        nodes.push(k);
        let out_shape = self.shape(y).to_vec();
        loop {
            let (v, views) = self.through_views(y);
            if let Some((op, g, end)) = self.gelu(v) {
                nodes.extend(views);
                nodes.extend(g);
                w = w.then(op);
                y = end;
                continue;
            }
            if let Some((s, end)) = self.silu(v) {
                nodes.extend(views);
                nodes.extend(s);
                w = w.then(Unary::Silu);
                y = end;
                continue;
            }
            let Some(c) = self.sole_use(v) else { break };
            let n = &self.g.nodes[c];
            let next = match (n.op.as_str(), self.operand(n, v)) {
                ("Add", Some(o)) => {
                    let os = self.shape(o);
                    let axes = if self.constant(o).is_some()
                        && os.len() == 1
                        && Some(&os[0]) == out_shape.last()
                    {
                        vec![*w.output_axes().last()?]
                    } else if self.constant(o).is_none()
                        && numel(os) == numel(&out_shape)
                        && os == self.shape(v)
                    {
                        w.output_axes()
                    } else if let Some(axes) = self.broadcast_axes(o, v, &out_shape, &w) {
                        axes
                    } else {
                        break;
                    };
                    inputs.push((o, Layout::AsIs));
                    w.clone().then_with(Binary::Add, &axes).ok()
                }
                ("Mul", Some(o)) if self.scalar(o).is_some() => self
                    .scalar(o)
                    .and_then(|s| w.clone().then_scale(s as f64).ok()),
                // A gate: the product with a run-time tensor of the output's shape
                // (Llama's `SiLU(x·W1) ⊙ (x·W3)`).
                ("Mul", Some(o))
                    if self.constant(o).is_none()
                        && fact(self.facts, o).dtype == DType::F32
                        && self.shape(o) == self.shape(v)
                        && numel(self.shape(o)) == numel(&out_shape) =>
                {
                    inputs.push((o, Layout::AsIs));
                    w.clone().then_with(Binary::Mul, &w.output_axes()).ok()
                }
                ("Div", Some(o)) if n.inputs[0] == Some(v) => self
                    .scalar(o)
                    .filter(|&s| s != 0.0)
                    .and_then(|s| w.clone().then_scale(1.0 / s as f64).ok()),
                ("Tanh", _) => Some(w.clone().then(Unary::Tanh)),
                ("Relu", _) => Some(w.clone().then(Unary::Relu)),
                _ => None,
            };
            let Some(next) = next else { break };
            w = next;
            nodes.extend(views);
            nodes.push(c);
            y = n.outputs[0];
        }
        Some(Step {
            kind: StepKind::Kernel(w),
            nodes,
            inputs,
            output: Some(y),
        })
    }
}
