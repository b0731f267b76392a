//! The Winograd transforms' inner passes, for F(2x2, 3x3) and F(4x4, 3x3). The host
//! crates are built for the baseline x86-64 (SSE2: 4 lanes), so these are compiled
//! twice, for it and for AVX2 with FMA (8 lanes), and the CPU's features pick one at
//! run time (`multiversion`). Both forms round alike: Rust contracts no multiply-add
//! into an FMA, so a module's outputs do not depend on the CPU it runs on.
//!
//! The input transform works on **lanes**: chunks of [`L`] tiles side by side, in the
//! order the products keep them (channel, image, tile), so that a chunk runs on across
//! channels where an image has few tiles (a 3 x 3 image has 4). A chunk's tiles are
//! gathered into `α x α` vectors of `L` lanes (where the CPU has AVX, as 8 x 8
//! transposes of the tiles' rows: ResNet-50's input transforms 2.23 -> 1.76 ms at 224 x
//! 224, Zen 4, together with zeroing only the padded planes' borders), transformed
//! there (`Bᵀ` across, then down: [`Filtering`]) and written as vectors, each into its
//! position's row. The
//! output transform does the same (`Aᵀ`, its `m x m` results written lane by lane into
//! the output's planes) where rows of tiles are narrow, and a row of tiles at a time
//! where they are wide ([`ROW_TILES`]). (Measured serially on a Zen 3 against passes
//! that vectorized along each row of tiles, deinterleaving its columns, one channel
//! per part: ResNet-50's input transforms 3.2 against 5.0 ms at 224 x 224, 0.74
//! against 1.70 ms at 96 x 96, where 512 channels of 3 x 3 took 43 against 135 µs.)
use super::Tiles;
use multiversion::multiversion;

mod lanes;
mod rows;

pub(super) use lanes::BLOCK;
pub(super) use rows::{output_rows, ROW_TILES};

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

impl Products<'_> {
    /// Output plane `plane`'s image, channel and bias.
    fn plane(&self, plane: usize) -> (usize, usize, f32) {
        let (b, o) = (plane / self.co, plane % self.co);
        (b, o, self.bias.map_or(0.0, |v| v[o]))
    }
}

/// The transformed tiles of channels `c0 ..` into `dst`: `α²` rows, one per position,
/// each the channels' stretch of that position's row of `V` (`n·th·tw` per channel,
/// as many channels as it holds); `scratch` is the part's working memory.
#[multiversion(targets("x86_64+avx2+fma"))]
pub(super) fn input_channels(
    img: &Image,
    t: &Tiles,
    c0: usize,
    dst: &mut [&mut [f32]],
    scratch: &mut Vec<f32>,
) {
    match t.tile.m {
        2 => lanes::input_lanes::<4, 2, F2>(img, t, c0, dst, scratch),
        _ => lanes::input_lanes::<6, 4, F4>(img, t, c0, dst, scratch),
    }
}

/// Output planes `first ..` (plane `q` is image `q / co`, channel `q % co`), as many
/// as `out` holds (`oh·ow` each): each tile's `Aᵀ m A` plus the bias, then the
/// residual and the ReLU, its rows and columns past the output's extents left out.
#[multiversion(targets("x86_64+avx2+fma"))]
pub(super) fn output_planes(p: &Products, t: &Tiles, first: usize, out: &mut [f32]) {
    match t.tile.m {
        2 => lanes::output_lanes::<4, 2, F2>(p, t, first, out),
        _ => lanes::output_lanes::<6, 4, F4>(p, t, first, out),
    }
}

/// The ReLU of an output transform where no residual follows (with one, it follows
/// the residual's add).
pub(super) fn clamps(p: &Products) -> bool {
    p.relu && p.residual.is_none()
}

/// The residual and the ReLU after it over `out`, which starts at element `at` of the
/// output: a pass of their own, which vectorizes.
#[inline(always)]
pub(super) fn residual(p: &Products, at: usize, out: &mut [f32]) {
    if let Some(r) = p.residual {
        let r = &r[at..][..out.len()];
        for (y, &v) in out.iter_mut().zip(r) {
            *y += v;
            if p.relu {
                *y = y.max(0.0);
            }
        }
    }
}

/// Lanes of a pass's chunk: the passes work on chunks of this many tiles side by side.
pub(super) const L: usize = 8;

/// A chunk of `L` lanes, whose arithmetic is lane by lane: loops of a constant length
/// that the compiler keeps in vector registers.
#[derive(Clone, Copy)]
pub(super) struct V(pub(super) [f32; L]);

impl V {
    /// `max(x, 0)` lane by lane.
    #[inline(always)]
    pub(super) fn relu(mut self) -> V {
        for a in self.0.iter_mut() {
            *a = a.max(0.0);
        }
        self
    }
}

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

/// `row[at .. at + L]`, zeros past its end.
#[inline(always)]
pub(super) fn load(row: &[f32], at: usize) -> [f32; L] {
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
pub(super) fn store(row: &mut [f32], at: usize, v: &[f32; L]) {
    match row.get_mut(at..at + L) {
        Some(r) => r.copy_from_slice(v),
        None => {
            let rest = row.get_mut(at..).unwrap_or_default();
            let n = rest.len();
            rest.copy_from_slice(&v[..n]);
        }
    }
}

/// A filtering's transforms on chunks of lanes: `Bᵀ` on `A` (= `α`) values, `Aᵀ`
/// from `A` values to `M` (= `m`).
pub(super) trait Filtering<const A: usize, const M: usize> {
    /// `Bᵀ` on `A` values.
    fn bt(d: [V; A]) -> [V; A];
    /// `Aᵀ` on `A` values.
    fn at(m: [V; A]) -> [V; M];
}

/// F(2x2, 3x3).
pub(super) struct F2;

impl Filtering<4, 2> for F2 {
    /// `Bᵀ` = `[[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]`.
    #[inline(always)]
    fn bt([d0, d1, d2, d3]: [V; 4]) -> [V; 4] {
        [d0 - d2, d1 + d2, d2 - d1, d1 - d3]
    }

    /// `Aᵀ` = `[[1, 1, 1, 0], [0, 1, -1, -1]]`.
    #[inline(always)]
    fn at([m0, m1, m2, m3]: [V; 4]) -> [V; 2] {
        [m0 + m1 + m2, m1 - m2 - m3]
    }
}

/// F(4x4, 3x3) (points 0, ±1, ±2).
pub(super) struct F4;

impl Filtering<6, 4> for F4 {
    /// `Bᵀ` on six values `d`: `[4d0 - 5d2 + d4, -4d1 - 4d2 + d3 + d4, 4d1 - 4d2 -
    /// d3 + d4, -2d1 - d2 + 2d3 + d4, 2d1 - d2 - 2d3 + d4, 4d1 - 5d3 + d5]`.
    #[inline(always)]
    fn bt([d0, d1, d2, d3, d4, d5]: [V; 6]) -> [V; 6] {
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

    /// `Aᵀ` on six values `m`: `[m0 + m1 + m2 + m3 + m4, m1 - m2 + 2m3 - 2m4, m1 + m2 +
    /// 4m3 + 4m4, m1 - m2 + 8m3 - 8m4 + m5]`.
    #[inline(always)]
    fn at([m0, m1, m2, m3, m4, m5]: [V; 6]) -> [V; 4] {
        let (a, b) = (m1 + m2, m1 - m2);
        let (c, d) = (m3 + m4, m3 - m4);
        [m0 + a + c, b + d * 2.0, a + c * 4.0, b + d * 8.0 + m5]
    }
}
