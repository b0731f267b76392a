//! Sliding windows over spatial axes: the window that `Conv` and the pools share
//! (strides, pads — given or `SAME_*` —, dilations, `ceil_mode` and the output extent
//! they give, symbolic or concrete; a convolution's 1-D window as a 2-D one over a
//! height of 1), and the pools — `MaxPool` (and its indices), `AveragePool`, `LpPool`
//! over 1 to 3 axes, `MaxUnpool`, `GlobalAveragePool`, `GlobalMaxPool` — as reference
//! loops (host steps; averages and norms summed in `f64`).
use super::{fail, req, sized, Dims, OpSpec, MAX_ELEMENTS};
use crate::node::Node;
use crate::{DType, Fact, Result, Tensor, TensorRef};
use anyshape_ir::Expr;

pub(super) static OPS: &[OpSpec] = &[
    OpSpec {
        name: "MaxPool",
        since: 8,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: None,
    },
    OpSpec {
        name: "AveragePool",
        since: 7,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: None,
    },
    OpSpec {
        name: "LpPool",
        since: 11,
        infer: infer_pool,
        eval: eval_pool,
        eval_into: None,
    },
    OpSpec {
        name: "MaxUnpool",
        since: 11,
        infer: infer_unpool,
        eval: eval_unpool,
        eval_into: None,
    },
    OpSpec {
        name: "GlobalAveragePool",
        since: 1,
        infer: infer_global,
        eval: eval_global,
        eval_into: None,
    },
    OpSpec {
        name: "GlobalMaxPool",
        since: 1,
        infer: infer_global,
        eval: eval_global,
        eval_into: None,
    },
];

/// How `auto_pad` `SAME_*` places a window's pads: their sum follows from the input's
/// extent, the odd one after (`Upper`) or before (`Lower`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Same {
    /// `SAME_UPPER`.
    Upper,
    /// `SAME_LOWER`.
    Lower,
}

/// A window's placement over its spatial axes: strides, pads (each axis's before,
/// then each axis's after), dilations.
#[derive(Clone, Debug)]
pub struct Window {
    /// Steps between windows along each axis.
    pub strides: Dims,
    /// Pads before each axis, then after each (`[top, left, bottom, right]` in 2-D).
    pub pads: Dims,
    /// Steps between a window's taps along each axis.
    pub dilations: Dims,
    /// `auto_pad` `SAME_*`: the output extent is the input's over the stride, rounded
    /// up, and the pads follow from the input's extent ([`Window::at`]).
    pub same: Option<Same>,
    /// `ceil_mode` (pools): the output extent rounds up, a last window kept where it
    /// starts inside the input or its leading pad.
    pub ceil: bool,
}

impl Window {
    /// The window attributes of `node` over two spatial axes (absent: strides and
    /// dilations 1, no pads).
    pub fn of(node: &Node) -> Result<Window> {
        Window::of_rank(node, 2)
    }

    /// The window of a convolution over `spatial` axes, 1 or 2, as a 2-D one: a 1-D
    /// window is one over a height of 1 (its attributes those of the width).
    pub fn of_rank(node: &Node, spatial: usize) -> Result<Window> {
        if !matches!(spatial, 1 | 2) {
            return fail(
                node,
                format!("{spatial} spatial axes: 1-D and 2-D convolutions only"),
            );
        }
        let mut w = Window::of_axes(node, spatial)?;
        if spatial == 1 {
            w.strides.insert(0, 1);
            w.dilations.insert(0, 1);
            w.pads.insert(1, 0);
            w.pads.insert(0, 0);
        }
        Ok(w)
    }

