//! Vendor baselines: OpenBLAS (`cblas_sgemm`: one multi-threaded call per batch item, or
//! an OpenMP loop over the batch with one-threaded calls) and oneDNN (a matmul
//! primitive, batched natively), each as a C function with anyshape's kernel ABI,
//! compiled against the system's headers and linked to the system library; and the
//! `gemm` crate, built into the worker ([`crate::BUILTINS`]). A library that is missing
//! fails its own build only: the bench goes on without it.
//!
//! Layouts come from the workload: the strides of each tensor along the GEMM axes
//! decide transposition (BLAS) or the memory descriptors (oneDNN), so any contraction
//! the sketch accepts with a unit stride along N or K works.
use anyshape_codegen::render::expr;
use anyshape_codegen::{CpuTarget, DeviceKind, GemmView};
use anyshape_ir::{Expr, Workload};
use anyshape_measure::{Builder, KernelSource, Kernels};
use std::fmt::Write;
use std::path::Path;

/// One vendor variant: its label in reports and its symbol.
#[derive(Clone, Debug)]
pub struct VendorKernel {
    /// Report label, e.g. `openblas` or `openblas-omp`.
    pub name: String,
    /// The kernel's symbol in its library.
    pub symbol: String,
}

/// A vendor library built for a workload, or why it is unavailable.
#[derive(Clone, Debug)]
pub struct VendorLibrary {
    /// `gemm crate`, `OpenBLAS` or `oneDNN`.
    pub vendor: &'static str,
    /// Where the variants are, or the reason there are none.
    pub built: Result<(Kernels, Vec<VendorKernel>), String>,
}

/// Every vendor, as named in [`VendorLibrary::vendor`].
const VENDORS: [&str; 3] = ["gemm crate", "OpenBLAS", "oneDNN"];

/// The C prelude of a shim: shape vars, extents and strides of the GEMM view.
fn prelude(w: &Workload, g: &GemmView) -> String {
    let mut s = String::new();
    for (i, v) in w.shape_vars().iter().enumerate() {
        let _ = writeln!(s, "  const int64_t {v} = vars[{i}]; (void){v};");
    }
    let e = |x: &Expr| expr(x);
    let batch = g.batch.first().map(|&b| e(&w.axes[b].extent));
    let _ = writeln!(
        s,
        "  const int64_t NB = {};",
        batch.unwrap_or_else(|| "1".into())
    );
    let _ = writeln!(s, "  const int64_t M = {};", e(&w.axes[g.m].extent));
    let _ = writeln!(s, "  const int64_t N = {};", e(&w.axes[g.n].extent));
    let _ = writeln!(s, "  const int64_t K = {};", e(&w.axes[g.k].extent));
    let tensors = [
        ("a", &w.inputs[0], [g.m, g.k]),
        ("b", &w.inputs[1], [g.k, g.n]),
        ("c", &w.output, [g.m, g.n]),
    ];
    for (name, t, [r, col]) in tensors {
        let sb = g
            .batch
            .first()
            .map_or("0".into(), |&b| e(&t.axis_stride(b)));
        let _ = writeln!(
            s,
            "  const int64_t {name}b = {sb}, {name}r = {}, {name}c = {}, {name}o = {};",
            e(&t.axis_stride(r)),
            e(&t.axis_stride(col)),
            e(&t.base_offset())
        );
    }
    s.push_str("  if (M == 0 || N == 0 || NB == 0) return 0;\n");
    s.push_str("  if (K == 0) { for (int64_t b = 0; b < NB; b++) for (int64_t i = 0; i < M; i++) for (int64_t j = 0; j < N; j++) outs[0][co + b * cb + i * cr + j * cc] = 0.0f; return 0; }\n");
    s
}

