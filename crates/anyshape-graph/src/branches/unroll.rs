//! `Scan` (opset 9 on) and `Loop` unrolled at import (see the parent module's doc): each
//! step a renamed copy of the body, its scan outputs unsqueezed and concatenated.
use super::{constant, copy_of, fresh, unary, MAX_UNROLLED};
use crate::graph::Graph;
use crate::{GraphError, Result};
use anyshape_tensor::{Attr, Fact, Node};
use std::collections::BTreeMap;

/// The nodes that replace the `Scan` at `k`: its body unrolled over the scan axis.
/// `facts`: those of the values the nodes before it make.
pub(super) fn unroll_scan(g: &mut Graph, k: usize, facts: &[Option<Fact>]) -> Result<Vec<Node>> {
    let node = g.nodes[k].clone();
    if g.opset < 9 {
        return Err(GraphError::Unsupported(format!(
            "node `{}`: Scan before opset 9 (batch-major, with sequence lengths) is not implemented",
            node.name
        )));
    }
    let body = match node.attrs.get("body") {
        Some(Attr::Branch(b)) => (**b).clone(),
        _ => return Err(node.error("`body` must be a graph").into()),
    };
    let m = node.int("num_scan_inputs", 0)?;
    let n_in = node.inputs.len();
    let m = usize::try_from(m)
        .ok()
        .filter(|&m| m >= 1 && m <= n_in)
        .ok_or_else(|| node.error(format!("num_scan_inputs {m} for {n_in} inputs")))?;
    let states = n_in - m;
    let scans_out = node
        .outputs
        .len()
        .checked_sub(states)
        .ok_or_else(|| node.error("fewer outputs than states"))?;
    if body.inputs.len() != n_in || body.outputs.len() != node.outputs.len() {
        return Err(node.error("the body takes the states and a slice of each scan input, and gives the states and a slice of each scan output").into());
    }
    let list = |name: &str, len: usize| -> Result<Vec<i64>> {
        let v = node.ints(name)?.unwrap_or_else(|| vec![0; len]);
        match v.len() == len {
            true => Ok(v),
            false => Err(node.error(format!("`{name}` needs {len} values")).into()),
        }
    };
    let (in_axes, in_dirs) = (
        list("scan_input_axes", m)?,
        list("scan_input_directions", m)?,
    );
    let (out_axes, out_dirs) = (
        list("scan_output_axes", scans_out)?,
        list("scan_output_directions", scans_out)?,
    );
    // The scan axis's extent, which every scan input shares.
    let mut steps = None;
    let mut axes = Vec::with_capacity(m);
    for (&input, &axis) in node.inputs[states..].iter().zip(&in_axes) {
        let v = input.ok_or_else(|| node.error("a scan input is left out"))?;
        let f = facts[v]
            .as_ref()
            .ok_or_else(|| node.error("a scan input without a value"))?;
        let r = f.rank() as i64;
        let a = match axis {
            a if (0..r).contains(&a) => a as usize,
            a if (-r..0).contains(&a) => (a + r) as usize,
            a => return Err(node.error(format!("scan axis {a} for rank {r}")).into()),
        };
        let t = f.shape[a].as_const().ok_or_else(|| {
            GraphError::Unsupported(format!(
                "node `{}`: a Scan over an extent known only at run time ({}) cannot be unrolled",
                node.name, f.shape[a]
            ))
        })?;
        if steps.is_some_and(|s| s != t) {
            return Err(node
                .error("scan inputs of different extents along their axes")
                .into());
        }
        steps = Some(t);
        axes.push(a);
    }
    let steps = steps.unwrap_or(0) as usize;
    if steps == 0 || steps.saturating_mul(body.nodes.len() + m + scans_out) > MAX_UNROLLED {
        return Err(GraphError::Unsupported(format!(
            "node `{}`: a Scan of {steps} iterations of {} nodes (1 to {MAX_UNROLLED} nodes unrolled)",
            node.name,
            body.nodes.len()
        )));
    }
    let mut out = Vec::new();
    let mut state: Vec<usize> = (0..states)
        .map(|i| node.inputs[i].ok_or_else(|| node.error("a state is left out")))
        .collect::<std::result::Result<_, _>>()?;
    let mut pieces: Vec<Vec<usize>> = vec![Vec::new(); scans_out];
    for t in 0..steps {
        let suffix = format!(" (step {t})");
        let mut map = BTreeMap::new();
        for (i, &s) in state.iter().enumerate() {
            map.insert(body.inputs[i], s);
        }
        for j in 0..m {
            let at = if in_dirs[j] != 0 { steps - 1 - t } else { t };
            let index = constant(
                g,
                format!("{} scan index {at}", node.name),
                anyshape_tensor::Tensor::scalar_i64(at as i64),
            );
            let slice = fresh(g, format!("{}{suffix}", g.values[body.inputs[states + j]]));
            out.push(Node {
                name: format!("{} slice {j}{suffix}", node.name),
                op: "Gather".into(),
                inputs: vec![node.inputs[states + j], Some(index)],
                outputs: vec![slice],
                attrs: [("axis".to_string(), Attr::Int(axes[j] as i64))].into(),
            });
            map.insert(body.inputs[states + j], slice);
        }
        let given = copy_of(g, &body, &suffix, &mut map, &mut out);
        state = given[..states].to_vec();
        stack(
            g,
            &node,
            &suffix,
            &given[states..],
            &out_axes,
            &mut out,
            &mut pieces,
        );
    }
    let reversed: Vec<bool> = out_dirs.iter().map(|&d| d != 0).collect();
    finish(&node, &state, pieces, &out_axes, &reversed, &mut out);
    Ok(out)
}

