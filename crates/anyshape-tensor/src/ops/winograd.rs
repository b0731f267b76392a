//! Winograd's minimal filtering F(m x m, 3 x 3) (Lavin and Gray, 2016), for output
//! tiles of `m` = 2 or 4: a 3 x 3 convolution of stride 1 as `α²` matrix products (`α`
//! = `m + 2`), one per position of an `α x α` input tile; an `m x m` output tile costs
//! `α²` multiplications instead of `9·m²` (2.25x fewer for m = 2, 4x for m = 4, whose
//! transforms round a little more). Three parts, which fusion runs as a host step, a
//! batched matmul kernel and a host step:
//!
//! - [`winograd_filters`]: the filters `g` `[co, ci, 3, 3]` transformed once, when the
//!   model is compiled, into `U = G g Gᵀ` `[α², co, ci]`;
//! - `anyshape.WinogradInput` ([`WINOGRAD_INPUT`]): the image `x` `[n, ci, h, w]`,
//!   zero-padded by its `pads` attribute (`[top, left, bottom, right]`), cut into
//!   overlapping `α x α` tiles `m` apart (its `tile` attribute: `m`, 2 where absent),
//!   each transformed into `Bᵀ d B`: `V` `[α², ci, n·th·tw]` (`th`, `tw`: the output's
//!   extents over `m`, rounded up);
//! - `U · V` per position (`MatMul` of `[α², co, ci]` by `[α², ci, n·th·tw]`);
//! - `anyshape.WinogradOutput` ([`WINOGRAD_OUTPUT`]): that product `[α², co,
//!   n·th·tw]`, the image (for its shape), the bias `[co]` and a residual `[n, co, oh,
//!   ow]` (both optional) to the convolution's output `[n, co, oh, ow]`, each tile
//!   `Aᵀ m A` plus the bias and the residual, then a ReLU where its `relu` attribute
//!   is 1 (its `pads` and `tile` as the input transform's).
//!
//! The internal ops are no ONNX ops: a model that names them is refused at import.
use super::{fail, req, shaped, sized, OpSpec};
use crate::node::Node;
use crate::{DType, Data, Fact, Result, Tensor, TensorRef, Workers};
use anyshape_ir::Expr;

mod passes;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: WINOGRAD_INPUT,
        since: 1,
        infer: infer_input,
        eval: eval_input,
        eval_into: Some(eval_input_into),
    },
    OpSpec {
        name: WINOGRAD_OUTPUT,
        since: 1,
        infer: infer_output,
        eval: eval_output,
        eval_into: Some(eval_output_into),
    },
];

/// The internal op that transforms an image's input tiles (see the module's doc).
pub const WINOGRAD_INPUT: &str = "anyshape.WinogradInput";

/// The internal op that transforms the products back into the convolution's output.
pub const WINOGRAD_OUTPUT: &str = "anyshape.WinogradOutput";

/// One of the minimal filterings F(m x m, 3 x 3): its tile and its filters'
/// transform (the input's and the output's are passes of `passes.rs`).
#[derive(Debug)]
pub struct WinogradTile {
    /// The output tile's extent `m`.
    pub m: usize,
    /// `G` (`α x 3`): the filters' transform (exact in `f64` where `f32` is not: 1/6,
    /// 1/24).
    g: &'static [[f64; 3]],
}

impl WinogradTile {
    /// F(2x2, 3x3): 4 x 4 input tiles, 16 products per 4 outputs.
    pub const F2: WinogradTile = WinogradTile {
        m: 2,
        g: &[
            [1.0, 0.0, 0.0],
            [0.5, 0.5, 0.5],
            [0.5, -0.5, 0.5],
            [0.0, 0.0, 1.0],
        ],
    };

