//! Building workloads in code: an operator of the registry with its arguments, then
//! epilogue ops one by one — what the text form reads into and what fusion builds,
//! so a workload never travels as text between stages.
use crate::ops::known_operator;
use crate::{
    Binary, EpilogueOp, Expr, IrError, Normalization, OpClass, Result, Scalar, TensorRef, Unary,
    Workload,
};

impl Workload {
    /// The operator `name` of the registry over `args` (in the operator's order),
    /// without an epilogue.
    pub fn of(name: &str, args: &[Expr]) -> Result<Workload> {
        let def = known_operator(name)?;
        if args.len() != def.args.len() {
            return Err(IrError::BadArguments {
                name: name.to_string(),
                message: format!(
                    "{} arguments for its {} ({})",
                    args.len(),
                    def.args.len(),
                    def.args.join(", ")
                ),
            });
        }
        let w = (def.build)(args);
        w.validate()?;
        Ok(w)
    }

    /// Append the unary `op` to the epilogue.
    pub fn then(mut self, op: Unary) -> Workload {
        self.epilogue.0.push(EpilogueOp::Unary(op));
        self
    }

    /// Append a scaling by the finite constant `c` to the epilogue.
    pub fn then_scale(mut self, c: f64) -> Result<Workload> {
        if !c.is_finite() {
            return Err(IrError::InvalidWorkload(format!(
                "scale({c}): the constant must be finite"
            )));
        }
        self.epilogue.0.push(EpilogueOp::Scale(Scalar(c)));
        Ok(self)
    }

    /// The layer norm or RMSNorm with `epsilon` added under its square root (finite,
    /// not negative).
    pub fn with_epsilon(mut self, epsilon: f64) -> Result<Workload> {
        let none = || IrError::InvalidWorkload(format!("{} has no epsilon", self.op));
        let OpClass::Normalization { kind, axis } = self.class else {
            return Err(none());
        };
        let e = Scalar(epsilon);
        let kind = match kind {
            Normalization::LayerNorm { .. } => Normalization::LayerNorm { epsilon: e },
            Normalization::RmsNorm { .. } => Normalization::RmsNorm { epsilon: e },
            Normalization::Softmax => return Err(none()),
        };
        if !(epsilon.is_finite() && epsilon >= 0.0) {
            return Err(IrError::InvalidWorkload(format!(
                "eps={epsilon}: the epsilon must be finite and not negative"
            )));
        }
        self.class = OpClass::Normalization { kind, axis };
        Ok(self)
    }

    /// An attention with its scores scaled by `scale` and, with `nan_to_zero`,
    /// probabilities that are not numbers counted as 0 (see
    /// [`AttentionSpec`](crate::AttentionSpec)). The error says why not: another
    /// class, or a scale that is not finite.
    pub fn with_attention(mut self, scale: f64, nan_to_zero: bool) -> Result<Workload> {
        let OpClass::Attention(spec) = self.class else {
            return Err(IrError::InvalidWorkload(format!(
                "{} is no attention: it has no scale",
                self.op
            )));
        };
        if !scale.is_finite() {
            return Err(IrError::InvalidWorkload(format!(
                "scale={scale}: the scale must be finite"
            )));
        }
        self.class = OpClass::Attention(crate::AttentionSpec {
            scale: Scalar(scale),
            nan_to_zero,
            ..spec
        });
        Ok(self)
    }

    /// Append `op` with a new input indexed by the output axes `axes` (axis positions,
    /// in the input's dimension order; broadcast along the others) to the epilogue:
    /// a bias is the output's last axis, a residual all of them (a layer norm's scale
    /// and bias are along its row).
    pub fn then_with(mut self, op: Binary, axes: &[usize]) -> Result<Workload> {
        let outputs = self.output_axes();
        if let Some(a) = axes.iter().find(|a| !outputs.contains(a)) {
            return Err(IrError::InvalidWorkload(format!(
                "axis {a} is not an output axis of {}",
                self.op
            )));
        }
        let input = self.inputs.len();
        let name = format!("E{}", input - self.class.operands());
        self.inputs.push(TensorRef::over(&name, &self.axes, axes));
        self.epilogue.0.push(EpilogueOp::With { op, input });
        self.validate()?;
        Ok(self)
    }

    /// The output axis named `name`, if there is one.
    pub fn output_axis(&self, name: &str) -> Option<usize> {
        self.output_axes()
            .into_iter()
            .find(|&a| self.axes[a].name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Built in code and parsed from text, a workload is the same.
    #[test]
    fn built_workloads_are_the_parsed_ones() {
        let t = Expr::var("T");
        let w = Workload::of("dense", &[t.clone(), Expr::Const(3072), Expr::Const(768)]).unwrap();
        let n = w.output_axis("n").unwrap();
        let all = w.output_axes();
        let w = w
            .then_with(Binary::Add, &[n])
            .unwrap()
            .then(Unary::Gelu)
            .then_scale(0.5)
            .unwrap()
            .then_with(Binary::Add, &all)
            .unwrap();
        let parsed =
            Workload::parse("dense(M=T,N=3072,K=768)+bias+gelu+scale(0.5)+residual").unwrap();
        assert_eq!(w, parsed);
        assert!(Workload::of("dense", std::slice::from_ref(&t)).is_err());
        assert!(Workload::of("conv9d", &[]).is_err());
        let s = Workload::of("softmax", &[t.clone(), t.clone()]).unwrap();
        assert!(s.clone().then_with(Binary::Add, &[1]).is_ok());
        assert!(s.clone().then_with(Binary::Add, &[2]).is_err());
        assert!(s.clone().with_epsilon(1e-5).is_err());
        assert!(s.then_scale(f64::NAN).is_err());
        // A layer norm's epsilon, and its scale and bias along the row.
        let ln = Workload::of("layer_norm", &[t.clone(), Expr::Const(768)])
            .unwrap()
            .with_epsilon(1e-12)
            .unwrap()
            .then_with(Binary::Mul, &[1])
            .unwrap()
            .then_with(Binary::Add, &[1])
            .unwrap();
        assert_eq!(
            ln,
            Workload::parse("layer_norm(M=T,N=768,eps=1e-12)+mul(n)+add(n)").unwrap()
        );
        assert_eq!(ln.inputs[1].shape, vec![Expr::Const(768)]);
        for bad in [f64::NAN, f64::INFINITY, -1e-5] {
            let rms = Workload::of("rms_norm", &[t.clone(), t.clone()]).unwrap();
            assert!(rms.with_epsilon(bad).is_err(), "{bad}");
        }
    }
}
