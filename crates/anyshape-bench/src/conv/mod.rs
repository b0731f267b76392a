//! `anyshape bench --model M --conv-kernels`: each convolution of a model module against
//! oneDNN's convolution primitive, layer by layer, at every combination of the dim
//! values. anyshape's side is what its plan runs for the layer — the patches' layout
//! (`anyshape.Im2Col`, a host step) where there is one, and the `conv_packed` kernel
//! with its epilogue; or, for a 3 x 3 convolution of stride 1, Winograd's input
//! transform, the `batch_matmul_nn` kernel of its products and its output transform —
//! timed step by step inside whole-model runs
//! ([`anyshape_runtime::Model::step_seconds`]); oneDNN's is its direct convolution
//! (`onednn_conv.c`, built against the system's `libdnnl` and loaded in this process)
//! over the same geometry, with the bias and, as post-ops, the residual sum and ReLU
//! where anyshape's kernel has them, its data in the layouts it picks (reordered once,
//! outside the timing), timed two ways: every layer in the model's order, its input
//! read just before (as a model run leaves it), and one layer of each geometry called
//! again and again (all warm). Every layer's oneDNN output is checked against the
//! operator reference (`Conv`, then the residual and ReLU). Writes `conv.md` and
//! `conv.csv`.
//!
//! Here: the layers read from the plan and the measurement; `onednn.rs`: the shim,
//! loaded, and one convolution set up in it and checked; `report.rs`: the tables.
mod onednn;
mod report;

use crate::error::{BenchError, Result};
use crate::model::{inputs, instances};
use crate::out::OutDir;
use crate::peak::{Ceiling, Peak};
use crate::report::significant;
use crate::Harness;
use anyshape_codegen::Target;
use anyshape_files::Reads;
use anyshape_ir::{Binary, Bindings, EpilogueOp, Unary, Workload};
use anyshape_measure::Progress;
use anyshape_plan::Step;
use anyshape_tensor::ops::Window;
use anyshape_tensor::{Attr, Node, TensorRef, ValueId};
use onednn::{Conv, OneDnn};
use report::Report;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

/// What `compare_convolutions` measures and where it writes.
pub struct ConvCompareOptions<'a> {
    /// Values of each of the model's dims (every dim named); the instances are their
    /// cross product.
    pub dims: &'a [(String, Vec<i64>)],
    /// Interleaved rounds per instance (anyshape's runs and oneDNN's layers take turns
    /// going first).
    pub rounds: usize,
    /// Seconds of timed runs per system, instance and round (at least three runs).
    pub seconds: f64,
    /// Where the CSV and report go.
    pub out_dir: &'a Path,
}

/// One convolution of the plan: the steps that compute it and what it computes.
struct Layer {
    /// The plan's steps: the patches' layout (where there is one), then the kernel; or
    /// Winograd's input transform, the kernel of its products and its output
    /// transform.
    steps: Vec<usize>,
    /// Which of `steps` is the kernel.
    kernel: usize,
    /// The image it reads (`[n, ci, h, w]`).
    image: ValueId,
    /// The kernel's workload (its `M` is the output channels).
    workload: Workload,
    /// The convolution's window attributes and `kernel_shape` (a 1 x 1 one with no
    /// stride, pad or dilation where the kernel reads the image as it is).
    attrs: BTreeMap<String, Attr>,
    /// Its epilogue: a bias, a residual sum, ReLU (in that order; each where true).
    bias: bool,
    residual: bool,
    relu: bool,
    /// Computed by Winograd's F(m x m, 3x3) (`anyshape.WinogradInput`, a
    /// `batch_matmul_packed` kernel, `anyshape.WinogradOutput`): its `m`.
    winograd: Option<i64>,
}

/// A layer at one instance: everything oneDNN's convolution needs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Geometry {
    /// n, ci, h, w, co, kh, kw, strides, dilations, pads (top, left, bottom, right),
    /// oh, ow: the order `as_onednn_conv_new` takes.
    g: [i64; 17],
    bias: bool,
    residual: bool,
    relu: bool,
    winograd: Option<i64>,
}

