//! Shape vars, their domains and weights, and bindings of shape vars to values.
use crate::{IrError, ParseError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The values a shape var may take.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Domain {
    /// Every integer in `lo..=hi`.
    Range {
        /// Smallest value.
        lo: i64,
        /// Largest value (inclusive).
        hi: i64,
    },
    /// An explicit list of values.
    List(Vec<i64>),
}

impl Domain {
    /// How many values the domain holds (saturating; a range may be far too large to
    /// list, so check this before collecting [`Domain::iter`]).
    pub fn len(&self) -> u64 {
        match self {
            Domain::Range { lo, hi } if hi >= lo => {
                u64::try_from(*hi as i128 - *lo as i128 + 1).unwrap_or(u64::MAX)
            }
            Domain::Range { .. } => 0,
            Domain::List(v) => v.len() as u64,
        }
    }

    /// Whether the domain holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values of the domain, ascending, without collecting them.
    pub fn iter(&self) -> Box<dyn Iterator<Item = i64> + '_> {
        match self {
            Domain::Range { lo, hi } => Box::new(*lo..=*hi),
            Domain::List(v) => Box::new(v.iter().copied()),
        }
    }

    /// The smallest and largest value (`None` for an empty domain).
    pub fn bounds(&self) -> Option<(i64, i64)> {
        match self {
            Domain::Range { lo, hi } if lo <= hi => Some((*lo, *hi)),
            Domain::Range { .. } => None,
            Domain::List(v) => Some((*v.iter().min()?, *v.iter().max()?)),
        }
    }
}

/// A named symbolic dimension with a domain and optional weights (how often each
/// value occurs; uniform when absent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShapeVar {
    /// The name, e.g. `T`.
    pub name: String,
    /// The values it takes.
    pub domain: Domain,
    /// One weight per domain value, or `None` for uniform weights.
    pub weights: Option<Vec<f64>>,
}

impl ShapeVar {
    /// At most `n` (at least 2) of the var's values, spread geometrically from the
    /// smallest to the largest (both kept; dense where relative changes are large),
    /// each with its weight; the var itself where it has no more than `n`.
    pub fn spread(&self, n: usize) -> ShapeVar {
        let n = n.max(2);
        if self.domain.len() <= n as u64 {
            return self.clone();
        }
        // Positions in the domain's ascending values, 0-based: 1 + position grows
        // geometrically from 1 to the domain's size.
        let size = self.domain.len();
        let mut picked: Vec<u64> = Vec::with_capacity(n);
        for k in 0..n {
            let x = (size as f64).powf(k as f64 / (n - 1) as f64).round() as u64;
            let pos = x.clamp(1, size) - 1;
            let pos = picked.last().map_or(pos, |&p| pos.max(p + 1)).min(size - 1);
            if picked.last() != Some(&pos) {
                picked.push(pos);
            }
        }
        let value = |pos: u64| match &self.domain {
            Domain::Range { lo, .. } => lo + pos as i64,
            Domain::List(v) => v[pos as usize],
        };
        ShapeVar {
            name: self.name.clone(),
            domain: Domain::List(picked.iter().map(|&p| value(p)).collect()),
            weights: self
                .weights
                .as_ref()
                .map(|w| picked.iter().map(|&p| w[p as usize]).collect()),
        }
    }

    /// Parse `T=1..128` (inclusive range) or `T=1,8,16` (list). Values must be >= 0.
    pub fn parse(text: &str) -> Result<ShapeVar> {
        let err = |pos: usize, message: &str| {
            IrError::Parse(ParseError {
                text: text.to_string(),
                pos,
                message: message.to_string(),
            })
        };
        let (name, rest) = text
            .split_once('=')
            .ok_or_else(|| err(0, "expected `NAME=LO..HI` or `NAME=V1,V2,...`"))?;
        let name = name.trim();
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || name.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(err(
                0,
                "a shape var name is letters, digits and `_`, not starting with a digit",
            ));
        }
        let base = name.len() + 1;
        let num = |s: &str, at: usize| -> Result<i64> {
            let v: i64 = s
                .trim()
                .parse()
                .map_err(|_| err(at, "expected a whole number"))?;
            if v < 0 {
                return Err(err(at, "shape var values must be >= 0"));
            }
            Ok(v)
        };
        let domain = if let Some((lo, hi)) = rest.split_once("..") {
            let hi_at = base + lo.len() + 2;
            let (lo, hi) = (num(lo, base)?, num(hi.trim_start_matches('='), hi_at)?);
            if lo > hi {
                return Err(err(hi_at, "the range is empty (LO > HI)"));
            }
            Domain::Range { lo, hi }
        } else {
            let mut values = Vec::new();
            let mut at = base;
            for part in rest.split(',') {
                values.push(num(part, at)?);
                at += part.len() + 1;
            }
            values.sort_unstable();
            values.dedup();
            Domain::List(values)
        };
        Ok(ShapeVar {
            name: name.to_string(),
            domain,
            weights: None,
        })
    }
}

/// Values of shape vars (and, in lowered code, of other named integers).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Bindings(BTreeMap<String, i64>);

