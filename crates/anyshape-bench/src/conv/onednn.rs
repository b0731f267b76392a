//! oneDNN's convolution for `bench --model --conv-kernels`: `onednn_conv.c` built
//! against the system's `libdnnl` and loaded in this process ([`OneDnn`]), and one
//! convolution set up in it on random data, its output checked against the operator
//! reference ([`Conv`]).
use super::{Geometry, Layer};
use crate::error::{BenchError, Result};
use crate::model::{rel_error, uniform};
use crate::Harness;
use anyshape_measure::KernelSource;
use anyshape_tensor::{Tensor, TensorRef};
use std::ffi::c_void;
use std::time::Instant;

type New = unsafe extern "C" fn(
    *const i64,
    i32,
    *const f32,
    *const f32,
    *const f32,
    *const f32,
) -> *mut c_void;
type Call = unsafe extern "C" fn(*mut c_void) -> i32;
type Output = unsafe extern "C" fn(*mut c_void, *mut f32) -> i32;
type Free = unsafe extern "C" fn(*mut c_void);
type Warm = unsafe extern "C" fn(*mut c_void) -> f32;

/// The oneDNN shim, loaded.
pub(super) struct OneDnn {
    new: New,
    run: Call,
    output: Output,
    free: Free,
    warm: Warm,
    /// Keeps the functions above alive.
    _lib: libloading::Library,
}

impl OneDnn {
    /// Build `onednn_conv.c` against the system's oneDNN and load it.
    pub(super) fn load(h: &Harness) -> Result<OneDnn> {
        let mut b = h.builder.clone();
        b.link_flags.push("-ldnnl".into());
        let source = KernelSource {
            symbol: "as_onednn_conv_new".into(),
            code: include_str!("onednn_conv.c").into(),
        };
        let built = b.build(&h.target, &[source])?;
        if let Some(why) = built.failed.values().next() {
            return Err(BenchError::Environment(format!(
                "cannot build against oneDNN (install libdnnl-dev): {}",
                why.lines().next().unwrap_or("")
            )));
        }
        let env = |e: libloading::Error| {
            BenchError::Environment(format!("{}: {e}", built.path.display()))
        };
        // SAFETY: the library is the shim just built; each symbol has the signature
        // declared in `onednn_conv.c`.
        unsafe {
            let lib = libloading::Library::new(&built.path).map_err(env)?;
            Ok(OneDnn {
                new: *lib.get::<New>(b"as_onednn_conv_new").map_err(env)?,
                run: *lib.get::<Call>(b"as_onednn_conv_run").map_err(env)?,
                output: *lib.get::<Output>(b"as_onednn_conv_output").map_err(env)?,
                free: *lib.get::<Free>(b"as_onednn_conv_free").map_err(env)?,
                warm: *lib.get::<Warm>(b"as_onednn_conv_warm").map_err(env)?,
                _lib: lib,
            })
        }
    }
}

/// One convolution set up in oneDNN, with random data.
pub(super) struct Conv<'a> {
    dnn: &'a OneDnn,
    handle: *mut c_void,
}