    /// The window attributes of `node` over `n` spatial axes.
    pub fn of_axes(node: &Node, n: usize) -> Result<Window> {
        let same = match node.string("auto_pad", "NOTSET")?.as_str() {
            "NOTSET" | "VALID" => None,
            "SAME_UPPER" => Some(Same::Upper),
            "SAME_LOWER" => Some(Same::Lower),
            other => return fail(node, format!("auto_pad {other} is not one ONNX defines")),
        };
        let axes = |name: &str| -> Result<Dims> {
            match node.ints(name)? {
                None => Ok(smallvec::smallvec![1; n]),
                Some(v) if v.len() == n && v.iter().all(|&x| x > 0) => {
                    Ok(v.iter().map(|&x| x as usize).collect())
                }
                Some(v) => fail(node, format!("{name} {v:?}: {n} spatial axes")),
            }
        };
        // VALID and SAME_* ignore the pads given.
        let pads: Dims = match node.ints("pads")? {
            _ if same.is_some() || node.string("auto_pad", "NOTSET")? == "VALID" => {
                smallvec::smallvec![0; 2 * n]
            }
            None => smallvec::smallvec![0; 2 * n],
            Some(v) if v.len() == 2 * n && v.iter().all(|&x| x >= 0) => {
                v.iter().map(|&x| x as usize).collect()
            }
            Some(v) => return fail(node, format!("pads {v:?}: {n} spatial axes")),
        };
        Ok(Window {
            strides: axes("strides")?,
            pads,
            dilations: axes("dilations")?,
            same,
            ceil: node.int("ceil_mode", 0)? != 0,
        })
    }

    /// The pad after axis `i`.
    fn after(&self, i: usize) -> usize {
        self.pads[i + self.strides.len()]
    }

    /// This window over an input of extents `sizes` under a kernel of extents `k`, its
    /// pads concrete (those `SAME_*` gives at these extents).
    pub fn at(&self, sizes: &[usize], k: &[usize]) -> Window {
        let mut w = self.clone();
        let n = self.strides.len();
        if let Some(same) = self.same {
            for i in 0..n {
                let out = sizes[i].div_ceil(self.strides[i]);
                let span = self.dilations[i] * (k[i].max(1) - 1) + 1;
                let total = ((out.max(1) - 1) * self.strides[i] + span).saturating_sub(sizes[i]);
                let (before, after) = match same {
                    Same::Upper => (total / 2, total - total / 2),
                    Same::Lower => (total - total / 2, total / 2),
                };
                w.pads[i] = before;
                w.pads[i + n] = after;
            }
            w.same = None;
        }
        w
    }

    /// The output extent of spatial axis `i` of input extent `d`
    /// under a kernel of extent `k`, as an expression.
    pub fn out_expr(&self, d: &Expr, k: i64, i: usize) -> Expr {
        let s = Expr::Const(self.strides[i] as i64);
        if self.same.is_some() {
            return Expr::ceil_div(d.clone(), s).simplify();
        }
        let span = (self.dilations[i] as i64) * (k - 1) + 1;
        let padded = d.clone() + (self.pads[i] + self.after(i)) as i64 - span;
        if self.ceil {
            // The last window starts before the input's end and its leading pad's.
            let last = Expr::floor_div(d.clone() + self.pads[i] as i64 - 1, s.clone());
            return (Expr::min(Expr::ceil_div(padded, s), last) + 1).simplify();
        }
        (Expr::floor_div(padded, s) + 1).simplify()
    }

    /// The same for concrete extents (0 where the window does not fit).
    pub fn out(&self, d: usize, k: usize, i: usize) -> usize {
        let s = self.strides[i];
        if self.same.is_some() {
            return d.div_ceil(s);
        }
        let span = self.dilations[i] * (k.max(1) - 1) + 1;
        let room = (d + self.pads[i] + self.after(i)) as isize - span as isize;
        let s = s as isize;
        let out = if self.ceil {
            // A last window may reach past the padded input (ceil), but starts inside it.
            let last = (d as isize + self.pads[i] as isize - 1).div_euclid(s);
            (-(-room).div_euclid(s)).min(last) + 1
        } else {
            room.div_euclid(s) + 1
        };
        out.max(0) as usize
    }

