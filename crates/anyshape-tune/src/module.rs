//! Writing a module: symbolic kernels for the chosen micro-kernels, specialized kernels
//! for some instances, the dispatcher, one shared library, a C header and the manifest.
use crate::{output, Result, TuneError, Votes};
use anyshape_abi::{
    host_cpu_features, sha256_hex, write_manifest, DispatchTree, FileEntry, Manifest,
    SpecializedKernel, TuningInfo, ENTRY_SYMBOL, FORMAT_VERSION, HEADER_FILE, SELECT_SYMBOL,
    STATUS_NO_KERNEL, STATUS_NO_MEMORY, STATUS_OK, STATUS_WRONG_SHAPE,
};
use anyshape_codegen::{
    dispatcher_c, ContractionKernel, CpuTarget, DispatcherSpec, PaddingStrategy, Program, Sketch,
};
use anyshape_ir::{Bindings, ShapeVar, Workload};
use anyshape_measure::{Builder, KernelSource};
use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

/// Which instances get a kernel specialized for them (the rest run symbolic kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Specialize {
    /// None: one symbolic kernel per micro-kernel (smallest module).
    None,
    /// Every tuned instance.
    All,
    /// The `n` heaviest instances (evenly spread where weights tie).
    Count(usize),
}

impl FromStr for Specialize {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(Specialize::None),
            "all" => Ok(Specialize::All),
            n => n
                .parse()
                .map(Specialize::Count)
                .map_err(|_| format!("`{s}`: expected `none`, `all` or a number of instances")),
        }
    }
}

impl Specialize {
    /// The instances to specialize among `votes`, given their `weights`.
    pub fn pick(self, bindings: &[Bindings], weights: &[f64]) -> Vec<Bindings> {
        let n = match self {
            Specialize::None => 0,
            Specialize::All => bindings.len(),
            Specialize::Count(n) => n.min(bindings.len()),
        };
        if n == 0 {
            return Vec::new();
        }
        let mut order: Vec<usize> = (0..bindings.len()).collect();
        order.sort_by(|&a, &b| weights[b].total_cmp(&weights[a]));
        let cut = weights[order[n - 1]];
        let above: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| weights[i] > cut)
            .collect();
        let tied: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&i| weights[i] == cut)
            .collect();
        let need = n - above.len();
        let mut out: Vec<usize> = above;
        // Evenly spaced among the tied ones, ends included.
        for j in 0..need {
            let at = if need == 1 {
                tied.len() - 1
            } else {
                j * (tied.len() - 1) / (need - 1)
            };
            out.push(tied[at]);
        }
        out.sort();
        out.dedup();
        out.into_iter().map(|i| bindings[i].clone()).collect()
    }
}

/// What goes into a module.
pub struct ModuleSpec<'a, K: Sketch = ContractionKernel> {
    /// The workload.
    pub workload: &'a Workload,
    /// The tuned domains.
    pub shape_vars: &'a [ShapeVar],
    /// The target.
    pub target: &'a K::Target,
    /// Padding strategy of every kernel.
    pub strategy: PaddingStrategy,
    /// The votes (micro-kernels and each instance's choice).
    pub votes: &'a Votes<K>,
    /// The dispatch tree over `votes.micro_kernels`.
    pub tree: &'a DispatchTree,
    /// Fraction of votes the tree reproduces.
    pub tree_accuracy: f64,
    /// Instances that get specialized kernels (each runs the micro-kernel it voted for).
    pub specialize: &'a [Bindings],
    /// The tuning run, for the record.
    pub tuning: Option<TuningInfo>,
    /// What the command reads: the module never replaces or enters them.
    pub reads: &'a anyshape_files::Reads,
}

