//! The tables of `bench --model --conv-kernels`: `conv.md` (per instance, each
//! geometry's layers on both sides, their rates and errors) and `conv.csv`.
use super::{ConvCompareOptions, Row};
use crate::model::{dim_cells, dim_columns};
use crate::report::{geomean, significant};
use anyshape_ir::Bindings;
use std::fmt::Write as _;
use std::path::Path;

/// What the tables show: the module, the machine, the options and the rows.
pub(super) struct Report<'a> {
    pub(super) dir: &'a Path,
    pub(super) target: &'a str,
    pub(super) peak: f64,
    pub(super) o: &'a ConvCompareOptions<'a>,
    pub(super) rows: &'a [Row],
    pub(super) skipped: &'a [String],
}

impl Report<'_> {
    /// Per instance: its rows; anyshape's, oneDNN's in the model's order and oneDNN's
    /// repeated total seconds.
    fn instances(&self) -> Vec<(&Bindings, Vec<&Row>, [f64; 3])> {
        let mut out: Vec<(&Bindings, Vec<&Row>, [f64; 3])> = Vec::new();
        for r in self.rows {
            if out.last().is_none_or(|(b, ..)| **b != r.bindings) {
                out.push((&r.bindings, Vec::new(), [0.0; 3]));
            }
            let (_, rows, t) = out.last_mut().expect("pushed");
            rows.push(r);
            t[0] += r.layout + r.kernel;
            t[1] += r.in_order;
            t[2] += r.repeated;
        }
        out
    }

    pub(super) fn summary(&self) -> String {
        let mut s = String::new();
        for (b, rows, [a, d, h]) in self.instances() {
            let per: Vec<f64> = rows
                .iter()
                .map(|r| r.in_order / (r.layout + r.kernel))
                .collect();
            let _ = writeln!(
                s,
                "{b}: {} convolutions, anyshape {} ms, oneDNN {} ms in the model's order: {:.2}x oneDNN (geomean over the {} geometries {:.2}x); {:.2}x oneDNN's layers called again and again ({} ms)",
                rows.iter().map(|r| r.calls).sum::<usize>(),
                significant(a * 1e3),
                significant(d * 1e3),
                d / a,
                rows.len(),
                geomean(&per),
                h / a,
                significant(h * 1e3),
            );
        }
        s
    }

    pub(super) fn markdown(&self) -> String {
        let mut s = crate::out::heading(format!(
            "anyshape bench --model --conv-kernels: {}",
            self.dir.display()
        ));
        let _ = writeln!(
            s,
            "Machine: {}; FP32 FMA peak measured in this run: {:.1} GFLOP/s (all cores; the better of a measurement before the runs and one after).\n",
            self.target, self.peak
        );
        let _ = writeln!(
            s,
            "Each convolution of the module against oneDNN's (its direct convolution primitive, FP32, its OpenMP threads on every core; bias, and the residual sum and ReLU as post-ops where anyshape's kernel has them; its data in the blocked layouts it picks, reordered once outside the timing; one primitive and set of weights per layer, as in a model). anyshape: the patches' layout (`anyshape.Im2Col`, a host step; none for a 1 x 1 convolution without stride) and the `conv_packed` kernel, or for a 3 x 3 convolution of stride 1 (marked Winograd F(m x m)) the two transforms of Winograd's F(m x m, 3x3) (host steps, in the layout column) and the `batch_matmul_packed` kernel of their products (the transformed filters in panels), timed step by step inside whole-model runs (its minimum per step). oneDNN, two ways: every layer in the model's order, pass after pass, its input (and the output a residual sum adds to) read just before the call (each layer's minimum: its weights as cold and its input as warm as in a model run), and one layer of each geometry called again and again (its minimum: everything warm). {} rounds of >= {} s per system, anyshape's runs and oneDNN's layers taking turns to go first. Layers of the same geometry are one row (calls: how many; times: all of them). GFLOP/s: two per multiply-add of every tap, those over the padding too (oneDNN skips those: on small images its rate can pass the FMA peak; a Winograd layer computes fewer: its rate is the direct convolution's flops over its time). Speedup = oneDNN / anyshape (> 1: anyshape is faster). Error: oneDNN's output against the operator reference (`Conv`, then the residual and ReLU) on random data, max |error| / max |reference| over the layers of the row.\n",
            self.o.rounds, self.o.seconds
        );
        s.push_str(&self.summary());
        s.push('\n');
        for (b, rows, [a, d, h]) in self.instances() {
            let _ = writeln!(s, "## {b}\n");
            s.push_str("| convolution | calls | anyshape layout ms | anyshape kernel ms | anyshape ms | anyshape GFLOP/s | % of FMA peak | oneDNN ms, model order | oneDNN GFLOP/s | speedup | oneDNN ms, repeated | speedup | error of oneDNN |\n");
            s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
            let mut flops = 0.0;
            for r in &rows {
                let mine = r.layout + r.kernel;
                let f = r.geom.flops() * r.calls as f64;
                flops += f;
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {:.1} | {:.0} % | {} | {:.1} | {:.2}x | {} | {:.2}x | {:.1e} |",
                    r.geom.label(),
                    r.calls,
                    significant(r.layout * 1e3),
                    significant(r.kernel * 1e3),
                    significant(mine * 1e3),
                    f / mine / 1e9,
                    f / mine / 1e9 / self.peak * 100.0,
                    significant(r.in_order * 1e3),
                    f / r.in_order / 1e9,
                    r.in_order / mine,
                    significant(r.repeated * 1e3),
                    r.repeated / mine,
                    r.error
                );
            }
            let layout: f64 = rows.iter().map(|r| r.layout).sum();
            let _ = writeln!(
                s,
                "| all | {} | {} | {} | {} | {:.1} | {:.0} % | {} | {:.1} | {:.2}x | {} | {:.2}x | |\n",
                rows.iter().map(|r| r.calls).sum::<usize>(),
                significant(layout * 1e3),
                significant((a - layout) * 1e3),
                significant(a * 1e3),
                flops / a / 1e9,
                flops / a / 1e9 / self.peak * 100.0,
                significant(d * 1e3),
                flops / d / 1e9,
                d / a,
                significant(h * 1e3),
                h / a
            );
        }
        if !self.skipped.is_empty() {
            s.push_str("Not compared:\n\n");
            for k in self.skipped {
                let _ = writeln!(s, "- {k}");
            }
        }
        s
    }

    pub(super) fn csv(&self) -> String {
        let mut s = format!(
            "{},convolution,calls,flops_per_call,anyshape_layout_s,anyshape_kernel_s,onednn_model_order_s,onednn_repeated_s,onednn_error\n",
            dim_columns(self.o.dims)
        );
        for r in self.rows {
            let _ = writeln!(
                s,
                "{},\"{}\",{},{},{:e},{:e},{:e},{:e},{:e}",
                dim_cells(self.o.dims, &r.bindings),
                r.geom.label(),
                r.calls,
                r.geom.flops(),
                r.layout,
                r.kernel,
                r.in_order,
                r.repeated,
                r.error
            );
        }
        s
    }
}
