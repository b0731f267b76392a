//! A loaded module: checked on load, callable for any instance of its workload; the
//! threads its kernels run on, lent to other work through its parallel loop
//! ([`Threads`]).
use crate::{Result, RuntimeError};
use anyshape_abi::{
    check_cpu, check_files, host_cpu_features, load_library, read_manifest, status_message,
    DispatchTree, KernelFn, Manifest, ModuleError, ParallelFn, SelectFn, ENTRY_SYMBOL,
    MANIFEST_FILE, PARALLEL_SYMBOL, SELECT_SYMBOL, STATUS_OK,
};
use anyshape_ir::{Bindings, BoundWorkload, Workload};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Which kernel serves an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dispatch {
    /// Index of the micro-kernel in the manifest.
    pub micro_kernel: usize,
    /// The kernel's symbol.
    pub symbol: String,
    /// A kernel specialized for exactly this instance (else the symbolic one).
    pub specialized: bool,
}

/// A loaded module.
pub struct Module {
    dir: PathBuf,
    manifest: Manifest,
    workload: Workload,
    vars: Vec<String>,
    entry: KernelFn,
    select: SelectFn,
    /// The parallel loop over the kernels' threads (absent in modules older than it).
    parallel: Option<ParallelFn>,
    kernels: HashMap<String, KernelFn>,
    specialized: HashMap<Bindings, usize>,
    /// Buffer lengths of the instance checked last (repeated shapes skip binding).
    last: Mutex<Option<(Bindings, Vec<usize>)>>,
    // Keeps the library mapped (it is never unloaded anyway: see `load_library`).
    _library: libloading::Library,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("dir", &self.dir)
            .field("workload", &self.manifest.workload)
            .finish_non_exhaustive()
    }
}

impl Module {
    /// Load the module in directory `path`: its manifest must be intact and of this
    /// anyshape version, every file must match its checksum, and this CPU must have the
    /// instruction-set extensions the kernels were compiled for.
    pub fn load(path: impl AsRef<Path>) -> Result<Module> {
        let dir = path.as_ref().to_path_buf();
        let manifest = read_manifest(&dir)?;
        check_files(&manifest, &dir)?;
        check_cpu(&manifest, &host_cpu_features())?;
        let bad = |reason: String| {
            RuntimeError::Module(ModuleError::BadManifest {
                path: dir.join(MANIFEST_FILE).display().to_string(),
                reason,
            })
        };
        let workload = Workload::parse(&manifest.workload).map_err(|e| bad(e.to_string()))?;
        let vars = workload.shape_vars();
        let n = manifest.micro_kernels.len();
        if manifest.dispatch.depth() > DispatchTree::MAX_DEPTH {
            return Err(bad(format!(
                "the dispatch tree is {} levels deep; at most {} are allowed",
                manifest.dispatch.depth(),
                DispatchTree::MAX_DEPTH
            )));
        }
        if manifest.symbolic.len() != n
            || manifest.dispatch.max_kernel() >= n
            || manifest.specialized.iter().any(|s| s.micro_kernel >= n)
        {
            return Err(bad("kernel indices out of range".into()));
        }
        let lib_path = dir.join(&manifest.library);
        let load_err = |reason: String| RuntimeError::Load {
            path: lib_path.display().to_string(),
            reason,
        };
        // SAFETY: the library's checksum matches the manifest anyshape wrote with it.
        let library = unsafe { load_library(&lib_path) }.map_err(|e| load_err(e.to_string()))?;
        let get = |sym: &str| -> Result<KernelFn> {
            // SAFETY: every kernel and the entry point have the `KernelFn` signature.
            unsafe { library.get::<KernelFn>(sym.as_bytes()) }
                .map(|f| *f)
                .map_err(|e| load_err(format!("symbol {sym}: {e}")))
        };
        let entry = get(ENTRY_SYMBOL)?;
        // SAFETY: the select function has the `SelectFn` signature.
        let select = unsafe { library.get::<SelectFn>(SELECT_SYMBOL.as_bytes()) }
            .map(|f| *f)
            .map_err(|e| load_err(format!("symbol {SELECT_SYMBOL}: {e}")))?;
        // SAFETY: the parallel loop has the `ParallelFn` signature.
        let parallel = unsafe { library.get::<ParallelFn>(PARALLEL_SYMBOL.as_bytes()) }
            .ok()
            .map(|f| *f);
        let mut kernels = HashMap::new();
        for sym in manifest
            .symbolic
            .iter()
            .chain(manifest.specialized.iter().map(|s| &s.symbol))
        {
            kernels.insert(sym.clone(), get(sym)?);
        }
        let specialized = manifest
            .specialized
            .iter()
            .enumerate()
            .map(|(i, s)| (s.bindings.clone(), i))
            .collect();
        Ok(Module {
            dir,
            manifest,
            workload,
            vars,
            entry,
            select,
            parallel,
            kernels,
            specialized,
            last: Mutex::new(None),
            _library: library,
        })
    }