/// Each of one step's scan outputs `given` unsqueezed at its axis, into `pieces`.
fn stack(
    g: &mut Graph,
    node: &Node,
    suffix: &str,
    given: &[usize],
    axes: &[i64],
    out: &mut Vec<Node>,
    pieces: &mut [Vec<usize>],
) {
    for (o, &v) in given.iter().enumerate() {
        let grown = fresh(g, format!("{}{suffix} (unsqueezed)", g.values[v]));
        out.push(unary(
            format!("{} output {o}{suffix}", node.name),
            "Unsqueeze",
            v,
            grown,
            vec![("axes", Attr::Ints(vec![axes[o]]))],
        ));
        pieces[o].push(grown);
    }
}

/// The unrolled op's outputs: its final states, then each scan output's pieces
/// concatenated along its axis (`reversed`: last step first).
fn finish(
    node: &Node,
    state: &[usize],
    pieces: Vec<Vec<usize>>,
    axes: &[i64],
    reversed: &[bool],
    out: &mut Vec<Node>,
) {
    for (i, &s) in state.iter().enumerate() {
        out.push(unary(
            format!("{} state {i}", node.name),
            "Identity",
            s,
            node.outputs[i],
            vec![],
        ));
    }
    for (o, mut p) in pieces.into_iter().enumerate() {
        if reversed[o] {
            p.reverse();
        }
        out.push(Node {
            name: format!("{} output {o}", node.name),
            op: "Concat".into(),
            inputs: p.into_iter().map(Some).collect(),
            outputs: vec![node.outputs[state.len() + o]],
            attrs: [("axis".to_string(), Attr::Int(axes[o]))].into(),
        });
    }
}

