//! CPU targets: what the rest of the system may assume about the machine (cores, SIMD
//! width, vector registers, cache sizes), detected at run time or read from JSON.
use crate::loop_ir::Func;
use crate::{CodegenError, Result};
use serde::{Deserialize, Serialize};

/// The widest SIMD instruction set the generated code may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Simd {
    /// Scalar code only.
    None,
    /// 128-bit SSE.
    Sse,
    /// 256-bit AVX2 with FMA.
    Avx2,
    /// 512-bit AVX-512F.
    Avx512,
    /// 128-bit Arm NEON.
    Neon,
}

impl Simd {
    /// Vector width in bytes (4 for scalar code).
    pub fn vector_bytes(self) -> usize {
        match self {
            Simd::None => 4,
            Simd::Sse | Simd::Neon => 16,
            Simd::Avx2 => 32,
            Simd::Avx512 => 64,
        }
    }
}

/// A CPU target description.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuTarget {
    /// Human-readable model name.
    pub name: String,
    /// Cores the kernels may run on.
    pub cores: usize,
    /// SIMD instruction set.
    pub simd: Simd,
    /// Number of architectural vector registers.
    pub vector_registers: usize,
    /// L1 data cache per core, bytes.
    pub l1d_bytes: usize,
    /// L2 cache per core, bytes.
    pub l2_bytes: usize,
    /// Last-level cache (shared), bytes.
    pub l3_bytes: usize,
    /// AMX with bfloat16 tiles (`amx_tile`, `amx_bf16`), and the OS grants this process
    /// their state: a bf16 contraction may run its products on tiles
    /// (`ContractionKernel::amx`). Absent from the JSON form when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub amx: bool,
    /// AVX512_BF16 (`vdpbf16ps`, the products of bfloat16 pairs in f32): a bf16
    /// attention may run its products on pairs (`AttentionKernel::pairs`). Absent from
    /// the JSON form when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub avx512_bf16: bool,
    /// AVX512_VNNI (`vpdpbusd`, the products of four bytes summed in 32-bit integers):
    /// what an i8 contraction's products run on (elsewhere byte by byte). Absent from
    /// the JSON form when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub avx512_vnni: bool,
}

impl CpuTarget {
    /// Detect the machine this process runs on.
    pub fn detect() -> CpuTarget {
        let simd = detect_simd();
        let vector_registers = match simd {
            Simd::Avx512 | Simd::Neon => 32,
            _ => 16,
        };
        let cache = |level: &str, fallback: usize| read_cache_size(level).unwrap_or(fallback);
        CpuTarget {
            name: read_model_name().unwrap_or_else(|| std::env::consts::ARCH.to_string()),
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            simd,
            vector_registers,
            l1d_bytes: cache("1", 32 << 10),
            l2_bytes: cache("2", 1 << 20),
            l3_bytes: cache("3", 8 << 20),
            amx: simd == Simd::Avx512 && detect_amx(),
            avx512_bf16: simd == Simd::Avx512 && host_has("avx512_bf16"),
            avx512_vnni: simd == Simd::Avx512 && host_has("avx512_vnni"),
        }
    }

    /// Read a JSON description (the form `anyshape target` prints).
    pub fn from_json(text: &str) -> Result<CpuTarget> {
        let t: CpuTarget =
            serde_json::from_str(text).map_err(|e| CodegenError::BadTarget(e.to_string()))?;
        if t.cores == 0
            || t.vector_registers < 4
            || t.l1d_bytes == 0
            || t.l2_bytes == 0
            || t.l3_bytes == 0
        {
            return Err(CodegenError::BadTarget(
                "cores, vector_registers and cache sizes must be positive".into(),
            ));
        }
        Ok(t)
    }

    /// f32 lanes per vector register.
    pub fn lanes_f32(&self) -> usize {
        self.simd.vector_bytes() / 4
    }

    /// A fixed AVX-512 target of 2 cores (48 KB L1d, 2 MB L2, 32 MB L3, no AMX) for
    /// the crate's tests, whatever the machine running them.
    #[cfg(test)]
    pub(crate) fn avx512_for_tests() -> CpuTarget {
        CpuTarget {
            name: "test".into(),
            cores: 2,
            simd: Simd::Avx512,
            vector_registers: 32,
            l1d_bytes: 48 << 10,
            l2_bytes: 2 << 20,
            l3_bytes: 32 << 20,
            amx: false,
            avx512_bf16: false,
            avx512_vnni: false,
        }
    }
}

/// Whether this host's CPU has the feature flag `flag` (as Linux names it).
fn host_has(flag: &str) -> bool {
    anyshape_abi::host_cpu_features().iter().any(|f| f == flag)
}

#[cfg(target_arch = "x86_64")]
fn detect_simd() -> Simd {
    if std::arch::is_x86_feature_detected!("avx512f") {
        Simd::Avx512
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        Simd::Avx2
    } else {
        Simd::Sse
    }
}

/// Whether the CPU has AMX's bfloat16 tiles and Linux grants this process their state
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: once per process, what a
/// kernel's first tile instruction needs; the kernels ask again, in whichever process
/// runs them).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect_amx() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    let flags = anyshape_abi::host_cpu_features();
    let has = |f: &str| flags.iter().any(|x| x == f);
    // SAFETY: arch_prctl with this request reads two integers and changes only the
    // process's permitted extended state.
    has("amx_tile")
        && has("amx_bf16")
        && unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        } == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect_amx() -> bool {
    false
}

#[cfg(target_arch = "aarch64")]
fn detect_simd() -> Simd {
    Simd::Neon
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_simd() -> Simd {
    Simd::None
}

impl super::Target for CpuTarget {
    const DEVICE: super::DeviceKind = super::DeviceKind::Cpu;

    fn name(&self) -> &str {
        &self.name
    }

    fn describe(&self) -> String {
        let amx = if self.amx { ", AMX-BF16" } else { "" };
        format!("{} ({} cores, {:?}{amx})", self.name, self.cores, self.simd)
    }

    fn prelude(&self) -> String {
        crate::render::prelude(crate::render::Dialect::C, self.lanes_f32(), self.amx)
    }

    fn render(&self, f: &Func) -> String {
        crate::render::render(f, crate::render::Dialect::C, self.lanes_f32(), self.cores)
    }
}

/// Size of the data/unified cache of the given level for cpu0, from sysfs.
fn read_cache_size(level: &str) -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    for entry in dir.flatten() {
        let read = |f: &str| {
            std::fs::read_to_string(entry.path().join(f))
                .ok()
                .map(|s| s.trim().to_string())
        };
        let (Some(lvl), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
        else {
            continue;
        };
        if lvl != level || kind == "Instruction" {
            continue;
        }
        let (num, mult) = match size.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size.as_str(), 1),
            },
        };
        return num.parse::<usize>().ok().map(|n| n * mult);
    }
    None
}

fn read_model_name() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_something_sane_and_round_trips() {
        let t = CpuTarget::detect();
        assert!(t.cores >= 1 && t.lanes_f32() >= 1 && t.l1d_bytes >= 1024);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(CpuTarget::from_json(&json).unwrap(), t);
        assert!(CpuTarget::from_json("{}").is_err());
        assert!(CpuTarget::from_json(&json.replace("{", "{\"turbo\":true,")).is_err());
        assert!(CpuTarget::from_json(
            &json.replace(&format!("\"cores\":{}", t.cores), "\"cores\":0")
        )
        .is_err());
    }
}