impl Geometry {
    fn label(&self) -> String {
        let g = &self.g;
        let mut s = format!("{}x{} {}->{} on {}x{}", g[5], g[6], g[1], g[4], g[2], g[3]);
        if g[0] != 1 {
            let _ = write!(s, " (batch {})", g[0]);
        }
        if g[7] != 1 || g[8] != 1 {
            let _ = write!(s, " /{}", g[7].max(g[8]));
        }
        if g[11..15].iter().any(|&p| p != 0) {
            let _ = write!(s, " pad {}", g[11]);
        }
        if g[9] != 1 || g[10] != 1 {
            let _ = write!(s, " dilation {}", g[9]);
        }
        if self.bias {
            s.push_str(" +bias");
        }
        if self.residual {
            s.push_str(" +residual");
        }
        if self.relu {
            s.push_str(" +relu");
        }
        if let Some(m) = self.winograd {
            let _ = write!(s, " (Winograd F({m}x{m}))");
        }
        s
    }

    /// Multiply-adds times two.
    fn flops(&self) -> f64 {
        let g = &self.g;
        2.0 * (g[0] * g[4] * g[15] * g[16] * g[1] * g[5] * g[6]) as f64
    }

    fn output_len(&self) -> usize {
        let g = &self.g;
        (g[0] * g[4] * g[15] * g[16]) as usize
    }
}

/// The convolutions of `plan`, and the kernel steps of `conv_packed` it leaves out (an
/// epilogue oneDNN's post-ops do not express), with why.
fn layers(plan: &anyshape_plan::Plan) -> (Vec<Layer>, Vec<String>) {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    for (k, step) in plan.steps.iter().enumerate() {
        let Step::Kernel { task, inputs, .. } = step else {
            continue;
        };
        let w = &plan.tasks[*task].workload;
        if w.op != "conv_packed" || inputs.len() < 2 {
            continue;
        }
        // The epilogue oneDNN expresses: the bias, a residual sum, ReLU, in that order.
        let rank = w.output.shape.len();
        let kinds: Vec<&str> = w
            .epilogue
            .0
            .iter()
            .map(|op| match op {
                EpilogueOp::With {
                    op: Binary::Add,
                    input,
                } => match w.inputs[*input].index.len() {
                    1 => "bias",
                    r if r == rank => "residual",
                    _ => "other",
                },
                EpilogueOp::Unary(Unary::Relu) => "relu",
                _ => "other",
            })
            .collect();
        let bias = kinds.first() == Some(&"bias");
        let (residual, relu) = match kinds[bias as usize..] {
            [] => (false, false),
            ["relu"] => (false, true),
            ["residual"] => (true, false),
            ["residual", "relu"] => (true, true),
            _ => {
                skipped.push(format!(
                    "{w}: an epilogue oneDNN's post-ops do not express here"
                ));
                continue;
            }
        };
        let columns = inputs[1];
        let layout = plan.steps[..k].iter().rposition(|s| match s {
            Step::Host(n) => n.outputs.contains(&columns),
            Step::Kernel { .. } => false,
        });
        let (steps, image, attrs) = match layout.map(|l| (l, &plan.steps[l])) {
            Some((l, Step::Host(node))) if node.op == anyshape_tensor::ops::IM2COL => {
                let Some(Some(image)) = node.inputs.first() else {
                    skipped.push(format!("{w}: its patches' layout reads no image"));
                    continue;
                };
                (vec![l, k], *image, node.attrs.clone())
            }
            _ => (vec![k], columns, BTreeMap::new()),
        };
        out.push(Layer {
            kernel: steps.len() - 1,
            steps,
            image,
            workload: w.clone(),
            attrs,
            bias,
            residual,
            relu,
            winograd: None,
        });
    }
    out.extend(
        plan.steps
            .iter()
            .enumerate()
            .filter_map(|(k, s)| winograd(plan, k, s)),
    );
    out.sort_by_key(|l| l.steps[l.kernel]);
    (out, skipped)
}

/// The convolution that step `k` ends where it is Winograd's output transform: its
/// products' kernel and the input transform before that.
fn winograd(plan: &anyshape_plan::Plan, k: usize, step: &Step) -> Option<Layer> {
    use anyshape_tensor::ops::{WINOGRAD_INPUT, WINOGRAD_OUTPUT};
    let Step::Host(out) = step else { return None };
    if out.op != WINOGRAD_OUTPUT {
        return None;
    }
    let made = |v: ValueId| {
        plan.steps[..k].iter().rposition(|s| match s {
            Step::Host(n) => n.outputs.contains(&v),
            Step::Kernel { output, .. } => *output == v,
        })
    };
    let products = made((*out.inputs.first()?)?)?;
    let Step::Kernel { task, inputs, .. } = &plan.steps[products] else {
        return None;
    };
    let tiles = made(*inputs.get(1)?)?;
    let Step::Host(input) = &plan.steps[tiles] else {
        return None;
    };
    if input.op != WINOGRAD_INPUT {
        return None;
    }
    let mut attrs = BTreeMap::new();
    attrs.insert("pads".to_string(), out.attrs.get("pads")?.clone());
    attrs.insert("kernel_shape".to_string(), Attr::Ints(vec![3, 3]));
    Some(Layer {
        steps: vec![tiles, products, k],
        kernel: 1,
        image: (*input.inputs.first()?)?,
        workload: plan.tasks[*task].workload.clone(),
        attrs,
        bias: matches!(out.inputs.get(2), Some(Some(_))),
        residual: matches!(out.inputs.get(3), Some(Some(_))),
        relu: out.int("relu", 0).ok()? != 0,
        winograd: Some(out.int("tile", 2).ok()?),
    })
}

