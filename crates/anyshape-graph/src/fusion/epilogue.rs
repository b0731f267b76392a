//! Epilogue patterns: the elementwise decompositions that fusion folds into the kernel
//! before them — GELU in its erf and tanh forms (whichever way the exporter associated
//! the products), SiLU (`x · Sigmoid(x)`), an input added along some of a contraction's
//! output axes (a mask), and the NaN guard after a softmax.
use super::Fuser;
use anyshape_ir::{Expr, Unary, Workload};
use anyshape_tensor::ValueId;

impl Fuser<'_> {
    /// A GELU decomposition reading `x`: its epilogue op, nodes and output.
    pub(super) fn gelu(&self, x: ValueId) -> Option<(Unary, Vec<usize>, ValueId)> {
        if self.g.outputs.contains(&x) {
            return None;
        }
        if let Some((nodes, end)) = self.gelu_tanh(x) {
            return Some((Unary::GeluTanh, nodes, end));
        }
        let uses = self.uses(x);
        let div = uses.iter().find(|(c, op)| {
            let n = &self.g.nodes[*c];
            (*op == "Div"
                && n.inputs[0] == Some(x)
                && self
                    .operand(n, x)
                    .and_then(|o| self.scalar(o))
                    .is_some_and(|s| (s - std::f32::consts::SQRT_2).abs() < 1e-3))
                || (*op == "Mul"
                    && self
                        .operand(n, x)
                        .and_then(|o| self.scalar(o))
                        .is_some_and(|s| (s - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-3))
        })?;
        let (nodes, end) = self.gelu_erf(x, div.0)?;
        Some((Unary::Gelu, nodes, end))
    }

    /// The two uses of `x`, a value no graph output: the one of op `op`, then the other.
    fn two_uses(&self, x: ValueId, op: &str) -> Option<(usize, usize)> {
        if self.g.outputs.contains(&x) {
            return None;
        }
        match self.uses(x).as_slice() {
            [(a, o), (b, _)] | [(b, _), (a, o)] if *o == op => Some((*a, *b)),
            _ => None,
        }
    }

    /// `Mul(x, Sigmoid(x))` reading `x` (its only uses): SiLU's two nodes and output.
    pub(super) fn silu(&self, x: ValueId) -> Option<(Vec<usize>, ValueId)> {
        let (sig, mul) = self.two_uses(x, "Sigmoid")?;
        let s = self.g.nodes[sig].outputs[0];
        let m = &self.g.nodes[mul];
        (m.op == "Mul"
            && self.operand(m, x) == Some(s)
            && self.single(s, "Mul") == Some(mul)
            && !self.g.outputs.contains(&s))
        .then(|| (vec![sig, mul], m.outputs[0]))
    }

    /// The output axes of the contraction `backbone` along which `o` is added to its
    /// output `v` (shaped `out_shape` and not reshaped since), the others broadcast
    /// (dims of 1): e.g. an attention mask `[B, 1, M, N]` over the scores `[B, H, M, N]`
    /// is axes `b, m, n`. A dim of `v` may span adjacent output axes (grouped-query
    /// scores `[B, H·G, M, N]` are axes `b, h, g, m, n`): `o`'s dim there is all of them
    /// or 1. `None` where it is not such a broadcast.
    pub(super) fn broadcast_axes(
        &self,
        o: ValueId,
        v: ValueId,
        out_shape: &[Expr],
        backbone: &Workload,
    ) -> Option<Vec<usize>> {
        let names = backbone.output_axes();
        let (os, vs) = (self.shape(o), self.shape(v));
        if vs != out_shape || os.len() > vs.len() {
            return None;
        }
        // The run of output axes behind each dim of `v`, in order.
        let extents = &backbone.output.shape;
        let mut runs: Vec<&[usize]> = Vec::new();
        let mut at = 0;
        for d in vs {
            let mut take = 1;
            while at + take <= names.len()
                && anyshape_tensor::exact_quotient(std::slice::from_ref(d), &extents[at..at + take])
                    != Some(Expr::Const(1))
            {
                take += 1;
            }
            if at + take > names.len() {
                return None;
            }
            runs.push(&names[at..at + take]);
            at += take;
        }
        if at != names.len() {
            return None;
        }
        let lead = vs.len() - os.len();
        let mut axes = Vec::new();
        for (i, d) in os.iter().enumerate() {
            match anyshape_tensor::equal(d, &vs[lead + i]) {
                Some(true) => axes.extend(runs[lead + i]),
                _ if d.as_const() == Some(1) => {}
                _ => return None,
            }
        }
        (!axes.is_empty()).then_some(axes)
    }

    /// `x · 0.5 · (1 + erf(x / √2))` from `x`, whose division by √2 is `div`: its
    /// nodes and its output, whichever way the exporter associated the products.
    fn gelu_erf(&self, x: ValueId, div: usize) -> Option<(Vec<usize>, ValueId)> {
        let uses = self.uses(x);
        if uses.len() != 2 {
            return None;
        }
        let other_use = uses.iter().find(|(c, _)| *c != div)?.0;
        let erf = self.single(self.g.nodes[div].outputs[0], "Erf")?;
        let add = self.single(self.g.nodes[erf].outputs[0], "Add")?;
        let one = self.g.nodes[add].outputs[0];
        let m1 = self.single(one, "Mul")?;
        let p = self.operand(&self.g.nodes[m1], one)?;
        let half = |v: ValueId| self.scalar(v).is_some_and(|s| (s - 0.5).abs() < 1e-6);
        let mut nodes = vec![div, erf, add, m1];
        let end = if p == x || half(p) {
            // (1 + erf) · x, then · 0.5; or (1 + erf) · 0.5, then · x.
            let m2 = self.single(self.g.nodes[m1].outputs[0], "Mul")?;
            let q = self.operand(&self.g.nodes[m2], self.g.nodes[m1].outputs[0])?;
            if !((p == x && half(q)) || (half(p) && q == x))
                || other_use != if p == x { m1 } else { m2 }
            {
                return None;
            }
            nodes.push(m2);
            self.g.nodes[m2].outputs[0]
        } else {
            // (x · 0.5) · (1 + erf).
            let h = &self.g.nodes[other_use];
            if h.op != "Mul" || h.outputs[0] != p || !self.operand(h, x).is_some_and(half) {
                return None;
            }
            nodes.push(other_use);
            self.g.nodes[m1].outputs[0]
        };
        Some((nodes, end))
    }

    /// `0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))` from `x`: its nodes and its
    /// output (GPT-2's decomposition).
    fn gelu_tanh(&self, x: ValueId) -> Option<(Vec<usize>, ValueId)> {
        let uses = self.uses(x);
        if uses.len() != 3 {
            return None;
        }
        let pow = uses.iter().find(|(_, op)| *op == "Pow")?.0;
        let half = uses.iter().find(|(c, op)| *op == "Mul" && *c != pow)?.0;
        let add_x = uses.iter().find(|(_, op)| *op == "Add")?.0;
        let mul_c = self.single(self.g.nodes[pow].outputs[0], "Mul")?;
        if self.single(self.g.nodes[mul_c].outputs[0], "Add")? != add_x {
            return None;
        }
        let mul_k = self.single(self.g.nodes[add_x].outputs[0], "Mul")?;
        let tanh = self.single(self.g.nodes[mul_k].outputs[0], "Tanh")?;
        let one = self.single(self.g.nodes[tanh].outputs[0], "Add")?;
        let last = self.single(self.g.nodes[one].outputs[0], "Mul")?;
        if !self.g.nodes[last]
            .inputs
            .contains(&Some(self.g.nodes[half].outputs[0]))
        {
            return None;
        }
        Some((
            vec![pow, half, mul_c, add_x, mul_k, tanh, one, last],
            self.g.nodes[last].outputs[0],
        ))
    }

    /// `Where(IsNaN(p), 0, p)` reading `p` (its only uses): the two nodes and the
    /// output. Exporters write it after attention's softmax, whose fully masked rows
    /// are NaN.
    pub(super) fn nan_to_zero(&self, p: ValueId) -> Option<(Vec<usize>, ValueId)> {
        let (is_nan, pick) = self.two_uses(p, "IsNaN")?;
        let n = &self.g.nodes[pick];
        let flag = self.g.nodes[is_nan].outputs[0];
        let guards = matches!(n.inputs.as_slice(),
            [Some(c), Some(z), Some(x)] if *c == flag && *x == p && self.scalar(*z) == Some(0.0));
        (n.op == "Where" && guards && self.single(flag, "Where") == Some(pick))
            .then(|| (vec![is_nan, pick], n.outputs[0]))
    }
}
