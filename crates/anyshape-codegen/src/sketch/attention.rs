//! The fused attention sketch on the CPU ([`AttentionKernel`]): one task per (batch,
//! key/value head), the keys packed once per task transposed (`Kᵀ`, vectors along the
//! keys), then (for each query head of the group, where heads are grouped) the queries
//! in blocks of `rows` rows: the block's scores against every key into
//! a scratch row block (a register tile of `rows x vectors` vectors along the keys),
//! the softmax of each row in place, then the context (a register tile of `rows x
//! vectors` vectors along the head dim, the values read in place) scaled by each row's
//! `1 / Σ` as it is stored. The scores never reach memory beyond one block's
//! `rows x N`.
//!
//! Its AMX variant (`amx=1`, a bf16 attention on a CPU with AMX-BF16 whose head dim is
//! whole tiles of 32) runs both products on tiles instead: blocks of 16 or 32 query
//! rows, the queries, keys, probabilities and values rounded into words of bfloat16
//! pairs (`lower/attention_amx.rs`). Its pairs variant (`pairs=1`, the same attention on
//! a CPU with AVX512_BF16 and no AMX) packs them so too and runs both products as
//! register tiles of `vdpbf16ps` pair products, twice the f32 FMAs' products an
//! instruction.
//!
//! An [`AttentionKernel`] fixes every parameter; it is valid on any target whose vector
//! registers hold the accumulators, never depending on a shape. Its tails are handled
//! one way whatever the padding strategy: the packed keys and the query block are
//! zero-filled to whole tiles, the softmax's tail is scalar and the stores past the
//! last row are skipped.
use crate::{CodegenError, CpuTarget, Result};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Every parameter of the fused attention sketch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttentionKernel {
    /// Query rows per block (the register tile's rows in both products).
    pub rows: usize,
    /// Vector registers per tile row: along the keys in the scores, along the head
    /// dim in the context (the softmax's passes only, in the AMX variant).
    pub vectors: usize,
    /// Both products on AMX tiles (`rows` 16 or 32).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub amx: bool,
    /// Both products as bf16 pair products (`vdpbf16ps`) on vector registers, the
    /// operands packed as the AMX variant's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pairs: bool,
}

impl AttentionKernel {
    /// A reasonable kernel for `target`: the largest of a few tiles that fits its
    /// registers.
    pub fn default_for(target: &CpuTarget) -> AttentionKernel {
        [(6, 4), (4, 3), (4, 2), (2, 2), (1, 1)]
            .into_iter()
            .map(|(rows, vectors)| AttentionKernel {
                rows,
                vectors,
                amx: false,
                pairs: false,
            })
            .find(|k| k.validate(target).is_ok())
            .unwrap_or(AttentionKernel {
                rows: 1,
                vectors: 1,
                amx: false,
                pairs: false,
            })
    }

    /// Elements a tile row covers.
    pub fn width(&self, target: &CpuTarget) -> usize {
        self.vectors * target.lanes_f32()
    }

    /// Check the target's limits: at least one row and vector, at most 64 rows; the
    /// accumulators, a row of loads and a broadcast fit the vector registers.
    pub fn validate(&self, target: &CpuTarget) -> Result<()> {
        let fail = |reason: String| {
            Err(CodegenError::InvalidMicroKernel {
                micro_kernel: self.to_string(),
                reason,
            })
        };
        if self.rows == 0 || self.vectors == 0 {
            return fail("rows and vectors must be at least 1".into());
        }
        if self.rows > 64 {
            return fail("at most 64 rows per block".into());
        }
        if self.amx && !target.amx {
            return fail("the AMX variant needs a CPU with AMX-BF16".into());
        }
        if self.pairs && (self.amx || !pairs_on(target)) {
            return fail(
                "the pairs variant needs a CPU with AVX512_BF16 (and is not AMX's)".into(),
            );
        }
        if self.amx && self.rows != 16 && self.rows != 32 {
            return fail("the AMX variant's blocks are 16 or 32 rows".into());
        }
        let tile_rows = if self.amx { 0 } else { self.rows };
        let need = tile_rows * self.vectors + self.vectors + 1;
        if need > target.vector_registers {
            return fail(format!(
                "a tile of {} x {} vectors needs {need} vector registers; the target has {}",
                self.rows, self.vectors, target.vector_registers
            ));
        }
        Ok(())
    }