    /// How many of the `k` taps of output position `o` of axis `i` fall inside the
    /// input of `extent` with its pads.
    pub fn padded_taps(&self, o: usize, k: usize, i: usize, extent: usize) -> usize {
        let end = extent + self.pads[i] + self.after(i);
        (0..k)
            .filter(|&u| o * self.strides[i] + u * self.dilations[i] < end)
            .count()
    }

    /// The kernel offsets at which output position `o` of axis `i` reads inside an input of `extent` (a window of `k` taps): the others
    /// fall in the padding.
    pub fn inside(&self, o: usize, k: usize, i: usize, extent: usize) -> std::ops::Range<usize> {
        let start = o * self.strides[i];
        let d = self.dilations[i];
        // Tap u reads start + u·d - pad, inside where pad <= start + u·d < pad + extent.
        let lo = self.pads[i].saturating_sub(start).div_ceil(d).min(k);
        let hi = (self.pads[i] + extent)
            .saturating_sub(start)
            .div_ceil(d)
            .clamp(lo, k);
        lo..hi
    }
}

/// A pool's kernel extents (`kernel_shape`, one per spatial axis).
fn kernel(node: &Node, spatial: usize) -> Result<Dims> {
    match node.ints("kernel_shape")? {
        Some(v) if v.len() == spatial && v.iter().all(|&x| x > 0) => {
            Ok(v.iter().map(|&x| x as usize).collect())
        }
        Some(v) => fail(node, format!("kernel_shape {v:?}: {spatial} spatial axes")),
        None => fail(node, "kernel_shape is required"),
    }
}

/// `u` moved to the next point of the box `ranges` (the last axis fastest); false
/// past its last.
fn advance(u: &mut [usize], ranges: &[std::ops::Range<usize>]) -> bool {
    for i in (0..u.len()).rev() {
        u[i] += 1;
        if u[i] < ranges[i].end {
            return true;
        }
        u[i] = ranges[i].start;
    }
    false
}

/// The spatial axes of a pooled input of `rank`: 1 to 3 (NCL, NCHW, NCDHW).
fn pooled_axes(node: &Node, rank: usize) -> Result<usize> {
    match rank {
        3..=5 => Ok(rank - 2),
        r => fail(node, format!("an input of rank {r}: 1 to 3 spatial axes")),
    }
}

/// The extents `[h, w]` of the trailing spatial axes of `shape` (an NCL tensor's or a
/// 1-D kernel's as a height of 1).
pub(super) fn plane(shape: &[usize]) -> [usize; 2] {
    match shape {
        [.., h, w] if shape.len() == 4 => [*h, *w],
        [.., w] => [1, *w],
        [] => [1, 1],
    }
}

/// `[n, c]` and the output extents `[oh, ow]` as the shape of an output over `spatial`
/// axes (a 1-D one without its height), checked against [`MAX_ELEMENTS`].
pub(super) fn planar_shape(
    node: &Node,
    nc: [usize; 2],
    [oh, ow]: [usize; 2],
    spatial: usize,
) -> Result<Vec<usize>> {
    let mut shape = nc.to_vec();
    if spatial == 2 {
        shape.push(oh);
    }
    shape.push(ow);
    sized(node, &shape)?;
    Ok(shape)
}

/// The spatial axes of a pooled or convolved input of `rank`: 1 (NCL) or 2 (NCHW).
pub(super) fn spatial_axes(node: &Node, rank: usize) -> Result<usize> {
    match rank {
        3 | 4 => Ok(rank - 2),
        r => fail(
            node,
            format!("an input of rank {r}: 1-D (NCL) and 2-D (NCHW) windows only"),
        ),
    }
}

fn infer_pool(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let n = pooled_axes(node, x.rank())?;
    let (k, w) = (kernel(node, n)?, Window::of_axes(node, n)?);
    let mut shape = x.shape[..2].to_vec();
    for i in 0..n {
        shape.push(w.out_expr(&x.shape[2 + i], k[i] as i64, i));
    }
    let mut outs = vec![Fact::new(x.dtype, shape.clone())];
    if node.outputs.len() > 1 {
        if node.op != "MaxPool" {
            return fail(node, "one output");
        }
        outs.push(Fact::new(DType::I64, shape));
    }
    Ok(outs)
}

