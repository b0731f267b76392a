//! The Winograd transforms' inner passes: one input channel's tiles, one output
//! plane's, for F(2x2, 3x3) and F(4x4, 3x3) each. The host crates are built for the
//! baseline x86-64 (SSE2: 4 lanes), so these are compiled twice, for it and for AVX2
//! with FMA (8 lanes), and the CPU's features pick one at run time (`multiversion`).
//! Both forms round alike: Rust contracts no multiply-add into an FMA, so a module's
//! outputs do not depend on the CPU it runs on.
//!
//! Every pass vectorizes across tiles (or image columns). The F(2x2) passes are a
//! loop per row of `Bᵀ` or `Aᵀ` (two taps each). The F(4x4) ones compute all six rows
//! of a transform at once (`Bᵀ`'s or `Aᵀ`'s as sums and differences, written out
//! below) on chunks of 8 tiles: rows of tiles are short (14 tiles of 4 x 4 across a
//! 56 x 56 image), and a loop per matrix entry cost twice the time.
use super::Tiles;
use multiversion::multiversion;

/// The image an input transform reads: `[n, c, h, w]`, row-major.
pub(super) struct Image<'a> {
    pub(super) x: &'a [f32],
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) h: usize,
    pub(super) w: usize,
}

/// What an output transform reads besides its geometry.
pub(super) struct Products<'a> {
    /// The products `[α², co, n·th·tw]`.
    pub(super) m: &'a [f32],
    pub(super) co: usize,
    /// Tiles of the batch: `n·th·tw`.
    pub(super) cols: usize,
    pub(super) bias: Option<&'a [f32]>,
    /// `[n, co, oh, ow]`, added after the bias.
    pub(super) residual: Option<&'a [f32]>,
    pub(super) relu: bool,
}

/// Channel `ch`'s transformed tiles into its `α²` rows `dst` (one per position, each
/// `n·th·tw` long); `scratch` is the part's working memory.
#[multiversion(targets("x86_64+avx2+fma"))]
pub(super) fn input_channel(
    img: &Image,
    t: &Tiles,
    ch: usize,
    dst: &mut [&mut [f32]],
    scratch: &mut Vec<f32>,
) {
    match t.tile.m {
        2 => input_f2(img, t, ch, dst, scratch),
        _ => input_f4(img, t, ch, dst, scratch),
    }
}

/// Output plane `plane` (image `plane / co`, channel `plane % co`) into `out`
/// (`oh·ow`): each tile's `Aᵀ m A` plus the bias, then the residual and the ReLU, its
/// rows and columns past the output's extents left out.
#[multiversion(targets("x86_64+avx2+fma"))]
pub(super) fn output_plane(
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
    if let Some(r) = p.residual {
        let r = &r[plane * t.oh * t.ow..][..t.oh * t.ow];
        for (y, &v) in out.iter_mut().zip(r) {
            *y += v;
            if p.relu {
                *y = y.max(0.0);
            }
        }
    }
}

/// The ReLU of an output transform where no residual follows (with one, it follows
/// the residual's add).
fn clamps(p: &Products) -> bool {
    p.relu && p.residual.is_none()
}

/// F(2x2, 3x3)'s `Bᵀ` rows as their two taps `(offset, sign)`: row `i` reads input
/// rows (and columns) `offset` of the 4 x 4 tile.
const BT2: [[(usize, f32); 2]; 4] = [
    [(0, 1.0), (2, -1.0)],
    [(1, 1.0), (2, 1.0)],
    [(1, -1.0), (2, 1.0)],
    [(1, 1.0), (3, -1.0)],
];