    /// F(4x4, 3x3) (points 0, ±1, ±2): 6 x 6 input tiles, 36 products per 16 outputs.
    pub const F4: WinogradTile = WinogradTile {
        m: 4,
        g: &[
            [0.25, 0.0, 0.0],
            [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
            [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
            [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
            [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
            [0.0, 0.0, 1.0],
        ],
    };

    /// The filtering of output tiles `m` x `m`, where there is one.
    pub fn of(m: usize) -> Option<&'static WinogradTile> {
        match m {
            2 => Some(&Self::F2),
            4 => Some(&Self::F4),
            _ => None,
        }
    }

    /// The input tile's extent `α` = `m + 2`.
    pub fn alpha(&self) -> usize {
        self.m + 2
    }

    /// Positions of a transformed tile, `α²`: the batch of the matrix products.
    pub fn positions(&self) -> usize {
        self.alpha() * self.alpha()
    }
}

/// A node's `tile` attribute (2 where absent, as before there were two).
fn tile(node: &Node) -> Result<&'static WinogradTile> {
    match node.int("tile", 2)? {
        m if m == 2 || m == 4 => Ok(WinogradTile::of(m as usize).expect("2 or 4")),
        m => fail(
            node,
            format!("tile {m}: F(2x2, 3x3) or F(4x4, 3x3) (2 or 4)"),
        ),
    }
}

/// The filters `[co, ci, 3, 3]` transformed for `t`: `[α², co, ci]`, position `(i, j)`
/// (row-major) holding `(G g Gᵀ)[i][j]` of every filter, summed in `f64`.
pub fn winograd_filters(node: &Node, g: TensorRef, t: &WinogradTile) -> Result<Tensor> {
    let &[co, ci, 3, 3] = g.shape else {
        return fail(
            node,
            format!(
                "filters {:?}: a Winograd F(m x m, 3x3) needs [co, ci, 3, 3]",
                g.shape
            ),
        );
    };
    let gv = g.as_f32().map_err(|e| node.error(e))?;
    let (alpha, positions) = (t.alpha(), t.positions());
    let len = sized(node, &[positions, co, ci])?;
    let mut u = vec![0f32; len];
    for (f, taps) in gv.chunks_exact(9).enumerate() {
        for (p, pos) in u.chunks_exact_mut(co * ci).enumerate() {
            let (gi, gj) = (t.g[p / alpha], t.g[p % alpha]);
            let mut acc = 0f64;
            for a in 0..3 {
                for b in 0..3 {
                    acc += gi[a] * gj[b] * f64::from(taps[a * 3 + b]);
                }
            }
            pos[f] = acc as f32;
        }
    }
    Tensor::new(vec![positions, co, ci], Data::F32(u)).map_err(|e| node.error(e))
}

/// The geometry of one convolution's tiles.
struct Tiles {
    /// The filtering.
    tile: &'static WinogradTile,
    /// Pads `[top, left, bottom, right]`.
    pads: [usize; 4],
    /// The output's extents.
    oh: usize,
    ow: usize,
    /// Tiles down and across (the output's extents over `m`, rounded up).
    th: usize,
    tw: usize,
}

/// The `pads` attribute: four extents, none negative.
fn pads(node: &Node) -> Result<[usize; 4]> {
    match node.ints("pads")? {
        Some(p) if p.len() == 4 && p.iter().all(|&x| (0..=1 << 20).contains(&x)) => {
            Ok([p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize])
        }
        _ => fail(
            node,
            "pads: four extents [top, left, bottom, right], 0 or more",
        ),
    }
}

impl Tiles {
    /// The tiles of an image `h` x `w` under `node`'s pads (an error where the 3 x 3
    /// window does not fit).
    fn of(node: &Node, h: usize, w: usize) -> Result<Tiles> {
        let pads = pads(node)?;
        let (ph, pw) = (h + pads[0] + pads[2], w + pads[1] + pads[3]);
        if ph < 3 || pw < 3 {
            return fail(
                node,
                format!("an image of {h} x {w}, padded {ph} x {pw}: smaller than its 3 x 3 window"),
            );
        }
        let (oh, ow) = (ph - 2, pw - 2);
        let tile = tile(node)?;
        Ok(Tiles {
            tile,
            pads,
            oh,
            ow,
            th: oh.div_ceil(tile.m),
            tw: ow.div_ceil(tile.m),
        })
    }

    /// The same as expressions of the image's extents: `(oh, ow, th·tw)`.
    fn exprs(node: &Node, h: &Expr, w: &Expr) -> Result<(Expr, Expr, Expr)> {
        let p = pads(node)?;
        let oh = (h.clone() + (p[0] + p[2]) as i64 - 2).simplify();
        let ow = (w.clone() + (p[1] + p[3]) as i64 - 2).simplify();
        let m = Expr::Const(tile(node)?.m as i64);
        let tiles = Expr::ceil_div(oh.clone(), m.clone()) * Expr::ceil_div(ow.clone(), m);
        Ok((oh, ow, tiles.simplify()))
    }
}

/// An NCHW image of `f32`.
fn image<'a>(node: &Node, ins: &[Option<TensorRef<'a>>], i: usize) -> Result<TensorRef<'a>> {
    let x = req(node, ins, i)?;
    if x.shape.len() != 4 || x.dtype() != DType::F32 {
        return fail(node, "an NCHW image of f32");
    }
    Ok(x)
}

