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
    let mut at = vec![0; declared.len()];
    Binder::new(declared).bind(given, &mut b, &mut at)?;
    Ok((at.iter().map(|&i| given[i].1).collect(), b))
}

/// A dim of the declared inputs: (input, axis).
type Dim = (usize, usize);

/// [`bind`] prepared once for a model's inputs, so that binding a run allocates
/// nothing (a decoder binds one every token): which dims bind a shape var (and where
/// the var first appears), which are checked against the values they imply.
#[derive(Clone, Debug)]
pub struct Binder {
    declared: Vec<TensorSpec>,
    /// Each dim that is a plain shape var: (input, dim, the first (input, dim) naming
    /// the var, if this is not it).
    vars: Vec<(usize, usize, Option<Dim>)>,
    /// The other dims whose every var some dim binds: (input, dim).
    checked: Vec<(usize, usize)>,
}

impl Binder {
    /// A binder of inputs `declared`.
    pub fn new(declared: &[TensorSpec]) -> Binder {
        let mut first: Vec<(&str, (usize, usize))> = Vec::new();
        let mut vars = Vec::new();
        for (i, d) in declared.iter().enumerate() {
            for (k, e) in d.shape.iter().enumerate() {
                if let Expr::Var(v) = e {
                    let seen = first.iter().find(|(n, _)| n == v).map(|&(_, at)| at);
                    if seen.is_none() {
                        first.push((v, (i, k)));
                    }
                    vars.push((i, k, seen));
                }
            }
        }
        let mut checked = Vec::new();
        for (i, d) in declared.iter().enumerate() {
            for (k, e) in d.shape.iter().enumerate() {
                if !matches!(e, Expr::Var(_))
                    && e.vars().iter().all(|v| first.iter().any(|(n, _)| n == v))
                {
                    checked.push((i, k));
                }
            }
        }
        Binder {
            declared: declared.to_vec(),
            vars,
            checked,
        }
    }

    /// The inputs it binds.
    pub fn declared(&self) -> &[TensorSpec] {
        &self.declared
    }

    /// Check `given` against the declared inputs and bind the shape vars their dims
    /// imply in `b` (in place: a var `b` holds already is updated, others are added);
    /// `at[i]` becomes the index in `given` of declared input `i`. Allocates nothing
    /// where `b` holds every var already and nothing is wrong.
    pub fn bind(
        &self,
        given: &[(&str, TensorRef)],
        b: &mut Bindings,
        at: &mut Vec<usize>,
    ) -> Result<()> {
        at.resize(self.declared.len(), 0);
        for (i, d) in self.declared.iter().enumerate() {
            let name = &d.name;
            let g = given
                .iter()
                .position(|(n, _)| n == name)
                .ok_or_else(|| TensorError::Shape(format!("input `{name}` is not given")))?;
            let t = &given[g].1;
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
            at[i] = g;
        }
        let dim = |i: usize, k: usize| given[at[i]].1.shape[k] as i64;
        for &(i, k, first) in &self.vars {
            let Expr::Var(var) = &self.declared[i].shape[k] else {
                unreachable!("a var dim")
            };
            let v = dim(i, k);
            match first {
                None => b.update(var, v),
                Some((fi, fk)) if dim(fi, fk) != v => {
                    return Err(TensorError::Shape(format!(
                        "input `{}`: dim `{var}` is {v}, another input gives it {}",
                        self.declared[i].name,
                        dim(fi, fk)
                    )))
                }
                Some(_) => {}
            }
        }
        for &(i, k) in &self.checked {
            let e = &self.declared[i].shape[k];
            let (want, v) = (e.eval(b)?, dim(i, k));
            if want != v {
                return Err(TensorError::Shape(format!(
                    "input `{}`: a dim is {v} where the model's {e} gives {want}",
                    self.declared[i].name
                )));
            }
        }
        Ok(())
    }
}
