//! The passes on lanes (see the parent's doc): chunks of tiles side by side in the
//! products' order, gathered (where the CPU has AVX, by 8 x 8 transposes: `gather`,
//! the module's one `unsafe` block), transformed in vectors and written out — every
//! input transform, and the output transforms of narrow rows of tiles.
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
    // The planes, and a chunk's width of zeros past the last (the gather loads whole
    // chunks of a row): what lies outside the image zeroed, the rest copied over.
    scratch.resize(planes * area + L, 0.0);
    scratch[planes * area..].fill(0.0);
    let avx = gather::available();
    // The image's rows and columns that lie in the padded plane (all of them: the
    // tiles cover the output, which is the padded image less 2 each way).
    let (y1, x1) = (h.min(ph.saturating_sub(pt)), w.min(pw.saturating_sub(pl)));
    for (q, padded) in scratch.chunks_exact_mut(area).take(planes).enumerate() {
        let (ch, b) = (c0 + q / n, q % n);
        let plane = &img.x[(b * img.c + ch) * h * w..][..h * w];
        padded[..pt * pw].fill(0.0);
        for y in 0..y1 {
            let row = &mut padded[(pt + y) * pw..][..pw];
            row[..pl].fill(0.0);
            row[pl..pl + x1].copy_from_slice(&plane[y * w..][..x1]);
            row[pl + x1..].fill(0.0);
        }
        padded[(pt + y1) * pw..].fill(0.0);
    }
    let padded = &scratch[..];
    let mut at = Cursor::default();
    // A block's tiles transformed across their rows: chunk k's element (a, j) at
    // across[k][a][j].
    let mut across = [[[ZERO; A]; A]; CHUNKS];
    // A chunk's tiles, element (a, b) of every lane in d[a][b].
    let mut d = [[ZERO; A]; A];
    for s0 in (0..lanes).step_by(BLOCK) {
        let chunks = (lanes - s0).min(BLOCK).div_ceil(L);
        for (k, e) in across.iter_mut().enumerate().take(chunks) {
            let chunk = at.chunk(lanes - s0 - k * L, th, tw, 0);
            // Every lane of every element of d written (the last lane repeated).
            let corners = chunk.map(|c| c.q * area + c.ty * M * pw + c.tx * M);
            if !(avx && gather::rows(padded, &corners, pw, &mut d)) {
                for (l, corner) in corners.into_iter().enumerate() {
                    for (a, da) in d.iter_mut().enumerate() {
                        let row = &padded[corner + a * pw..][..A];
                        for (x, &v) in da.iter_mut().zip(row) {
                            x.0[l] = v;
                        }
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

/// The gather of a chunk's tiles as 8 x 8 transposes of whole rows (AVX).
mod gather {
    use super::{L, V};

    /// Whether the CPU runs AVX.
    pub(super) fn available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Element `(a, b)` of the tile at `corners[l]` (rows `pw` apart) into
    /// `d[a][b].0[l]`: for each of the tiles' rows `a`, the eight tiles' rows loaded
    /// whole (`L` elements from each corner) and transposed. False (nothing done) where
    /// a load would pass the end of `padded`, or off x86-64; only call it where AVX runs.
    #[inline(always)]
    pub(super) fn rows<const A: usize>(
        padded: &[f32],
        corners: &[usize; L],
        pw: usize,
        d: &mut [[V; A]; A],
    ) -> bool {
        let last = corners.iter().max().map_or(0, |&c| c + (A - 1) * pw + L);
        if A > L || last > padded.len() || cfg!(not(target_arch = "x86_64")) {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: every load reads `L` elements from `corner + a·pw` (a < A), which the
        // check above keeps inside `padded`; every store writes one `V` of `d`; the
        // caller runs this only where the CPU has AVX.
        unsafe {
            use std::arch::x86_64::*;
            let p = padded.as_ptr();
            for (a, da) in d.iter_mut().enumerate() {
                let r = corners.map(|c| _mm256_loadu_ps(p.add(c + a * pw)));
                let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let columns = [
                    _mm256_permute2f128_ps::<0x20>(s0, s4),
                    _mm256_permute2f128_ps::<0x20>(s1, s5),
                    _mm256_permute2f128_ps::<0x20>(s2, s6),
                    _mm256_permute2f128_ps::<0x20>(s3, s7),
                    _mm256_permute2f128_ps::<0x31>(s0, s4),
                    _mm256_permute2f128_ps::<0x31>(s1, s5),
                    _mm256_permute2f128_ps::<0x31>(s2, s6),
                    _mm256_permute2f128_ps::<0x31>(s3, s7),
                ];
                for (x, column) in da.iter_mut().zip(columns) {
                    _mm256_storeu_ps(x.0.as_mut_ptr(), column);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{gather, L, V, ZERO};

    /// The transposes gather what element-by-element reads would, for both tiles'
    /// extents, tiles anywhere in the rows (the last 6 x 6 one's last load ending at the
    /// slice's end), and refuse a load past the end.
    #[test]
    fn the_transposes_gather_each_tiles_elements() {
        if !gather::available() {
            return;
        }
        let pw = 13;
        let padded: Vec<f32> = (0..6 * pw + L).map(|i| i as f32 * 0.5 - 7.0).collect();
        let corners = [0, 3, 5, 4, 1, 2, 2, pw];
        fn check<const A: usize>(padded: &[f32], corners: &[usize; L], pw: usize) {
            let mut d = [[ZERO; A]; A];
            assert!(gather::rows(padded, corners, pw, &mut d));
            for (l, &c) in corners.iter().enumerate() {
                for (a, da) in d.iter().enumerate() {
                    for (b, x) in da.iter().enumerate() {
                        assert_eq!(x.0[l], padded[c + a * pw + b], "A={A} ({a}, {b}) lane {l}");
                    }
                }
            }
            let past = corners.map(|c| c + padded.len());
            assert!(!gather::rows::<A>(
                padded,
                &past,
                pw,
                &mut [[V([0.0; L]); A]; A]
            ));
        }
        check::<4>(&padded, &corners, pw);
        check::<6>(&padded, &corners, pw);
    }
}
