//! Tensors with data: what initializers, constants, model inputs and the reference
//! executor's values are. Three element types cover the models anyshape imports:
//! `f32` (activations, weights), `i64` (indices, shapes) and `bool` (masks).
use crate::{Result, TensorError};

pub use anyshape_ir::DType;

/// The elements of a tensor.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Data {
    /// `f32` elements.
    F32(Vec<f32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `bool` elements.
    Bool(Vec<bool>),
}

/// A dense row-major tensor.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tensor {
    /// Extents, outermost first (empty: a scalar).
    pub shape: Vec<usize>,
    /// The elements, `shape.iter().product()` of them.
    pub data: Data,
}

/// The number of elements of `shape`, or an error if it overflows.
pub fn numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| TensorError::Shape(format!("the shape {shape:?} has too many elements")))
}

impl Tensor {
    /// A tensor of `f32`; the data must fit the shape.
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Result<Tensor> {
        Tensor::new(shape, Data::F32(data))
    }

    /// A tensor of `i64`; the data must fit the shape.
    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Result<Tensor> {
        Tensor::new(shape, Data::I64(data))
    }

    /// A tensor of `bool`; the data must fit the shape.
    pub fn bool(shape: Vec<usize>, data: Vec<bool>) -> Result<Tensor> {
        Tensor::new(shape, Data::Bool(data))
    }

    /// A tensor; the data must fit the shape.
    pub fn new(shape: Vec<usize>, data: Data) -> Result<Tensor> {
        let n = numel(&shape)?;
        if data.len() != n {
            return Err(TensorError::Shape(format!(
                "{} elements for the shape {shape:?}, which holds {n}",
                data.len()
            )));
        }
        Ok(Tensor { shape, data })
    }

    /// A tensor of `dtype` and `shape`, every element zero (false).
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Result<Tensor> {
        let data = Data::zeros(dtype, numel(&shape)?);
        Ok(Tensor { shape, data })
    }

    /// Make this tensor one of `dtype` and `shape` (its elements unspecified), in
    /// place: nothing is allocated where its vectors have room (a run's host steps
    /// keep their outputs so from run to run).
    pub fn fit(&mut self, dtype: DType, shape: &[usize]) -> Result<()> {
        let n = numel(shape)?;
        self.shape.clear();
        self.shape.extend_from_slice(shape);
        match (&mut self.data, dtype) {
            (Data::F32(v), DType::F32) => v.resize(n, 0.0),
            (Data::I64(v), DType::I64) => v.resize(n, 0),
            (Data::Bool(v), DType::Bool) => v.resize(n, false),
            _ => *self = Tensor::zeros(dtype, shape.to_vec())?,
        }
        Ok(())
    }

    /// Room for `n` elements of its type without allocating again.
    pub fn reserve(&mut self, n: usize) {
        match &mut self.data {
            Data::F32(v) => v.reserve(n.saturating_sub(v.len())),
            Data::I64(v) => v.reserve(n.saturating_sub(v.len())),
            Data::Bool(v) => v.reserve(n.saturating_sub(v.len())),
        }
    }

    /// The `f32` elements to write, or an error naming what they are.
    pub fn f32_mut(&mut self) -> Result<&mut [f32]> {
        match &mut self.data {
            Data::F32(v) => Ok(v),
            d => Err(TensorError::Type(format!(
                "expected float, got {}",
                d.dtype()
            ))),
        }
    }

    /// The `i64` elements to write, or an error naming what they are.
    pub fn i64_mut(&mut self) -> Result<&mut [i64]> {
        match &mut self.data {
            Data::I64(v) => Ok(v),
            d => Err(TensorError::Type(format!(
                "expected int64, got {}",
                d.dtype()
            ))),
        }
    }

    /// The `bool` elements to write, or an error naming what they are.
    pub fn bool_mut(&mut self) -> Result<&mut [bool]> {
        match &mut self.data {
            Data::Bool(v) => Ok(v),
            d => Err(TensorError::Type(format!(
                "expected bool, got {}",
                d.dtype()
            ))),
        }
    }

