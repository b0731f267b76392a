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
    fn reads_both_spellings_of_f32_and_refuses_others() {
        assert_eq!(read("f32").unwrap(), DType::F32);
        assert_eq!(read("F32").unwrap(), DType::F32);
        assert_eq!(read("bool").unwrap(), DType::Bool);
        assert!(read("f16").is_err());
    }
}