    /// Parse the compact form `rows=6,vectors=4` or the JSON form.
    pub fn parse(text: &str) -> Result<AttentionKernel> {
        let bad = |reason: String| CodegenError::BadMicroKernelText {
            text: text.into(),
            reason,
        };
        if text.trim_start().starts_with('{') {
            return serde_json::from_str(text).map_err(|e| bad(e.to_string()));
        }
        let v = super::parse_fields(text, &["rows", "vectors", "amx", "pairs"]).map_err(bad)?;
        match (v[0], v[1], v[2].unwrap_or(0), v[3].unwrap_or(0)) {
            (Some(rows), Some(vectors), amx @ (0 | 1), pairs @ (0 | 1)) => Ok(AttentionKernel {
                rows,
                vectors,
                amx: amx == 1,
                pairs: pairs == 1,
            }),
            (_, _, 0 | 1, 0 | 1) => Err(bad("need rows and vectors".into())),
            _ => Err(bad("amx and pairs are 0 or 1".into())),
        }
    }
}

impl fmt::Display for AttentionKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rows={},vectors={}", self.rows, self.vectors)?;
        if self.amx {
            write!(f, ",amx=1")?;
        }
        if self.pairs {
            write!(f, ",pairs=1")?;
        }
        Ok(())
    }
}

/// The fewest query rows a head (of all its group's query heads) for which an untuned
/// module runs the pairs variant. Masked cache attention, 12 heads (Zen 4), f32
/// products against pairs: 256 keys, 8 rows 0.054 against 0.080 ms, 16 rows 0.083
/// against 0.104, 32 rows 0.162 against 0.133; as many keys as rows, 32: 0.035 against
/// 0.039 (medians 0.052 and 0.040), 64: 0.078 against 0.057.
const PAIRS_MIN_ROWS: usize = 32;

/// How many pieces each (batch, key/value head) of a fused attention is split into
/// over its `items` (query head, row block) pairs, for `heads` such tasks on `threads`:
/// `threads / gcd(heads, threads)`, so that the tasks divide evenly among the threads
/// (one where they already do), at most `items` and at least one. Multi-query
/// attention (one key/value head, 8 query heads, 512 rows and keys) on two cores ran on
/// one thread.
pub(crate) fn attention_pieces(heads: i64, items: i64, threads: i64) -> i64 {
    fn gcd(a: i64, b: i64) -> i64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let t = threads.max(1);
    (t / gcd(heads.rem_euclid(t), t)).min(items).max(1)
}

/// The extents of an attention instance: batch, key/value heads, query rows (of every
/// query head of a group), keys, head dim.
fn extents(w: &anyshape_ir::Workload, bound: &anyshape_ir::BoundWorkload) -> [f64; 5] {
    let e = |a: usize| bound.extents.get(a).copied().unwrap_or(0).max(0) as f64;
    let Some(x) = anyshape_ir::AttentionAxes::of(w) else {
        return [0.0; 5];
    };
    let group = x.g.map_or(1.0, e);
    [e(x.b), e(x.h), group * e(x.m), e(x.n), e(x.d)]
}

impl crate::Sketch for AttentionKernel {
    type Target = CpuTarget;
    const NAME: &'static str = "attention";

    fn applies(w: &anyshape_ir::Workload) -> Result<()> {
        match w.class {
            anyshape_ir::OpClass::Attention(_) => Ok(()),
            _ => Err(CodegenError::SketchNotApplicable {
                workload: w.to_string(),
                reason: "the attention sketch serves fused attentions".into(),
            }),
        }
    }

    fn default_for(target: &CpuTarget) -> Self {
        AttentionKernel::default_for(target)
    }

    /// The default on pairs first where `w` can run on them (what an untuned module
    /// runs from `PAIRS_MIN_ROWS` query rows on), then the default in f32 products
    /// (what it runs below, and a search measures too).
    fn seeds(target: &CpuTarget, w: &anyshape_ir::Workload) -> Vec<Self> {
        let default = AttentionKernel::default_for(target);
        match pairs_run(target, w) {
            true => vec![
                AttentionKernel {
                    pairs: true,
                    ..default
                },
                default,
            ],
            false => vec![default],
        }
    }

