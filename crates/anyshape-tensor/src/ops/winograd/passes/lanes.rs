//! The passes on lanes (see the parent's doc): chunks of tiles side by side in the
//! products' order, gathered, transformed in vectors and written out — every input
//! transform, and the output transforms of narrow rows of tiles.
use super::{clamps, load, residual, store, Filtering, Image, Products, Tiles, L, V};

/// Chunks of a block: a pass transforms a block's chunks a row (or column) of
/// positions at a time.
const CHUNKS: usize = 16;

/// Lanes of a block.
pub(in super::super) const BLOCK: usize = CHUNKS * L;

/// A chunk of zeros.
const ZERO: V = V([0.0; L]);

/// Where the lanes of a pass stand, one after another: plane `q` of the pass's planes
/// (whose place among all planes is `(outer, inner)`, `inner` below an extent the
/// pass gives: the output's image and channel), tile `ty`, `tx` in it.
#[derive(Clone, Copy, Default)]
struct Cursor {
    q: usize,
    outer: usize,
    inner: usize,
    ty: usize,
    tx: usize,
}

impl Cursor {
    /// The first lane of plane `first`, of `inner` extent `k`.
    fn at(first: usize, k: usize) -> Cursor {
        Cursor {
            outer: first / k.max(1),
            inner: first % k.max(1),
            ..Cursor::default()
        }
    }

    /// The next lane, in planes of `th` x `tw` tiles and `inner` extent `k`.
    #[inline(always)]
    fn advance(&mut self, th: usize, tw: usize, k: usize) {
        self.tx += 1;
        if self.tx == tw {
            self.tx = 0;
            self.ty += 1;
            if self.ty == th {
                self.ty = 0;
                self.q += 1;
                self.inner += 1;
                if self.inner == k {
                    self.inner = 0;
                    self.outer += 1;
                }
            }
        }
    }

    /// The lanes of the chunk from `self` on (`count` of them; the last repeated in
    /// the chunk's lanes past them), `self` left at the next chunk's first.
    #[inline(always)]
    fn chunk(&mut self, count: usize, th: usize, tw: usize, k: usize) -> [Cursor; L] {
        let mut lanes = [*self; L];
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = *self;
            if l < count {
                self.advance(th, tw, k);
            }
            if l + 1 >= count {
                // The last lane stays where it is for the rest of the chunk.
                let last = *lane;
                lanes[l + 1..].fill(last);
                break;
            }
        }
        lanes
    }
}

/// The input transform's lanes (see the module's doc): the channels' planes are first
/// copied into zero-padded ones (`th·m + 2` x `tw·m + 2`: every tile's reach), from
/// which each chunk's tiles are read.
#[inline(always)]
pub(super) fn input_lanes<const A: usize, const M: usize, F: Filtering<A, M>>(
    img: &Image,
    t: &Tiles,
    c0: usize,
    dst: &mut [&mut [f32]],
    scratch: &mut Vec<f32>,
) {
    let (n, h, w, th, tw) = (img.n, img.h, img.w, t.th, t.tw);
    let [pt, pl, ..] = t.pads;
    let lanes = dst.first().map_or(0, |d| d.len());
    let tiles = th * tw;
    if tiles == 0 || dst.len() != A * A {
        return;
    }
    // (channel, image) pairs, in the products' order.
    let planes = lanes / tiles;
    let (ph, pw) = (th * M + 2, tw * M + 2);
    let area = ph * pw;
    scratch.clear();
    scratch.resize(planes * area, 0.0);
    // The image's rows and columns that lie in the padded plane (all of them: the
    // tiles cover the output, which is the padded image less 2 each way).
    let (y1, x1) = (h.min(ph.saturating_sub(pt)), w.min(pw.saturating_sub(pl)));
    for (q, padded) in scratch.chunks_exact_mut(area).enumerate() {
        let (ch, b) = (c0 + q / n, q % n);
        let plane = &img.x[(b * img.c + ch) * h * w..][..h * w];
        for y in 0..y1 {
            padded[(pt + y) * pw + pl..][..x1].copy_from_slice(&plane[y * w..][..x1]);
        }
    }
    let padded = &scratch[..];
    let mut at = Cursor::default();
    // A block's tiles transformed across their rows: chunk k's element (a, j) at
    // across[k][a][j].
    let mut across = [[[ZERO; A]; A]; CHUNKS];
    for s0 in (0..lanes).step_by(BLOCK) {
        let chunks = (lanes - s0).min(BLOCK).div_ceil(L);
        for (k, e) in across.iter_mut().enumerate().take(chunks) {
            let chunk = at.chunk(lanes - s0 - k * L, th, tw, 0);
            // The tiles, element (a, b) of every lane in d[a][b].
            let mut d = [[ZERO; A]; A];
            for (l, c) in chunk.iter().enumerate() {
                let corner = c.q * area + c.ty * M * pw + c.tx * M;
                for (a, da) in d.iter_mut().enumerate() {
                    let row = &padded[corner + a * pw..][..A];
                    for (x, &v) in da.iter_mut().zip(row) {
                        x.0[l] = v;
                    }
                }
            }
            for (ea, da) in e.iter_mut().zip(d) {
                *ea = F::bt(da);
            }
        }
        // Down each column j into positions (i, j), over the block's chunks: `α` of
        // the `α²` rows written at a time.
        for j in 0..A {
            for (k, e) in across.iter().enumerate().take(chunks) {
                let mut column = [ZERO; A];
                for (x, ea) in column.iter_mut().zip(e) {
                    *x = ea[j];
                }
                for (i, v) in F::bt(column).iter().enumerate() {
                    store(&mut dst[i * A + j][..], s0 + k * L, &v.0);
                }
            }
        }
    }
}