/// The nodes that replace the `Loop` at `k`: its body unrolled `M` times, `M` its trip
/// count known when the model is read, the body passing its condition through.
/// `facts`: those of the values the nodes before it make.
pub(super) fn unroll_loop(g: &mut Graph, k: usize, facts: &[Option<Fact>]) -> Result<Vec<Node>> {
    use anyshape_tensor::Tensor;
    let node = g.nodes[k].clone();
    let body = match node.attrs.get("body") {
        Some(Attr::Branch(b)) => (**b).clone(),
        _ => return Err(node.error("`body` must be a graph").into()),
    };
    let carried = node.inputs.len().saturating_sub(2);
    let scans = node
        .outputs
        .len()
        .checked_sub(carried)
        .ok_or_else(|| node.error("fewer outputs than loop-carried values"))?;
    if body.inputs.len() != carried + 2 || body.outputs.len() != carried + 1 + scans {
        return Err(node.error("the body takes the iteration, the condition and the carried values, and gives the condition, the carried values and the scan outputs").into());
    }
    let trips = match node.optional_input(0) {
        None => None,
        Some(m) => match facts[m].as_ref().and_then(|f| f.value.as_ref()) {
            Some(t) => match t.as_i64().map_err(|e| node.error(e))? {
                [m] => Some(*m),
                _ => return Err(node.error("the trip count must be one integer").into()),
            },
            None => {
                return Err(GraphError::Unsupported(format!(
                "node `{}`: a Loop whose trip count is known only at run time cannot be unrolled",
                node.name
            )))
            }
        },
    };
    // The body must give its condition back unchanged: the loop then runs its trip
    // count where the condition holds, and not at all where it does not.
    let passes = body.outputs[0] == body.inputs[1]
        || body.nodes.iter().any(|n| {
            n.op == "Identity"
                && n.outputs == [body.outputs[0]]
                && n.inputs == [Some(body.inputs[1])]
        });
    let trips = match (trips, passes) {
        (Some(m), true) => m,
        _ => {
            return Err(GraphError::Unsupported(format!(
            "node `{}`: a Loop whose condition its body computes (a while loop) cannot be unrolled",
            node.name
        )))
        }
    };
    let cond = match node.optional_input(1) {
        None => true,
        Some(c) => match facts[c].as_ref().and_then(|f| f.value.as_ref()) {
            Some(t) => match t.as_bool().map_err(|e| node.error(e))? {
                [c] => *c,
                _ => return Err(node.error("the condition must be one boolean").into()),
            },
            None => {
                return Err(GraphError::Unsupported(format!(
                "node `{}`: a Loop whose condition is known only at run time cannot be unrolled",
                node.name
            )))
            }
        },
    };
    let steps = if cond { trips.max(0) as usize } else { 0 };
    if (steps == 0 && scans > 0) || steps.saturating_mul(body.nodes.len() + scans) > MAX_UNROLLED {
        return Err(GraphError::Unsupported(format!(
            "node `{}`: a Loop of {steps} iterations of {} nodes (1 to {MAX_UNROLLED} nodes unrolled, at least one with scan outputs)",
            node.name,
            body.nodes.len()
        )));
    }
    let cond_value = constant(
        g,
        format!("{} condition", node.name),
        Tensor::bool(vec![], vec![cond])?,
    );
    let mut state: Vec<usize> = (0..carried)
        .map(|i| node.inputs[2 + i].ok_or_else(|| node.error("a loop-carried value is left out")))
        .collect::<std::result::Result<_, _>>()?;
    let mut out = Vec::new();
    let mut pieces: Vec<Vec<usize>> = vec![Vec::new(); scans];
    let axes = vec![0; scans];
    for t in 0..steps {
        let suffix = format!(" (iteration {t})");
        let iteration = constant(
            g,
            format!("{} iteration {t}", node.name),
            Tensor::scalar_i64(t as i64),
        );
        let mut map = BTreeMap::from([(body.inputs[0], iteration), (body.inputs[1], cond_value)]);
        for (i, &s) in state.iter().enumerate() {
            map.insert(body.inputs[2 + i], s);
        }
        let given = copy_of(g, &body, &suffix, &mut map, &mut out);
        state = given[1..1 + carried].to_vec();
        stack(
            g,
            &node,
            &suffix,
            &given[1 + carried..],
            &axes,
            &mut out,
            &mut pieces,
        );
    }
    finish(&node, &state, pieces, &axes, &vec![false; scans], &mut out);
    Ok(out)
}
