//! `anyshape inspect`: what a module holds and where each instance goes; for an ONNX
//! model, its inputs and outputs with symbolic shapes and the tasks fusion makes; for a
//! model module, how each task was compiled and what its plan holds.
use anyhow::{bail, Result};
use anyshape_codegen::{CpuTarget, Target as _};
use anyshape_ir::{Bindings, Precision};
use anyshape_runtime::Module;
use anyshape_tensor::shape_text;
use std::path::Path;

/// `anyshape inspect PATH`: an ONNX model (with the values `shown` asks for), a model
/// module or an operator module, by what `path` is.
pub fn inspect_path(path: &Path, shown: &Shown) -> Result<()> {
    if path.is_file() {
        return inspect_model(path, shown);
    }
    if path.extension().is_some_and(|e| e == "onnx") && !path.exists() {
        bail!("{}: no such file", path.display());
    }
    if *shown != Shown::None {
        bail!("--value and --values are for an .onnx file: a module's values are in its plan (`anyshape inspect` without them)");
    }
    match anyshape_abi::ModuleKind::of(path)? {
        anyshape_abi::ModuleKind::Model => inspect_model_module(path),
        anyshape_abi::ModuleKind::Operator => inspect(path),
    }
}

/// Print what a module holds: micro-kernels, the dispatch tree, which instances go where.
fn inspect(path: &Path) -> Result<()> {
    let module = Module::load(path)?;
    let m = module.manifest();
    println!("module       {}", path.display());
    println!("workload     {}", m.workload);
    for v in &m.shape_vars {
        let (lo, hi) = v.domain.bounds().unwrap_or((0, 0));
        println!(
            "shape var    {} tuned on {} values ({lo}..{hi})",
            v.name,
            v.domain.len()
        );
    }
    let target = serde_json::from_value::<CpuTarget>(m.target.clone())
        .map_or_else(|_| m.target_name().to_string(), |t| t.describe());
    println!(
        "built by     anyshape {} (format {}) for {target}, strategy {}",
        m.anyshape, m.format, m.strategy
    );
    let bytes: u64 = m.files.values().map(|f| f.bytes).sum();
    println!(
        "files        {} ({:.1} KiB in all; checksums verified)",
        m.files
            .iter()
            .map(|(n, f)| format!("{n} {:.1} KiB", f.bytes as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(", "),
        bytes as f64 / 1024.0
    );
    println!("\nmicro-kernels ({}):", m.micro_kernels.len());
    for (k, mk) in m.micro_kernels.iter().enumerate() {
        let votes = m.votes.iter().filter(|v| v.micro_kernel == k).count();
        let spec = m.specialized.iter().filter(|s| s.micro_kernel == k).count();
        println!(
            "  #{k}  {mk}   votes {votes:>4}   specialized kernels {spec:>3}   symbolic {}",
            m.symbolic[k]
        );
    }
    println!(
        "\ndispatch tree (depth {}, {} leaves, training accuracy {:.1}%):",
        m.dispatch.depth(),
        m.dispatch.leaves(),
        m.tree_accuracy * 100.0
    );
    print!(
        "{}",
        m.dispatch
            .render(&|k| format!("#{k} {}", m.micro_kernels[k]))
    );
    println!("\ninstances (vote -> dispatched kernel; * = specialized kernel, ! = tree differs from the vote):");
    let mut i = 0;
    let votes = &m.votes;
    let label = |b: &Bindings, vote: usize| {
        let d = module.dispatch(b);
        (vote, d.micro_kernel, d.specialized)
    };
    while i < votes.len() {
        let key = label(&votes[i].bindings, votes[i].micro_kernel);
        let mut j = i;
        while j + 1 < votes.len() && label(&votes[j + 1].bindings, votes[j + 1].micro_kernel) == key
        {
            j += 1;
        }
        let span = if i == j {
            votes[i].bindings.to_string()
        } else {
            format!("{} .. {}", votes[i].bindings, votes[j].bindings)
        };
        let (vote, got, spec) = key;
        println!(
            "  {span:<24} vote #{vote} -> #{got}{}{}",
            if spec { " *" } else { "" },
            if vote != got { " !" } else { "" }
        );
        i = j + 1;
    }
    Ok(())
}

/// Print what a model module holds: its source, dims and tasks (how each was compiled),
/// its inputs and outputs, and its plan (steps, constants, the arena's peak as an
/// expression over the dims and at their largest compiled values) — every file's
/// SHA-256 verified.
fn inspect_model_module(dir: &Path) -> Result<()> {
    let model = anyshape_runtime::Model::load(dir)?;
    model.verify_files()?;
    let m = model.manifest();
    println!(
        "model module {} (anyshape {}, format {}; every file's SHA-256 verified)",
        dir.display(),
        m.anyshape,
        m.format
    );
    println!(
        "compiled from {} (SHA-256 {}…, {} bytes)",
        m.source.path,
        &m.source.file.sha256[..16],
        m.source.file.bytes
    );
    for v in &m.dims {
        let (lo, hi) = v.domain.bounds().unwrap_or((0, 0));
        println!("dim          {} compiled for {lo}..{hi}", v.name);
    }
    match m.precision {
        Precision::F32 => println!("precision    f32"),
        Precision::Bf16 => println!(
            "precision    bf16 (dense layers over weights and attention's scores; the rest f32)"
        ),
        Precision::I8 => println!(
            "precision    i8 (dense layers over weights: 8-bit weights per output channel, activations quantized per row; attention in bf16 where the compiling CPU had bf16 products, its tasks say; the rest f32)"
        ),
    }
    for s in model.inputs() {
        println!(
            "input        {} {} {}",
            s.name,
            s.dtype,
            shape_text(&s.shape)
        );
    }
    for s in model.outputs() {
        println!(
            "output       {} {} {}",
            s.name,
            s.dtype,
            shape_text(&s.shape)
        );
    }
    println!("\ntasks ({}):", m.tasks.len());
    for t in &m.tasks {
        let module = Module::load(dir.join(&t.module))?;
        let tm = module.manifest();
        println!(
            "  {:>3} x  {}   [{}: {} micro-kernel(s), dispatch depth {}, {}]",
            t.count,
            t.workload,
            t.module,
            tm.micro_kernels.len(),
            tm.dispatch.depth(),
            if t.trials == 0 {
                "default micro-kernel".to_string()
            } else {
                format!("{} trials", t.trials)
            }
        );
    }
    let plan = model.plan();
    let kernels = plan
        .steps
        .iter()
        .filter(|s| matches!(s, anyshape_plan::Step::Kernel { .. }))
        .count();
    let mut host: std::collections::BTreeMap<&str, usize> = Default::default();
    for s in &plan.steps {
        if let anyshape_plan::Step::Host(n) = s {
            *host.entry(n.op.as_str()).or_default() += 1;
        }
    }
    println!(
        "\nplan: {} steps: {kernels} kernel calls, {} host ops ({})",
        plan.steps.len(),
        plan.steps.len() - kernels,
        host.iter()
            .map(|(op, n)| format!("{n} {op}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let weights: u64 = plan.constants.iter().map(|c| c.bytes).sum();
    println!(
        "constants: {} ({:.1} MiB, weights read by kernels already in panels)",
        plan.constants.len(),
        weights as f64 / (1u64 << 20) as f64
    );
    let peak = plan.memory.peak();
    let largest = Bindings::from_pairs(
        m.dims
            .iter()
            .map(|d| (d.name.as_str(), d.domain.bounds().map_or(1, |b| b.1))),
    );
    println!(
        "arena: {} slots, {peak} bytes ({:.1} MiB at {largest})",
        plan.memory.slots.len(),
        peak.eval(&largest).unwrap_or(0) as f64 / (1u64 << 20) as f64
    );
    Ok(())
}

/// Which of an ONNX model's values `inspect` prints with their shapes.
#[derive(Debug, PartialEq, Eq)]
pub enum Shown {
    /// None: the inputs and outputs only.
    None,
    /// These, by name, in the order given.
    Named(Vec<String>),
    /// Every value, in the model's order (inputs, then each node's outputs).
    All,
}

/// Print what an ONNX model is: inputs and outputs with their symbolic shapes, the
/// values `shown` asks for, and the steps and tasks fusion makes of it.
fn inspect_model(path: &Path, shown: &Shown) -> Result<()> {
    print_graph(&mut anyshape_graph::onnx::load(path)?, path, shown)
}

fn print_graph(g: &mut anyshape_graph::Graph, path: &Path, shown: &Shown) -> Result<()> {
    use anyshape_graph::{fact, fuse, infer, rotate_half, winograd};
    let nodes = g.nodes.len();
    let inferred = infer(g)?;
    // The values as the model names them, before the rewrites below replace some.
    let values = shown_values(g, &inferred, shown)?;
    // No dims' values here: F(2x2, 3x3) where the image's extents are symbolic.
    let facts = rotate_half(g, inferred)?;
    let facts = winograd(g, facts, &Default::default())?;
    println!(
        "model        {} (opset {}, {} nodes)",
        path.display(),
        g.opset,
        nodes
    );
    println!("shape vars   {}", g.dim_names().join(", "));
    for i in &g.inputs {
        println!(
            "input        {} {} {}",
            g.values[i.value],
            i.dtype,
            shape_text(&i.dims)
        );
    }
    for &o in &g.outputs {
        let f = fact(&facts, o);
        println!(
            "output       {} {} {}",
            g.values[o],
            f.dtype,
            shape_text(&f.shape)
        );
    }
    if !values.is_empty() {
        println!();
    }
    for line in values {
        println!("{line}");
    }
    let fusion = fuse(g, &facts, anyshape_ir::Precision::F32);
    let runtime: usize = fusion.steps.iter().map(|s| s.nodes.len()).sum();
    println!(
        "\n{} run-time nodes in {} steps ({} nodes known at compile time)",
        runtime,
        fusion.steps.len(),
        g.nodes.len() - runtime
    );
    let tasks = fusion.tasks();
    println!("\nkernel tasks ({}):", tasks.len());
    for t in &tasks {
        println!("  {:>3} x  {}", t.count, t.workload);
    }
    println!("\nother steps:");
    for (what, n) in fusion.other_steps() {
        println!("  {n:>3} x  {what}");
    }
    Ok(())
}

/// The lines of the values `shown` asks for: name, element type, symbolic shape (and
/// the elements of a shape computation, where inference knows them) and where the
/// value comes from (an input, a weight, or the node that makes it; "known
/// when compiled" where shape inference folded its elements). A name the model does not
/// have is an error.
fn shown_values(
    g: &anyshape_graph::Graph,
    facts: &[Option<anyshape_tensor::Fact>],
    shown: &Shown,
) -> Result<Vec<String>> {
    let mut made_by = vec![None; g.values.len()];
    for node in &g.nodes {
        for &o in &node.outputs {
            made_by[o] = Some(node);
        }
    }
    let ids: Vec<usize> = match shown {
        Shown::None => return Ok(Vec::new()),
        Shown::All => g
            .inputs
            .iter()
            .map(|i| i.value)
            .chain(g.nodes.iter().flat_map(|n| n.outputs.iter().copied()))
            .collect(),
        Shown::Named(names) => names
            .iter()
            .map(|name| {
                g.value(name).ok_or_else(|| {
                    anyhow::anyhow!(
                        "--value {name}: the model has no value of that name (`--values` lists them)"
                    )
                })
            })
            .collect::<Result<_>>()?,
    };
    Ok(ids
        .into_iter()
        .map(|v| {
            let name = &g.values[v];
            let Some(f) = facts.get(v).and_then(Option::as_ref) else {
                return format!("value        {name}  (not used by the model's outputs)");
            };
            let from = match made_by[v] {
                _ if g.initializers.contains_key(&v) => "a weight".to_string(),
                _ if g.inputs.iter().any(|i| i.value == v) => "an input".to_string(),
                Some(n) if f.value.is_some() => {
                    format!("{} '{}', known when compiled", n.op, n.name)
                }
                Some(n) => format!("{} '{}'", n.op, n.name),
                None => "the model".to_string(),
            };
            // A shape computation's elements, where inference knows them as expressions.
            let elements = match &f.sym {
                Some(e) if f.shape.is_empty() && e.len() == 1 => format!(" = {}", e[0]),
                Some(e) => format!(" = {}", shape_text(e)),
                None => String::new(),
            };
            format!(
                "value        {name} {} {}{elements}  ({from})",
                f.dtype,
                shape_text(&f.shape)
            )
        })
        .collect())
}
