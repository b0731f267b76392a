//! Element types: the one list of what anyshape computes in, shared by workloads (whose
//! kernels compute `f32`), tensors, the plan's values and constants, and the front ends.

/// An element type. Workloads' tensors are `f32` (the kernels anyshape generates compute
/// in it); tensors, plan values and constants are any of the three: `f32` (activations,
/// weights), `i64` (indices, shapes) and `bool` (masks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// 32-bit IEEE float (`F32` is its spelling in manifests written before `i64` and
    /// `bool` joined it).
    #[serde(alias = "F32")]
    F32,
    /// 64-bit signed integer.
    I64,
    /// Boolean, one byte per element.
    Bool,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    /// The ONNX name.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::I64 => "int64",
            DType::Bool => "bool",
        }
    }

    /// The element type of an ONNX `TensorProto.DataType` code, where anyshape computes
    /// it (32-bit integers widen to `i64`, doubles narrow to `f32`).
    pub fn from_onnx(code: i32) -> Option<DType> {
        match code {
            1 | 11 => Some(DType::F32), // FLOAT, DOUBLE
            6 | 7 => Some(DType::I64),  // INT32, INT64
            9 => Some(DType::Bool),     // BOOL
            _ => None,
        }
    }
}

/// What a contraction multiplies in; it accumulates in `f32` (in `i8`: in 32-bit
/// integers per reduction slice, then `f32`).
///
/// `bf16`: its operands are rounded to bfloat16 (the top 16 bits of an `f32`, rounded
/// to nearest, ties to even) and multiplied in pairs along the reduction, as AVX512_BF16's
/// `vdpbf16ps` does: the reduction axis counts **pairs**, the first operand is read two
/// elements at a time along its contiguous last dimension (element `2k` and `2k + 1`),
/// and the second operand is stored as 32-bit words, each two bfloat16 values (element
/// `2k` in the low half, `2k + 1` in the high half) — half the bytes of `f32` weights.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 32-bit IEEE float throughout.
    #[default]
    F32,
    /// bfloat16 products of pairs, accumulated in `f32`.
    Bf16,
    /// 8-bit integer products of quads (AVX512_VNNI's `vpdpbusd`): the first operand
    /// quantized per row as it is read ([`i8_row_scale`], [`i8_quantize`]: symmetric,
    /// `[-127, 127]`, one scale per row over the whole reduction), the second stored
    /// as 32-bit words of four bytes along the reduction, each the weight's 8-bit
    /// value plus 128 ([`i8_quad`]; a quarter of `f32` weights' bytes). The reduction
    /// axis counts quads; the result is the sum of the products times the row's scale
    /// — in the units of the weights' 8-bit values: a model multiplies by each output
    /// channel's weight scale in the epilogue.
    I8,
}

impl Precision {
    /// Whether it is `f32` (the default, left out of serialized workloads).
    pub fn is_f32(&self) -> bool {
        *self == Precision::F32
    }

    /// The relative error (of the largest magnitude) within which a model compiled in
    /// this precision is checked against an `f32` reference unless told otherwise:
    /// `1e-4` in `f32` (sums in another order), `2e-2` in `bf16` (8-bit mantissas).
    pub fn expected_error(self) -> f64 {
        match self {
            Precision::F32 => 1e-4,
            Precision::Bf16 => 2e-2,
            Precision::I8 => 1e-1,
        }
    }

    /// Its name: `f32`, `bf16` or `i8`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::I8 => "i8",
        }
    }

    /// Elements of a reduction one step of its contraction multiplies (one 32-bit
    /// word of the second operand): 1, 2 (a pair of bfloat16) or 4 (a quad of bytes).
    pub fn group(self) -> i64 {
        match self {
            Precision::F32 => 1,
            Precision::Bf16 => 2,
            Precision::I8 => 4,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Precision, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            "i8" => Ok(Precision::I8),
            _ => Err(format!("unknown precision `{s}` (known: f32, bf16, i8)")),
        }
    }
}