/// Build the module into directory `dir` and return its manifest. `dir` may be absent,
/// empty or an anyshape module holding only its files (see `output.rs` for what is
/// refused); the new module is swapped in whole, so `dir` holds the old module or the
/// new one at every moment.
pub fn write_module<K: Sketch<Target = CpuTarget>>(
    spec: &ModuleSpec<K>,
    builder: &Builder,
    dir: &Path,
) -> Result<Manifest> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source: std::io::Error| TuneError::Io { path, source }
    };
    anyshape_files::clean_leftovers(dir);
    output::check_out_dir(dir, "--out", spec.reads, &[])?;
    let vars = spec.workload.shape_vars();
    let mks = &spec.votes.micro_kernels;
    let mut sources = Vec::new();
    let mut add = |p: &Program<K>| -> Result<String> {
        let symbol = p.symbol(spec.target);
        sources.push(KernelSource {
            symbol: symbol.clone(),
            code: p.source(spec.target)?,
        });
        Ok(symbol)
    };
    let symbolic: Vec<String> = mks
        .iter()
        .map(|mk| add(&Program::symbolic(spec.workload, *mk, spec.strategy)))
        .collect::<Result<_>>()?;
    let mut specialized = Vec::new();
    for b in spec.specialize {
        let k = spec
            .votes
            .votes
            .iter()
            .find(|v| &v.bindings == b)
            .map_or_else(|| spec.tree.select(b), |v| v.micro_kernel);
        let symbol = add(&Program::specialized(
            spec.workload,
            mks[k],
            spec.strategy,
            b,
        ))?;
        specialized.push(SpecializedKernel {
            bindings: b.clone(),
            micro_kernel: k,
            symbol,
        });
    }
    let exact: Vec<(Vec<i64>, String)> = specialized
        .iter()
        .map(|s| {
            let values = vars
                .iter()
                .map(|v| s.bindings.get(v).unwrap_or(0))
                .collect();
            (values, s.symbol.clone())
        })
        .collect();
    sources.push(KernelSource {
        symbol: ENTRY_SYMBOL.into(),
        code: dispatcher_c(&DispatcherSpec {
            vars: &vars,
            tree: spec.tree,
            symbolic: &symbolic,
            specialized: &exact,
            threads: spec.target.cores,
        }),
    });
    let lib = builder.build(spec.target, &sources)?;
    lib.require_all()?;

    let tmp = anyshape_files::temp_dir(dir);
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    let so = std::fs::read(&lib.path).map_err(io(&lib.path))?;
    let library = format!("kernels-{}.so", &sha256_hex(&so)[..16]);
    let header = header_text(spec.workload, &vars, &symbolic, &specialized);
    let mut files = BTreeMap::new();
    for (name, bytes) in [
        (library.as_str(), so.as_slice()),
        (HEADER_FILE, header.as_bytes()),
    ] {
        let path = tmp.join(name);
        std::fs::write(&path, bytes).map_err(io(&path))?;
        files.insert(
            name.to_string(),
            FileEntry {
                sha256: sha256_hex(bytes),
                bytes: bytes.len() as u64,
            },
        );
    }
    let mut manifest = Manifest {
        format: FORMAT_VERSION,
        anyshape: env!("CARGO_PKG_VERSION").into(),
        workload: spec.workload.to_string(),
        shape_vars: spec.shape_vars.to_vec(),
        target: serde_json::to_value(spec.target).expect("targets serialize"),
        cpu_features: host_cpu_features(),
        strategy: spec.strategy.to_string(),
        micro_kernels: mks.iter().map(|mk| mk.to_string()).collect(),
        symbolic,
        specialized,
        dispatch: spec.tree.clone(),
        votes: spec.votes.votes.clone(),
        tree_accuracy: spec.tree_accuracy,
        library,
        files,
        tuning: spec.tuning.clone(),
        checksum: String::new(),
    };
    manifest.seal();
    write_manifest(&manifest, &tmp)?;
    // Whatever appeared at `dir` while the kernels were built is checked once more.
    let swapped = output::check_out_dir(dir, "--out", spec.reads, &[])
        .and_then(|()| anyshape_files::swap_dir(&tmp, dir).map_err(io(dir)));
    if swapped.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    swapped?;
    Ok(manifest)
}

/// The C header: the entry point, the tree walk, each kernel, and how to call them.
fn header_text(
    w: &Workload,
    vars: &[String],
    symbolic: &[String],
    specialized: &[SpecializedKernel],
) -> String {
    let mut h = String::new();
    h.push_str("/* Generated by anyshape. Do not edit.\n *\n");
    h.push_str(&format!(" * Workload: {w}\n"));
    h.push_str(&format!(
        " * vars[] holds the shape vars in this order: {}\n",
        vars.join(", ")
    ));
    for (i, t) in w.inputs.iter().enumerate() {
        let shape: Vec<String> = t.shape.iter().map(|e| e.to_string()).collect();
        let layout = match t.panels {
            Some(p) => {
                let stored: Vec<String> = t.stored_shape().iter().map(|e| e.to_string()).collect();
                format!(
                    "f32 in panels of {p} rows: [{}], rows padded",
                    stored.join(", ")
                )
            }
            None => "row-major f32".into(),
        };
        h.push_str(&format!(
            " * ins[{i}]  = {} [{}], {layout}\n",
            t.name,
            shape.join(", ")
        ));
    }
    let shape: Vec<String> = w.output.shape.iter().map(|e| e.to_string()).collect();
    h.push_str(&format!(
        " * outs[0] = {} [{}], row-major f32 (overwritten)\n *\n",
        w.output.name,
        shape.join(", ")
    ));
    h.push_str(
        " * Returns ANYSHAPE_OK, or a status below. Safe to call from several threads.\n */\n",
    );
    h.push_str("#ifndef ANYSHAPE_MODULE_H\n#define ANYSHAPE_MODULE_H\n#include <stdint.h>\n");
    for (name, value) in [
        ("ANYSHAPE_OK", STATUS_OK),
        ("ANYSHAPE_WRONG_SHAPE", STATUS_WRONG_SHAPE),
        ("ANYSHAPE_NO_MEMORY", STATUS_NO_MEMORY),
        ("ANYSHAPE_NO_KERNEL", STATUS_NO_KERNEL),
    ] {
        h.push_str(&format!("#define {name} {value}\n"));
    }
    let sig = "(const int64_t *vars, const float *const *ins, float *const *outs)";
    h.push_str("\n/* Any shape: dispatches to the best kernel of the module. */\n");
    h.push_str(&format!("int32_t {ENTRY_SYMBOL}{sig};\n"));
    h.push_str("/* The dispatch tree alone: the index of the micro-kernel it picks. */\n");
    h.push_str(&format!("int32_t {SELECT_SYMBOL}(const int64_t *vars);\n"));
    h.push_str("\n/* Symbolic kernels, one per micro-kernel (any shape). */\n");
    for s in symbolic {
        h.push_str(&format!("int32_t {s}{sig};\n"));
    }
    if !specialized.is_empty() {
        h.push_str("\n/* Specialized kernels (return ANYSHAPE_WRONG_SHAPE for other shapes). */\n");
        for s in specialized {
            h.push_str(&format!(
                "int32_t {}{sig}; /* {} */\n",
                s.symbol, s.bindings
            ));
        }
    }
    h.push_str("#endif\n");
    h
}
