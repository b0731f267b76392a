//! Row-wise normalizations over the last axis as kernels: `Softmax` (with its NaN
//! guard), `LayerNormalization` and `RMSNormalization` with their scale and bias as
//! epilogue inputs along the row, and RMSNorm as both PyTorch exporters decompose it:
//!
//! ```text
//! Pow(x, 2) → ReduceMean(last axis, keepdims) → Add(ε) → Sqrt → Div(1, ·) | Reciprocal
//!   → Mul(x, ·) [→ Cast to float] [→ Mul(scale)]
//! ```
use super::{numel, Fuser, Layout, Step, StepKind};
use crate::fact;
use anyshape_ir::{Binary, Unary, Workload};
use anyshape_tensor::{DType, ValueId};

impl Fuser<'_> {
    /// `Softmax` over the last axis, its NaN guard fused.
    pub(super) fn softmax(&self, k: usize) -> Option<Step> {
        let node = &self.g.nodes[k];
        let x = node.input(0).ok()?;
        let (m, n) = self.rows(x, node.int("axis", -1).ok()?)?;
        let w = Workload::of("softmax", &[m, n]).ok()?;
        let (w, mut nodes, y) = match self.nan_to_zero(node.outputs[0]) {
            Some((guard, y)) => (w.then(Unary::NanToZero), guard, y),
            None => (w, vec![], node.outputs[0]),
        };
        nodes.insert(0, k);
        Some(Step {
            kind: StepKind::Kernel(w),
            nodes,
            inputs: vec![(x, Layout::AsIs)],
            output: Some(y),
        })
    }

    /// `LayerNormalization(X, Scale, B)` or `RMSNormalization(X, Scale)` over the last
    /// axis, without the optional statistics outputs.
    pub(super) fn layer_norm(&self, k: usize) -> Option<Step> {
        let node = &self.g.nodes[k];
        let x = node.input(0).ok()?;
        let (m, n) = self.rows(x, node.int("axis", -1).ok()?)?;
        let op = match node.op.as_str() {
            "LayerNormalization" => "layer_norm",
            _ => "rms_norm",
        };
        if node.outputs.len() > 1 {
            return None;
        }
        let epsilon = node.float("epsilon", 1e-5).ok()? as f64;
        let w = Workload::of(op, &[m, n]).ok()?.with_epsilon(epsilon).ok()?;
        let mut step = Step {
            kind: StepKind::Kernel(w),
            nodes: vec![k],
            inputs: vec![(x, Layout::AsIs)],
            output: Some(node.outputs[0]),
        };
        self.along_row(&mut step, Binary::Mul, node.input(1).ok()?)?;
        if let Some(b) = node.optional_input(2) {
            self.along_row(&mut step, Binary::Add, b)?;
        }
        Some(step)
    }

    /// RMSNorm as the exporters decompose it (see the module doc), from its `Pow`.
    pub(super) fn rms_norm(&self, k: usize) -> Option<Step> {
        let pow = &self.g.nodes[k];
        let x = pow.input(0).ok()?;
        if self.scalar(pow.input(1).ok()?)? != 2.0 {
            return None;
        }
        let (m, n) = self.rows(x, -1)?;
        let r = self.shape(x).len() as i64;
        let next = |v: ValueId, op: &str| {
            self.sole_use(v)
                .filter(|&c| self.g.nodes[c].op == op && self.g.nodes[c].input(0).ok() == Some(v))
        };
        let mean = next(pow.outputs[0], "ReduceMean")?;
        let reduce = &self.g.nodes[mean];
        let axes = match reduce.ints("axes").ok()? {
            Some(a) => a,
            None => self
                .constant(reduce.input(1).ok()?)?
                .as_i64()
                .ok()?
                .to_vec(),
        };
        if !(axes == [-1] || axes == [r - 1]) || reduce.int("keepdims", 1).ok()? != 1 {
            return None;
        }
        // `Add` in either order.
        let add = self
            .sole_use(reduce.outputs[0])
            .filter(|&c| self.g.nodes[c].op == "Add")?;
        let epsilon = self.scalar(self.operand(&self.g.nodes[add], reduce.outputs[0])?)? as f64;
        let sqrt = next(self.g.nodes[add].outputs[0], "Sqrt")?;
        let root = self.g.nodes[sqrt].outputs[0];
        let inverse = self.sole_use(root).filter(|&c| {
            let n = &self.g.nodes[c];
            match n.op.as_str() {
                "Reciprocal" => true,
                "Div" => {
                    n.input(1).ok() == Some(root)
                        && n.input(0).ok().and_then(|o| self.scalar(o)) == Some(1.0)
                }
                _ => false,
            }
        })?;
        let inv = self.g.nodes[inverse].outputs[0];
        let scaled = self.sole_use(inv).filter(|&c| {
            let n = &self.g.nodes[c];
            n.op == "Mul" && self.operand(n, inv) == Some(x)
        })?;
        let mut y = self.g.nodes[scaled].outputs[0];
        let mut nodes = vec![k, mean, add, sqrt, inverse, scaled];
        if let Some(c) = self.sole_use(y).filter(|&c| {
            let n = &self.g.nodes[c];
            n.op == "Cast" && n.int("to", 0).ok() == Some(1)
        }) {
            nodes.push(c);
            y = self.g.nodes[c].outputs[0];
        }
        let w = Workload::of("rms_norm", &[m, n])
            .ok()?
            .with_epsilon(epsilon)
            .ok()?;
        let mut step = Step {
            kind: StepKind::Kernel(w),
            nodes,
            inputs: vec![(x, Layout::AsIs)],
            output: Some(y),
        };
        // Its scale, where the `Mul` after it is by a vector along the row.
        if let Some(c) = self.sole_use(y).filter(|&c| self.g.nodes[c].op == "Mul") {
            let s = self.operand(&self.g.nodes[c], y);
            if s.and_then(|s| self.along_row(&mut step, Binary::Mul, s))
                .is_some()
            {
                step.nodes.push(c);
                step.output = Some(self.g.nodes[c].outputs[0]);
            }
        }
        Some(step)
    }

    /// The rows `(M, N)` of an f32 tensor `x` along `axis` where it is the last.
    fn rows(&self, x: ValueId, axis: i64) -> Option<(anyshape_ir::Expr, anyshape_ir::Expr)> {
        let s = self.shape(x);
        let r = s.len();
        if r == 0
            || !(axis == -1 || axis == r as i64 - 1)
            || fact(self.facts, x).dtype != DType::F32
        {
            return None;
        }
        Some((numel(&s[..r - 1]), s[r - 1].clone()))
    }

    /// `op` of the step's workload with `v`, an f32 vector along its rows (a scale or
    /// bias of the row's length), as an epilogue input; the step is left as it was
    /// where `v` is not one.
    fn along_row(&self, step: &mut Step, op: Binary, v: ValueId) -> Option<()> {
        let StepKind::Kernel(w) = &step.kind else {
            return None;
        };
        let n = w.output_axis("n")?;
        let f = fact(self.facts, v);
        if f.dtype != DType::F32 || f.shape.len() != 1 || f.shape[0] != w.axes[n].extent {
            return None;
        }
        step.kind = StepKind::Kernel(w.clone().then_with(op, &[n]).ok()?);
        step.inputs.push((v, Layout::AsIs));
        Some(())
    }
}