    /// The AMX variant where `w` is a bf16 attention the tiles run on a target with
    /// them (blocks of 16 or 32 rows, whichever is nearer); else the vector one, on
    /// pairs only where they run (`self`'s choice kept there).
    fn fit(self, target: &CpuTarget, w: &anyshape_ir::Workload) -> Self {
        if target.amx && packs_pairs(w) {
            let rows = if self.rows > 24 { 32 } else { 16 };
            return AttentionKernel {
                rows,
                amx: true,
                pairs: false,
                ..self
            };
        }
        let vector = match self.amx {
            true => AttentionKernel::default_for(target),
            false => self,
        };
        AttentionKernel {
            amx: false,
            pairs: vector.pairs && pairs_run(target, w),
            ..vector
        }
    }

    /// The workload's default, in blocks of one query row where the instance has one
    /// (the vector variant): a decoder's step (one query row against its cache) would
    /// otherwise compute six rows' scores and context for one. Masked cache attention,
    /// one row against 256 keys, 12 heads (Emerald Rapids class): 28-30 -> 22-23 µs.
    /// (Two to five rows keep the default: one more kernel each for a rare instance.)
    /// The pairs variant only from `PAIRS_MIN_ROWS` (32) query rows a head on: its packing
    /// of the keys and values into words costs more than its products save below.
    fn default_for_instance(
        target: &CpuTarget,
        w: &anyshape_ir::Workload,
        bound: &anyshape_ir::BoundWorkload,
    ) -> Self {
        let default = Self::default_for_workload(target, w);
        let rows = anyshape_ir::AttentionAxes::of(w)
            .and_then(|x| bound.extents.get(x.m).copied())
            .unwrap_or(0);
        let pairs = default.pairs && extents(w, bound)[2] >= PAIRS_MIN_ROWS as f64;
        match default.amx {
            true => default,
            false if rows == 1 => AttentionKernel {
                rows: 1,
                pairs,
                ..default
            },
            false => AttentionKernel { pairs, ..default },
        }
    }

    fn parse(text: &str) -> Result<Self> {
        AttentionKernel::parse(text)
    }

    fn validate(&self, target: &CpuTarget) -> Result<()> {
        AttentionKernel::validate(self, target)
    }

    fn lower(p: &crate::Program<Self>, target: &CpuTarget) -> Result<crate::loop_ir::Func> {
        crate::lower::attention(p, target)
    }

    /// A task is a piece of one (batch, key/value head) (`attention_pieces`); the
    /// query rows are padded to whole blocks, the keys and the head dim to whole tile
    /// rows.
    fn adaptation(
        &self,
        target: &CpuTarget,
        w: &anyshape_ir::Workload,
        bound: &anyshape_ir::BoundWorkload,
    ) -> crate::Adaptation {
        let [b, h, m, n, d] = extents(w, bound);
        let up = |x: f64, to: usize| (x / to as f64).ceil() * to as f64;
        let width = self.width(target);
        let padded = up(m, self.rows) * (up(n, width) * d + n * up(d, width));
        crate::Adaptation {
            tasks: {
                let blocks = (m / self.rows as f64).ceil() as i64;
                let heads = (b * h) as i64;
                (heads * attention_pieces(heads, blocks, target.cores as i64)).max(1) as f64
            },
            slots: target.cores as f64,
            pad: if padded > 0.0 {
                2.0 * m * n * d / padded
            } else {
                1.0
            },
        }
    }

    fn sample(target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        loop {
            let amx = target.amx && rng.random_bool(0.5);
            let k = AttentionKernel {
                rows: match amx {
                    true => [16, 32][rng.random_range(0..2)],
                    false => rng.random_range(1..=12),
                },
                vectors: rng.random_range(1..=4),
                amx,
                pairs: !amx && pairs_on(target) && rng.random_bool(0.5),
            };
            if k.validate(target).is_ok() {
                return k;
            }
        }
    }

