//! The C API of model modules (`include/anyshape.h`): load a model module, describe its
//! inputs and outputs (dims as text), run it on the caller's buffers, free it, and the
//! last error's message per thread. Every entry point checks its pointers and catches
//! panics, so a C caller gets a status code and a message, never an abort.
use anyshape_runtime::{Model, RuntimeError};
use anyshape_tensor::{DType, Data, DataRef, TensorRef, TensorSpec};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};

/// Buffers on cache lines, as in the `anyshape` CLI (see
/// [`anyshape_abi::CacheLineAllocator`]): the kernels were tuned on such buffers.
#[global_allocator]
static ALLOCATOR: anyshape_abi::CacheLineAllocator = anyshape_abi::CacheLineAllocator;

/// `ANYSHAPE_OK`.
pub const OK: c_int = 0;
/// `ANYSHAPE_INVALID_ARGUMENT`: the caller's input.
pub const INVALID_ARGUMENT: c_int = 1;
/// `ANYSHAPE_MODULE_ERROR`: the module cannot be loaded.
pub const MODULE_ERROR: c_int = 2;
/// `ANYSHAPE_OUT_OF_MEMORY`: a run too large for the machine.
pub const OUT_OF_MEMORY: c_int = 3;
/// `ANYSHAPE_BUFFER_TOO_SMALL`: an output buffer holds less than the output.
pub const BUFFER_TOO_SMALL: c_int = 4;
/// `ANYSHAPE_ERROR`: anything else.
pub const ERROR: c_int = 5;
/// `ANYSHAPE_MAX_RANK`.
pub const MAX_RANK: usize = 8;

/// `anyshape_tensor`.
#[repr(C)]
pub struct AnyshapeTensor {
    /// `anyshape_dtype` (ONNX's element type codes: 1 float32, 7 int64, 9 bool).
    pub dtype: c_int,
    /// The rank.
    pub rank: usize,
    /// The dims (the first `rank`).
    pub dims: [i64; MAX_RANK],
    /// The elements.
    pub data: *mut c_void,
    /// Outputs: the buffer's bytes.
    pub capacity: usize,
}

/// `anyshape_model`: a loaded model, its inputs' and outputs' names and dims as C
/// strings, and the last run's output tensors, which the next run writes over before
/// they are copied to the caller's buffers (`Model::run_into`: fresh outputs paid their
/// page faults on every run). A run that finds them taken by a run on another thread
/// uses fresh ones.
pub struct AnyshapeModel {
    model: Model,
    inputs: Vec<(CString, Vec<CString>)>,
    outputs: Vec<(CString, Vec<CString>)>,
    kept: anyshape_runtime::KeptOutputs,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `message` as this thread's last error; returns `code`.
fn fail(code: c_int, message: impl std::fmt::Display) -> c_int {
    let text = CString::new(message.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    code
}

/// The status of a runtime error.
fn code(e: &RuntimeError) -> c_int {
    match e {
        RuntimeError::Module(_) => MODULE_ERROR,
        RuntimeError::Memory(_) => OUT_OF_MEMORY,
        RuntimeError::Tensor(_)
        | RuntimeError::Shape(_)
        | RuntimeError::UnknownVar { .. }
        | RuntimeError::BufferCount { .. }
        | RuntimeError::BufferLen { .. } => INVALID_ARGUMENT,
        _ => ERROR,
    }
}

/// Run `f`, turning a panic into `ANYSHAPE_ERROR`.
fn guarded(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        fail(
            ERROR,
            "internal error (a bug in anyshape, please report it): a panic",
        )
    })
}

fn dtype_code(d: DType) -> c_int {
    match d {
        DType::F32 => 1,
        DType::I64 => 7,
        DType::Bool => 9,
    }
}

fn c_strings(s: &TensorSpec) -> (CString, Vec<CString>) {
    let text = |t: String| CString::new(t).unwrap_or_default();
    (
        text(s.name.clone()),
        s.shape.iter().map(|e| text(e.to_string())).collect(),
    )
}

/// `anyshape_model_load`.
///
/// # Safety
/// `path` is a NUL-terminated string; `model` points to writable storage for a pointer.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_load(
    path: *const c_char,
    model: *mut *mut AnyshapeModel,
) -> c_int {
    guarded(|| {
        if path.is_null() || model.is_null() {
            return fail(INVALID_ARGUMENT, "anyshape_model_load: a NULL argument");
        }
        // SAFETY: the caller's promise.
        let path = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        match Model::load(&path) {
            Ok(m) => {
                let inputs = m.inputs().iter().map(c_strings).collect();
                let outputs = m.outputs().into_iter().map(c_strings).collect();
                let boxed = Box::new(AnyshapeModel {
                    model: m,
                    inputs,
                    outputs,
                    kept: Default::default(),
                });
                // SAFETY: the caller's promise.
                unsafe { *model = Box::into_raw(boxed) };
                OK
            }
            Err(e) => fail(code(&e), e),
        }
    })
}