/// F(2x2, 3x3)'s input tiles. Each row of tiles is passes that vectorize: `Bᵀ` down
/// the tiles' four image rows (`u_i`, a padded row each, zeros past the image), each
/// `u_i` split into its even and odd columns, then `Bᵀ` across — tile `tx`'s columns
/// `2·tx .. 2·tx + 3` are the even and odd ones `tx` and `tx + 1` — into the 16 rows.
/// (Measured against one tile at a time, whole, ResNet-50 at 224 x 224: 9.7 against
/// 12.9 ms for both transforms; 3.5 against 3.3 ms at 96 x 96.)
#[inline(always)]
fn input_f2(img: &Image, t: &Tiles, ch: usize, dst: &mut [&mut [f32]], scratch: &mut Vec<f32>) {
    let (h, w, th, tw) = (img.h, img.w, t.th, t.tw);
    let [pt, pl, ..] = t.pads;
    // A padded row: the columns a row of tiles reads (`2·tw + 2`), and two more.
    let half = tw + 2;
    // Where the image's columns lie in it.
    let (x0, x1) = (pl.min(2 * half), (pl + w).min(2 * half));
    scratch.clear();
    scratch.resize(4 * half, 0.0);
    let (u, split) = scratch.split_at_mut(2 * half);
    let (even, odd) = split.split_at_mut(half);
    for b in 0..img.n {
        let plane = &img.x[(b * img.c + ch) * h * w..][..h * w];
        let row = |y: usize| {
            (y.checked_sub(pt))
                .filter(|&y| y < h)
                .map(|y| &plane[y * w..][..x1 - x0])
        };
        for ty in 0..th {
            let d = [
                row(2 * ty),
                row(2 * ty + 1),
                row(2 * ty + 2),
                row(2 * ty + 3),
            ];
            let start = (b * th + ty) * tw;
            for (i, [(a0, s0), (a1, s1)]) in BT2.into_iter().enumerate() {
                let inside = &mut u[x0..x1];
                match (d[a0], d[a1]) {
                    (Some(r0), Some(r1)) => {
                        for ((o, &p), &q) in inside.iter_mut().zip(r0).zip(r1) {
                            *o = s0 * p + s1 * q;
                        }
                    }
                    (Some(r0), None) => inside.iter_mut().zip(r0).for_each(|(o, &p)| *o = s0 * p),
                    (None, Some(r1)) => inside.iter_mut().zip(r1).for_each(|(o, &q)| *o = s1 * q),
                    (None, None) => inside.fill(0.0),
                }
                for ((e, o), two) in even.iter_mut().zip(odd.iter_mut()).zip(u.chunks_exact(2)) {
                    *e = two[0];
                    *o = two[1];
                }
                let (e0, e1, o0, o1) = (&even[..tw], &even[1..=tw], &odd[..tw], &odd[1..=tw]);
                // Bᵀ across: c0 - c2, c1 + c2, c2 - c1, c1 - c3.
                let across: [(&[f32], &[f32], f32); 4] = [
                    (e0, e1, -1.0),
                    (o0, e1, 1.0),
                    (e1, o0, -1.0),
                    (o0, o1, -1.0),
                ];
                for (j, (l, r, sign)) in across.into_iter().enumerate() {
                    let out = &mut dst[4 * i + j][start..][..tw];
                    for ((y, &a), &b2) in out.iter_mut().zip(l).zip(r) {
                        *y = a + sign * b2;
                    }
                }
            }
        }
    }
}

/// F(2x2, 3x3)'s output plane. A row of tiles is passes over its tiles that
/// vectorize: `Aᵀ` (`[[1, 1, 1, 0], [0, 1, -1, -1]]`) down the 16 positions' rows,
/// then across, then the two output rows written as pairs.
#[inline(always)]
fn output_f2(p: &Products, t: &Tiles, plane: usize, out: &mut [f32], scratch: &mut Vec<f32>) {
    let (oh, ow, th, tw) = (t.oh, t.ow, t.th, t.tw);
    let (co, cols, mv) = (p.co, p.cols, p.m);
    let (b, o) = (plane / co, plane % co);
    let add = p.bias.map_or(0.0, |v| v[o]);
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

/// Lanes of a pass's chunk: the F(4x4, 3x3) passes work on chunks of this many tiles
/// (or columns) side by side.
const L: usize = 8;

/// A chunk of `L` lanes, whose arithmetic is lane by lane: loops of a constant length
/// that the compiler keeps in vector registers.
#[derive(Clone, Copy)]
struct V([f32; L]);

impl std::ops::Add for V {
    type Output = V;
    #[inline(always)]
    fn add(mut self, o: V) -> V {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a += b;
        }
        self
    }
}

impl std::ops::Sub for V {
    type Output = V;
    #[inline(always)]
    fn sub(mut self, o: V) -> V {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a -= b;
        }
        self
    }
}

impl std::ops::Mul<f32> for V {
    type Output = V;
    #[inline(always)]
    fn mul(mut self, s: f32) -> V {
        for a in self.0.iter_mut() {
            *a *= s;
        }
        self
    }
}

/// `[f(0), .., f(5)]`, spelled out: `std::array::from_fn` left a call per element in
/// the passes, compiled without their CPU features (the output pass took 2.5x the
/// time).
#[inline(always)]
fn six(f: impl Fn(usize) -> V) -> [V; 6] {
    [f(0), f(1), f(2), f(3), f(4), f(5)]
}

/// F(4x4, 3x3)'s `Bᵀ` (points 0, ±1, ±2) on six values `d`:
/// `[4d0 - 5d2 + d4, -4d1 - 4d2 + d3 + d4, 4d1 - 4d2 - d3 + d4, -2d1 - d2 + 2d3 + d4,
/// 2d1 - d2 - 2d3 + d4, 4d1 - 5d3 + d5]`.
#[inline(always)]
fn bt4([d0, d1, d2, d3, d4, d5]: [V; 6]) -> [V; 6] {
    let (p, q) = (d4 - d2 * 4.0, d3 - d1 * 4.0);
    let (r, s) = (d4 - d2, (d3 - d1) * 2.0);
    [
        d0 * 4.0 - d2 * 5.0 + d4,
        p + q,
        p - q,
        r + s,
        r - s,
        d1 * 4.0 - d3 * 5.0 + d5,
    ]
}

