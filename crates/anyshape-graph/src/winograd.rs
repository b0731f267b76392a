//! Convolutions by Winograd's minimal filtering F(m x m, 3x3), a rewrite of the graph
//! before fusion: each `Conv` over constant 3 x 3 filters of stride 1, dilation 1 and
//! one group (pads given, not `SAME_*`) becomes
//!
//! 1. `anyshape.WinogradInput(X)`: the image's tiles transformed, `[α², ci, tiles]`
//!    (`α` = `m + 2`);
//! 2. `MatMul(U, V)`: the filters transformed when the model is compiled (`U`
//!    `[α², co, ci]`, a new constant) by those tiles, position by position — a
//!    `batch_matmul_nn` kernel of 2.25x (m = 2) or 4x (m = 4) fewer multiply-adds
//!    than the convolution;
//! 3. `anyshape.WinogradOutput(M, X, B, R)`: the products transformed back into the
//!    convolution's output, its bias added, then the residual `Add` (of the output's
//!    shape) and the `Relu` that follow it, each the sole use of what it reads, where
//!    there are such (those nodes are gone).
//!
//! Which `m`: 4 where the output is at least [`F4_FROM`] pixels each way at the dims'
//! smallest values (then its tiles are many and few of them overhang the output), 2
//! elsewhere — and where those values are not known.
//!
//! The transforms and their arithmetic are `anyshape_tensor::ops`' (`winograd.rs`).
//! Other convolutions stay `Conv`s (fusion makes `conv_packed` kernels of them).
use crate::graph::Graph;
use crate::infer::infer;
use crate::Result;
use anyshape_ir::Bindings;
use anyshape_tensor::ops::{
    winograd_filters, Window, WinogradTile, WINOGRAD_INPUT, WINOGRAD_OUTPUT,
};
use anyshape_tensor::{Attr, DType, Fact, Node, ValueId};
use std::collections::BTreeMap;

/// The least output extent (each way) at which a convolution takes F(4x4, 3x3).
/// ResNet-50 compiled for 96..320 (Zen 3, untuned, per-step minima over 6 runs in
/// alternating order, `benchmarks/results/resnet50.ts/zen3/f4-step-minima.txt`): its
/// first two stages' images (24..80, 12..40) take it, and their Winograd steps
/// (transforms and products) took 10.7 against 14.0 ms with F(2x2, 3x3) at 224 x 224,
/// 14.0 against 18.0 ms at 320 x 320, but 5.3 against 4.4 ms at 96 x 96, where the
/// second stage's 3 x 3 tiles make a product kernel of 9 columns; the third stage's
/// (6..20) keep F(2x2).
pub const F4_FROM: i64 = 12;