/// `anyshape_model_free`.
///
/// # Safety
/// `model` is NULL or a model from `anyshape_model_load`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_free(model: *mut AnyshapeModel) {
    if !model.is_null() {
        // SAFETY: the caller's promise: a pointer from Box::into_raw, freed once.
        drop(unsafe { Box::from_raw(model) });
    }
}

/// `anyshape_model_num_inputs`.
///
/// # Safety
/// `model` is NULL or a loaded model.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_num_inputs(model: *const AnyshapeModel) -> usize {
    // SAFETY: the caller's promise.
    unsafe { model.as_ref() }.map_or(0, |m| m.inputs.len())
}

/// `anyshape_model_num_outputs`.
///
/// # Safety
/// `model` is NULL or a loaded model.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_num_outputs(model: *const AnyshapeModel) -> usize {
    // SAFETY: the caller's promise.
    unsafe { model.as_ref() }.map_or(0, |m| m.outputs.len())
}

/// Describe tensor `index` of `specs` into the caller's pointers.
///
/// # Safety
/// The out pointers are NULL or point to writable storage.
unsafe fn describe(
    names: &[(CString, Vec<CString>)],
    dtypes: &[DType],
    index: usize,
    name: *mut *const c_char,
    dtype: *mut c_int,
    rank: *mut usize,
) -> c_int {
    let Some((n, dims)) = names.get(index) else {
        return fail(
            INVALID_ARGUMENT,
            format!("index {index} is past the model's {} tensors", names.len()),
        );
    };
    // SAFETY: the caller's promise (each pointer NULL or writable).
    unsafe {
        if !name.is_null() {
            *name = n.as_ptr();
        }
        if !dtype.is_null() {
            *dtype = dtype_code(dtypes[index]);
        }
        if !rank.is_null() {
            *rank = dims.len();
        }
    }
    OK
}

/// `anyshape_model_input`.
///
/// # Safety
/// `model` is a loaded model; the out pointers are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_input(
    model: *const AnyshapeModel,
    index: usize,
    name: *mut *const c_char,
    dtype: *mut c_int,
    rank: *mut usize,
) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise.
        let Some(m) = (unsafe { model.as_ref() }) else {
            return fail(INVALID_ARGUMENT, "anyshape_model_input: a NULL model");
        };
        let dtypes: Vec<DType> = m.model.inputs().iter().map(|s| s.dtype).collect();
        // SAFETY: the caller's promise.
        unsafe { describe(&m.inputs, &dtypes, index, name, dtype, rank) }
    })
}

/// `anyshape_model_output`.
///
/// # Safety
/// `model` is a loaded model; the out pointers are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_output(
    model: *const AnyshapeModel,
    index: usize,
    name: *mut *const c_char,
    dtype: *mut c_int,
    rank: *mut usize,
) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise.
        let Some(m) = (unsafe { model.as_ref() }) else {
            return fail(INVALID_ARGUMENT, "anyshape_model_output: a NULL model");
        };
        let dtypes: Vec<DType> = m.model.outputs().iter().map(|s| s.dtype).collect();
        // SAFETY: the caller's promise.
        unsafe { describe(&m.outputs, &dtypes, index, name, dtype, rank) }
    })
}

/// Dim `dim` of tensor `index` of `names`, or NULL.
fn dim_text(names: &[(CString, Vec<CString>)], index: usize, dim: usize) -> *const c_char {
    names
        .get(index)
        .and_then(|(_, dims)| dims.get(dim))
        .map_or(std::ptr::null(), |d| d.as_ptr())
}

/// `anyshape_model_input_dim`.
///
/// # Safety
/// `model` is NULL or a loaded model.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_input_dim(
    model: *const AnyshapeModel,
    index: usize,
    dim: usize,
) -> *const c_char {
    // SAFETY: the caller's promise.
    unsafe { model.as_ref() }.map_or(std::ptr::null(), |m| dim_text(&m.inputs, index, dim))
}

/// `anyshape_model_output_dim`.
///
/// # Safety
/// `model` is NULL or a loaded model.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_output_dim(
    model: *const AnyshapeModel,
    index: usize,
    dim: usize,
) -> *const c_char {
    // SAFETY: the caller's promise.
    unsafe { model.as_ref() }.map_or(std::ptr::null(), |m| dim_text(&m.outputs, index, dim))
}