/// F(4x4, 3x3)'s `Aᵀ` on six values `m`: `[m0 + m1 + m2 + m3 + m4, m1 - m2 + 2m3 -
/// 2m4, m1 + m2 + 4m3 + 4m4, m1 - m2 + 8m3 - 8m4 + m5]`.
#[inline(always)]
fn at4([m0, m1, m2, m3, m4, m5]: [V; 6]) -> [V; 4] {
    let (a, b) = (m1 + m2, m1 - m2);
    let (c, d) = (m3 + m4, m3 - m4);
    [m0 + a + c, b + d * 2.0, a + c * 4.0, b + d * 8.0 + m5]
}

/// `row[at .. at + L]`, zeros past its end.
#[inline(always)]
fn load(row: &[f32], at: usize) -> [f32; L] {
    match row.get(at..at + L) {
        Some(v) => v.try_into().unwrap_or([0.0; L]),
        None => {
            let mut v = [0.0; L];
            let rest = row.get(at..).unwrap_or_default();
            v[..rest.len()].copy_from_slice(rest);
            v
        }
    }
}

/// `v` into `row[at .. at + L]`, what lies past its end dropped.
#[inline(always)]
fn store(row: &mut [f32], at: usize, v: &[f32; L]) {
    match row.get_mut(at..at + L) {
        Some(r) => r.copy_from_slice(v),
        None => {
            let rest = row.get_mut(at..).unwrap_or_default();
            let n = rest.len();
            rest.copy_from_slice(&v[..n]);
        }
    }
}

/// F(4x4, 3x3)'s input tiles. The channel's image is first copied into a zero-padded
/// plane (the tiles' `4·th + 2` rows of `cols` columns: `half` = the tiles across in
/// whole chunks and one more, four times); then `Bᵀ` down each row of tiles' six
/// rows, in one pass, for every row of tiles; then for each of the six results, row
/// of tiles by row of tiles, its four phases (columns `4·t + r`) and `Bᵀ` across —
/// tile `tx`'s columns `4·tx + a` are phase `a mod 4`'s element `tx + a / 4` — into
/// six of the 36 rows.
#[inline(always)]
fn input_f4(img: &Image, t: &Tiles, ch: usize, dst: &mut [&mut [f32]], scratch: &mut Vec<f32>) {
    let (h, w, th, tw) = (img.h, img.w, t.th, t.tw);
    let [pt, pl, ..] = t.pads;
    let half = tw.next_multiple_of(L) + 1;
    let (rows, cols) = (4 * th + 2, (4 * half).next_multiple_of(L));
    // The columns the tiles read, in whole chunks.
    let reach = (4 * tw + 2).next_multiple_of(L);
    scratch.clear();
    scratch.resize(rows * cols + 6 * th * cols + 4 * half, 0.0);
    let (padded, rest) = scratch.split_at_mut(rows * cols);
    let (u, phases) = rest.split_at_mut(6 * th * cols);
    // The image's rows and columns that lie in the padded plane (all of them: the
    // tiles cover the output, which is the padded image less 2 each way).
    let (y1, x1) = (
        h.min(rows.saturating_sub(pt)),
        w.min(cols.saturating_sub(pl)),
    );
    for b in 0..img.n {
        let plane = &img.x[(b * img.c + ch) * h * w..][..h * w];
        for y in 0..y1 {
            padded[(pt + y) * cols + pl..][..x1].copy_from_slice(&plane[y * w..][..x1]);
        }
        // Down: the six rows of Bᵀ d of each row of tiles (result k of row ty at
        // (k·th + ty)·cols), from its six image rows.
        for ty in 0..th {
            let d = &padded[4 * ty * cols..][..6 * cols];
            for x in (0..reach).step_by(L) {
                let v = bt4(six(|a| V(load(d, a * cols + x))));
                for (k, v) in v.iter().enumerate() {
                    store(&mut u[(k * th + ty) * cols..][..cols], x, &v.0);
                }
            }
        }
        // Across: each result into its six positions.
        for (i, out) in dst.chunks_exact_mut(6).enumerate() {
            for ty in 0..th {
                let ui = &u[(i * th + ty) * cols..][..cols];
                let (p01, p23) = phases.split_at_mut(2 * half);
                let ((p0, p1), (p2, p3)) = (p01.split_at_mut(half), p23.split_at_mut(half));
                let phased = p0.iter_mut().zip(p1.iter_mut()).zip(p2.iter_mut().zip(p3));
                for (((a, b), (c, d)), four) in phased.zip(ui.chunks_exact(4)) {
                    (*a, *b, *c, *d) = (four[0], four[1], four[2], four[3]);
                }
                let start = (b * th + ty) * tw;
                for tx in (0..tw).step_by(L) {
                    let c = six(|a| V(load(&phases[(a % 4) * half..][..half], tx + a / 4)));
                    // Lanes past the row of tiles land on the next row's place (written
                    // after this one), past the channel's last row dropped.
                    for (o, v) in out.iter_mut().zip(bt4(c)) {
                        store(&mut o[start..], tx, &v.0);
                    }
                }
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
    let (b, o) = (plane / co, plane % co);
    let add = p.bias.map_or(0.0, |v| v[o]);
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
            let v = at4(six(|i| V(load(pos(6 * i + j), x))));
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
                for (c, v) in at4(q).into_iter().enumerate() {
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
