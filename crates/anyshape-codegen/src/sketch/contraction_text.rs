//! The contraction micro-kernel's text form: `mr=12,nr=32,mc=96,nc=384,kc=256,uk=4`
//! (`,dot=1` for the dot variant, `,pf=1` for software prefetch, `,ia=1` for A read in
//! place, `,ib=1` for B read in place, `,vm=1` for the transposed variant, `,amx=1` for AMX
//! tiles), as the command line
//! takes it and messages print it, or the JSON form of records.
use super::contraction::ContractionKernel;
use crate::{CodegenError, Result};
use std::fmt;

const FIELDS: [&str; 12] = [
    "mr", "nr", "mc", "nc", "kc", "uk", "dot", "pf", "ia", "ib", "vm", "amx",
];

impl ContractionKernel {
    /// Every parameter in [`FIELDS`] order (the flags as 0 or 1).
    pub(super) fn values(&self) -> [usize; 12] {
        [
            self.mr,
            self.nr,
            self.mc,
            self.nc,
            self.kc,
            self.uk,
            usize::from(self.dot),
            usize::from(self.pf),
            usize::from(self.ia),
            usize::from(self.ib),
            usize::from(self.vm),
            usize::from(self.amx),
        ]
    }

    /// Parse the compact form `mr=12,nr=32,mc=96,nc=384,kc=256,uk=4` (with `,dot=1` for
    /// the dot variant, `,pf=1` for software prefetch, `,ia=1` for A in place, `,ib=1`
    /// for B in place, `,vm=1` for the transposed variant, `,amx=1` for AMX tiles) or the
    /// JSON form.
    pub fn parse(text: &str) -> Result<ContractionKernel> {
        let bad = |reason: String| CodegenError::BadMicroKernelText {
            text: text.into(),
            reason,
        };
        if text.trim_start().starts_with('{') {
            return serde_json::from_str(text).map_err(|e| bad(e.to_string()));
        }
        let mut v: Vec<Option<usize>> = super::parse_fields(text, &FIELDS).map_err(bad)?;
        let mut flag = |i: usize| match v[i].take() {
            None | Some(0) => Ok(false),
            Some(1) => Ok(true),
            Some(other) => Err(bad(format!("{} = {other} is neither 0 nor 1", FIELDS[i]))),
        };
        let (dot, pf, ia, ib, vm) = (flag(6)?, flag(7)?, flag(8)?, flag(9)?, flag(10)?);
        let amx = flag(11)?;
        let missing: Vec<_> = FIELDS[..6]
            .iter()
            .zip(&v)
            .filter(|(_, x)| x.is_none())
            .map(|(f, _)| *f)
            .collect();
        if !missing.is_empty() {
            return Err(bad(format!("missing {}", missing.join(", "))));
        }
        let [mr, nr, mc, nc, kc, uk] = [0, 1, 2, 3, 4, 5].map(|i| v[i].unwrap_or(0));
        Ok(ContractionKernel {
            mr,
            nr,
            mc,
            nc,
            kc,
            uk,
            dot,
            pf,
            ia,
            ib,
            vm,
            amx,
        })
    }
}

impl fmt::Display for ContractionKernel {
    /// The compact form [`ContractionKernel::parse`] reads (the flags only where set).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<_> = FIELDS
            .iter()
            .zip(self.values())
            .enumerate()
            .filter(|(i, (_, v))| *i < 6 || *v != 0)
            .map(|(_, (k, v))| format!("{k}={v}"))
            .collect();
        write!(f, "{}", parts.join(","))
    }
}