/// Rewrite every convolution of `g` that Winograd's filtering computes (see the
/// module's doc), given the facts of `g` and each dim's smallest value (`least`; none
/// known: F(2x2, 3x3) everywhere but at constant extents); the facts of the graph
/// rewritten.
pub fn winograd(
    g: &mut Graph,
    facts: Vec<Option<Fact>>,
    least: &Bindings,
) -> Result<Vec<Option<Fact>>> {
    let mut nodes = Vec::with_capacity(g.nodes.len());
    // The nodes an output transform absorbed, each with what takes its place: the
    // output transform itself at the last of them (where the residual it reads is
    // written), nothing at the others.
    let mut absorbed: BTreeMap<usize, Option<Node>> = BTreeMap::new();
    let old = std::mem::take(&mut g.nodes);
    let mut rewritten = false;
    for (k, node) in old.iter().enumerate() {
        if let Some(place) = absorbed.remove(&k) {
            nodes.extend(place);
            continue;
        }
        let Some(conv) = Conv::of(&facts, node, least) else {
            nodes.push(node.clone());
            continue;
        };
        // A residual `Add` of the output's shape that is its sole use, then a `Relu`
        // that is the sole use of what came before it, run in the output transform.
        let sole_use = |v: ValueId| -> Option<usize> {
            let uses: Vec<usize> = (k + 1..old.len())
                .filter(|&u| old[u].inputs.contains(&Some(v)))
                .collect();
            match uses[..] {
                [u] if !g.outputs.contains(&v) => Some(u),
                _ => None,
            }
        };
        let shape = |v: ValueId| facts.get(v).and_then(Option::as_ref).map(|f| &f.shape);
        let (mut out, mut residual, mut last) = (node.outputs[0], None, None);
        if let Some(a) = sole_use(out).filter(|&a| old[a].op == "Add") {
            let other = match old[a].inputs[..] {
                [Some(p), Some(q)] if p == out && q != out => Some(q),
                [Some(p), Some(q)] if q == out && p != out => Some(p),
                _ => None,
            };
            if let Some(r) = other.filter(|&r| shape(r).is_some() && shape(r) == shape(out)) {
                absorbed.insert(a, None);
                (out, residual, last) = (old[a].outputs[0], Some(r), Some(a));
            }
        }
        let relu = match sole_use(out).filter(|&r| old[r].op == "Relu") {
            Some(r) => {
                absorbed.insert(r, None);
                (out, last) = (old[r].outputs[0], Some(r));
                true
            }
            None => false,
        };
        let y = node.outputs[0];
        let name = g.values[y].clone();
        let mut value = |suffix: &str| {
            g.values.push(format!("{name}.winograd_{suffix}"));
            g.values.len() - 1
        };
        let (u, v, m) = (value("filters"), value("tiles"), value("products"));
        g.initializers.insert(u, conv.filters);
        let pads = Attr::Ints(conv.pads.iter().map(|&p| p as i64).collect());
        let tile = Attr::Int(conv.tile.m as i64);
        let internal = |name: String, op: &str, inputs: Vec<Option<ValueId>>, outputs| Node {
            name,
            op: op.into(),
            inputs,
            outputs,
            attrs: Default::default(),
        };
        let mut input = internal(
            format!("{} (tiles)", node.name),
            WINOGRAD_INPUT,
            vec![Some(conv.x)],
            vec![v],
        );
        input.attrs.insert("pads".into(), pads.clone());
        input.attrs.insert("tile".into(), tile.clone());
        let products = internal(
            format!("{} (products)", node.name),
            "MatMul",
            vec![Some(u), Some(v)],
            vec![m],
        );
        let mut output = internal(
            node.name.clone(),
            WINOGRAD_OUTPUT,
            vec![Some(m), Some(conv.x), conv.bias, residual],
            vec![out],
        );
        output.attrs.insert("pads".into(), pads);
        output.attrs.insert("tile".into(), tile);
        output.attrs.insert("relu".into(), Attr::Int(relu as i64));
        nodes.extend([input, products]);
        rewritten = true;
        match last {
            Some(l) => drop(absorbed.insert(l, Some(output))),
            None => nodes.push(output),
        }
    }
    g.nodes = nodes;
    match rewritten {
        true => infer(g),
        false => Ok(facts),
    }
}

/// A convolution Winograd's filtering computes: its image, its tile, its filters
/// transformed, its bias and its pads.
struct Conv {
    x: ValueId,
    tile: &'static WinogradTile,
    filters: anyshape_tensor::Tensor,
    bias: Option<ValueId>,
    pads: [usize; 4],
}

impl Conv {
    /// `node` as such a convolution, where it is one, its tile chosen by its output's
    /// extents at the dims' values `least`.
    fn of(facts: &[Option<Fact>], node: &Node, least: &Bindings) -> Option<Conv> {
        if node.op != "Conv" || node.outputs.len() != 1 || node.int("group", 1).ok()? != 1 {
            return None;
        }
        let fact = |v: ValueId| facts.get(v)?.as_ref();
        let (x, w) = (node.input(0).ok()?, node.input(1).ok()?);
        let (fx, fw) = (fact(x)?, fact(w)?);
        let filters = fw.value.as_ref()?;
        let &[co, ci, 3, 3] = &filters.shape[..] else {
            return None;
        };
        if fx.dtype != DType::F32
            || filters.dtype() != DType::F32
            || fx.shape.len() != 4
            || fx.shape[1].as_const() != Some(ci as i64)
        {
            return None;
        }
        let bias = node.optional_input(2);
        if let Some(b) = bias {
            let fb = fact(b)?;
            if fb.dtype != DType::F32
                || fb.shape.len() != 1
                || fb.shape[0].as_const() != Some(co as i64)
            {
                return None;
            }
        }
        let window = Window::of(node).ok()?;
        if window.same.is_some()
            || window.strides[..] != [1, 1]
            || window.dilations[..] != [1, 1]
            || window.pads.len() != 4
        {
            return None;
        }
        let pads = [
            window.pads[0],
            window.pads[1],
            window.pads[2],
            window.pads[3],
        ];
        // The output's extents at the smallest dims (the padded image less 2).
        let smallest = |axis: usize, before: usize, after: usize| {
            let extent = fx.shape[2 + axis].eval(least).ok()?;
            Some(extent + (before + after) as i64 - 2)
        };
        let wide = [smallest(0, pads[0], pads[2]), smallest(1, pads[1], pads[3])]
            .iter()
            .all(|e| e.is_some_and(|e| e >= F4_FROM));
        let tile = match wide {
            true => &WinogradTile::F4,
            false => &WinogradTile::F2,
        };
        Some(Conv {
            x,
            tile,
            filters: winograd_filters(node, filters.view(), tile).ok()?,
            bias,
            pads,
        })
    }
}
