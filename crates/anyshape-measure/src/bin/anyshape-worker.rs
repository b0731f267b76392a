//! The measuring worker as a stand-alone program (the `anyshape` CLI embeds the same
//! worker as `anyshape __worker`).
/// Buffers on cache lines, as in the `anyshape` CLI (see [`anyshape_abi::CacheLineAllocator`]).
#[global_allocator]
static ALLOCATOR: anyshape_abi::CacheLineAllocator = anyshape_abi::CacheLineAllocator;

fn main() {
    std::process::exit(anyshape_measure::worker::serve());
}
