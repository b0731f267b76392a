//! What the host CPU offers compiled kernels: the instruction-set extensions a module
//! built here may use, and a module loaded here must find.

/// Instruction-set extensions of this CPU that compiled code may use (the ISA flags of
/// `/proc/cpuinfo`: `avx512f`, `fma`, `amx_tile`, …), sorted. Kernels are built with
/// `-march=native`, so a library built here may need every one of them.
pub fn host_cpu_features() -> Vec<String> {
    const ISA: [&str; 16] = [
        "sse",
        "ssse3",
        "avx",
        "fma",
        "f16c",
        "bmi",
        "amx",
        "popcnt",
        "movbe",
        "adx",
        "sha_ni",
        "vaes",
        "vpclmulqdq",
        "gfni",
        "abm",
        "asimd",
    ];
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return Vec::new();
    };
    let Some(flags) = info
        .lines()
        .find(|l| l.starts_with("flags") || l.starts_with("Features"))
        .and_then(|l| l.split(':').nth(1))
    else {
        return Vec::new();
    };
    let mut out: Vec<String> = flags
        .split_whitespace()
        .filter(|f| ISA.iter().any(|p| f.starts_with(p)))
        .map(String::from)
        .collect();
    out.sort();
    out.dedup();
    out
}