/// `x` rounded to bfloat16 (nearest, ties to even; a NaN stays a quiet NaN), as the
/// bits of the 16-bit value.
pub fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if x.is_nan() {
        return ((u >> 16) | 0x40) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// The `f32` value of bfloat16 bits.
pub fn bf16_value(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Two values as one 32-bit word of bfloat16 (`lo` in the low half), as a bf16
/// contraction's second operand stores each pair (see [`Precision::Bf16`]); the word's
/// bits carried in an `f32`.
pub fn bf16_pair(lo: f32, hi: f32) -> f32 {
    f32::from_bits(bf16_bits(lo) as u32 | (bf16_bits(hi) as u32) << 16)
}

/// The two values of a word of bfloat16 (low half first).
pub fn bf16_unpair(word: f32) -> (f32, f32) {
    let u = word.to_bits();
    (bf16_value(u as u16), bf16_value((u >> 16) as u16))
}

/// The scale of a row quantized to 8 bits ([`Precision::I8`]) from its elements:
/// `(scale, inverse)`, from the largest magnitude `max` among them (a NaN passed over),
/// `scale = max / 127` and `inverse = 127 / max` in `f32` (both 0 for a row of zeros,
/// one whose largest magnitude is infinite, or one so small that the inverse is) —
/// exactly as the generated kernels compute them.
pub fn i8_row_scale(row: impl IntoIterator<Item = f32>) -> (f32, f32) {
    let max = row
        .into_iter()
        .fold(0.0f32, |m, x| if x.abs() > m { x.abs() } else { m });
    let inverse = 127.0 / max;
    if max > 0.0 && max.is_finite() && inverse.is_finite() {
        (max / 127.0, inverse)
    } else {
        (0.0, 0.0)
    }
}

/// `x` quantized with a row's `inverse` scale ([`i8_row_scale`]): `x · inverse` in
/// `f32`, rounded to nearest (ties to even) and clamped to `[-127, 127]` — exactly as
/// the generated kernels do.
pub fn i8_quantize(x: f32, inverse: f32) -> i32 {
    let q = (x * inverse).round_ties_even();
    if q.is_nan() {
        0
    } else {
        q.clamp(-127.0, 127.0) as i32
    }
}

/// Four 8-bit weights (each in `[-128, 127]`, first in the low byte) as one word of an
/// `i8` contraction's second operand: each byte the value plus 128; the word's bits
/// carried in an `f32`.
pub fn i8_quad(values: [i32; 4]) -> f32 {
    let bits = values.iter().enumerate().fold(0u32, |w, (i, &q)| {
        w | (((q + 128) as u32 & 0xff) << (8 * i))
    });
    f32::from_bits(bits)
}

/// The four 8-bit weights of a word of an `i8` contraction's second operand (low byte
/// first): each byte minus 128.
pub fn i8_unquad(word: f32) -> [i32; 4] {
    let u = word.to_bits();
    std::array::from_fn(|i| ((u >> (8 * i)) & 0xff) as i32 - 128)
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::DType;
    use serde::de::{value::Error, IntoDeserializer};
    use serde::Deserialize;

    fn read(text: &str) -> Result<DType, Error> {
        DType::deserialize(text.into_deserializer())
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan() {
        use super::{bf16_bits, bf16_pair, bf16_unpair, bf16_value};
        assert_eq!(bf16_value(bf16_bits(1.0)), 1.0);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even (1).
        assert_eq!(bf16_value(bf16_bits(1.0 + 1.0 / 256.0)), 1.0);
        assert_eq!(bf16_value(bf16_bits(1.0 + 3.0 / 256.0)), 1.0 + 4.0 / 256.0);
        assert!(bf16_value(bf16_bits(f32::NAN)).is_nan());
        assert_eq!(bf16_value(bf16_bits(f32::INFINITY)), f32::INFINITY);
        assert_eq!(bf16_unpair(bf16_pair(-2.5, 0.375)), (-2.5, 0.375));
    }

    #[test]
    fn i8_quantizes_symmetrically_to_nearest_even_and_packs_quads() {
        use super::{i8_quad, i8_quantize, i8_row_scale, i8_unquad};
        let (scale, inv) = i8_row_scale([1.0, f32::NAN, -2.54, 0.5]);
        assert_eq!((scale, inv), (2.54f32 / 127.0, 127.0f32 / 2.54));
        assert_eq!(i8_quantize(2.54, inv), 127);
        assert_eq!(i8_quantize(-2.54, inv), -127);
        // Past the largest magnitude (not in its row) clamps; 0.5 ties to even.
        assert_eq!(i8_quantize(9.0, inv), 127);
        assert_eq!(i8_quantize(0.5, 1.0), 0);
        assert_eq!(i8_quantize(1.5, 1.0), 2);
        assert_eq!(i8_quantize(f32::NAN, 1.0), 0);
        for row in [
            [0.0, -0.0],
            [1.0, f32::NEG_INFINITY],
            [f32::NAN, 0.0],
            [1e-40, 0.0],
        ] {
            assert_eq!(i8_row_scale(row), (0.0, 0.0));
        }
        let q = [-128, -1, 0, 127];
        assert_eq!(i8_quad(q).to_bits(), 0xff_80_7f_00);
        assert_eq!(i8_unquad(i8_quad(q)), q);
    }

    #[test]
    fn reads_both_spellings_of_f32_and_refuses_others() {
        assert_eq!(read("f32").unwrap(), DType::F32);
        assert_eq!(read("F32").unwrap(), DType::F32);
        assert_eq!(read("bool").unwrap(), DType::Bool);
        assert!(read("f16").is_err());
    }
}
