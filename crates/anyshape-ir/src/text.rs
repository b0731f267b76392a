//! The text form of a workload, as the command line takes it and records and manifests
//! store it: `OP(ARGS)` then any number of `+EPILOGUE`.
//!
//! - `OP` is an operator of the registry; `ARGS` are its arguments by name
//!   (`dense(M=16*T,N=2304,K=768)`) or position (`dense(16*T,2304,768)`), each an
//!   integer expression over shape vars; a layer norm or RMSNorm also takes `eps=C`,
//!   a number (`layer_norm(M=T,N=768,eps=1e-12)`); an attention `scale=C` and the
//!   word `nan_to_zero` (`attention(B=1,H=12,M=T,N=T,D=64,scale=0.125,nan_to_zero)`);
//! - epilogues: `relu`, `tanh`, `gelu` (erf form), `gelu_tanh`, `nan_to_zero`,
//!   `scale(C)`; `add(AXES)` and `mul(AXES)` with a new input indexed by the named
//!   output axes (`add(n)`: a bias along `n`); `bias` is `add` of the output's last
//!   axis and `residual` is `add` of all its axes.
//!
//! [`Workload`]'s `Display` writes the form [`Workload::parse`] reads back.
use crate::ops::known_operator;
use crate::{
    parse_expr, split_top_level, Binary, EpilogueOp, Expr, IrError, OpClass, ParseError, Result,
    Unary, Workload,
};
use std::fmt;