/// Each output position's window over 1 to 3 spatial axes: its taps inside the input
/// (per axis, the offsets `Window::inside` gives), the max, the average (over the taps
/// inside, or with `count_include_pad` over those inside the padded input) or the
/// p-norm; `MaxPool`'s second output the flat index of each maximum (`storage_order`
/// 0: row-major over the whole input, 1: the spatial axes column-major).
fn eval_pool(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    let n = pooled_axes(node, x.shape.len())?;
    let (k, w) = (kernel(node, n)?, Window::of_axes(node, n)?);
    let max = node.op == "MaxPool";
    let p = match node.op.as_str() {
        "LpPool" => match node.int("p", 2)? {
            p if p >= 1 => Some(p as f64),
            p => return fail(node, format!("p {p}: need 1 or more")),
        },
        _ => None,
    };
    let with_indices = node.outputs.len() > 1;
    if with_indices && !max {
        return fail(node, "one output");
    }
    let column_major = node.int("storage_order", 0)? != 0;
    let include_pad = node.int("count_include_pad", 0)? != 0;
    let dims = &x.shape[2..];
    let images = x.shape[0] * x.shape[1];
    let area: usize = dims.iter().product();
    let w = w.at(dims, &k);
    let out: Dims = (0..n).map(|i| w.out(dims[i], k[i], i)).collect();
    let mut shape = x.shape[..2].to_vec();
    shape.extend(&out);
    sized(node, &shape)?;
    let points: usize = out.iter().product();
    let taps: usize = k.iter().product();
    // The work, not only the output, is bounded: a huge window over huge pads would
    // otherwise loop for ages on a small output.
    if crate::tensor::numel(&[images, points, taps]).map_or(true, |w| w > MAX_ELEMENTS) {
        return fail(
            node,
            format!("a window of {k:?} over an output of {out:?} is more work than one op may do"),
        );
    }
    let v = x.as_f32().map_err(|e| node.error(e))?;
    // Per axis and output index: the taps inside the input, and those inside with the pads.
    let inside: Vec<Vec<std::ops::Range<usize>>> = (0..n)
        .map(|i| (0..out[i]).map(|o| w.inside(o, k[i], i, dims[i])).collect())
        .collect();
    let padded: Vec<Vec<usize>> = (0..n)
        .map(|i| {
            (0..out[i])
                .map(|o| w.padded_taps(o, k[i], i, dims[i]))
                .collect()
        })
        .collect();
    // The input's strides, and where an index output counts (column-major: reversed).
    let strides = crate::tensor::strides(dims);
    let index_strides: Vec<usize> = match column_major {
        true => (0..n).map(|i| dims[..i].iter().product()).collect(),
        false => strides.clone(),
    };
    let mut values = Vec::with_capacity(images * points);
    let mut indices = Vec::with_capacity(if with_indices { images * points } else { 0 });
    // The output positions, walked by `at`.
    let positions: Vec<std::ops::Range<usize>> = out.iter().map(|&o| 0..o).collect();
    let mut at: Dims = smallvec::smallvec![0; n];
    for img in 0..images {
        let image = &v[img * area..][..area];
        at.iter_mut().for_each(|a| *a = 0);
        for _ in 0..points {
            let ranges: smallvec::SmallVec<[std::ops::Range<usize>; 3]> =
                (0..n).map(|i| inside[i][at[i]].clone()).collect();
            // Every tap inside: its input offset and its index-output offset.
            let mut best = (f32::NEG_INFINITY, None::<usize>);
            let (mut sum, mut count) = (0f64, 0usize);
            if ranges.iter().all(|r| !r.is_empty()) {
                let mut u: Dims = ranges.iter().map(|r| r.start).collect();
                loop {
                    let (mut off, mut idx) = (0, 0);
                    for i in 0..n {
                        let pos = at[i] * w.strides[i] + u[i] * w.dilations[i] - w.pads[i];
                        off += pos * strides[i];
                        idx += pos * index_strides[i];
                    }
                    let e = image[off];
                    count += 1;
                    if max {
                        // NaN wins a max, as in onnxruntime.
                        if e > best.0 || e.is_nan() || best.1.is_none() {
                            best = (e, Some(idx));
                        }
                    } else if let Some(p) = p {
                        sum += (e as f64).abs().powf(p);
                    } else {
                        sum += e as f64;
                    }
                    if !advance(&mut u, &ranges) {
                        break;
                    }
                }
            }
            values.push(if max {
                best.0
            } else if let Some(p) = p {
                sum.powf(1.0 / p) as f32
            } else {
                let count = match include_pad {
                    true => (0..n).map(|i| padded[i][at[i]]).product::<usize>(),
                    false => count,
                };
                (sum / count.max(1) as f64) as f32
            });
            if with_indices {
                indices.push(best.1.map_or(-1, |i| (img * area + i) as i64));
            }
            advance(&mut at, &positions);
        }
    }
    let mut outs = vec![Tensor::f32(shape.clone(), values)?];
    if with_indices {
        outs.push(Tensor::i64(shape, indices)?);
    }
    Ok(outs)
}

