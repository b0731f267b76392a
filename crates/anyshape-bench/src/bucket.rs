//! Global padding, the bucketing baseline: a kernel specialized for a bucket's largest
//! instance serves every smaller instance of the bucket. The wrapper copies each input
//! whose shape differs into a zero-filled buffer of the bucket's shape, calls the
//! specialized kernel, and copies the output's valid part back. Zeros along a reduction
//! axis add nothing and padded output rows or columns are dropped, so the result is
//! exact for any contraction whose tensors are indexed by plain axes.
use anyshape_abi::{STATUS_NO_MEMORY, STATUS_WRONG_SHAPE};
use anyshape_codegen::render::expr;
use anyshape_codegen::{CodegenError, Result};
use anyshape_ir::{Bindings, Workload};
use std::fmt::Write;

/// C source of `symbol` (the kernel ABI) running `inner`, a kernel specialized for the
/// instance `bucket`, on any instance no larger than `bucket` in every shape var; larger
/// ones get `STATUS_WRONG_SHAPE`. Padding buffers are per thread and kept across calls.
pub fn bucket_c(w: &Workload, bucket: &Bindings, symbol: &str, inner: &str) -> Result<String> {
    let plain = w.inputs.iter().chain([&w.output]).all(|t| {
        t.panels.is_none()
            && t.index
                .iter()
                .all(|ix| ix.offset == 0 && ix.terms.len() == 1 && ix.terms[0].1 == 1)
    });
    if !plain {
        return Err(CodegenError::SketchNotApplicable {
            workload: w.to_string(),
            reason:
                "global padding needs every tensor row-major, each dimension indexed by one axis"
                    .into(),
        });
    }
    let big = w.bind(bucket)?;
    let vars = w.shape_vars();
    let sig = "(const int64_t *vars, const float *const *ins, float *const *outs)";
    let mut s = format!("int32_t {inner}{sig};\nint32_t {symbol}{sig} {{\n");
    let mut big_vars = Vec::new();
    for (i, v) in vars.iter().enumerate() {
        let b = bucket
            .get(v)
            .ok_or_else(|| CodegenError::Unspecialized(format!("{v} has no bucket value")))?;
        big_vars.push(b.to_string());
        let _ = writeln!(
            s,
            "  const int64_t {v} = vars[{i}];\n  if ({v} < 0 || {v} > {b}) return {};",
            STATUS_WRONG_SHAPE
        );
    }
    let n = w.inputs.len() + 1;
    let _ = writeln!(
        s,
        "  static const int64_t as_big[{}] = {{{}}};",
        vars.len().max(1),
        if big_vars.is_empty() {
            "0".into()
        } else {
            big_vars.join(", ")
        }
    );
    let _ = writeln!(
        s,
        "  static __thread float *as_pad[{n}];\n  static __thread int64_t as_cap[{n}];\n  const float *as_in[{}];\n  float *as_out[1];",
        w.inputs.len().max(1)
    );
    for (t, tensor) in w.inputs.iter().chain([&w.output]).enumerate() {
        let is_out = t == w.inputs.len();
        let rank = tensor.shape.len();
        let small: Vec<String> = tensor.shape.iter().map(expr).collect();
        let large = &big.shapes[t];
        let _ = writeln!(s, "  {{ /* {} */", tensor.name);
        for d in 0..rank {
            let _ = writeln!(
                s,
                "    const int64_t s{d} = {}, b{d} = {};",
                small[d], large[d]
            );
        }
        let same = (0..rank)
            .map(|d| format!("s{d} == b{d}"))
            .collect::<Vec<_>>()
            .join(" && ");
        let (direct, padded) = if is_out {
            ("as_out[0] = outs[0];", "as_out[0] = as_pad[{t}];")
        } else {
            ("as_in[{t}] = ins[{t}];", "as_in[{t}] = as_pad[{t}];")
        };
        let direct = direct.replace("{t}", &t.to_string());
        let padded = padded.replace("{t}", &t.to_string());
        let total: String = (0..rank).map(|d| format!(" * b{d}")).collect();
        let _ = writeln!(
            s,
            "    if ({}) {direct} else {{",
            if same.is_empty() { "1".into() } else { same }
        );
        let _ = writeln!(
            s,
            "      const int64_t as_n = 1{total};\n      if (as_n > as_cap[{t}]) {{ free(as_pad[{t}]); as_pad[{t}] = malloc((size_t)(as_n > 0 ? as_n : 1) * sizeof(float)); as_cap[{t}] = as_pad[{t}] ? as_n : 0; if (!as_pad[{t}]) return {}; }}\n      {padded}",
            STATUS_NO_MEMORY
        );
        if !is_out {
            s.push_str(&copy_rows(rank, t, true));
        }
        s.push_str("    }\n  }\n");
    }
    let _ = writeln!(
        s,
        "  int32_t as_status = {inner}(as_big, as_in, as_out);\n  if (as_status != 0) return as_status;"
    );
    let out = w.inputs.len();
    let _ = writeln!(s, "  if (as_out[0] != outs[0]) {{");
    let rank = w.output.shape.len();
    for d in 0..rank {
        let _ = writeln!(
            s,
            "    const int64_t s{d} = {}, b{d} = {};",
            expr(&w.output.shape[d]),
            big.shapes[out][d]
        );
    }
    s.push_str(&copy_rows(rank, out, false));
    s.push_str("  }\n  return 0;\n}\n");
    Ok(s)
}