impl Workload {
    /// Parse the text form (see the module doc).
    pub fn parse(text: &str) -> Result<Workload> {
        let perr = |pos: usize, message: String| {
            IrError::Parse(ParseError {
                text: text.to_string(),
                pos,
                message,
            })
        };
        let pieces = split_top_level(text, '+');
        let (_, call) = pieces[0];
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
        let def = known_operator(name)?;
        let arg_names = def.args;
        let mut values: Vec<Option<Expr>> = vec![None; arg_names.len()];
        let mut epsilon = None;
        let (mut scale, mut nan_to_zero) = (None, false);
        let inner = &call[open + 1..close];
        if !inner.trim().is_empty() {
            for (i, (at, part)) in split_top_level(inner, ',').into_iter().enumerate() {
                let at = open + 1 + at;
                if let Some(("eps", c)) = part.split_once('=').map(|(k, c)| (k.trim(), c)) {
                    let e = c
                        .trim()
                        .parse::<f64>()
                        .map_err(|_| perr(at, format!("`eps={}`: expected a number", c.trim())))?;
                    epsilon = Some(e);
                    continue;
                }
                if let Some(("scale", c)) = part.split_once('=').map(|(k, c)| (k.trim(), c)) {
                    let e = c.trim().parse::<f64>().map_err(|_| {
                        perr(at, format!("`scale={}`: expected a number", c.trim()))
                    })?;
                    scale = Some(e);
                    continue;
                }
                if part.trim() == "nan_to_zero" {
                    nan_to_zero = true;
                    continue;
                }
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
        let args: Vec<Expr> = values.into_iter().flatten().collect();
        let mut w = Workload::of(name, &args)?;
        if let Some(e) = epsilon {
            w = w.with_epsilon(e)?;
        }
        if scale.is_some() || nan_to_zero {
            w = w.with_attention(scale.unwrap_or(1.0), nan_to_zero)?;
        }
        for &(at, piece) in &pieces[1..] {
            w = add_epilogue(w, piece.trim()).map_err(|m| perr(at, m))?;
        }
        w.validate()?;
        Ok(w)
    }
}

/// The workload with the epilogue op written `piece` appended (see the module doc).
fn add_epilogue(w: Workload, piece: &str) -> std::result::Result<Workload, String> {
    let (head, arg) = match piece.split_once('(') {
        Some((h, rest)) => (
            h.trim(),
            Some(
                rest.strip_suffix(')')
                    .ok_or_else(|| format!("`{piece}`: missing `)`"))?
                    .trim(),
            ),
        ),
        None => (piece, None),
    };
    let known = Unary::ALL.map(|u| u.name()).join(", ")
        + ", scale(C), add(AXES), mul(AXES), bias, residual";
    let out_axes = w.output_axes();
    let in_piece = |e: IrError| format!("`{piece}`: {e}");
    match (head, arg) {
        (u, None) if Unary::ALL.iter().any(|x| x.name() == u) => {
            Ok(w.then(*Unary::ALL.iter().find(|x| x.name() == u).expect("found")))
        }
        ("scale", Some(c)) => {
            let v: f64 = c
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite())
                .ok_or_else(|| format!("`scale({c})`: expected a finite number"))?;
            w.then_scale(v).map_err(in_piece)
        }
        ("bias", None) | ("residual", None) | ("add", Some(_)) | ("mul", Some(_)) => {
            let axes: Vec<usize> = match (head, arg) {
                ("bias", _) => out_axes.last().copied().into_iter().collect(),
                ("residual", _) => out_axes.clone(),
                (_, Some(list)) => list
                    .split(',')
                    .map(|n| {
                        let n = n.trim();
                        w.output_axis(n).ok_or_else(|| {
                            format!(
                                "`{piece}`: `{n}` is not an output axis (they are {})",
                                out_axes
                                    .iter()
                                    .map(|&a| w.axes[a].name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        })
                    })
                    .collect::<std::result::Result<_, _>>()?,
                _ => unreachable!("matched above"),
            };
            let op = if head == "mul" {
                Binary::Mul
            } else {
                Binary::Add
            };
            w.then_with(op, &axes).map_err(in_piece)
        }
        _ => Err(format!("unknown epilogue `{piece}` (known: {known})")),
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
        write!(f, "{}({}", self.op, args.join(","))?;
        if let OpClass::Normalization { kind, .. } = self.class {
            if let Some(e) = kind.epsilon() {
                write!(f, ",eps={e:e}")?;
            }
        }
        if let OpClass::Attention(a) = self.class {
            write!(f, ",scale={:e}", a.scale.0)?;
            if a.nan_to_zero {
                write!(f, ",nan_to_zero")?;
            }
        }
        write!(f, ")")?;
        for op in self.epilogue.ops() {
            match op {
                EpilogueOp::Unary(u) => write!(f, "+{}", u.name())?,
                EpilogueOp::Scale(s) => write!(f, "+scale({s})")?,
                EpilogueOp::With { op, input } => {
                    let axes: Vec<&str> = self.inputs[*input]
                        .plain_axes()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|a| self.axes[a].name.as_str())
                        .collect();
                    write!(f, "+{}({})", op.name(), axes.join(","))?
                }
            }
        }
        Ok(())
    }
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
        assert_eq!(w.epilogue.ops(), &[EpilogueOp::Unary(Unary::Relu)]);
        let w = Workload::parse("softmax(M=12*T,N=T)").unwrap();
        assert_eq!(w.to_string(), "softmax(M=12*T,N=T)");
    }

    #[test]
    fn fused_epilogues_round_trip() {
        let w = Workload::parse("dense(M=T,N=3072,K=768)+bias+gelu+scale(0.5)+residual").unwrap();
        assert_eq!(
            w.to_string(),
            "dense(M=T,N=3072,K=768)+add(n)+gelu+scale(0.5)+add(m,n)"
        );
        assert_eq!(Workload::parse(&w.to_string()).unwrap(), w);
        assert_eq!(w.inputs.len(), 4);
        assert_eq!(w.inputs[2].shape, vec![Expr::Const(3072)]);
        assert_eq!(w.inputs[3].shape, w.output.shape);
        let w =
            Workload::parse("batch_matmul_nt(B=2,M=T,N=T,K=8)+scale(0.125)+add(b,n)+tanh").unwrap();
        assert_eq!(Workload::parse(&w.to_string()).unwrap(), w);
    }

    #[test]
    fn rejects_bad_text_clearly() {
        for bad in [
            "dense(M=16*T,N=2304)",
            "dense(M=16*,N=1,K=1)",
            "conv(1,2)",
            "dense(M=1,N=1,K=1,Q=2)",
            "dense(M=1,M=2,K=3)",
            "dense M=1",
            "dense(1,2,3)+swish",
            "dense(1,2,3) x",
            "dense(1,2,3,4)",
            "dense(1,2,3)+scale(inf)",
            "dense(1,2,3)+add(q)",
            "dense(1,2,3)+scale(2",
            "softmax(T,8)+add(q)",
            "softmax(T,8,eps=1e-5)",
            "layer_norm(T,8,eps=x)",
            "layer_norm(T,8,eps=-1)",
            "layer_norm(T,8,eps=inf)",
            "rms_norm(T,8,eps=nan)",
            "softmax(T,8,scale=2)",
            "softmax(T,8,nan_to_zero)",
            "attention(1,2,T,T,64,scale=x)",
            "attention(1,2,T,T,64,scale=inf)",
            "attention(1,2,T,T,64)+relu",
        ] {
            let e = Workload::parse(bad).unwrap_err();
            assert!(!e.to_string().is_empty(), "{bad}");
        }
        let w = Workload::parse("softmax(T,8)+nan_to_zero+scale(0.5)").unwrap();
        assert_eq!(w.to_string(), "softmax(M=T,N=8)+nan_to_zero+scale(0.5)");
        // A layer norm's epsilon is written exactly; without one it is ONNX's default.
        for (text, form) in [
            (
                "layer_norm(T,768,eps=9.999999960041972e-13)+mul(n)+add(n)",
                "layer_norm(M=T,N=768,eps=9.999999960041972e-13)+mul(n)+add(n)",
            ),
            (
                "rms_norm(N=64,M=T)+mul(n)",
                "rms_norm(M=T,N=64,eps=1e-5)+mul(n)",
            ),
            // An attention's scale (1 if absent) and NaN guard.
            (
                "masked_attention_bf16(1,12,T,T,64,nan_to_zero,scale=0.125)",
                "masked_attention_bf16(B=1,H=12,M=T,N=T,D=64,scale=1.25e-1,nan_to_zero)",
            ),
            (
                "attention(1,2,T,T,8)",
                "attention(B=1,H=2,M=T,N=T,D=8,scale=1e0)",
            ),
        ] {
            let w = Workload::parse(text).unwrap();
            assert_eq!(w.to_string(), form);
            assert_eq!(Workload::parse(form).unwrap(), w);
        }
        let e = Workload::parse("dense(M=16*,N=1,K=1)").unwrap_err();
        match e {
            IrError::Parse(p) => assert_eq!(p.pos, 11),
            other => panic!("{other}"),
        }
    }
}
