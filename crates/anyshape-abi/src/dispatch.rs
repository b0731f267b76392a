//! The dispatch tree: a decision tree over shape-var values whose leaves name
//! micro-kernels (by index into a module's list). The code generator emits it as C;
//! the runtime walks it to say which kernel serves an instance.
use anyshape_ir::Bindings;
use serde::{Deserialize, Serialize};
use std::fmt::Write;

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
    fn selects_renders_and_round_trips() {
        let t = tree();
        let at = |v| t.select(&Bindings::from_pairs([("T", v)]));
        assert_eq!(
            (at(1), at(40), at(41), at(90), at(91), at(5000)),
            (0, 0, 1, 1, 2, 2)
        );
        assert_eq!((t.depth(), t.leaves(), t.max_kernel()), (2, 3, 2));
        assert_eq!(t.vars(), vec!["T".to_string()]);
        assert!(t.render(&|k| format!("mk{k}")).contains("if T <= 90:"));
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<DispatchTree>(&json).unwrap(), t);
    }
}