/// A vendor, its header, its link flag and its kernels `(name, C source)`.
type Variant = (
    &'static str,
    &'static str,
    &'static str,
    Vec<(&'static str, String)>,
);

/// Debian's OpenMP build of OpenBLAS (package `libopenblas0-openmp`), used when present.
const OPENBLAS_OPENMP: &str = "/usr/lib/x86_64-linux-gnu/openblas-openmp";

const SIG: &str = "(const int64_t *vars, const float *const *ins, float *const *outs)";

fn openblas_source(w: &Workload, g: &GemmView, symbol: &str, omp: bool) -> String {
    let mut s = format!("int32_t {symbol}{SIG} {{\n{}", prelude(w, g));
    s.push_str(
        r#"  enum CBLAS_TRANSPOSE ta, tb; int64_t lda, ldb;
  if (ac == 1) { ta = CblasNoTrans; lda = ar; } else if (ar == 1) { ta = CblasTrans; lda = ac; } else return 4;
  if (bc == 1) { tb = CblasNoTrans; ldb = br; } else if (br == 1) { tb = CblasTrans; ldb = bc; } else return 4;
  if (cc != 1) return 4;
"#,
    );
    let call = "cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, ins[0] + ao + b * ab, lda, ins[1] + bo + b * bb, ldb, 0.0f, outs[0] + co + b * cb, cr);";
    if omp {
        let _ = write!(
            s,
            "  /* One thread per call, the batch spread over the cores (not restored: each\n     bench worker process runs one variant, and switching costs a thread wake-up). */\n  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);\n#pragma omp parallel for schedule(static)\n  for (int64_t b = 0; b < NB; b++) {call}\n"
        );
    } else {
        let _ = writeln!(s, "  for (int64_t b = 0; b < NB; b++) {call}");
    }
    s.push_str("  return 0;\n}\n");
    s
}

fn onednn_source(w: &Workload, g: &GemmView, symbol: &str) -> String {
    let mut s = String::from(
        r#"/* One cached primitive (the last shape): created on the first call for a shape,
   which the runner's untimed warm-up call makes. Not thread-safe: one caller. */
static dnnl_engine_t as_eng;
static dnnl_stream_t as_str;
static dnnl_primitive_t as_prim;
static dnnl_memory_t as_mem[3];
static int64_t as_key[13];
"#,
    );
    let _ = write!(s, "int32_t {symbol}{SIG} {{\n{}", prelude(w, g));
    s.push_str(
        r#"  if (!as_eng) {
    if (dnnl_engine_create(&as_eng, dnnl_cpu, 0) != dnnl_success) return 5;
    if (dnnl_stream_create(&as_str, as_eng, dnnl_stream_default_flags) != dnnl_success) return 5;
  }
  int64_t key[13] = {NB, M, N, K, ab, ar, ac, bb, br, bc, cb, cr, cc};
  if (!as_prim || memcmp(key, as_key, sizeof key) != 0) {
    if (as_prim) { dnnl_primitive_destroy(as_prim); for (int i = 0; i < 3; i++) dnnl_memory_destroy(as_mem[i]); as_prim = 0; }
    int nd = NB > 1 || ab != 0 ? 3 : 2;
    int64_t dims[3][2] = {{M, K}, {K, N}, {M, N}};
    int64_t str[3][3] = {{ab, ar, ac}, {bb, br, bc}, {cb, cr, cc}};
    dnnl_memory_desc_t md[3];
    for (int t = 0; t < 3; t++) {
      dnnl_dims_t d, st;
      int o = nd - 2;
      if (nd == 3) { d[0] = NB; st[0] = str[t][0] ? str[t][0] : 1; }
      d[o] = dims[t][0]; d[o + 1] = dims[t][1];
      st[o] = str[t][1]; st[o + 1] = str[t][2];
      if (dnnl_memory_desc_init_by_strides(&md[t], nd, d, dnnl_f32, st) != dnnl_success) return 5;
    }
    dnnl_matmul_desc_t desc;
    if (dnnl_matmul_desc_init(&desc, &md[0], &md[1], NULL, &md[2]) != dnnl_success) return 5;
    dnnl_primitive_desc_t pd;
    if (dnnl_primitive_desc_create(&pd, &desc, NULL, as_eng, NULL) != dnnl_success) return 5;
    dnnl_status_t st = dnnl_primitive_create(&as_prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) { as_prim = 0; return 5; }
    for (int t = 0; t < 3; t++)
      if (dnnl_memory_create(&as_mem[t], &md[t], as_eng, DNNL_MEMORY_NONE) != dnnl_success) return 5;
    memcpy(as_key, key, sizeof key);
  }
  dnnl_memory_set_data_handle(as_mem[0], (void *)(ins[0] + ao));
  dnnl_memory_set_data_handle(as_mem[1], (void *)(ins[1] + bo));
  dnnl_memory_set_data_handle(as_mem[2], (void *)(outs[0] + co));
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, as_mem[0]}, {DNNL_ARG_WEIGHTS, as_mem[1]}, {DNNL_ARG_DST, as_mem[2]}};
  if (dnnl_primitive_execute(as_prim, as_str, 3, args) != dnnl_success) return 5;
  if (dnnl_stream_wait(as_str) != dnnl_success) return 5;
  return 0;
}
"#,
    );
    s
}