/// The copy between a tensor of shape `s0..` (the caller's) and its padded buffer of
/// shape `b0..`, row by row (the last dimension is contiguous): into the buffer with
/// zero fill (`fill`), or back out of it.
fn copy_rows(rank: usize, t: usize, fill: bool) -> String {
    if rank == 0 {
        return if fill {
            format!("      as_pad[{t}][0] = ins[{t}][0];\n")
        } else {
            format!("    outs[0][0] = as_pad[{t}][0];\n")
        };
    }
    let last = rank - 1;
    // Rows are counted in the buffer's shape (fill) or the caller's (copy back).
    let (dims, pre) = if fill { ("b", "      ") } else { ("s", "    ") };
    let rows: String = (0..last).map(|d| format!(" * {dims}{d}")).collect();
    let inside = if fill { ", as_inside = 1" } else { "" };
    // The buffer table is thread-local: OpenMP's threads read the pointer from here.
    let mut s = format!(
        "{pre}float *const as_buf = as_pad[{t}];\n{pre}const int64_t as_rows = 1{rows};\n{pre}#pragma omp parallel for schedule(static) if (as_rows * {dims}{last} > 65536)\n{pre}for (int64_t as_r = 0; as_r < as_rows; as_r++) {{\n{pre}  int64_t as_rest = as_r, as_src = 0, as_dst = 0{inside};\n"
    );
    // The row's index along each outer dimension, innermost first, and its row-major
    // offset in both layouts.
    let mut small_stride = format!("s{last}");
    let mut big_stride = format!("b{last}");
    for d in (0..last).rev() {
        let check = if fill {
            format!(" as_inside &= i < s{d};")
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "{pre}  {{ const int64_t i = as_rest % {dims}{d}; as_rest /= {dims}{d};{check} as_src += i * {small_stride}; as_dst += i * {big_stride}; }}"
        );
        small_stride = format!("{small_stride} * s{d}");
        big_stride = format!("{big_stride} * b{d}");
    }
    if fill {
        let _ = writeln!(
            s,
            "{pre}  float *as_d = as_buf + as_dst;\n{pre}  int64_t as_k = as_inside ? s{last} : 0;\n{pre}  if (as_k) memcpy(as_d, ins[{t}] + as_src, (size_t)as_k * sizeof(float));\n{pre}  memset(as_d + as_k, 0, (size_t)(b{last} - as_k) * sizeof(float));"
        );
    } else {
        let _ = writeln!(
            s,
            "{pre}  memcpy(outs[0] + as_src, as_buf + as_dst, (size_t)s{last} * sizeof(float));"
        );
    }
    s.push_str(&format!("{pre}}}\n"));
    s
}