/// `MaxUnpool`'s output extent along axis `i`: `(d - 1)·stride + kernel - pads`.
fn unpooled(w: &Window, d: &Expr, k: usize, i: usize) -> Expr {
    ((d.clone() - 1) * w.strides[i] as i64 + k as i64 - (w.pads[i] + w.after(i)) as i64).simplify()
}

fn infer_unpool(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    let n = pooled_axes(node, x.rank())?;
    if ins.get(2).copied().flatten().is_some() {
        let s = super::sym_input(node, ins, 2)?;
        if s.len() != x.rank() {
            return fail(node, "an output_shape of another rank than the input");
        }
        return Ok(vec![Fact::new(x.dtype, s)]);
    }
    let (k, w) = (kernel(node, n)?, Window::of_axes(node, n)?);
    let mut shape = x.shape[..2].to_vec();
    for i in 0..n {
        shape.push(unpooled(&w, &x.shape[2 + i], k[i], i));
    }
    Ok(vec![Fact::new(x.dtype, shape)])
}

/// `MaxUnpool`: zeros, each input value written at its index (a flat index into the
/// output, as `MaxPool`'s indices are into its input).
fn eval_unpool(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let (x, idx) = (req(node, ins, 0)?, req(node, ins, 1)?);
    let n = pooled_axes(node, x.shape.len())?;
    let shape: Vec<usize> = match ins.get(2).copied().flatten() {
        Some(_) => super::ints(node, ins, 2)?
            .iter()
            .map(|&d| d.max(0) as usize)
            .collect(),
        None => {
            let (k, w) = (kernel(node, n)?, Window::of_axes(node, n)?);
            let mut shape = x.shape[..2].to_vec();
            for i in 0..n {
                let d = x.shape[2 + i];
                let e = (d.max(1) - 1) * w.strides[i] + k[i];
                shape.push(e.saturating_sub(w.pads[i] + w.after(i)));
            }
            shape
        }
    };
    if shape.len() != x.shape.len() || idx.shape != x.shape {
        return fail(
            node,
            "indices of the input's shape and an output of its rank",
        );
    }
    let total = sized(node, &shape)?;
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let ix = idx.as_i64().map_err(|e| node.error(e))?;
    let mut out = vec![0f32; total];
    for (&e, &i) in v.iter().zip(ix) {
        match usize::try_from(i).ok().filter(|&i| i < total) {
            Some(i) => out[i] = e,
            None => {
                return fail(
                    node,
                    format!("index {i} outside an output of {total} elements"),
                )
            }
        }
    }
    Ok(vec![Tensor::f32(shape, out)?])
}