/// Build the vendor baselines for `w`: one library per vendor, each linked to its
/// system library. A vendor whose headers or library are missing is reported, not fatal.
pub fn build_vendors(w: &Workload, target: &CpuTarget, builder: &Builder) -> Vec<VendorLibrary> {
    let g = match GemmView::of(w) {
        Ok(g) if g.batch.len() <= 1 && w.epilogue.is_empty() => g,
        Ok(_) => {
            let why = format!("{w}: vendor baselines need at most one batch axis and no epilogue");
            return VENDORS
                .map(|vendor| VendorLibrary {
                    vendor,
                    built: Err(why.clone()),
                })
                .to_vec();
        }
        Err(e) => {
            return VENDORS
                .map(|vendor| VendorLibrary {
                    vendor,
                    built: Err(e.to_string()),
                })
                .to_vec()
        }
    };
    let mut gemm = vec![VendorKernel {
        name: "gemm".into(),
        symbol: "gemm".into(),
    }];
    if !g.batch.is_empty() {
        gemm.push(VendorKernel {
            name: "gemm-par".into(),
            symbol: "gemm_par".into(),
        });
    }
    let mut out = vec![VendorLibrary {
        vendor: "gemm crate",
        built: Ok((Kernels::Builtin(DeviceKind::Cpu), gemm)),
    }];
    let mut blas = vec![(
        "openblas",
        openblas_source(w, &g, "as_vendor_openblas", false),
    )];
    if !g.batch.is_empty() {
        blas.push((
            "openblas-omp",
            openblas_source(w, &g, "as_vendor_openblas_omp", true),
        ));
    }
    let variants: [Variant; 2] = [
        ("OpenBLAS", "#include <cblas.h>\n", "-lopenblas", blas),
        (
            "oneDNN",
            "#include <dnnl.h>\n",
            "-ldnnl",
            vec![("onednn", onednn_source(w, &g, "as_vendor_onednn"))],
        ),
    ];
    for (vendor, include, lib, kernels) in variants {
        let mut b = builder.clone();
        if vendor == "OpenBLAS" && Path::new(OPENBLAS_OPENMP).exists() {
            // The OpenMP build: one-threaded inside an OpenMP loop, without the pthread
            // build's stalls when several threads call it at once.
            b.link_flags.extend([
                format!("-L{OPENBLAS_OPENMP}"),
                format!("-Wl,-rpath,{OPENBLAS_OPENMP}"),
            ]);
        }
        b.link_flags.push(lib.into());
        let sources: Vec<KernelSource> = kernels
            .iter()
            .map(|(name, code)| KernelSource {
                symbol: format!("as_vendor_{}", name.replace('-', "_")),
                code: format!("{include}{code}"),
            })
            .collect();
        let built = match b.build(target, &sources) {
            Err(e) => Err(e.to_string()),
            Ok(l) if !l.failed.is_empty() => Err(format!(
                "cannot build against {vendor} (install {}): {}",
                if vendor == "oneDNN" {
                    "libdnnl-dev"
                } else {
                    "libopenblas-dev"
                },
                l.failed
                    .values()
                    .next()
                    .map_or("", |e| e.lines().next().unwrap_or(""))
            )),
            Ok(l) => Ok((
                l.kernels(),
                kernels
                    .iter()
                    .zip(&sources)
                    .map(|((name, _), s)| VendorKernel {
                        name: name.to_string(),
                        symbol: s.symbol.clone(),
                    })
                    .collect(),
            )),
        };
        out.push(VendorLibrary { vendor, built });
    }
    out
}
