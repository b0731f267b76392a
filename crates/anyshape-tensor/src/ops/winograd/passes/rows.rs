//! The output transforms of wide rows of tiles (see the parent's doc): a plane a row of
//! tiles at a time, vectorized along the row (its tiles side by side), the columns of
//! each tile's rows written interleaved.
use super::{clamps, load, residual, store, Filtering, Products, Tiles, F4, L, V};
use multiversion::multiversion;

/// Tiles across from which an output transform runs a row of tiles at a time
/// ([`output_rows`]: its tiles side by side, the columns of a tile's rows written
/// interleaved) rather than lanes of tiles ([`output_planes`](super::output_planes)).
/// Measured serially on a Zen 3, ResNet-50's output transforms, rows against lanes:
/// 300 against 470 µs for 64 planes of 56 x 56 (14 tiles across), 200 against 245 for
/// 28 x 28 (7), 80 against 87 for 24 x 24 (6); 175 against 146 for 14 x 14 (4), 70
/// against 44 for 12 x 12 (3), 64 against 32 for 512 planes of 3 x 3 (2).
pub(in super::super) const ROW_TILES: usize = 5;

/// Output plane `plane` (image `plane / co`, channel `plane % co`) into `out`
/// (`oh·ow`), a row of tiles at a time (the passes for wide planes, see
/// [`ROW_TILES`]): each tile's `Aᵀ m A` plus the bias, then the residual and the ReLU,
/// its rows and columns past the output's extents left out.
#[multiversion(targets("x86_64+avx2+fma"))]
pub(in super::super) fn output_rows(
    p: &Products,
    t: &Tiles,
    plane: usize,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
) {
    match t.tile.m {
        2 => output_f2(p, t, plane, out, scratch),
        _ => output_f4(p, t, plane, out, scratch),
    }
    residual(p, plane * t.oh * t.ow, out);
}

/// `[f(0), .., f(5)]`, spelled out: `std::array::from_fn` left a call per element in
/// the passes, compiled without their CPU features (the output pass took 2.5x the
/// time).
#[inline(always)]
fn six(f: impl Fn(usize) -> V) -> [V; 6] {
    [f(0), f(1), f(2), f(3), f(4), f(5)]
}

/// F(2x2, 3x3)'s output plane. A row of tiles is passes over its tiles that
/// vectorize: `Aᵀ` (`[[1, 1, 1, 0], [0, 1, -1, -1]]`) down the 16 positions' rows,
/// then across, then the two output rows written as pairs.
#[inline(always)]
fn output_f2(p: &Products, t: &Tiles, plane: usize, out: &mut [f32], scratch: &mut Vec<f32>) {
    let (oh, ow, th, tw) = (t.oh, t.ow, t.th, t.tw);
    let (co, cols, mv) = (p.co, p.cols, p.m);
    let (b, o, add) = p.plane(plane);
    let clamp = clamps(p);
    let act = |v: f32| if clamp { v.max(0.0) } else { v };
    scratch.clear();
    scratch.resize(8 * tw, 0.0);
    let (sums, diffs) = scratch.split_at_mut(4 * tw);
    for ty in 0..th {
        let start = (b * th + ty) * tw;
        let pos = |q: usize| &mv[(q * co + o) * cols + start..][..tw];
        // Down: s_j = m0j + m1j + m2j, d_j = m1j - m2j - m3j.
        for j in 0..4 {
            let (s, d) = (&mut sums[j * tw..][..tw], &mut diffs[j * tw..][..tw]);
            let rows = pos(j)
                .iter()
                .zip(pos(4 + j))
                .zip(pos(8 + j))
                .zip(pos(12 + j));
            for ((s, d), (((&a, &b), &c), &e)) in s.iter_mut().zip(d).zip(rows) {
                *s = a + b + c;
                *d = b - c - e;
            }
        }
        // Across, and out: the even and odd columns of the tile's two rows.
        for (k, half) in [&*sums, &*diffs].into_iter().enumerate() {
            let yy = 2 * ty + k;
            if yy >= oh {
                break;
            }
            let line = &mut out[yy * ow..][..ow];
            let q = |j: usize| &half[j * tw..][..tw];
            let (q0, q1, q2, q3) = (q(0), q(1), q(2), q(3));
            let terms = q0.iter().zip(q1).zip(q2).zip(q3);
            let mut pairs = line.chunks_exact_mut(2);
            for (pair, (((&a, &b), &c), &d)) in (&mut pairs).zip(terms) {
                pair[0] = act(a + b + c + add);
                pair[1] = act(b - c - d + add);
            }
            // An odd width: the last tile's left column only.
            if let [last] = pairs.into_remainder() {
                let k = tw - 1;
                *last = act(q0[k] + q1[k] + q2[k] + add);
            }
        }
    }
}