fn infer_global(node: &Node, ins: &[Option<&Fact>]) -> Result<Vec<Fact>> {
    let x = req(node, ins, 0)?;
    if x.rank() < 3 {
        return fail(node, "an input of rank 3 or more (N, C, spatial axes)");
    }
    let mut shape = x.shape.to_vec();
    shape[2..].fill(Expr::Const(1));
    Ok(vec![Fact::new(x.dtype, shape)])
}

fn eval_global(node: &Node, ins: &[Option<TensorRef>]) -> Result<Vec<Tensor>> {
    let x = req(node, ins, 0)?;
    if x.shape.len() < 3 {
        return fail(node, "an input of rank 3 or more (N, C, spatial axes)");
    }
    let v = x.as_f32().map_err(|e| node.error(e))?;
    let area: usize = x.shape[2..].iter().product();
    let images = x.shape[0] * x.shape[1];
    let out: Vec<f32> = if area == 0 {
        vec![f32::NAN; images]
    } else if node.op == "GlobalMaxPool" {
        v.chunks(area)
            .map(|c| {
                c.iter().copied().fold(
                    f32::NEG_INFINITY,
                    |a, e| if e > a || e.is_nan() { e } else { a },
                )
            })
            .collect()
    } else {
        v.chunks(area)
            .map(|c| (c.iter().map(|&e| e as f64).sum::<f64>() / area as f64) as f32)
            .collect()
    };
    let mut shape = x.shape.to_vec();
    shape[2..].fill(1);
    Ok(vec![Tensor::f32(shape, out)?])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Attr;
    use anyshape_ir::Bindings;

    /// A window's output extent as an expression over a symbolic input extent is the
    /// concrete one at every extent (1 to 40) where the window fits, for pads given, `SAME_*` and
    /// `ceil_mode`, over strides, dilations and kernels; and `SAME_*`'s pads make the
    /// output the input over the stride, the odd pad after (upper) or before (lower).
    #[test]
    fn symbolic_and_concrete_extents_agree() {
        for auto_pad in ["NOTSET", "SAME_UPPER", "SAME_LOWER"] {
            for ceil in [0, 1] {
                for (k, s, dil, pads) in [
                    (3, 2, 1, [1, 0]),
                    (2, 3, 2, [0, 2]),
                    (1, 1, 1, [0, 0]),
                    (4, 1, 3, [2, 1]),
                ] {
                    let node = Node {
                        name: "pool".into(),
                        op: "MaxPool".into(),
                        inputs: vec![],
                        outputs: vec![],
                        attrs: [
                            ("auto_pad".to_string(), Attr::Str(auto_pad.into())),
                            ("ceil_mode".to_string(), Attr::Int(ceil)),
                            ("strides".to_string(), Attr::Ints(vec![s])),
                            ("dilations".to_string(), Attr::Ints(vec![dil])),
                            ("pads".to_string(), Attr::Ints(pads.to_vec())),
                        ]
                        .into(),
                    };
                    let w = Window::of_axes(&node, 1).unwrap();
                    let e = w.out_expr(&Expr::var("d"), k, 0);
                    for d in 1..=40usize {
                        let b = Bindings::from_pairs([("d", d as i64)]);
                        let out = w.out(d, k as usize, 0);
                        let case = format!("{auto_pad} ceil {ceil} k {k} s {s} dil {dil} d {d}");
                        // Where the window does not fit, the expression is not positive
                        // (the instance is refused).
                        match out {
                            0 => assert!(e.eval(&b).unwrap() <= 0, "{case}"),
                            _ => assert_eq!(e.eval(&b).unwrap(), out as i64, "{case}"),
                        }
                        let at = w.at(&[d], &[k as usize]);
                        assert_eq!(at.out(d, k as usize, 0), out, "{case}");
                        if auto_pad != "NOTSET" {
                            assert_eq!(out, d.div_ceil(s as usize), "{case}");
                            let (before, after) = (at.pads[0], at.pads[1]);
                            assert!(before.abs_diff(after) <= 1, "{case}");
                            assert_eq!(
                                before > after,
                                auto_pad == "SAME_LOWER" && before != after,
                                "{case}"
                            );
                        }
                    }
                }
            }
        }
    }
}
