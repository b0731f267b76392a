//! The dispatcher's C form (a module's entry point): the dispatch tree as nested
//! comparisons, sending exact matches to specialized kernels and everything else
//! through the tree to a symbolic kernel; beside it the module's parallel loop, which
//! lends the kernels' OpenMP team to the runtime's host steps.
use anyshape_abi::{
    DispatchTree, ENTRY_SYMBOL, KERNEL_SIGNATURE, PARALLEL_SYMBOL, SELECT_SYMBOL, STATUS_NO_KERNEL,
};
use std::collections::BTreeMap;
use std::fmt::Write;

/// The tree as C statements returning `ret(kernel)`; `vars` gives each var's index.
fn tree_c(
    tree: &DispatchTree,
    out: &mut String,
    depth: usize,
    vars: &[String],
    ret: &dyn Fn(usize) -> String,
) {
    let pad = "  ".repeat(depth);
    match tree {
        DispatchTree::Leaf { kernel } => {
            let _ = writeln!(out, "{pad}return {};", ret(*kernel));
        }
        DispatchTree::Split { var, at, le, gt } => {
            let i = vars.iter().position(|v| v == var).unwrap_or(0);
            let _ = writeln!(out, "{pad}if (vars[{i}] <= {at}LL) {{");
            tree_c(le, out, depth + 1, vars, ret);
            let _ = writeln!(out, "{pad}}} else {{");
            tree_c(gt, out, depth + 1, vars, ret);
            let _ = writeln!(out, "{pad}}}");
        }
    }
}

/// Everything the dispatcher's C code needs.
pub struct DispatcherSpec<'a> {
    /// The workload's shape vars, in kernel-ABI order (sorted by name).
    pub vars: &'a [String],
    /// The tree; its leaves index `symbolic`.
    pub tree: &'a DispatchTree,
    /// Symbol of the symbolic kernel of each micro-kernel.
    pub symbolic: &'a [String],
    /// Specialized kernels: the instance (values in `vars` order) and the symbol.
    pub specialized: &'a [(Vec<i64>, String)],
    /// The threads the kernels run on (the target's cores): the parallel loop's team.
    pub threads: usize,
}

/// The dispatcher as a C translation unit (without the shared prelude): prototypes of
/// the kernels it calls, [`SELECT_SYMBOL`], [`ENTRY_SYMBOL`] and [`PARALLEL_SYMBOL`].
pub fn dispatcher_c(spec: &DispatcherSpec) -> String {
    let mut out = String::new();
    let sig = KERNEL_SIGNATURE;
    let mut declared: Vec<&String> = spec
        .symbolic
        .iter()
        .chain(spec.specialized.iter().map(|s| &s.1))
        .collect();
    declared.sort();
    declared.dedup();
    for s in declared {
        let _ = writeln!(out, "int32_t {s}{sig};");
    }
    let _ = writeln!(
        out,
        "int32_t {SELECT_SYMBOL}(const int64_t *restrict vars) {{"
    );
    let _ = writeln!(out, "  (void)vars;");
    tree_c(spec.tree, &mut out, 1, spec.vars, &|k| k.to_string());
    out.push_str("}\n");
    let _ = writeln!(out, "int32_t {ENTRY_SYMBOL}{sig} {{");
    let mut by_value: BTreeMap<&[i64], &String> = BTreeMap::new();
    for (values, sym) in spec.specialized {
        by_value.insert(values.as_slice(), sym);
    }
    let entries: Vec<(&[i64], &String)> = by_value.into_iter().collect();
    specialized_switch(&mut out, 1, 0, &entries);
    let _ = writeln!(out, "  switch ({SELECT_SYMBOL}(vars)) {{");
    for (k, sym) in spec.symbolic.iter().enumerate() {
        let _ = writeln!(out, "  case {k}: return {sym}(vars, ins, outs);");
    }
    let _ = writeln!(out, "  default: return {STATUS_NO_KERNEL};");
    out.push_str("  }\n}\n");
    // The kernels' loops are `num_threads(threads)` teams too: one set of threads.
    let _ = writeln!(
        out,
        "void {PARALLEL_SYMBOL}(int64_t parts, void (*part)(void *, int64_t), void *ctx) {{"
    );
    let _ = writeln!(
        out,
        "#pragma omp parallel for schedule(static) num_threads({}) if(parts > 1)",
        spec.threads.max(1)
    );
    out.push_str("  for (int64_t i = 0; i < parts; i++) part(ctx, i);\n}\n");
    out
}

/// Nested `switch`es on `vars[level..]` that return the specialized kernel of an exact match.
fn specialized_switch(out: &mut String, depth: usize, level: usize, entries: &[(&[i64], &String)]) {
    if entries.is_empty() {
        return;
    }
    let pad = "  ".repeat(depth);
    if entries[0].0.len() == level {
        let _ = writeln!(out, "{pad}return {}(vars, ins, outs);", entries[0].1);
        return;
    }
    let _ = writeln!(out, "{pad}switch (vars[{level}]) {{");
    let mut i = 0;
    while i < entries.len() {
        let v = entries[i].0[level];
        let mut j = i;
        while j < entries.len() && entries[j].0[level] == v {
            j += 1;
        }
        let _ = writeln!(out, "{pad}case {v}LL: {{");
        specialized_switch(out, depth + 1, level + 1, &entries[i..j]);
        let _ = writeln!(out, "{pad}  break;\n{pad}}}");
        i = j;
    }
    let _ = writeln!(out, "{pad}default: break;\n{pad}}}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyshape_abi::DispatchTree;

    fn tree() -> DispatchTree {
        DispatchTree::Split {
            var: "T".into(),
            at: 40,
            le: Box::new(DispatchTree::Leaf { kernel: 0 }),
            gt: Box::new(DispatchTree::Split {
                var: "T".into(),
                at: 90,
                le: Box::new(DispatchTree::Leaf { kernel: 1 }),
                gt: Box::new(DispatchTree::Leaf { kernel: 2 }),
            }),
        }
    }

    #[test]
    fn prints_the_tree_and_the_specialized_switch() {
        let t = tree();
        let c = dispatcher_c(&DispatcherSpec {
            vars: &["T".to_string()],
            tree: &t,
            symbolic: &["a".into(), "b".into(), "c".into()],
            specialized: &[(vec![7], "s7".into()), (vec![3], "s3".into())],
            threads: 2,
        });
        assert!(c.contains("case 3LL: {") && c.contains("return s7(vars, ins, outs);"));
        assert!(c.contains("if (vars[0] <= 40LL)") && c.contains("case 2: return c("));
    }
}