    fn neighbour(&self, _target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        let step = [-1, 1][rng.random_range(0..2)];
        let mut k = *self;
        if k.amx && rng.random_bool(0.5) {
            k.rows = 48 - k.rows;
        } else if rng.random_bool(0.5) {
            k.rows = (k.rows as i64 + step).max(1) as usize;
        } else {
            k.vectors = (k.vectors as i64 + step).max(1) as usize;
        }
        k
    }

    fn child(&self, other: &Self, _target: &CpuTarget, rng: &mut impl rand::Rng) -> Self {
        use rand::RngExt;
        let amx = self.amx && other.amx;
        AttentionKernel {
            amx,
            pairs: self.pairs && other.pairs,
            rows: if rng.random_bool(0.5) {
                self.rows
            } else {
                other.rows
            },
            vectors: if rng.random_bool(0.5) {
                self.vectors
            } else {
                other.vectors
            },
        }
    }

    /// The query rows (M).
    fn factors(
        _target: &CpuTarget,
        w: &anyshape_ir::Workload,
        bound: &anyshape_ir::BoundWorkload,
    ) -> crate::Factors {
        let m = anyshape_ir::AttentionAxes::of(w)
            .and_then(|x| bound.extents.get(x.m).copied())
            .unwrap_or(1);
        crate::Factors(vec![usize::try_from(m).unwrap_or(1).max(1)])
    }

    fn snap(&self, _target: &CpuTarget, f: &crate::Factors) -> Self {
        let rows = (1..=self.rows.min(f.0[0]))
            .rev()
            .find(|r| f.0[0].is_multiple_of(*r))
            .unwrap_or(1);
        AttentionKernel { rows, ..*self }
    }

    fn divides(&self, f: &crate::Factors) -> bool {
        f.0[0].is_multiple_of(self.rows)
    }
}

/// Whether `target` runs the pairs variant: AVX512_BF16 on 16-lane vectors.
fn pairs_on(target: &CpuTarget) -> bool {
    target.avx512_bf16 && target.lanes_f32() == 16
}

/// Whether the pairs variant runs `w` on `target` (and no AMX variant does).
fn pairs_run(target: &CpuTarget, w: &anyshape_ir::Workload) -> bool {
    !target.amx && pairs_on(target) && packs_pairs(w)
}