    /// The module's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The workload it computes.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// Bind shape-var values: every shape var must be given (values >= 0), no other.
    pub fn bind(&self, bindings: &Bindings) -> Result<BoundWorkload> {
        if let Some((name, _)) = bindings
            .iter()
            .find(|(n, _)| !self.vars.iter().any(|v| v == n))
        {
            return Err(RuntimeError::UnknownVar {
                name: name.into(),
                workload: self.manifest.workload.clone(),
                vars: self.vars.join(", "),
            });
        }
        Ok(self.workload.bind(bindings)?)
    }

    /// Buffer lengths (inputs, then output) at `bindings`, checked as [`Module::bind`] does.
    fn lens(&self, bindings: &Bindings) -> Result<Vec<usize>> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((b, lens)) = last.as_ref() {
            if b == bindings {
                return Ok(lens.clone());
            }
        }
        let lens = self.bind(bindings)?.lens;
        *last = Some((bindings.clone(), lens.clone()));
        Ok(lens)
    }

    /// Which kernel the module runs for `bindings` (as its compiled dispatcher decides).
    pub fn dispatch(&self, bindings: &Bindings) -> Dispatch {
        if let Some(&i) = self.specialized.get(bindings) {
            let s = &self.manifest.specialized[i];
            return Dispatch {
                micro_kernel: s.micro_kernel,
                symbol: s.symbol.clone(),
                specialized: true,
            };
        }
        let k = self.manifest.dispatch.select(bindings);
        Dispatch {
            micro_kernel: k,
            symbol: self.manifest.symbolic[k].clone(),
            specialized: false,
        }
    }

    /// The micro-kernel index the compiled tree walk returns (the same as
    /// [`Module::dispatch`] for instances without a specialized kernel).
    pub fn select_compiled(&self, bindings: &Bindings) -> i32 {
        let vars = self.var_values(bindings);
        // SAFETY: `vars` has one value per shape var, as the dispatcher reads.
        unsafe { (self.select)(vars.as_ptr()) }
    }

    /// Shape-var values in the kernel ABI's order (unbound ones as 0).
    pub fn var_values(&self, bindings: &Bindings) -> Vec<i64> {
        self.vars
            .iter()
            .map(|v| bindings.get(v).unwrap_or(0))
            .collect()
    }

    /// The threads the module's kernels run on, to split other work over (none in a
    /// module older than its parallel loop).
    pub fn threads(&self) -> Option<Threads> {
        self.parallel.map(Threads)
    }

    /// The module's entry point (dispatcher + kernels), for callers that validated buffers.
    pub fn entry(&self) -> KernelFn {
        self.entry
    }

    /// A kernel of the module by symbol.
    pub fn kernel(&self, symbol: &str) -> Option<KernelFn> {
        self.kernels.get(symbol).copied()
    }

    /// Compute the workload at `bindings`: `inputs` in the workload's order, one output.
    /// Buffer lengths are checked against the bound shapes first. Kernels were tuned on
    /// buffers that start on a cache line (64 bytes, as a framework's tensors do); a
    /// buffer that starts elsewhere gives the same result, possibly slower (up to 20 %
    /// measured): a Rust caller gets such buffers from
    /// [`anyshape_abi::CacheLineAllocator`] as its global allocator.
    pub fn run(
        &self,
        bindings: &Bindings,
        inputs: &[&[f32]],
        outputs: &mut [&mut [f32]],
    ) -> Result<()> {
        self.run_with(self.entry, bindings, inputs, outputs)
    }

    /// Call the module's entry point on raw buffers: `vars` are the shape vars' values in
    /// the workload's order ([`Workload::shape_vars`]).
    ///
    /// # Safety
    /// `ins` must point to the workload's inputs and `out` to its output, each with as
    /// many elements as the bound workload takes at `vars`, valid for the call; `out`
    /// may alias none of the inputs.
    pub unsafe fn call(&self, vars: &[i64], ins: &[*const f32], out: *mut f32) -> Result<()> {
        let outs = [out];
        // SAFETY: the caller's promise; `vars` holds a value per shape var.
        let status = unsafe { (self.entry)(vars.as_ptr(), ins.as_ptr(), outs.as_ptr()) };
        if status == STATUS_OK {
            Ok(())
        } else {
            Err(RuntimeError::Kernel(status_message(status)))
        }
    }

    /// Like [`Module::run`] with a given kernel of the module (see [`Module::kernel`]).
    pub fn run_with(
        &self,
        kernel: KernelFn,
        bindings: &Bindings,
        inputs: &[&[f32]],
        outputs: &mut [&mut [f32]],
    ) -> Result<()> {
        let lens = self.lens(bindings)?;
        let n_in = self.workload.inputs.len();
        if inputs.len() != n_in {
            return Err(RuntimeError::BufferCount {
                what: "input",
                expected: n_in,
                got: inputs.len(),
            });
        }
        if outputs.len() != 1 {
            return Err(RuntimeError::BufferCount {
                what: "output",
                expected: 1,
                got: outputs.len(),
            });
        }
        let given = inputs
            .iter()
            .map(|b| b.len())
            .chain(std::iter::once(outputs[0].len()));
        for ((t, got), &expected) in self.workload.tensors().zip(given).zip(&lens) {
            if got != expected {
                return Err(RuntimeError::BufferLen {
                    tensor: t.name.clone(),
                    bindings: bindings.to_string(),
                    expected,
                    got,
                });
            }
        }
        let vars = self.var_values(bindings);
        let ins: Vec<*const f32> = inputs.iter().map(|b| b.as_ptr()).collect();
        let outs = [outputs[0].as_mut_ptr()];
        // SAFETY: the buffers have the lengths the bound workload gives for these values.
        let status = unsafe { kernel(vars.as_ptr(), ins.as_ptr(), outs.as_ptr()) };
        if status == STATUS_OK {
            Ok(())
        } else {
            Err(RuntimeError::Kernel(status_message(status)))
        }
    }
}