impl Layer {
    /// Its geometry at `b`.
    fn at(&self, plan: &anyshape_plan::Plan, b: &Bindings) -> Result<Geometry> {
        let bad = |why: String| BenchError::Options(format!("{}: {why}", self.workload));
        let dims = plan.values[self.image]
            .shape
            .iter()
            .map(|d| d.eval(b))
            .collect::<std::result::Result<Vec<i64>, _>>()?;
        let &[n, ci, h, w] = &dims[..] else {
            return Err(bad(format!("an image of {} dims", dims.len())));
        };
        let co = self
            .workload
            .args
            .iter()
            .find(|(name, _)| name == "M")
            .ok_or_else(|| bad("no M".into()))?
            .1
            .eval(b)?;
        let node = self.node();
        let kernel = match node.ints("kernel_shape") {
            Ok(Some(k)) if k.len() == 2 => [k[0] as usize, k[1] as usize],
            _ => [1, 1],
        };
        let window = Window::of(&node)
            .map_err(|e| bad(e.to_string()))?
            .at(&[h as usize, w as usize], &kernel);
        let (oh, ow) = (
            window.out(h as usize, kernel[0], 0),
            window.out(w as usize, kernel[1], 1),
        );
        let s = |x: usize| x as i64;
        let p = &window.pads;
        Ok(Geometry {
            g: [
                n,
                ci,
                h,
                w,
                co,
                s(kernel[0]),
                s(kernel[1]),
                s(window.strides[0]),
                s(window.strides[1]),
                s(window.dilations[0]),
                s(window.dilations[1]),
                s(p[0]),
                s(p[1]),
                s(p[2]),
                s(p[3]),
                s(oh),
                s(ow),
            ],
            bias: self.bias,
            residual: self.residual,
            relu: self.relu,
            winograd: self.winograd,
        })
    }

    /// A `Conv` node of its attributes (inputs 0, 1, 2: image, filters, bias).
    fn node(&self) -> Node {
        Node {
            name: self.workload.to_string(),
            op: "Conv".into(),
            inputs: vec![Some(0), Some(1), Some(2)],
            outputs: vec![3],
            attrs: self.attrs.clone(),
        }
    }
}

/// One instance's results, per geometry (layers of the same geometry together).
struct Row {
    bindings: Bindings,
    geom: Geometry,
    /// How many of the model's layers have it.
    calls: usize,
    /// anyshape's seconds for those layers (their per-step minima summed): the patches'
    /// layout, the kernel.
    layout: f64,
    kernel: f64,
    /// oneDNN's seconds for those layers called in the model's order (each its
    /// minimum), and one of them called again and again (its minimum, times `calls`).
    in_order: f64,
    repeated: f64,
    /// oneDNN's largest relative error against the reference.
    error: f64,
}

