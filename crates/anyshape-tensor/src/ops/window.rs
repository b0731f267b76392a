//! The sliding window `Conv`, `ConvTranspose` and the pools share ([`Window`]): strides,
//! pads — given or `SAME_*` ([`Same`], concrete at an input's extents: [`Window::at`]) —,
//! dilations, `ceil_mode`, over any number of spatial axes (a convolution's 1-D window
//! lifted to 2-D: [`Window::of_rank`]), and the output extent they give, symbolic or
//! concrete.
use super::{fail, Dims};
use crate::node::Node;
use crate::Result;
use anyshape_ir::Expr;

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
    pub fn after(&self, i: usize) -> usize {
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
