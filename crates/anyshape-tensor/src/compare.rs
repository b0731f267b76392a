//! Comparing a computed tensor with a reference (a recorded output, a peer's): shapes
//! and element types first, then every element — a NaN or an infinity must be matched
//! by the same value, so all-NaN outputs can never pass as "error 0" — and the worst
//! element is named by its index.
use crate::{Data, Tensor};

/// One element, by its index, with both values.
#[derive(Clone, Debug, PartialEq)]
pub struct Element {
    /// Its multi-index.
    pub index: Vec<usize>,
    /// The computed value.
    pub got: f64,
    /// The reference value.
    pub want: f64,
}

impl std::fmt::Display for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}: {} where {} is expected",
            self.index, self.got, self.want
        )
    }
}

/// How a tensor compares with its reference of the same shape and element type.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// max |got − want| over the finite pairs, divided by max |want| over the finite
    /// reference values (by 1 where they are all 0).
    pub relative_error: f64,
    /// The element of the largest finite error.
    pub worst: Option<Element>,
    /// Elements where a NaN or an infinity on either side is not matched by the same
    /// value on the other.
    pub non_finite: usize,
    /// The first of them.
    pub first_non_finite: Option<Element>,
}

impl Comparison {
    /// Whether it passes a relative error bound: no unmatched NaN or infinity, and the
    /// relative error within `max`.
    pub fn passes(&self, max: f64) -> bool {
        self.non_finite == 0 && self.relative_error <= max
    }

    /// The error as one number for tables: infinite where NaNs or infinities differ.
    pub fn error(&self) -> f64 {
        if self.non_finite > 0 {
            f64::INFINITY
        } else {
            self.relative_error
        }
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "max relative error {:.2e}", self.relative_error)?;
        if let Some(w) = &self.worst {
            write!(f, " (worst at {w})")?;
        }
        if let Some(e) = &self.first_non_finite {
            write!(
                f,
                "; {} elements NaN or infinite on one side only (first at {e})",
                self.non_finite
            )?;
        }
        Ok(())
    }
}

/// The multi-index of flat index `i` in `shape`.
fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            index[k] = i % d;
            i /= d;
        }
    }
    index
}

/// Compare `got` with the reference `want`; an error (saying what differs) where their
/// shapes or element types differ.
pub fn compare(got: &Tensor, want: &Tensor) -> Result<Comparison, String> {
    if got.dtype() != want.dtype() {
        return Err(format!(
            "element type {}, the reference is {}",
            got.dtype(),
            want.dtype()
        ));
    }
    if got.shape != want.shape {
        return Err(format!(
            "shape {:?}, the reference is {:?}",
            got.shape, want.shape
        ));
    }
    let values = |d: &Data| -> Vec<f64> {
        match d {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v.iter().map(|&x| x as u8 as f64).collect(),
        }
    };
    let (a, b) = (values(&got.data), values(&want.data));
    let scale = b
        .iter()
        .filter(|y| y.is_finite())
        .fold(0f64, |m, y| m.max(y.abs()));
    let scale = if scale > 0.0 { scale } else { 1.0 };
    let mut c = Comparison {
        relative_error: 0.0,
        worst: None,
        non_finite: 0,
        first_non_finite: None,
    };
    let mut worst = -1f64;
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        let element = || Element {
            index: unravel(i, &got.shape),
            got: x,
            want: y,
        };
        if x.is_finite() && y.is_finite() {
            let e = (x - y).abs();
            if e > worst {
                worst = e;
                c.worst = Some(element());
            }
        } else if !(x == y || x.is_nan() && y.is_nan()) {
            c.non_finite += 1;
            if c.first_non_finite.is_none() {
                c.first_non_finite = Some(element());
            }
        }
    }
    c.relative_error = worst.max(0.0) / scale;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::f32(vec![2, v.len() / 2], v.to_vec()).unwrap()
    }

    #[test]
    fn nan_and_infinity_never_pass_unmatched() {
        let want = t(&[1.0, 2.0, 3.0, 4.0]);
        let c = compare(&t(&[f32::NAN; 4]), &want).unwrap();
        assert!(!c.passes(1e-4) && c.non_finite == 4, "{c}");
        assert_eq!(c.first_non_finite.unwrap().index, vec![0, 0]);
        let c = compare(&t(&[1.0, 2.0, f32::INFINITY, 4.0]), &want).unwrap();
        assert!(!c.passes(1.0) && c.error().is_infinite());
        // The same NaN or infinity on both sides matches.
        let special = t(&[f32::NAN, f32::INFINITY, 1.0, 2.0]);
        assert!(compare(&special, &special).unwrap().passes(0.0));
        let c = compare(&t(&[1.0, 2.0, 3.0, 4.5]), &want).unwrap();
        assert_eq!(c.worst.as_ref().unwrap().index, vec![1, 1]);
        assert!((c.relative_error - 0.125).abs() < 1e-12 && !c.passes(0.1));
        assert!(compare(&t(&[1.0, 2.0]), &want).is_err(), "shapes first");
        let ints = Tensor::i64(vec![2], vec![1, 2]).unwrap();
        assert!(
            compare(&ints, &t(&[1.0, 2.0])).is_err(),
            "element types first"
        );
        assert!(compare(&ints, &ints).unwrap().passes(0.0));
    }
}
