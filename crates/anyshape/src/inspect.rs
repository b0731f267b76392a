//! `anyshape inspect` and `anyshape run --module`: looking into a module and running it.
use crate::runner;
use anyhow::{bail, Result};
use anyshape_abi::ENTRY_SYMBOL;
use anyshape_codegen::CpuTarget;
use anyshape_ir::Bindings;
use anyshape_measure::{Candidate, MeasureOptions, Outcome};
use anyshape_runtime::Module;
use std::path::Path;

/// Print what a module holds: micro-kernels, the dispatch tree, which instances go where.
pub fn inspect(path: &Path) -> Result<()> {
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
    let target = serde_json::from_value::<CpuTarget>(m.target.clone()).map_or_else(
        |_| m.target_name().to_string(),
        |t| format!("{} ({} cores, {:?})", t.name, t.cores, t.simd),
    );
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

/// `anyshape run --module`: run the module's entry point on one instance in the worker.
pub fn run_module(
    path: &Path,
    bindings: &Bindings,
    check: bool,
    options: MeasureOptions,
) -> Result<()> {
    let module = Module::load(path)?;
    let bound = module.bind(bindings)?;
    let d = module.dispatch(bindings);
    let m = module.manifest();
    let candidate = Candidate {
        symbol: ENTRY_SYMBOL.into(),
        workload: module.workload().clone(),
        bindings: bindings.clone(),
        check,
        gpu: None,
    };
    let library = module.dir().join(&m.library);
    let outcome = runner(options)?.measure(&library, &[candidate])?.remove(0);
    let r = match outcome {
        Outcome::Measured(r) => r,
        Outcome::Failed(why) | Outcome::Interrupted(why) => bail!("the module failed: {why}"),
    };
    let flops = module.workload().flops(&bound);
    let tuned = m.votes.iter().any(|v| &v.bindings == bindings);
    println!(
        "module       {}  [{bindings}]{}",
        path.display(),
        if tuned {
            ""
        } else {
            "  (outside the tuned instances)"
        }
    );
    println!(
        "dispatched   #{} {} ({} kernel {})",
        d.micro_kernel,
        m.micro_kernels[d.micro_kernel],
        if d.specialized {
            "specialized"
        } else {
            "symbolic"
        },
        d.symbol
    );
    crate::print_measurement(&r, flops)
}