fn infer_input(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let [n, c, h, w] = &x.shape[..] else {
        return fail(node, "an NCHW image");
    };
    let (_, _, tiles) = Tiles::exprs(node, h, w)?;
    let cols = (n.clone() * tiles).simplify();
    Ok(vec![Fact::new(
        x.dtype,
        vec![Expr::Const(tile(node)?.positions() as i64), c.clone(), cols],
    )])
}

fn eval_input(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    super::eval_via(node, ins, eval_input_into)
}

/// The transformed tiles, a group of channels per part (their stretch of each of the
/// `α²` rows of `V`, one per position; the passes are [`passes::input_channels`]'s).
fn eval_input_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let x = image(node, ins, 0)?;
    let &[n, c, h, w] = x.shape else {
        return fail(node, "an NCHW image");
    };
    let t = Tiles::of(node, h, w)?;
    let cols = n * t.th * t.tw;
    let img = passes::Image {
        x: x.as_f32().map_err(|e| node.error(e))?,
        n,
        c,
        h,
        w,
    };
    let positions = t.tile.positions();
    let v = shaped(node, outs, 0, &[positions, c, cols])?
        .f32_mut()
        .map_err(|e| node.error(e))?;
    if cols == 0 || c == 0 {
        return Ok(());
    }
    // Channels in groups of at least a block of lanes' worth of tiles (all of them if
    // fewer), each group's stretch of every position's row its own.
    let group = passes::BLOCK.div_ceil(cols).min(c);
    let mut rows = v.chunks_mut(c * cols);
    let mut by_position: Vec<_> = (0..positions)
        .map(|_| {
            let row = rows.next().unwrap_or_default();
            row.chunks_mut(group * cols).collect::<Vec<_>>().into_iter()
        })
        .collect();
    let mut groups: Vec<Vec<&mut [f32]>> = (0..c.div_ceil(group))
        .map(|_| {
            by_position
                .iter_mut()
                .map(|p| p.next().unwrap_or_default())
                .collect()
        })
        .collect();
    workers.chunks_mut_weighted(&mut groups, 1, group * positions * cols, |g, dst| {
        SCRATCH.with_borrow_mut(|scratch| {
            passes::input_channels(&img, &t, g * group, &mut dst[0], scratch)
        })
    });
    Ok(())
}

thread_local! {
    /// A part's working rows (allocated once per thread).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn infer_output(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (m, x) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let ([_, co, _], [n, _, h, w]) = (&m.shape[..], &x.shape[..]) else {
        return fail(node, "products [16, co, tiles] and an NCHW image");
    };
    let (oh, ow, _) = Tiles::exprs(node, h, w)?;
    Ok(vec![Fact::new(
        m.dtype,
        vec![n.clone(), co.clone(), oh, ow],
    )])
}

