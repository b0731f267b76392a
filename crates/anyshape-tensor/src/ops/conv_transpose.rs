//! `ConvTranspose` (1-D to 3-D; groups, dilations,
//! `output_padding`, `output_shape` and `SAME_*` placing the pads as ONNX's reference
//! does): each input element scattered into the output through the filters — a
//! reference loop, a host step; and `Col2Im`, the sliding blocks of columns summed back
//! into an image of any number of spatial axes.
use super::window::{Same, Window};
use super::{fail, late_len, per_channel, req, runtime_shape, sized, sym_input_or_late, OpSpec};
use crate::node::Node;
use crate::{Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "ConvTranspose",
        since: 11,
        infer: infer_conv_transpose,
        eval: eval_conv_transpose,
        eval_into: None,
    },
    OpSpec {
        name: "Col2Im",
        since: 18,
        infer: infer_col2im,
        eval: eval_col2im,
        eval_into: None,
    },
];

/// A transposed convolution's placement over its 1 to 3 spatial axes: its [`Window`]
/// (strides, dilations, the pads given, `auto_pad`), `output_padding` and the output
/// extents asked for (`output_shape`, or the input's times the stride with `SAME_*`),
/// from which the pads follow ([`Transposed::pads`]).
struct Transposed {
    w: Window,
    extra: Vec<usize>,
    shape: Option<Vec<usize>>,
    group: usize,
}

/// The spatial axes of a transposed convolution's input of `rank`: 1 to 3.
fn spatial_axes(node: &Node, rank: usize) -> Result<usize> {
    match rank {
        3..=5 => Ok(rank - 2),
        r => fail(
            node,
            format!("an input of rank {r}: 1-D to 3-D transposed convolutions only"),
        ),
    }
}

impl Transposed {
    fn of(node: &Node, spatial: usize) -> Result<Transposed> {
        let w = Window::of_axes(node, spatial)?;
        let axes = |name: &str| -> Result<Option<Vec<usize>>> {
            match node.ints(name)? {
                None => Ok(None),
                Some(v) if v.len() == spatial && v.iter().all(|&x| x >= 0) => {
                    Ok(Some(v.iter().map(|&x| x as usize).collect()))
                }
                Some(v) => fail(node, format!("{name} {v:?}: {spatial} spatial axes")),
            }
        };
        let group = node.int("group", 1)?;
        if group < 1 {
            return fail(node, format!("group {group}: need 1 or more"));
        }
        Ok(Transposed {
            w,
            extra: axes("output_padding")?.unwrap_or_else(|| vec![0; spatial]),
            shape: axes("output_shape")?,
            group: group as usize,
        })
    }

    /// The pads (before, after) of axis `i` for an input extent `d` and a kernel of
    /// extent `k`: given, or those that make the output extent asked for (negative
    /// where it is more than the input makes: room after, as ONNX's reference places it).
    fn pads(&self, d: usize, k: usize, i: usize) -> (isize, isize) {
        let want = match (&self.shape, self.w.same) {
            (Some(s), _) => s[i],
            (None, Some(_)) => d * self.w.strides[i],
            (None, None) => return (self.w.pads[i] as isize, self.w.after(i) as isize),
        };
        let total = self.full(d, k, i) as isize - want as isize;
        let half = total.div_euclid(2);
        match self.w.same {
            Some(Same::Upper) => (half, total - half),
            _ => (total - half, half),
        }
    }

    /// The extent of axis `i` before pads.
    fn full(&self, d: usize, k: usize, i: usize) -> usize {
        self.w.strides[i] * d.saturating_sub(1)
            + self.extra[i]
            + self.w.dilations[i] * (k.max(1) - 1)
            + 1
    }

    /// The output extent of axis `i`.
    fn out(&self, d: usize, k: usize, i: usize) -> Result<usize, String> {
        let (before, after) = self.pads(d, k, i);
        usize::try_from(self.full(d, k, i) as isize - before - after)
            .map_err(|_| "pads larger than the output".to_string())
    }
}