impl Bindings {
    /// Bindings from `(name, value)` pairs.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, i64)>) -> Bindings {
        Bindings(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// Parse `T=37` or `T=37,B=2`; values must be >= 0 and each name given once.
    pub fn parse(text: &str) -> Result<Bindings> {
        let mut b = Bindings::default();
        b.extend_from_text(text)?;
        Ok(b)
    }

    /// Add the bindings in `text` (`T=37,B=2`); a name bound already (here or in
    /// `text` itself) is an error, not silently replaced.
    pub fn extend_from_text(&mut self, text: &str) -> Result<()> {
        let mut at = 0;
        for part in text.split(',') {
            let err = |pos: usize, message: &str| {
                IrError::Parse(ParseError {
                    text: text.to_string(),
                    pos,
                    message: message.to_string(),
                })
            };
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| err(at, "expected `NAME=VALUE`"))?;
            let name = name.trim();
            if name.is_empty() {
                return Err(err(at, "missing shape var name"));
            }
            let value: i64 = value
                .trim()
                .parse()
                .map_err(|_| err(at + name.len() + 1, "expected a whole number"))?;
            if value < 0 {
                return Err(IrError::NegativeVar {
                    name: name.to_string(),
                    value,
                });
            }
            if let Some(old) = self.0.get(name) {
                return Err(IrError::DuplicateVar {
                    name: name.to_string(),
                    first: *old,
                    second: value,
                });
            }
            self.0.insert(name.to_string(), value);
            at += part.len() + 1;
        }
        Ok(())
    }

    /// The value of `name`, if bound.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.0.get(name).copied()
    }

    /// Bind `name` to `value`.
    pub fn set(&mut self, name: impl Into<String>, value: i64) {
        self.0.insert(name.into(), value);
    }

    /// Bind `name` to `value`, in place where it is bound already (no allocation: a
    /// run's dims change every decoder step).
    pub fn update(&mut self, name: &str, value: i64) {
        match self.0.get_mut(name) {
            Some(v) => *v = value,
            None => {
                self.0.insert(name.to_string(), value);
            }
        }
    }

    /// Make these bindings `other`'s: in place where both bind the same names.
    pub fn assign(&mut self, other: &Bindings) {
        if self.0.len() == other.0.len() && self.0.keys().eq(other.0.keys()) {
            for (v, (_, &w)) in self.0.values_mut().zip(&other.0) {
                *v = w;
            }
        } else {
            self.0.clone_from(&other.0);
        }
    }

    /// Iterate over `(name, value)` in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

impl std::fmt::Display for Bindings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<_> = self.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(f, "{}", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn spread_keeps_the_ends_and_thins_the_large_values() {
        let t = super::ShapeVar::parse("sequence=1..512").unwrap();
        let s = t.spread(24);
        let values: Vec<i64> = s.domain.iter().collect();
        assert_eq!(values.len(), 24, "{values:?}");
        assert_eq!((values[0], values[23]), (1, 512));
        assert!(values.windows(2).all(|w| w[0] < w[1]), "{values:?}");
        assert!(values[..8].iter().all(|&v| v <= 8), "{values:?}");
        let small = super::ShapeVar::parse("T=3,5,9").unwrap();
        assert_eq!(small.spread(24), small);
        let mut listed = super::ShapeVar::parse("T=2,4,6,8,10").unwrap();
        listed.weights = Some(vec![1.0, 2.0, 3.0, 4.0, 5.0]);
        let s = listed.spread(3);
        assert_eq!(s.domain.iter().collect::<Vec<_>>(), vec![2, 4, 10]);
        assert_eq!(s.weights, Some(vec![1.0, 2.0, 5.0]));
    }

    use super::*;

    #[test]
    fn parses_domains() {
        assert_eq!(
            ShapeVar::parse("T=1..128").unwrap().domain,
            Domain::Range { lo: 1, hi: 128 }
        );
        let values = |text: &str| {
            ShapeVar::parse(text)
                .unwrap()
                .domain
                .iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(values("T=16,1,8"), vec![1, 8, 16]);
        assert_eq!(values("T=1..=4"), vec![1, 2, 3, 4]);
        // A huge range is counted, never listed.
        let huge = ShapeVar::parse("T=0..9223372036854775807").unwrap().domain;
        assert_eq!(huge.len(), 1 << 63);
        assert_eq!(huge.bounds(), Some((0, i64::MAX)));
        for bad in [
            "T", "=1..2", "T=5..1", "T=a..3", "T=-1..3", "1T=1..2", "T=1,,2",
        ] {
            assert!(ShapeVar::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_bindings() {
        let b = Bindings::parse("T=37, B=2").unwrap();
        assert_eq!((b.get("T"), b.get("B")), (Some(37), Some(2)));
        assert!(matches!(
            Bindings::parse("T=-3"),
            Err(IrError::NegativeVar { .. })
        ));
        assert!(Bindings::parse("T").is_err());
        assert!(matches!(
            Bindings::parse("T=5,T=7"),
            Err(IrError::DuplicateVar { .. })
        ));
        let mut b = Bindings::parse("T=5").unwrap();
        assert!(b.extend_from_text("T=7").is_err());
        assert_eq!(b.get("T"), Some(5));
        assert!(Bindings::parse("T=x").is_err());
    }
}