fn eval_output(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    super::eval_via(node, ins, eval_output_into)
}

/// The output, a plane `(image, channel)` per part where rows of tiles are wide
/// ([`passes::output_rows`]), else a group of planes ([`passes::output_planes`]).
fn eval_output_into(
    node: &Node,
    ins: &[Option<TensorRef>],
    outs: &mut [Tensor],
    workers: Workers,
) -> Result<()> {
    let m = req(node, ins, 0)?;
    let x = image(node, ins, 1)?;
    let &[n, _, h, w] = x.shape else {
        return fail(node, "an NCHW image");
    };
    let t = Tiles::of(node, h, w)?;
    let cols = n * t.th * t.tw;
    let positions = t.tile.positions();
    let &[p, co, got] = m.shape else {
        return fail(
            node,
            format!("products {:?}: need [{positions}, co, tiles]", m.shape),
        );
    };
    if p != positions || got != cols || m.dtype() != DType::F32 {
        return fail(
            node,
            format!("products of {p} positions and {got} tiles where the image makes {positions} and {cols} (f32)"),
        );
    }
    let bias = match ins.get(2).copied().flatten() {
        Some(b) if b.shape == [co] => Some(b.as_f32().map_err(|e| node.error(e))?),
        Some(b) => return fail(node, format!("a bias {:?} for {co} channels", b.shape)),
        None => None,
    };
    let (oh, ow) = (t.oh, t.ow);
    let residual = match ins.get(3).copied().flatten() {
        Some(r) if r.shape == [n, co, oh, ow] => Some(r.as_f32().map_err(|e| node.error(e))?),
        Some(r) => {
            return fail(
                node,
                format!(
                    "a residual {:?} for an output {:?}",
                    r.shape,
                    [n, co, oh, ow]
                ),
            )
        }
        None => None,
    };
    let products = passes::Products {
        m: m.as_f32().map_err(|e| node.error(e))?,
        co,
        cols,
        bias,
        residual,
        relu: node.int("relu", 0)? != 0,
    };
    let y = shaped(node, outs, 0, &[n, co, oh, ow])?
        .f32_mut()
        .map_err(|e| node.error(e))?;
    if t.tw >= passes::ROW_TILES {
        workers.chunks_mut(y, oh * ow, |plane, out| {
            SCRATCH.with_borrow_mut(|r| passes::output_rows(&products, &t, plane, out, r))
        });
    } else {
        // Planes in groups of at least a block of lanes' worth of tiles.
        let group = passes::BLOCK.div_ceil(t.th * t.tw);
        let weight = positions.div_ceil(t.tile.m * t.tile.m);
        workers.chunks_mut_weighted(y, group * oh * ow, weight, |g, out| {
            passes::output_planes(&products, &t, g * group, out)
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;
    use crate::workers::Two;

    fn node(op: &str, pads: [usize; 4], relu: bool) -> Node {
        tiled(op, pads, relu, 2)
    }

    /// An op node of `m` x `m` output tiles.
    fn tiled(op: &str, pads: [usize; 4], relu: bool, m: i64) -> Node {
        let mut attrs = std::collections::BTreeMap::new();
        attrs.insert("tile".to_string(), Attr::Int(m));
        attrs.insert(
            "pads".to_string(),
            Attr::Ints(pads.iter().map(|&p| p as i64).collect()),
        );
        if relu {
            attrs.insert("relu".to_string(), Attr::Int(1));
        }
        Node {
            name: "w".into(),
            op: op.into(),
            inputs: vec![],
            outputs: vec![],
            attrs,
        }
    }

    /// The filters' transform, the input tiles', the products per position and the
    /// output's equal `Conv` (then a residual add and the ReLU) within rounding, for
    /// both tiles (2 x 2 and 4 x 4): images of one pixel up, odd and even extents and
    /// extents one past a multiple of 4 (a last tile partly outside the output), rows
    /// of tiles narrow and wide (the output transform's two forms),
    /// pads none, ONNX's usual 1 and uneven, a batch of 2, with and without bias,
    /// residual and ReLU, serial and over two threads.
    #[test]
    fn winograd_equals_the_convolution() {
        /// Image `[n, ci, h, w]`, output channels, pads, with a bias, with a ReLU.
        type Case = ([usize; 4], usize, [usize; 4], bool, bool);
        let cases: &[Case] = &[
            ([1, 3, 7, 9], 5, [1, 1, 1, 1], true, true),
            ([2, 4, 8, 8], 3, [1, 1, 1, 1], false, false),
            ([1, 2, 1, 1], 4, [1, 1, 1, 1], true, false),
            ([1, 5, 2, 3], 2, [1, 1, 1, 1], true, true),
            ([2, 3, 6, 5], 4, [0, 0, 0, 0], true, false),
            ([1, 2, 9, 4], 3, [0, 1, 2, 0], false, true),
            ([1, 1, 3, 3], 1, [0, 0, 0, 0], false, false),
            ([1, 6, 14, 14], 8, [1, 1, 1, 1], true, true),
            ([1, 2, 1, 5], 2, [2, 0, 2, 3], true, false),
            ([1, 3, 13, 10], 4, [1, 1, 1, 1], true, true),
            ([2, 2, 11, 17], 3, [1, 0, 1, 1], false, false),
            // Rows of at least `ROW_TILES` tiles across for both tiles.
            ([2, 3, 5, 22], 4, [1, 1, 1, 1], true, true),
        ];
        for (&([n, ci, h, w], co, pads, with_bias, relu), m) in
            cases.iter().flat_map(|c| [(c, 2), (c, 4)])
        {
            let tile = WinogradTile::of(m).unwrap();
            let x: Vec<f32> = (0..n * ci * h * w)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect();
            let g: Vec<f32> = (0..co * ci * 9)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 40.0)
                .collect();
            let bias: Vec<f32> = (0..co).map(|o| o as f32 * 0.5 - 1.0).collect();
            let xt = Tensor::f32(vec![n, ci, h, w], x).unwrap();
            let gt = Tensor::f32(vec![co, ci, 3, 3], g).unwrap();
            let bt = Tensor::f32(vec![co], bias).unwrap();
            let mut conv = node("Conv", pads, false);
            conv.attrs.remove("relu");
            let mut want = (super::super::op("Conv").unwrap().eval)(
                &conv,
                &[
                    Some(xt.view()),
                    Some(gt.view()),
                    with_bias.then(|| bt.view()),
                ],
            )
            .unwrap()
            .remove(0);
            // A residual where there is a bias and a ReLU (a ResNet block's end).
            let residual = (with_bias && relu).then(|| {
                let len = want.len();
                let r: Vec<f32> = (0..len)
                    .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
                    .collect();
                Tensor::f32(want.shape.clone(), r).unwrap()
            });
            for (i, v) in want.f32_mut().unwrap().iter_mut().enumerate() {
                if let Some(r) = &residual {
                    *v += r.as_f32().unwrap()[i];
                }
                if relu {
                    *v = v.max(0.0);
                }
            }
            let u = winograd_filters(&conv, gt.view(), tile).unwrap();
            let input = tiled(WINOGRAD_INPUT, pads, false, m as i64);
            let output = tiled(WINOGRAD_OUTPUT, pads, relu, m as i64);
            let positions = tile.positions();
            for parallel in [false, true] {
                let workers = if parallel {
                    Workers::new(&Two)
                } else {
                    Workers::SERIAL
                };
                let fact = Fact::known(xt.clone());
                let shape = infer_input(&input, &[Some(&fact)]).unwrap()[0]
                    .const_shape()
                    .unwrap();
                let mut v = [Tensor::zeros(DType::F32, shape.clone()).unwrap()];
                eval_input_into(&input, &[Some(xt.view())], &mut v, workers).unwrap();
                let cols = shape[2];
                let (vv, uv) = (v[0].as_f32().unwrap(), u.as_f32().unwrap());
                let mut products = vec![0f32; positions * co * cols];
                for p in 0..positions {
                    for o in 0..co {
                        for k in 0..ci {
                            let a = uv[(p * co + o) * ci + k];
                            for t in 0..cols {
                                products[(p * co + o) * cols + t] +=
                                    a * vv[(p * ci + k) * cols + t];
                            }
                        }
                    }
                }
                let mt = Tensor::f32(vec![positions, co, cols], products).unwrap();
                let ins = [
                    Some(mt.view()),
                    Some(xt.view()),
                    with_bias.then(|| bt.view()),
                    residual.as_ref().map(Tensor::view),
                ];
                let mut y = [Tensor::zeros(DType::F32, want.shape.clone()).unwrap()];
                eval_output_into(&output, &ins, &mut y, workers).unwrap();
                let (got, want) = (y[0].as_f32().unwrap(), want.as_f32().unwrap());
                let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
                for (i, (g, e)) in got.iter().zip(want).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-5 * scale,
                        "F({m}x{m}) {n}x{ci}x{h}x{w} -> {co}, pads {pads:?}: element {i} {g} where {e}"
                    );
                }
            }
        }
    }

    /// A window larger than the padded image, a bias of the wrong length and products
    /// of another image's tiles are errors, not panics; an image of no channels or a
    /// batch of none transforms to nothing.
    #[test]
    fn bad_geometry_is_refused() {
        let input = node(WINOGRAD_INPUT, [0, 0, 0, 0], false);
        let input_one = node(WINOGRAD_INPUT, [1, 1, 1, 1], false);
        let x = Tensor::f32(vec![1, 1, 2, 5], vec![1.0; 10]).unwrap();
        assert!(eval_input(&input, &[Some(x.view())]).is_err());
        let output = node(WINOGRAD_OUTPUT, [1, 1, 1, 1], false);
        let x = Tensor::f32(vec![1, 1, 4, 4], vec![1.0; 16]).unwrap();
        let m = Tensor::f32(vec![16, 2, 4], vec![1.0; 128]).unwrap();
        let bias = Tensor::f32(vec![3], vec![0.0; 3]).unwrap();
        let ins = [Some(m.view()), Some(x.view()), Some(bias.view())];
        assert!(eval_output(&output, &ins).is_err());
        let m = Tensor::f32(vec![16, 2, 5], vec![1.0; 160]).unwrap();
        assert!(eval_output(&output, &[Some(m.view()), Some(x.view()), None]).is_err());
        let g = Tensor::f32(vec![1, 1, 5, 5], vec![1.0; 25]).unwrap();
        assert!(winograd_filters(&output, g.view(), &WinogradTile::F2).is_err());
        // No channels, no images: empty results, not a panic.
        for shape in [[1, 0, 4, 4], [0, 2, 4, 4]] {
            let x = Tensor::f32(shape.to_vec(), vec![]).unwrap();
            let v = eval_input(&input_one, &[Some(x.view())]).unwrap().remove(0);
            assert_eq!(v.len(), 0);
            let m = Tensor::f32(v.shape.clone(), vec![]).unwrap();
            let y = eval_output(&output, &[Some(m.view()), Some(x.view()), None]).unwrap();
            assert_eq!(y[0].len(), 0);
        }
        // Products of 2 x 2 tiles read as 4 x 4 ones; a tile of neither size.
        let m = Tensor::f32(vec![16, 2, 4], vec![1.0; 128]).unwrap();
        let four = tiled(WINOGRAD_OUTPUT, [1, 1, 1, 1], false, 4);
        assert!(eval_output(&four, &[Some(m.view()), Some(x.view()), None]).is_err());
        let three = tiled(WINOGRAD_INPUT, [1, 1, 1, 1], false, 3);
        assert!(eval_input(&three, &[Some(x.view())]).is_err());
    }
}