/// Whether `w` can run on AMX tiles (the AMX variant), or on pairs: a bf16 attention
/// whose head dim is a constant number of whole 32-element tiles (a tile step of the
/// scores' reduction and two output tiles of the context; the pairs variant packs its
/// operands as the AMX one).
pub(crate) fn packs_pairs(w: &anyshape_ir::Workload) -> bool {
    w.precision == anyshape_ir::Precision::Bf16
        && anyshape_ir::AttentionAxes::of(w)
            .and_then(|x| w.axes[x.d].extent.as_const())
            .is_some_and(|d| d > 0 && d % 32 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Sketch;
    use anyshape_ir::Workload;

    /// The text form reads back; the AMX variant is what a bf16 attention with a head
    /// dim of whole tiles gets on a target with AMX, and nothing else gets it.
    #[test]
    fn text_limits_and_the_amx_variant() {
        let plain = CpuTarget::avx512_for_tests();
        let amx = CpuTarget {
            amx: true,
            ..plain.clone()
        };
        for text in [
            "rows=6,vectors=4",
            "rows=32,vectors=2,amx=1",
            "rows=6,vectors=4,pairs=1",
        ] {
            let k = AttentionKernel::parse(text).unwrap();
            assert_eq!(k.to_string(), text);
            assert_eq!(
                AttentionKernel::parse(&serde_json::to_string(&k).unwrap()).unwrap(),
                k
            );
        }
        assert!(AttentionKernel::parse("rows=6,vectors=4,amx=2").is_err());
        let k = AttentionKernel::parse("rows=32,vectors=2,amx=1").unwrap();
        assert!(k.validate(&amx).is_ok());
        assert!(k
            .validate(&plain)
            .unwrap_err()
            .to_string()
            .contains("AMX-BF16"));
        let odd = AttentionKernel { rows: 20, ..k };
        assert!(odd.validate(&amx).is_err());
        // The pairs variant needs AVX512_BF16, and is not AMX's.
        let pairs = AttentionKernel::parse("rows=6,vectors=4,pairs=1").unwrap();
        let bf16_cpu = CpuTarget {
            avx512_bf16: true,
            avx512_vnni: false,
            ..plain.clone()
        };
        assert!(pairs.validate(&bf16_cpu).is_ok());
        assert!(pairs.validate(&plain).is_err());
        assert!(AttentionKernel { amx: true, ..k }
            .validate(&CpuTarget {
                amx: true,
                ..bf16_cpu.clone()
            })
            .is_ok());
        assert!(AttentionKernel { pairs: true, ..k }
            .validate(&CpuTarget {
                amx: true,
                ..bf16_cpu
            })
            .is_err());
        let default = AttentionKernel::default_for(&amx);
        let w = |text: &str| Workload::parse(text).unwrap();
        let bf16 = w("masked_attention_bf16(B=1,H=12,M=T,N=T,D=64)");
        assert_eq!(default.fit(&amx, &bf16).rows, 16);
        assert!(default.fit(&amx, &bf16).amx);
        for (target, text) in [
            (&plain, "masked_attention_bf16(B=1,H=12,M=T,N=T,D=64)"),
            (&amx, "masked_attention_bf16(B=1,H=12,M=T,N=T,D=48)"),
            (&amx, "masked_attention(B=1,H=12,M=T,N=T,D=64)"),
        ] {
            let fitted = k.fit(target, &w(text));
            assert!(!fitted.amx && fitted.validate(target).is_ok(), "{text}");
        }
    }

    /// An instance of one query row (a decoder's step) gets blocks of one row, in every
    /// layout; others the default; the AMX variant keeps its tiles'.
    #[test]
    fn instances_with_few_query_rows_get_blocks_of_them() {
        let plain = CpuTarget::avx512_for_tests();
        let amx = CpuTarget {
            amx: true,
            ..CpuTarget::avx512_for_tests()
        };
        let rows = |target: &CpuTarget, text: &str, t: i64| {
            let w = Workload::parse(text).unwrap();
            let b = w
                .bind(&anyshape_ir::Bindings::from_pairs([("T", t)]))
                .unwrap();
            AttentionKernel::default_for_instance(target, &w, &b)
        };
        let full = AttentionKernel::default_for(&plain).rows;
        let step = "masked_cache_attention(B=1,H=12,M=T,N=T+255,D=64,R=0)";
        assert_eq!(rows(&plain, step, 1).rows, 1);
        assert_eq!(rows(&plain, step, 2).rows, full);
        assert_eq!(rows(&plain, step, 100).rows, full);
        let grouped = "grouped_cache_attention(B=1,H=4,G=3,M=T,N=T,D=64,R=0)";
        assert_eq!(rows(&plain, grouped, 1).rows, 1);
        let bf16 = "masked_attention_bf16(B=1,H=12,M=T,N=T,D=64)";
        assert!(rows(&amx, bf16, 1).amx && rows(&amx, bf16, 1).rows == 16);
        // On pairs where the CPU has AVX512_BF16, from PAIRS_MIN_ROWS query rows (of
        // the whole group) on.
        let pairs = CpuTarget {
            avx512_bf16: true,
            avx512_vnni: false,
            ..CpuTarget::avx512_for_tests()
        };
        assert!(!rows(&plain, bf16, 100).pairs);
        assert!(!rows(&pairs, bf16, 1).pairs && rows(&pairs, bf16, 1).rows == 1);
        assert!(!rows(&pairs, bf16, PAIRS_MIN_ROWS as i64 - 1).pairs);
        assert!(rows(&pairs, bf16, PAIRS_MIN_ROWS as i64).pairs);
        let grouped = "grouped_cache_attention_bf16(B=1,H=2,G=8,M=T,N=T,D=64,R=0)";
        assert!(rows(&pairs, grouped, 4).pairs);
        assert!(!rows(&pairs, "attention(B=1,H=12,M=T,N=T,D=64)", 100).pairs);
        assert!(!rows(&pairs, "attention_bf16(B=1,H=12,M=T,N=T,D=48)", 100).pairs);
    }
}