impl<'a> Conv<'a> {
    /// Set up `geom` on random data; returns it and the relative error of its output
    /// against the operator reference.
    pub(super) fn new(dnn: &'a OneDnn, layer: &Layer, geom: &Geometry) -> Result<(Conv<'a>, f64)> {
        let g = &geom.g;
        let n = |dims: &[i64]| dims.iter().product::<i64>() as usize;
        let mut state = 0x9e37_79b9_7f4a_7c15u64
            ^ g.iter()
                .fold(0u64, |a, &x| a.wrapping_mul(31).wrapping_add(x as u64));
        let x = uniform(n(&g[0..4]), &mut state);
        let w = uniform(n(&[g[4], g[1], g[5], g[6]]), &mut state);
        // Without a bias in the model, oneDNN's is zero.
        let bias = match geom.bias {
            true => uniform(g[4] as usize, &mut state),
            false => vec![0.0; g[4] as usize],
        };
        let residual = geom
            .residual
            .then(|| uniform(geom.output_len(), &mut state));
        let fail = || BenchError::Environment(format!("oneDNN: {}: a call failed", geom.label()));
        // SAFETY: the buffers hold the elements the geometry says; oneDNN copies them.
        let handle = unsafe {
            (dnn.new)(
                g.as_ptr(),
                geom.relu as i32,
                x.as_ptr(),
                w.as_ptr(),
                bias.as_ptr(),
                residual.as_ref().map_or(std::ptr::null(), |r| r.as_ptr()),
            )
        };
        if handle.is_null() {
            return Err(fail());
        }
        let conv = Conv { dnn, handle };
        let mut got = vec![0f32; geom.output_len()];
        // SAFETY: `got` holds the output's elements.
        if unsafe { (dnn.run)(handle) != 0 || (dnn.output)(handle, got.as_mut_ptr()) != 0 } {
            return Err(fail());
        }
        let want = reference(layer, geom, [x, w, bias], residual)?;
        let got =
            Tensor::f32(want.shape.clone(), got).map_err(|e| BenchError::Options(e.to_string()))?;
        Ok((conv, rel_error(&[got], &[want])))
    }

    /// Read its input (and the output a residual sum adds to) into the cache, as the
    /// model's earlier steps leave them.
    pub(super) fn warm(&self) {
        // SAFETY: a handle `new` made.
        std::hint::black_box(unsafe { (self.dnn.warm)(self.handle) });
    }

    /// The seconds of one call (a residual sum accumulates into the output: for
    /// timing only).
    pub(super) fn time(&self) -> Result<f64> {
        let t = Instant::now();
        // SAFETY: a handle `new` made.
        match unsafe { (self.dnn.run)(self.handle) } {
            0 => Ok(t.elapsed().as_secs_f64()),
            _ => Err(BenchError::Environment(
                "oneDNN: a convolution failed".into(),
            )),
        }
    }
}

impl Drop for Conv<'_> {
    fn drop(&mut self) {
        // SAFETY: a handle `new` made, freed once.
        unsafe { (self.dnn.free)(self.handle) }
    }
}

/// The operator reference: `Conv` over `[x, w, bias]`, then the residual and ReLU.
fn reference(
    layer: &Layer,
    geom: &Geometry,
    [x, w, bias]: [Vec<f32>; 3],
    residual: Option<Vec<f32>>,
) -> Result<Tensor> {
    let g = &geom.g;
    let dims = |d: &[i64]| d.iter().map(|&v| v as usize).collect::<Vec<_>>();
    let t = |shape: Vec<usize>, v: Vec<f32>| {
        Tensor::f32(shape, v).map_err(|e| BenchError::Options(e.to_string()))
    };
    let x = t(dims(&g[0..4]), x)?;
    let w = t(dims(&[g[4], g[1], g[5], g[6]]), w)?;
    let bias = t(vec![g[4] as usize], bias)?;
    let conv = anyshape_tensor::ops::op("Conv")
        .ok_or_else(|| BenchError::Options("no Conv reference".into()))?;
    let ins: [Option<TensorRef>; 3] = [Some(x.view()), Some(w.view()), Some(bias.view())];
    let out = (conv.eval)(&layer.node(), &ins).map_err(|e| BenchError::Options(e.to_string()))?;
    let mut y = out
        .into_iter()
        .next()
        .ok_or_else(|| BenchError::Options("no Conv output".into()))?;
    let v = y
        .f32_mut()
        .map_err(|e| BenchError::Options(e.to_string()))?;
    for (i, v) in v.iter_mut().enumerate() {
        if let Some(r) = &residual {
            *v += r[i];
        }
        if geom.relu {
            *v = v.max(0.0);
        }
    }
    Ok(y)
}