/// F(4x4, 3x3)'s output plane: `Aᵀ` down the 36 positions' rows, a pass per column
/// of the tile over the plane's tiles (six rows read, four of `Aᵀ m` written), then
/// for each row of tiles `Aᵀ` across each of those four rows, its four columns a row
/// each, interleaved into the output's row.
#[inline(always)]
fn output_f4(p: &Products, t: &Tiles, plane: usize, out: &mut [f32], scratch: &mut Vec<f32>) {
    let (oh, ow, th, tw) = (t.oh, t.ow, t.th, t.tw);
    let (co, cols, mv) = (p.co, p.cols, p.m);
    let (b, o, add) = p.plane(plane);
    let clamp = clamps(p);
    let tws = tw.next_multiple_of(L);
    // The plane's tiles, and room for a chunk read past them.
    let tiles = th * tw;
    let stride = tiles.next_multiple_of(L) + L;
    scratch.clear();
    scratch.resize(24 * stride + 4 * tws, 0.0);
    let (down, cols4) = scratch.split_at_mut(24 * stride);
    // A position's tiles of this image from the first on: a chunk's lanes past them
    // read the next plane's products, and the results they make are never written out.
    let pos = |q: usize| &mv[(q * co + o) * cols + b * tiles..];
    // Down: (Aᵀ m)[k][j] of every tile, row 6k + j.
    for j in 0..6 {
        for x in (0..tiles).step_by(L) {
            let v = F4::at(six(|i| V(load(pos(6 * i + j), x))));
            for (k, v) in v.iter().enumerate() {
                store(&mut down[(6 * k + j) * stride..][..stride], x, &v.0);
            }
        }
    }
    for ty in 0..th {
        // Across, and out: each of the tile's four rows.
        for r in 0..4 {
            let yy = 4 * ty + r;
            if yy >= oh {
                break;
            }
            for tx in (0..tw).step_by(L) {
                let q = six(|j| V(load(&down[(6 * r + j) * stride..], ty * tw + tx)));
                for (c, v) in F4::at(q).into_iter().enumerate() {
                    let mut v = v + V([add; L]);
                    if clamp {
                        v.0.iter_mut().for_each(|x| *x = x.max(0.0));
                    }
                    store(&mut cols4[c * tws..][..tws], tx, &v.0);
                }
            }
            let line = &mut out[yy * ow..][..ow];
            let col = |c: usize| &cols4[c * tws..][..tw];
            let (c0, c1, c2, c3) = (col(0), col(1), col(2), col(3));
            let mut quads = line.chunks_exact_mut(4);
            for (quad, (((&a, &b), &c), &d)) in (&mut quads).zip(c0.iter().zip(c1).zip(c2).zip(c3))
            {
                quad.copy_from_slice(&[a, b, c, d]);
            }
            // A width not a multiple of 4: the last tile's first columns.
            let last = tw - 1;
            for (c, y) in quads.into_remainder().iter_mut().enumerate() {
                *y = cols4[c * tws + last];
            }
        }
    }
}