    /// A scalar `i64`.
    pub fn scalar_i64(x: i64) -> Tensor {
        Tensor {
            shape: vec![],
            data: Data::I64(vec![x]),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `f32` elements, or an error naming what they are.
    pub fn as_f32(&self) -> Result<&[f32]> {
        self.view().as_f32()
    }

    /// The `i64` elements, or an error naming what they are.
    pub fn as_i64(&self) -> Result<&[i64]> {
        self.view().as_i64()
    }

    /// The `bool` elements, or an error naming what they are.
    pub fn as_bool(&self) -> Result<&[bool]> {
        self.view().as_bool()
    }

    /// The same elements under another shape of as many elements.
    pub fn reshaped(&self, shape: Vec<usize>) -> Result<Tensor> {
        Tensor::new(shape, self.data.clone())
    }
}

impl Data {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.view().dtype()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.view().len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements at `indices`, in order (a gather over the flat data).
    pub fn pick(&self, indices: &[usize]) -> Data {
        self.view().pick(indices)
    }

    /// `n` copies of the element `at` (for filled tensors).
    pub fn filled(&self, at: usize, n: usize) -> Data {
        self.view().filled(at, n)
    }
}

/// The elements of a tensor, borrowed (from a tensor, an arena, a mapped file).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DataRef<'a> {
    /// `f32` elements.
    F32(&'a [f32]),
    /// `i64` elements.
    I64(&'a [i64]),
    /// `bool` elements.
    Bool(&'a [bool]),
}

/// A dense row-major tensor whose shape and elements are borrowed: what the ops'
/// evaluations read, so that a plan's host steps read kernels' outputs in an arena and
/// constants in a mapped file without copying them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorRef<'a> {
    /// Extents, outermost first (empty: a scalar).
    pub shape: &'a [usize],
    /// The elements, `shape.iter().product()` of them.
    pub data: DataRef<'a>,
}

impl<'a> TensorRef<'a> {
    /// A view of `data` as a tensor of `shape`; the lengths must agree.
    pub fn new(shape: &'a [usize], data: DataRef<'a>) -> Result<TensorRef<'a>> {
        let n = numel(shape)?;
        if data.len() != n {
            return Err(TensorError::Shape(format!(
                "{} elements for the shape {shape:?}, which holds {n}",
                data.len()
            )));
        }
        Ok(TensorRef { shape, data })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `f32` elements, or an error naming what they are.
    pub fn as_f32(&self) -> Result<&'a [f32]> {
        match self.data {
            DataRef::F32(v) => Ok(v),
            d => Err(TensorError::Type(format!(
                "expected float, got {}",
                d.dtype()
            ))),
        }
    }

    /// The `i64` elements, or an error naming what they are.
    pub fn as_i64(&self) -> Result<&'a [i64]> {
        match self.data {
            DataRef::I64(v) => Ok(v),
            d => Err(TensorError::Type(format!(
                "expected int64, got {}",
                d.dtype()
            ))),
        }
    }

    /// The `bool` elements, or an error naming what they are.
    pub fn as_bool(&self) -> Result<&'a [bool]> {
        match self.data {
            DataRef::Bool(v) => Ok(v),
            d => Err(TensorError::Type(format!(
                "expected bool, got {}",
                d.dtype()
            ))),
        }
    }

    /// An owned copy.
    pub fn to_tensor(&self) -> Tensor {
        Tensor {
            shape: self.shape.to_vec(),
            data: self.data.to_data(),
        }
    }

    /// The same elements, owned, under another shape of as many elements.
    pub fn reshaped(&self, shape: Vec<usize>) -> Result<Tensor> {
        Tensor::new(shape, self.data.to_data())
    }
}

impl<'a> DataRef<'a> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DataRef::F32(_) => DType::F32,
            DataRef::I64(_) => DType::I64,
            DataRef::Bool(_) => DType::Bool,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            DataRef::F32(v) => v.len(),
            DataRef::I64(v) => v.len(),
            DataRef::Bool(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An owned copy.
    pub fn to_data(&self) -> Data {
        match self {
            DataRef::F32(v) => Data::F32(v.to_vec()),
            DataRef::I64(v) => Data::I64(v.to_vec()),
            DataRef::Bool(v) => Data::Bool(v.to_vec()),
        }
    }

    /// The elements at `indices`, in order (a gather over the flat data).
    pub fn pick(&self, indices: &[usize]) -> Data {
        match self {
            DataRef::F32(v) => Data::F32(indices.iter().map(|&i| v[i]).collect()),
            DataRef::I64(v) => Data::I64(indices.iter().map(|&i| v[i]).collect()),
            DataRef::Bool(v) => Data::Bool(indices.iter().map(|&i| v[i]).collect()),
        }
    }

    /// `n` copies of the element `at` (for filled tensors).
    pub fn filled(&self, at: usize, n: usize) -> Data {
        self.pick(&vec![at; n])
    }
}

impl Tensor {
    /// A borrowed view.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            shape: &self.shape,
            data: self.data.view(),
        }
    }
}

impl Data {
    /// `n` elements of `dtype`, all zero (none: an empty vector to fill later).
    pub fn zeros(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; n]),
            DType::I64 => Data::I64(vec![0; n]),
            DType::Bool => Data::Bool(vec![false; n]),
        }
    }

    /// A borrowed view.
    pub fn view(&self) -> DataRef<'_> {
        match self {
            Data::F32(v) => DataRef::F32(v),
            Data::I64(v) => DataRef::I64(v),
            Data::Bool(v) => DataRef::Bool(v),
        }
    }
}

/// Row-major strides of `shape`.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}
