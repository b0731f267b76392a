//! Calling compiled kernels: their signature, loading their libraries, their status codes.
use anyshape_codegen::c;

/// Signature of every generated kernel and of a module's entry point (see `anyshape_codegen::c`).
pub type KernelFn = unsafe extern "C" fn(*const i64, *const *const f32, *const *mut f32) -> i32;

/// Signature of a module's tree walk: shape-var values to a micro-kernel index.
pub type SelectFn = unsafe extern "C" fn(*const i64) -> i32;

/// What a kernel's non-zero return status means.
pub fn status_message(status: i32) -> String {
    match status {
        c::STATUS_OK => "ok".into(),
        c::STATUS_WRONG_SHAPE => {
            format!("status {status}: a specialized kernel was called with other shape-var values")
        }
        c::STATUS_NO_MEMORY => format!("status {status}: out of scratch memory"),
        c::STATUS_NO_KERNEL => format!("status {status}: the dispatcher found no kernel"),
        s => format!("status {s}"),
    }
}

/// Load a kernel library. It is never unloaded (`RTLD_NODELETE`): its OpenMP runtime
/// keeps worker threads alive, and unloading their code under them would crash.
///
/// # Safety
/// The library must be one anyshape built (its initializers are the C runtime's).
pub unsafe fn load_library(
    path: &std::path::Path,
) -> Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
        #[cfg(target_os = "linux")]
        const RTLD_NODELETE: i32 = 0x1000;
        #[cfg(not(target_os = "linux"))]
        const RTLD_NODELETE: i32 = 0x80;
        // SAFETY: forwarded to the caller.
        unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: forwarded to the caller.
        unsafe { libloading::Library::new(path) }
    }
}