/// `anyshape_model_run`.
///
/// # Safety
/// `model` is a loaded model; `inputs` points to `num_inputs` tensors whose `data` hold
/// their dims' elements of their dtype; `outputs` points to `num_outputs` tensors whose
/// `data` are writable buffers of `capacity` bytes.
#[no_mangle]
pub unsafe extern "C" fn anyshape_model_run(
    model: *mut AnyshapeModel,
    inputs: *const AnyshapeTensor,
    num_inputs: usize,
    outputs: *mut AnyshapeTensor,
    num_outputs: usize,
) -> c_int {
    guarded(|| {
        // SAFETY: the caller's promise.
        let Some(m) = (unsafe { model.as_ref() }) else {
            return fail(INVALID_ARGUMENT, "anyshape_model_run: a NULL model");
        };
        let specs = m.model.inputs();
        if num_inputs != specs.len() || num_outputs != m.outputs.len() {
            return fail(
                INVALID_ARGUMENT,
                format!(
                    "{num_inputs} inputs and {num_outputs} outputs for a model of {} and {}",
                    specs.len(),
                    m.outputs.len()
                ),
            );
        }
        if (num_inputs > 0 && inputs.is_null()) || (num_outputs > 0 && outputs.is_null()) {
            return fail(INVALID_ARGUMENT, "anyshape_model_run: NULL tensors");
        }
        // SAFETY: the caller's promise: `num_inputs` tensors.
        let given = unsafe { std::slice::from_raw_parts(inputs, num_inputs) };
        let mut shapes = Vec::with_capacity(num_inputs);
        for (s, t) in specs.iter().zip(given) {
            if t.rank > MAX_RANK || t.dims[..t.rank.min(MAX_RANK)].iter().any(|&d| d < 0) {
                return fail(
                    INVALID_ARGUMENT,
                    format!("input `{}`: rank {} or a negative dim", s.name, t.rank),
                );
            }
            if t.dtype != dtype_code(s.dtype) {
                return fail(
                    INVALID_ARGUMENT,
                    format!(
                        "input `{}` has element type {}, the model takes {}",
                        s.name,
                        t.dtype,
                        dtype_code(s.dtype)
                    ),
                );
            }
            shapes.push(
                t.dims[..t.rank]
                    .iter()
                    .map(|&d| d as usize)
                    .collect::<Vec<_>>(),
            );
        }
        let mut views = Vec::with_capacity(num_inputs);
        for ((s, t), shape) in specs.iter().zip(given).zip(&shapes) {
            let Some(n) = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) else {
                return fail(INVALID_ARGUMENT, format!("input `{}`: too large", s.name));
            };
            if n > 0 && t.data.is_null() {
                return fail(INVALID_ARGUMENT, format!("input `{}`: NULL data", s.name));
            }
            // SAFETY: the caller's promise: `data` holds the dims' elements of the
            // dtype (checked above); a dangling pointer for no elements is never read.
            let data = unsafe {
                match s.dtype {
                    DType::F32 => DataRef::F32(std::slice::from_raw_parts(
                        t.data.cast::<f32>().cast_const(),
                        n,
                    )),
                    DType::I64 => DataRef::I64(std::slice::from_raw_parts(
                        t.data.cast::<i64>().cast_const(),
                        n,
                    )),
                    DType::Bool => DataRef::Bool(std::slice::from_raw_parts(
                        t.data.cast::<bool>().cast_const(),
                        n,
                    )),
                }
            };
            views.push((s.name.as_str(), TensorRef { shape, data }));
        }
        let mut outs = m.kept.for_run(&m.model);
        if let Err(e) = m.model.run_into(&views, &mut outs) {
            return fail(code(&e), e);
        }
        let outs: Vec<&anyshape_tensor::Tensor> = outs.iter().flatten().collect();
        if outs.len() != num_outputs {
            return fail(ERROR, "internal error: a run left an output unwritten");
        }
        // SAFETY: the caller's promise: `num_outputs` tensors.
        let slots = unsafe { std::slice::from_raw_parts_mut(outputs, num_outputs) };
        let bytes: Vec<&[u8]> = outs
            .iter()
            .map(|t| match &t.data {
                // SAFETY (all three): plain elements seen as bytes (a bool is one
                // byte, 0 or 1).
                Data::F32(v) => unsafe {
                    std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 4)
                },
                Data::I64(v) => unsafe {
                    std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len() * 8)
                },
                Data::Bool(v) => unsafe {
                    std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.len())
                },
            })
            .collect();
        // Every buffer is checked before any is written.
        for ((slot, (t, b)), (name, _)) in slots.iter().zip(outs.iter().zip(&bytes)).zip(&m.outputs)
        {
            if t.shape.len() > MAX_RANK
                || b.len() > slot.capacity
                || (slot.data.is_null() && !b.is_empty())
            {
                return fail(
                    BUFFER_TOO_SMALL,
                    format!(
                        "output `{}` takes {} bytes (shape {:?}); its buffer holds {}",
                        name.to_string_lossy(),
                        b.len(),
                        t.shape,
                        slot.capacity
                    ),
                );
            }
        }
        for (slot, (t, b)) in slots.iter_mut().zip(outs.iter().zip(&bytes)) {
            // SAFETY: the buffer holds `capacity` writable bytes, at least these.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), slot.data.cast::<u8>(), b.len()) };
            slot.dtype = dtype_code(t.dtype());
            slot.rank = t.shape.len();
            slot.dims = [0; MAX_RANK];
            for (d, &x) in slot.dims.iter_mut().zip(&t.shape) {
                *d = x as i64;
            }
        }
        OK
    })
}

/// `anyshape_last_error`.
#[no_mangle]
pub extern "C" fn anyshape_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
