//! The contract between generated kernels and whatever calls them: the kernel ABI (the
//! C signature every kernel and a module's entry point share, its status codes, how a
//! kernel library is opened, where its buffers start, whether they fit), the dispatch tree,
//! and the modules' manifests: their types, reading and writing them, checking a module
//! against its manifest, and what a module owns.
//!
//! The code generator writes to this contract and the runtime reads by it; neither
//! needs the other. This crate knows shape vars and workloads as text (`anyshape-ir`);
//! it knows nothing of sketches, targets, compiling, measuring or searching.
#![deny(missing_docs)]

mod alloc;
mod cpu;
mod dispatch;
mod error;
mod kernel;
mod manifest;
mod memory;
mod model;
mod read;

pub use alloc::{allocations, CacheLineAllocator, ALIGN_FROM_BYTES, BUFFER_ALIGN};
pub use cpu::host_cpu_features;
pub use dispatch::DispatchTree;
pub use error::ModuleError;
pub use kernel::{
    load_library, status_message, KernelFn, LoadError, ParallelFn, SelectFn, ENTRY_SYMBOL,
    KERNEL_SIGNATURE, PARALLEL_SYMBOL, SELECT_SYMBOL, STATUS_NO_KERNEL, STATUS_NO_MEMORY,
    STATUS_NO_TILES, STATUS_OK, STATUS_WRONG_SHAPE,
};
pub use manifest::{
    sha256_hex, FileEntry, HashingWriter, Manifest, SpecializedKernel, TuningInfo, Vote,
    FORMAT_VERSION, HEADER_FILE, MANIFEST_FILE,
};
pub use memory::{check_fits, gib, memory};
pub use model::{ModelManifest, ModelTask, Source, MODEL_FILE, MODEL_FORMAT, MODEL_PLAN};
pub use read::{
    check_cpu, check_file, check_files, listed_files, read_file, read_manifest,
    read_model_manifest, write_manifest, ModuleKind, MANIFEST_LIMIT, MODULE_FILE_LIMIT,
};