/// The threads a module's kernels run on (its parallel loop), lent to other work.
#[derive(Clone, Copy)]
pub struct Threads(ParallelFn);

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Threads")
    }
}

/// What one call of the parallel loop carries to its parts: the part, and the first
/// panic of any (a panic must not unwind through C: it is caught and resumed after).
struct Parts<'a> {
    part: &'a (dyn Fn(usize) + Sync),
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// Part `i` of the work at `ctx` (a `Parts`), called by the parallel loop.
unsafe extern "C" fn run_part(ctx: *mut std::ffi::c_void, i: i64) {
    // SAFETY: `ctx` is the `Parts` that `Threads::split` passed, alive for its call.
    let parts = unsafe { &*(ctx as *const Parts) };
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (parts.part)(i as usize)));
    if let Err(p) = done {
        parts
            .panic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(p);
    }
}

// SAFETY: OpenMP's `parallel for` runs each iteration once and joins its team before
// the loop returns.
unsafe impl anyshape_tensor::Split for Threads {
    fn split(&self, parts: usize, part: &(dyn Fn(usize) + Sync)) {
        let ctx = Parts {
            part,
            panic: Mutex::new(None),
        };
        // SAFETY: the loop calls `run_part` with `ctx` for each part, on its threads,
        // and returns when all are done; `ctx` outlives the call; `part` is `Sync`.
        unsafe { (self.0)(parts as i64, run_part, &ctx as *const Parts as *mut _) };
        if let Some(p) = ctx.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            std::panic::resume_unwind(p);
        }
    }
}