/// The output transform's lanes (see the module's doc).
#[inline(always)]
pub(super) fn output_lanes<const A: usize, const M: usize, F: Filtering<A, M>>(
    p: &Products,
    t: &Tiles,
    first: usize,
    out: &mut [f32],
) {
    let (oh, ow, th, tw) = (t.oh, t.ow, t.th, t.tw);
    let (co, cols) = (p.co, p.cols);
    let (area, tiles) = (oh * ow, th * tw);
    if area == 0 || tiles == 0 || co == 0 || cols == 0 {
        return;
    }
    let lanes = out.len() / area * tiles;
    let stride = co * cols;
    let clamp = clamps(p);
    let mut at = Cursor::at(first, co);
    // A block's chunks: their lanes, where their products start (per position) and
    // whether they lie together, their bias, and their products transformed across:
    // chunk k's row i, column jj at across[k][i][jj].
    let mut lanes_of = [[Cursor::default(); L]; CHUNKS];
    let mut from = [[0; L]; CHUNKS];
    let mut bias = [ZERO; CHUNKS];
    let mut across = [[[ZERO; M]; A]; CHUNKS];
    for s0 in (0..lanes).step_by(BLOCK) {
        let chunks = (lanes - s0).min(BLOCK).div_ceil(L);
        for k in 0..chunks {
            lanes_of[k] = at.chunk(lanes - s0 - k * L, th, tw, co);
            for (l, c) in lanes_of[k].iter().enumerate() {
                // Image `outer`, channel `inner`.
                from[k][l] = c.inner * cols + c.outer * tiles + c.ty * tw + c.tx;
            }
            if let Some(b) = p.bias {
                for (x, c) in bias[k].0.iter_mut().zip(&lanes_of[k]) {
                    *x = b[c.inner];
                }
            }
        }
        // Across, a row of positions at a time (as the input's down pass).
        for (i, row) in p.m.chunks_exact(A * stride).take(A).enumerate() {
            for (k, f) in from.iter().enumerate().take(chunks) {
                let together = f.windows(2).all(|f| f[1] == f[0] + 1);
                let mut m = [ZERO; A];
                for (x, position) in m.iter_mut().zip(row.chunks_exact(stride)) {
                    if together {
                        *x = V(load(position, f[0]));
                    } else {
                        for (v, &f) in x.0.iter_mut().zip(f) {
                            *v = position[f];
                        }
                    }
                }
                across[k][i] = F::at(m);
            }
        }
        for k in 0..chunks {
            // Down each column jj.
            let mut y = [[ZERO; M]; M];
            for jj in 0..M {
                let mut column = [ZERO; A];
                for (x, g) in column.iter_mut().zip(&across[k]) {
                    *x = g[jj];
                }
                for (ii, v) in F::at(column).into_iter().enumerate() {
                    let v = v + bias[k];
                    y[ii][jj] = if clamp { v.relu() } else { v };
                }
            }
            let count = (lanes - s0 - k * L).min(L);
            for (l, c) in lanes_of[k].iter().enumerate().take(count) {
                let plane = &mut out[c.q * area..][..area];
                let (y0, x0) = (c.ty * M, c.tx * M);
                let width = M.min(ow - x0);
                for (ii, yi) in y.iter().enumerate().take(M.min(oh - y0)) {
                    let row = &mut plane[(y0 + ii) * ow + x0..][..width];
                    for (o, v) in row.iter_mut().zip(yi) {
                        *o = v.0[l];
                    }
                }
            }
        }
    }
    residual(p, first * area, out);
}