/// Time every convolution of the model module in `dir` against oneDNN's; returns the
/// summary and the files written.
pub fn compare_convolutions(
    dir: &Path,
    o: &ConvCompareOptions,
    h: &Harness,
    progress: &mut dyn Progress,
) -> Result<(String, Vec<String>)> {
    let out = OutDir::new(o.out_dir, Reads::new().dir(dir).clone())?;
    let model = anyshape_runtime::Model::load(dir)?;
    let plan = model.plan();
    let (layers, skipped) = layers(plan);
    if layers.is_empty() {
        return Err(BenchError::Options(format!(
            "{}: no convolution kernels (conv_packed) to compare",
            dir.display()
        )));
    }
    let instances = instances(model.dims(), o.dims)?;
    progress.note("building the oneDNN convolution ...");
    let dnn = OneDnn::load(h)?;
    progress.note("measuring the FMA peak ...");
    let mut peak = Ceiling::measure(Peak::Fma, &h.target, &h.builder)?;
    let mut rows = Vec::new();
    progress.start("instances", instances.len());
    for b in &instances {
        progress.message(&b.to_string());
        let tensors = inputs(model.inputs(), b)?;
        let given: Vec<(&str, TensorRef)> = tensors
            .iter()
            .map(|(n, t)| (n.as_str(), t.view()))
            .collect();
        let geoms = layers
            .iter()
            .map(|l| l.at(plan, b))
            .collect::<Result<Vec<_>>>()?;
        let mut unique = geoms.clone();
        unique.sort();
        unique.dedup();
        // One oneDNN convolution per layer, each with its own weights (as in a model).
        let convs = layers
            .iter()
            .zip(&geoms)
            .map(|(l, g)| Conv::new(&dnn, l, g))
            .collect::<Result<Vec<_>>>()?;
        // The layers of each geometry.
        let members: Vec<Vec<usize>> = unique
            .iter()
            .map(|g| (0..layers.len()).filter(|&l| geoms[l] == *g).collect())
            .collect();
        model.run(&given)?;
        let mut steps = vec![f64::INFINITY; plan.steps.len()];
        let mut in_order = vec![f64::INFINITY; layers.len()];
        let mut repeated = vec![f64::INFINITY; unique.len()];
        for r in 0..o.rounds {
            for turn in 0..2 {
                if (turn + r) % 2 == 0 {
                    let start = Instant::now();
                    let mut runs = 0;
                    while runs < 3 || start.elapsed().as_secs_f64() < o.seconds {
                        for (s, t) in steps.iter_mut().zip(model.step_seconds(&given)?) {
                            *s = s.min(t);
                        }
                        runs += 1;
                    }
                } else {
                    // Half the turn in the model's order (each layer once a pass, its
                    // input read just before: its weights as cold and its input as
                    // warm as in a model run), half one layer of each geometry called
                    // again and again (all warm).
                    let start = Instant::now();
                    let mut passes = 0;
                    while passes < 3 || start.elapsed().as_secs_f64() < o.seconds / 2.0 {
                        for ((conv, _), best) in convs.iter().zip(&mut in_order) {
                            conv.warm();
                            *best = best.min(conv.time()?);
                        }
                        passes += 1;
                    }
                    let share = o.seconds / 2.0 / unique.len() as f64;
                    for (u, best) in repeated.iter_mut().enumerate() {
                        let conv = &convs[members[u][0]].0;
                        let start = Instant::now();
                        let mut runs = 0;
                        while runs < 3 || start.elapsed().as_secs_f64() < share {
                            *best = best.min(conv.time()?);
                            runs += 1;
                        }
                    }
                }
                // Each side's threads (oneDNN's OpenMP team spins a while after a
                // call) idle before the other's turn.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for (u, g) in unique.iter().enumerate() {
            let sum = |f: &dyn Fn(usize) -> f64| -> f64 { members[u].iter().map(|&l| f(l)).sum() };
            let calls = members[u].len();
            rows.push(Row {
                bindings: b.clone(),
                geom: g.clone(),
                calls,
                layout: sum(&|l| {
                    let (all, k) = (&layers[l].steps, layers[l].kernel);
                    all.iter().map(|&s| steps[s]).sum::<f64>() - steps[all[k]]
                }),
                kernel: sum(&|l| steps[layers[l].steps[layers[l].kernel]]),
                in_order: sum(&|l| in_order[l]),
                repeated: repeated[u] * calls as f64,
                error: members[u].iter().map(|&l| convs[l].1).fold(0.0, f64::max),
            });
        }
        let (a, d) = rows
            .iter()
            .filter(|r| r.bindings == *b)
            .fold((0.0, 0.0), |(a, d), r| {
                (a + r.layout + r.kernel, d + r.in_order)
            });
        progress.note(&format!(
            "{b}: convolutions anyshape {} ms, oneDNN {} ms in the model's order ({:.2}x)",
            significant(a * 1e3),
            significant(d * 1e3),
            d / a
        ));
        progress.inc(1);
    }
    progress.finish();
    progress.note("measuring the FMA peak again ...");
    peak.remeasure(&h.target, &h.builder)?;
    let report = Report {
        dir,
        target: &h.target.describe(),
        peak: peak.gflops,
        o,
        rows: &rows,
        skipped: &skipped,
    };
    let md = report.markdown();
    let mut written = Vec::new();
    for (name, text) in [("conv.md", &md), ("conv.csv", &report.csv())] {
        written.push(out.write(name, text.as_bytes())?.display().to_string());
    }
    Ok((report.summary(), written))
}
