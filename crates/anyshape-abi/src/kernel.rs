//! The kernel ABI: every generated kernel, and a module's entry point, is
//! `int32_t NAME(const int64_t *vars, const float *const *ins, float *const *outs)`
//! with `vars` the workload's shape vars sorted by name; it returns a status below.
//! A module's tree walk is `int32_t anyshape_module_select(const int64_t *vars)`; its
//! parallel loop [`PARALLEL_SYMBOL`].

/// The C parameter list of every kernel (after its name).
pub const KERNEL_SIGNATURE: &str =
    "(const int64_t *restrict vars, const float *const *restrict ins, float *const *restrict outs)";

/// Signature of every generated kernel and of a module's entry point.
pub type KernelFn = unsafe extern "C" fn(*const i64, *const *const f32, *const *mut f32) -> i32;

/// Signature of a module's tree walk: shape-var values to a micro-kernel index.
pub type SelectFn = unsafe extern "C" fn(*const i64) -> i32;

/// Name of a module's entry point: dispatches any instance to its kernel.
pub const ENTRY_SYMBOL: &str = "anyshape_module_run";
/// Name of a module's tree walk alone: returns the index of the micro-kernel it picks.
pub const SELECT_SYMBOL: &str = "anyshape_module_select";

/// Name of a module's parallel loop: `void NAME(int64_t parts, void (*part)(void *ctx,
/// int64_t i), void *ctx)` calls `part(ctx, i)` for every `i` in `0..parts` on the
/// threads its kernels run on (OpenMP's team, in contiguous runs of `i` per thread), so
/// that a model's host steps split their work over the same threads. Modules written
/// before it lack it (their host steps run on one thread).
pub const PARALLEL_SYMBOL: &str = "anyshape_module_parallel";

/// Signature of a module's parallel loop ([`PARALLEL_SYMBOL`]).
pub type ParallelFn = unsafe extern "C" fn(
    i64,
    unsafe extern "C" fn(*mut std::ffi::c_void, i64),
    *mut std::ffi::c_void,
);

/// Status: success.
pub const STATUS_OK: i32 = 0;
/// Status: a specialized kernel got other shape-var values than it was built for.
pub const STATUS_WRONG_SHAPE: i32 = 1;
/// Status: scratch memory could not be allocated.
pub const STATUS_NO_MEMORY: i32 = 2;
/// Status of a module's entry point: the dispatcher chose no kernel (a corrupted module).
pub const STATUS_NO_KERNEL: i32 = 3;
/// Status: a kernel on AMX tiles found no tiles: the operating system refused this
/// process their state, or the kernel was built for a CPU without them.
pub const STATUS_NO_TILES: i32 = 4;

/// What a kernel's status means, in words.
pub fn status_message(status: i32) -> String {
    match status {
        STATUS_OK => "ok".into(),
        STATUS_WRONG_SHAPE => {
            format!("status {status}: a specialized kernel was called with other shape-var values")
        }
        STATUS_NO_MEMORY => format!("status {status}: out of scratch memory"),
        STATUS_NO_KERNEL => format!("status {status}: the dispatcher found no kernel"),
        STATUS_NO_TILES => format!(
            "status {status}: AMX tiles are unavailable to this process (the OS refused their \
             state, or the CPU lacks them): compile the model again on this machine"
        ),
        s => format!("status {s}"),
    }
}

/// Why a kernel library or one of its symbols could not be loaded.
pub type LoadError = libloading::Error;

/// Open a kernel library. It is never unloaded (`RTLD_NODELETE`): its OpenMP runtime
/// keeps worker threads alive, and unloading their code under them would crash.
///
/// # Safety
/// The library must be one anyshape built (its initializers are the C runtime's).
pub unsafe fn load_library(path: &std::path::Path) -> Result<libloading::Library, LoadError> {
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
