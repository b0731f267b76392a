//! Binding a model's inputs: the tensors a caller gives, checked against the inputs the
//! model declares — every one given, by name, of its element type and rank, its dims
//! agreeing with each other — and the shape vars' values they imply.
use crate::{DType, Result, TensorError, TensorRef};
use anyshape_ir::{Bindings, Expr};

/// A tensor a model declares (an input or an output): its name, element type and dims
/// (constants or expressions over the model's shape vars).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its dims.
    pub shape: Vec<Expr>,
}

/// The given tensors in the order of `declared`, checked, and the shape vars' values
/// their dims imply. A dim that is a plain shape var binds it; every other dim must
/// equal its expression at those values.
pub fn bind<'a>(
    declared: &[TensorSpec],
    given: &[(&str, TensorRef<'a>)],
) -> Result<(Vec<TensorRef<'a>>, Bindings)> {
    let mut b = Bindings::default();
    let mut ordered = Vec::with_capacity(declared.len());
    for d in declared {
        let name = &d.name;
        let t = given
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .ok_or_else(|| TensorError::Shape(format!("input `{name}` is not given")))?;
        if t.dtype() != d.dtype {
            return Err(TensorError::Type(format!(
                "input `{name}` is {}, the model takes {}",
                t.dtype(),
                d.dtype
            )));
        }
        if t.shape.len() != d.shape.len() {
            return Err(TensorError::Shape(format!(
                "input `{name}` has rank {}, the model takes {}",
                t.shape.len(),
                d.shape.len()
            )));
        }
        for (e, &v) in d.shape.iter().zip(t.shape) {
            if let Expr::Var(var) = e {
                match b.get(var) {
                    Some(prev) if prev != v as i64 => {
                        return Err(TensorError::Shape(format!(
                            "input `{name}`: dim `{var}` is {v}, another input gives it {prev}"
                        )))
                    }
                    _ => b.set(var.clone(), v as i64),
                }
            }
        }
        ordered.push(t);
    }
    for (d, t) in declared.iter().zip(&ordered) {
        for (e, &v) in d.shape.iter().zip(t.shape) {
            if let Ok(want) = e.eval(&b) {
                if want != v as i64 {
                    return Err(TensorError::Shape(format!(
                        "input `{}`: a dim is {v} where the model's {e} gives {want}",
                        d.name
                    )));
                }
            }
        }
    }
    Ok((ordered, b))
}