fn infer_conv_transpose(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let spatial = spatial_axes(node, x.rank())?;
    if w.rank() != x.rank() {
        return fail(node, "filters of another rank than the input");
    }
    let t = Transposed::of(node, spatial)?;
    let co = w.shape[1].clone() * Expr::Const(t.group as i64);
    let mut shape = vec![x.shape[0].clone(), co.simplify()];
    for a in 2..x.rank() {
        let i = a - 2;
        let k = w.shape[a]
            .as_const()
            .ok_or_else(|| node.error("a symbolic kernel size"))? as usize;
        shape.push(match (&t.shape, t.w.same, x.shape[a].as_const()) {
            (Some(s), _, _) => Expr::Const(s[i] as i64),
            (None, Some(_), _) => (x.shape[a].clone() * t.w.strides[i] as i64).simplify(),
            (None, None, Some(d)) => {
                Expr::Const(t.out(d as usize, k, i).map_err(|e| node.error(e))? as i64)
            }
            (None, None, None) => {
                let span = t.w.dilations[i] * (k.max(1) - 1) + 1;
                ((x.shape[a].clone() - 1) * t.w.strides[i] as i64 + (t.extra[i] + span) as i64
                    - (t.w.pads[i] + t.w.after(i)) as i64)
                    .simplify()
            }
        });
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `ConvTranspose`: each input element scattered into the output through the
/// filters (`[ci, co / group, k…]`), group by group, then the bias.
fn eval_conv_transpose(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, w) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let spatial = spatial_axes(node, x.shape.len())?;
    let t = Transposed::of(node, spatial)?;
    let g = t.group;
    if w.shape.len() != x.shape.len() || x.shape[1] != w.shape[0] || x.shape[1] % g != 0 {
        return fail(
            node,
            format!(
                "filters {:?} in {g} groups do not read an input {:?}",
                w.shape, x.shape
            ),
        );
    }
    let (n, ci) = (x.shape[0], x.shape[1]);
    let (dims, ks) = (&x.shape[2..], &w.shape[2..]);
    let (cg, og) = (ci / g, w.shape[1]);
    let co = og * g;
    let outs: Vec<usize> = (0..spatial)
        .map(|i| t.out(dims[i], ks[i], i))
        .collect::<Result<_, _>>()
        .map_err(|e| node.error(e))?;
    let mut shape = vec![n, co];
    shape.extend(&outs);
    super::sized(node, &shape)?;
    let xv = x.as_f32().map_err(|e| node.error(e))?;
    let wv = w.as_f32().map_err(|e| node.error(e))?;
    let bias = ins
        .get(2)
        .copied()
        .flatten()
        .map(|_| per_channel(node, ins, 2, co))
        .transpose()?;
    // The work, not only the output, is bounded.
    let work: Vec<usize> = [n, ci, og].iter().chain(dims).chain(ks).copied().collect();
    super::bounded_work(node, &work)?;
    // Per axis, for each (input position, tap) the output position, or none outside.
    let places: Vec<Vec<Option<usize>>> = (0..spatial)
        .map(|i| {
            let before = t.pads(dims[i], ks[i], i).0;
            (0..dims[i] * ks[i])
                .map(|pk| {
                    let (p, k) = (pk / ks[i], pk % ks[i]);
                    let o = (p * t.w.strides[i] + k * t.w.dilations[i]) as isize - before;
                    usize::try_from(o).ok().filter(|&o| o < outs[i])
                })
                .collect()
        })
        .collect();
    let (plane_in, plane_out, taps): (usize, usize, usize) = (
        dims.iter().product(),
        outs.iter().product(),
        ks.iter().product(),
    );
    let unravel = |mut i: usize, ext: &[usize], into: &mut [usize]| {
        for a in (0..ext.len()).rev() {
            into[a] = i % ext[a];
            i /= ext[a];
        }
    };
    let (mut p, mut k) = (vec![0; spatial], vec![0; spatial]);
    let mut out = vec![0f32; n * co * plane_out];
    for b in 0..n {
        for c in 0..ci {
            let grp = c / cg;
            for pi in 0..plane_in {
                unravel(pi, dims, &mut p);
                let v = xv[(b * ci + c) * plane_in + pi];
                for ti in 0..taps {
                    unravel(ti, ks, &mut k);
                    let mut at = Some(0usize);
                    for i in 0..spatial {
                        at = match (at, places[i][p[i] * ks[i] + k[i]]) {
                            (Some(a), Some(o)) => Some(a * outs[i] + o),
                            _ => None,
                        };
                    }
                    let Some(at) = at else { continue };
                    for o in 0..og {
                        let oc = grp * og + o;
                        out[(b * co + oc) * plane_out + at] += v * wv[(c * og + o) * taps + ti];
                    }
                }
            }
        }
    }
    if let Some(bias) = bias {
        for (i, plane) in out.chunks_mut(plane_out.max(1)).enumerate() {
            let add = bias[i % co];
            plane.iter_mut().for_each(|e| *e += add);
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}

fn infer_col2im(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    if x.rank() != 3 {
        return fail(node, "the columns must be [N, C·block, blocks]");
    }
    let image = sym_input_or_late(node, ins, 1)?;
    let s = match &image {
        Some(i) => i.len(),
        None => late_len(node, ins, 1)?,
    };
    // The channels: the columns' rows over the block's elements, where the block is
    // known.
    let channels = sym_input_or_late(node, ins, 2)?
        .and_then(|b| b.iter().map(Expr::as_const).collect::<Option<Vec<i64>>>())
        .map(|b| b.iter().product::<i64>())
        .filter(|&k| k > 0)
        .and_then(|k| crate::fact::exact_quotient(&[x.shape[1].clone()], &[Expr::Const(k)]));
    let shape = runtime_shape(node, 0, 2 + s, |d| match d {
        0 => Some(x.shape[0].clone()),
        1 => channels.clone(),
        _ => image.as_ref().map(|i| i[d - 2].clone()),
    })?;
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `Col2Im(x, image_shape, block_shape)`: each column of `x` (`[N, C·∏block, L]`) a
/// block of the image at its sliding position (strides, dilations, pads), the blocks'
/// elements summed into `[N, C, image…]`, as ONNX's reference computes it.
fn eval_col2im(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let image = super::ints(node, ins, 1)?;
    let block = super::ints(node, ins, 2)?;
    let s = image.len();
    let &[n, rows, l] = x.shape else {
        return fail(node, "the columns must be [N, C·block, blocks]");
    };
    if block.len() != s || image.iter().chain(block).any(|&d| d <= 0) {
        return fail(
            node,
            "an image and a block of the same rank, of positive extents",
        );
    }
    let attr = |name: &str, len: usize, default: i64| -> Result<Vec<i64>> {
        let v = node.ints(name)?.unwrap_or_else(|| vec![default; len]);
        match v.len() == len {
            true => Ok(v),
            false => fail(node, format!("`{name}` needs {len} values")),
        }
    };
    let (dil, pads, strides) = (
        attr("dilations", s, 1)?,
        attr("pads", 2 * s, 0)?,
        attr("strides", s, 1)?,
    );
    if dil.iter().chain(&strides).any(|&v| v <= 0) {
        return fail(node, "dilations and strides must be positive");
    }
    let k: i64 = block.iter().product();
    if rows as i64 % k != 0 {
        return fail(
            node,
            format!("{rows} rows of columns for blocks of {k} elements"),
        );
    }
    let c = rows / k as usize;
    let blocks: Vec<i64> = (0..s)
        .map(|a| (image[a] + pads[a] + pads[a + s] - dil[a] * (block[a] - 1) - 1) / strides[a] + 1)
        .collect();
    if blocks.iter().any(|&b| b < 1) || blocks.iter().product::<i64>() != l as i64 {
        return fail(
            node,
            format!("{l} columns where the image holds {blocks:?} sliding blocks"),
        );
    }
    let mut shape = vec![n, c];
    shape.extend(image.iter().map(|&d| d as usize));
    let plane: usize = image.iter().map(|&d| d as usize).product();
    sized(node, &shape)?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let mut out = vec![0f32; n * c * plane];
    // Row-major multi-indices of the block's elements and the blocks' positions.
    let unravel = |mut i: i64, dims: &[i64], into: &mut [i64]| {
        for a in (0..dims.len()).rev() {
            into[a] = i % dims[a];
            i /= dims[a];
        }
    };
    let (mut kk, mut bb) = (vec![0i64; s], vec![0i64; s]);
    for ni in 0..n {
        for ci in 0..c {
            for ki in 0..k {
                unravel(ki, block, &mut kk);
                let row = ((ni * c + ci) * k as usize + ki as usize) * l;
                for li in 0..l {
                    unravel(li as i64, &blocks, &mut bb);
                    let mut at = 0i64;
                    let mut inside = true;
                    for a in 0..s {
                        let p = bb[a] * strides[a] - pads[a] + kk[a] * dil[a];
                        inside &= (0..image[a]).contains(&p);
                        at = at * image[a] + p;
                    }
                    if inside {
                        out[(ni * c + ci) * plane + at as usize] += v[row + li];
                    }
                }
            }
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}
