//! Expressions and workloads in the plan file as their text forms (what `parse_expr`
//! and `Workload::parse` read back): the file does not depend on how the types are
//! laid out in memory, only on the forms the project already keeps stable.
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A list of expressions as strings.
pub(crate) mod exprs {
    use super::*;
    use anyshape_ir::{parse_expr, Expr};

    pub(crate) fn serialize<S: Serializer>(v: &[Expr], s: S) -> Result<S::Ok, S::Error> {
        v.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Expr>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|t| parse_expr(t).map_err(serde::de::Error::custom))
            .collect()
    }
}

/// A workload as its text form.
pub(crate) mod workload {
    use super::*;
    use anyshape_ir::Workload;

    pub(crate) fn serialize<S: Serializer>(w: &Workload, s: S) -> Result<S::Ok, S::Error> {
        w.to_string().serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Workload, D::Error> {
        Workload::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}
