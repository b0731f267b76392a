//! The dispatcher: a decision tree over shape-var values whose leaves name micro-kernels,
//! and its C form (the module's entry point), which sends exact matches to specialized
//! kernels and everything else through the tree to a symbolic kernel.
use crate::c::STATUS_NO_KERNEL;
use anyshape_ir::Bindings;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Name of the module's entry point (the kernel ABI of [`crate::c`]).
pub const ENTRY_SYMBOL: &str = "anyshape_module_run";
/// Name of the tree walk alone: `int32_t anyshape_module_select(const int64_t *vars)`
/// returns the index of the micro-kernel the tree picks.
pub const SELECT_SYMBOL: &str = "anyshape_module_select";

/// A decision tree over shape-var values; leaves hold micro-kernel indices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DispatchTree {
    /// Use micro-kernel `kernel`.
    Leaf {
        /// Index into the module's micro-kernels.
        kernel: usize,
    },
    /// `var <= at` goes to `le`, the rest to `gt`.
    Split {
        /// The shape var compared.
        var: String,
        /// The threshold (inclusive on the `le` side).
        at: i64,
        /// Subtree for `var <= at`.
        le: Box<DispatchTree>,
        /// Subtree for `var > at`.
        gt: Box<DispatchTree>,
    },
}

impl DispatchTree {
    /// The deepest tree a module may hold: the tree is trained with this limit and the
    /// loader refuses deeper ones, so whatever a module's writer writes, its reader
    /// reads (a deeper tree would also exceed the JSON parser's nesting limit).
    pub const MAX_DEPTH: usize = 24;

    /// The micro-kernel index for `bindings` (an unbound var counts as 0).
    pub fn select(&self, bindings: &Bindings) -> usize {
        let mut node = self;
        loop {
            match node {
                DispatchTree::Leaf { kernel } => return *kernel,
                DispatchTree::Split { var, at, le, gt } => {
                    node = if bindings.get(var).unwrap_or(0) <= *at {
                        le
                    } else {
                        gt
                    };
                }
            }
        }
    }

    /// Levels of comparisons on the longest path.
    pub fn depth(&self) -> usize {
        match self {
            DispatchTree::Leaf { .. } => 0,
            DispatchTree::Split { le, gt, .. } => 1 + le.depth().max(gt.depth()),
        }
    }

    /// Number of leaves.
    pub fn leaves(&self) -> usize {
        match self {
            DispatchTree::Leaf { .. } => 1,
            DispatchTree::Split { le, gt, .. } => le.leaves() + gt.leaves(),
        }
    }

    /// Largest micro-kernel index in a leaf.
    pub fn max_kernel(&self) -> usize {
        match self {
            DispatchTree::Leaf { kernel } => *kernel,
            DispatchTree::Split { le, gt, .. } => le.max_kernel().max(gt.max_kernel()),
        }
    }

    /// Shape vars the tree compares.
    pub fn vars(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect_vars(&mut out);
        out.sort();
        out.dedup();
        out
    }

    fn collect_vars(&self, out: &mut Vec<String>) {
        if let DispatchTree::Split { var, le, gt, .. } = self {
            out.push(var.clone());
            le.collect_vars(out);
            gt.collect_vars(out);
        }
    }

    /// The tree as indented text, `name(kernel)` naming each leaf.
    pub fn render(&self, name: &dyn Fn(usize) -> String) -> String {
        let mut out = String::new();
        self.render_into(&mut out, 0, name);
        out
    }

    fn render_into(&self, out: &mut String, depth: usize, name: &dyn Fn(usize) -> String) {
        let pad = "  ".repeat(depth);
        match self {
            DispatchTree::Leaf { kernel } => {
                let _ = writeln!(out, "{pad}-> {}", name(*kernel));
            }
            DispatchTree::Split { var, at, le, gt } => {
                let _ = writeln!(out, "{pad}if {var} <= {at}:");
                le.render_into(out, depth + 1, name);
                let _ = writeln!(out, "{pad}else ({var} > {at}):");
                gt.render_into(out, depth + 1, name);
            }
        }
    }

    /// The tree as C statements returning `ret(kernel)`; `vars` gives each var's index.
    fn c_into(
        &self,
        out: &mut String,
        depth: usize,
        vars: &[String],
        ret: &dyn Fn(usize) -> String,
    ) {
        let pad = "  ".repeat(depth);
        match self {
            DispatchTree::Leaf { kernel } => {
                let _ = writeln!(out, "{pad}return {};", ret(*kernel));
            }
            DispatchTree::Split { var, at, le, gt } => {
                let i = vars.iter().position(|v| v == var).unwrap_or(0);
                let _ = writeln!(out, "{pad}if (vars[{i}] <= {at}LL) {{");
                le.c_into(out, depth + 1, vars, ret);
                let _ = writeln!(out, "{pad}}} else {{");
                gt.c_into(out, depth + 1, vars, ret);
                let _ = writeln!(out, "{pad}}}");
            }
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
}

/// The dispatcher as a C translation unit (without the shared prelude): prototypes of
/// the kernels it calls, [`SELECT_SYMBOL`] and [`ENTRY_SYMBOL`].
pub fn dispatcher_c(spec: &DispatcherSpec) -> String {
    let mut out = String::new();
    let sig = "(const int64_t *restrict vars, const float *const *restrict ins, float *const *restrict outs)";
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
    spec.tree.c_into(&mut out, 1, spec.vars, &|k| k.to_string());
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
    fn selects_renders_and_prints() {
        let t = tree();
        let at = |v| t.select(&Bindings::from_pairs([("T", v)]));
        assert_eq!(
            (at(1), at(40), at(41), at(90), at(91), at(5000)),
            (0, 0, 1, 1, 2, 2)
        );
        assert_eq!((t.depth(), t.leaves(), t.max_kernel()), (2, 3, 2));
        assert!(t.render(&|k| format!("mk{k}")).contains("if T <= 90:"));
        let c = dispatcher_c(&DispatcherSpec {
            vars: &["T".to_string()],
            tree: &t,
            symbolic: &["a".into(), "b".into(), "c".into()],
            specialized: &[(vec![7], "s7".into()), (vec![3], "s3".into())],
        });
        assert!(c.contains("case 3LL: {") && c.contains("return s7(vars, ins, outs);"));
        assert!(c.contains("if (vars[0] <= 40LL)") && c.contains("case 2: return c("));
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<DispatchTree>(&json).unwrap(), t);
    }
}
