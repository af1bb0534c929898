//! The filter gradient on AMX tiles: per image, the transposed output gradient times the patch
//! rows in pixel pairs, accumulated in f32 tiles (see the parent module). The pairs are
//! gathered from the padded image ([`pair_patches`]), or, for stride-1 layers of whole
//! 16-channel blocks and 32-pixel output rows, read in place from the padded image with each
//! pixel interleaved with its right neighbour ([`InPlacePairs`]): ResNet-20's 16-channel filter
//! gradients 2.08 → 1.22 ms at batch 128 (`cargo bench --bench cpu_kernels -- conv-algos`,
//! `bwdw-bf16-amx s1`, medians of 3 alternated runs), bitwise the gathered result.

use std::arch::asm;

use super::{
    BUFFERS, K_STEP, N_BLOCK, TILE_ROWS, Tiles, bf16_bits, check_supported, gather_windows,
    pad_image_bf16,
};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::conv::direct::{padded_hw, pixel_origins, segments};
use crate::backend::cpu::kernels::conv::tiles::Segment;
use crate::backend::cpu::kernels::conv::{Conv2dGeometry, ConvInput, ConvPass, check_operands};
use crate::backend::cpu::kernels::parallel::{split_range, threads, worth_parallel};
use crate::backend::cpu::kernels::simd::carry;
use rayon::prelude::*;

/// `dw = ∂conv2d/∂w · dy` with `x` and `dy` rounded to bf16, on AMX tiles (layouts as
/// [`crate::backend::cpu::kernels::conv2d_backward_filter`]). Per image, `dwᵀ += bf16(dy)ᵀ · patches`: the output
/// gradient transposed (channels × pixels) times the patch rows, laid out in pixel pairs as
/// `tdpbf16ps` reads its right operand, accumulated in f32 over the images of each thread's
/// range; the ranges' sums are added in range order (deterministic for a thread count). An
/// error where [`super::unsupported`] says why not.
pub fn backward_filter(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    dy: &[f32],
    dw: &mut [f32],
) -> Result<(), KernelError> {
    backward_filter_with(g, x, dy, dw, true)
}

/// [`backward_filter`], reading the patch pairs in place where it can when `in_place`
/// ([`InPlacePairs`]), else always gathering them.
fn backward_filter_with(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    dy: &[f32],
    dw: &mut [f32],
    in_place: bool,
) -> Result<(), KernelError> {
    let out_hw = check_operands(
        "conv2d_backward_filter_bf16",
        g,
        x.len(),
        dw.len(),
        dy.len(),
    )?;
    check_supported("conv2d_backward_filter_bf16", g, ConvPass::FilterGradient)?;
    let (c, o) = (g.in_channels, g.out_channels);
    let k_len = g.kernel_hw[0] * g.kernel_hw[1] * c;
    let pixels = out_hw[0] * out_hw[1];
    if k_len == 0 || o == 0 || pixels == 0 || g.batch == 0 {
        dw.fill(0.0);
        return Ok(());
    }
    let shape = FilterShape {
        k_len,
        k_padded: k_len.next_multiple_of(N_BLOCK),
        o,
        o_padded: o.next_multiple_of(TILE_ROWS),
        pixels,
        p_padded: pixels.next_multiple_of(K_STEP),
    };
    let parts = if worth_parallel(2 * g.macs()) {
        threads()
    } else {
        1
    };
    let ranges = split_range(g.batch, parts);
    let segs = segments(g);
    let origins = pixel_origins(g, out_hw);
    let in_place = InPlacePairs::of(g, out_hw).filter(|_| in_place);
    let image_len = g.in_hw[0] * g.in_hw[1] * c;
    let dy_len = pixels * o;
    let run = |images: std::ops::Range<usize>| -> Vec<f32> {
        let mut acc = vec![0.0; shape.o_padded * shape.k_padded];
        BUFFERS.with_borrow_mut(|b| {
            if b.filter_for != Some(shape) {
                b.pairs.clear();
                b.pairs.resize(shape.p_padded * shape.k_padded, 0);
                b.dy_t.clear();
                b.dy_t.resize(shape.o_padded * shape.p_padded, 0);
                b.two_rows.clear();
                b.two_rows.resize(2 * shape.k_padded, 0);
                b.filter_for = Some(shape);
            }
            // SAFETY: `backward_filter` runs only where `unsupported` found AMX available.
            let tiles = unsafe { Tiles::configure() };
            for n in images {
                x.with_image(n * image_len..(n + 1) * image_len, |image| {
                    pad_image_bf16(g, image, &mut b.padded, &mut b.padded_for);
                });
                let right = match in_place {
                    Some(plan) => {
                        pair_pixels(&b.padded, plan.c, &mut b.pixel_pairs);
                        Right::InPlace {
                            plan,
                            pixel_pairs: &b.pixel_pairs,
                        }
                    }
                    None => {
                        pair_patches(
                            &segs,
                            &origins,
                            &b.padded,
                            shape,
                            &mut b.two_rows,
                            &mut b.pairs,
                        );
                        Right::Gathered(&b.pairs)
                    }
                };
                transpose_to_bf16(&dy[n * dy_len..(n + 1) * dy_len], shape, &mut b.dy_t);
                accumulate_filter(&tiles, &b.dy_t, right, shape, &mut acc);
            }
        });
        acc
    };
    let partials: Vec<Vec<f32>> = if ranges.len() <= 1 {
        vec![run(0..g.batch)]
    } else {
        ranges.into_par_iter().map(carry(run)).collect()
    };
    for (k, dw_row) in dw.chunks_exact_mut(o).enumerate() {
        for (oc, d) in dw_row.iter_mut().enumerate() {
            let at = oc * shape.k_padded + k;
            *d = partials[1..]
                .iter()
                .fold(partials[0][at], |sum, p| sum + p[at]);
        }
    }
    Ok(())
}

/// The padded extents of a filter gradient's tile operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FilterShape {
    /// Patch length `KH·KW·C`, and rounded up to whole 16-column accumulator blocks.
    k_len: usize,
    k_padded: usize,
    /// Output channels, and rounded up to whole 16-row tiles.
    o: usize,
    o_padded: usize,
    /// Output pixels of an image, and rounded up to whole 32-deep steps.
    pixels: usize,
    p_padded: usize,
}

/// A stride-1 filter gradient whose patch pairs are read in place: the right operand's row for
/// the output pixels `(p, p + 1)` and the taps of one 16-channel block is the padded image's
/// pixel `j = origin(p) + tap` interleaved with pixel `j + 1` ([`pair_pixels`]), so a tile of 16
/// pairs is 16 rows of that interleaved image two pixels apart — no patch is gathered. Needs
/// channels in whole 16-channel blocks (a block of patch columns is one tap's channels) and
/// output rows of whole 32-pixel steps (a step's pairs lie in one row); the tiles then multiply
/// the same pairs in the same order as the gathered path, so the sums are bitwise the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InPlacePairs {
    c: usize,
    kw: usize,
    wp: usize,
    out_w: usize,
    hp: usize,
}

impl InPlacePairs {
    fn of(g: &Conv2dGeometry, out_hw: [usize; 2]) -> Option<InPlacePairs> {
        let [hp, wp] = padded_hw(g);
        let fits = g.strides == [1, 1]
            && g.dilations == [1, 1]
            && g.groups == 1
            && g.in_channels.is_multiple_of(N_BLOCK)
            && g.in_channels > 0
            && out_hw[1].is_multiple_of(K_STEP)
            && out_hw[1] > 0;
        fits.then_some(InPlacePairs {
            c: g.in_channels,
            kw: g.kernel_hw[1],
            wp,
            out_w: out_hw[1],
            hp,
        })
    }
}

/// Where the right operand's tiles of a filter gradient are.
#[derive(Clone, Copy)]
enum Right<'a> {
    /// Gathered patch rows in pixel pairs ([`pair_patches`]).
    Gathered(&'a [u16]),
    /// The padded image's pixel pairs, read in place ([`InPlacePairs`]).
    InPlace {
        plan: InPlacePairs,
        pixel_pairs: &'a [u16],
    },
}

impl Right<'_> {
    /// Whether every tile [`Right::tile`] can address for `shape` lies in the buffer.
    fn covers(&self, shape: FilterShape) -> bool {
        match *self {
            Right::Gathered(pairs) => pairs.len() >= shape.p_padded * shape.k_padded,
            Right::InPlace { plan, pixel_pairs } => {
                // The furthest row: the last step's last pair at the last tap is padded pixel
                // `hp·wp − 2` with its neighbour (see `InPlacePairs`).
                let pixels_read = plan.hp * plan.wp - 1;
                shape.k_padded == shape.k_len
                    && shape.p_padded == shape.pixels
                    && pixel_pairs.len() >= pixels_read * 2 * plan.c
            }
        }
    }

    /// Row stride of the tiles, in bytes.
    fn stride(&self, shape: FilterShape) -> usize {
        match *self {
            Right::Gathered(_) => 4 * shape.k_padded,
            // Two pixels of `2c` bf16 values.
            Right::InPlace { plan, .. } => 8 * plan.c,
        }
    }

    /// The tile of pixel step `step` (32 pixels) and patch-column block `block` (16 columns).
    fn tile(&self, shape: FilterShape, step: usize, block: usize) -> *const u16 {
        match *self {
            Right::Gathered(pairs) => pairs
                .as_ptr()
                .wrapping_add(step * TILE_ROWS * 2 * shape.k_padded + block * 2 * N_BLOCK),
            Right::InPlace { plan, pixel_pairs } => {
                let first = step * K_STEP;
                let (oh, ow) = (first / plan.out_w, first % plan.out_w);
                let blocks_per_tap = plan.c / N_BLOCK;
                let (tap, channels) = (block / blocks_per_tap, block % blocks_per_tap);
                let (ky, kx) = (tap / plan.kw, tap % plan.kw);
                let j = (oh + ky) * plan.wp + ow + kx;
                pixel_pairs
                    .as_ptr()
                    .wrapping_add(j * 2 * plan.c + channels * 2 * N_BLOCK)
            }
        }
    }
}

/// Pixel `j` of the padded image (`c` channels) interleaved with pixel `j + 1`:
/// `out[j][2i + t] = padded[j + t][i]`, for every pixel but the last.
fn pair_pixels(padded: &[u16], c: usize, out: &mut Vec<u16>) {
    let pixels = padded.len() / c.max(1);
    out.resize(pixels.saturating_sub(1) * 2 * c, 0);
    assert!(
        c.is_multiple_of(16) && padded.len() == pixels * c,
        "tile filter gradient out of bounds"
    );
    for j in 0..pixels.saturating_sub(1) {
        // SAFETY: pixels `j` and `j + 1` (2c values) lie in `padded`, row `j` of `out` holds
        // 2c; `c` is a multiple of 16; the CPU runs AVX-512 (`unsupported` checked the level).
        unsafe {
            interleave(
                padded.as_ptr().add(j * c),
                out.as_mut_ptr().add(j * 2 * c),
                c,
            )
        };
    }
}

/// The patch rows of one image in pixel pairs: row `q` of `pairs` holds
/// `(patch[2q][k], patch[2q + 1][k])` for every `k` (`2·k_padded` values); rows past the last
/// pixel stay zero.
fn pair_patches(
    segs: &[Segment],
    origins: &[usize],
    padded: &[u16],
    shape: FilterShape,
    two_rows: &mut [u16],
    pairs: &mut [u16],
) {
    let kp = shape.k_padded;
    let reach = segs.iter().map(|s| s.a_off + s.len).max().unwrap_or(0);
    assert!(
        origins.iter().all(|&origin| origin + reach <= padded.len())
            && segs.iter().all(|s| s.k0 + s.len <= kp)
            && origins.len() == shape.pixels
            && two_rows.len() >= 2 * kp
            && pairs.len() >= shape.p_padded * kp,
        "tile filter gradient out of bounds"
    );
    for (q, pair) in origins.chunks(2).enumerate() {
        if pair.len() == 1 {
            two_rows[kp..kp + shape.k_len].fill(0);
        }
        // SAFETY: the window runs lie in `padded`, the rows in `two_rows` (asserted above); the
        // CPU runs AVX-512 (`unsupported` checked the level).
        unsafe { gather_windows(segs, pair, padded.as_ptr(), two_rows.as_mut_ptr(), kp) };
        // SAFETY: both rows hold `kp` values and pair row `q` holds `2·kp` (asserted above).
        unsafe { interleave(two_rows.as_ptr(), pairs.as_mut_ptr().add(q * 2 * kp), kp) };
    }
}

/// `out[2k + j] = rows[j·len + k]` for `k < len` (a multiple of 16), `j < 2`.
///
/// # Safety
/// AVX-512F/BW are available; `rows` holds `2·len` values, `out` room for `2·len`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn interleave(rows: *const u16, out: *mut u16, len: usize) {
    use std::arch::x86_64::*;
    // Lane 2i takes element i of the first row (lanes 0–15), lane 2i + 1 element i of the second
    // (lanes 16–31).
    let index = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    );
    for k in (0..len).step_by(16) {
        // SAFETY: `k + 16 <= len` for both rows and `2k + 32 <= 2·len` for `out`.
        unsafe {
            let first = _mm256_loadu_si256(rows.add(k).cast());
            let second = _mm256_loadu_si256(rows.add(len + k).cast());
            let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(first), second);
            _mm512_storeu_si512(out.add(2 * k).cast(), _mm512_permutexvar_epi16(index, both));
        }
    }
}

/// `dy_t[oc][p] = bf16(dy[p][oc])` for the image's pixels and channels; the padding stays zero.
fn transpose_to_bf16(dy: &[f32], shape: FilterShape, dy_t: &mut [u16]) {
    let (o, pp, pixels) = (shape.o, shape.p_padded, shape.pixels);
    assert!(
        dy.len() == pixels * o && dy_t.len() >= shape.o_padded * pp && pixels <= pp,
        "tile filter gradient out of bounds"
    );
    // Whole blocks of 16 pixels by gathers where their byte offsets `15·o·4` fit in i32; the
    // rest one value at a time.
    let gathered = if o * 15 < (1 << 31) / 4 {
        pixels / 16 * 16
    } else {
        0
    };
    // SAFETY: AVX-512 runs (`unsupported` checked the level); every gathered index
    // `(p0 + i)·o + oc` with `p0 + i < gathered` lies in `dy` and every store in `dy_t`
    // (asserted above); the offsets fit in i32 (`gathered` is 0 otherwise).
    unsafe { transpose_blocks(dy.as_ptr(), o, gathered, pp, dy_t.as_mut_ptr()) };
    for p in gathered..pixels {
        for oc in 0..o {
            dy_t[oc * pp + p] = bf16_bits(dy[p * o + oc]);
        }
    }
}

/// [`transpose_to_bf16`] for pixels `0..whole` (a multiple of 16): per channel, 16 pixels
/// gathered, rounded to bf16 (the bit arithmetic of [`crate::lower::HalfFormat::Bf16`]) and stored at once.
///
/// # Safety
/// AVX-512F/BW are available; `dy` holds `whole·o` values, `dy_t` rows of `pp >= whole` for
/// `o` channels; `15·o·4` fits in i32.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn transpose_blocks(dy: *const f32, o: usize, whole: usize, pp: usize, dy_t: *mut u16) {
    use std::arch::x86_64::*;
    let stride = o as i32;
    let index = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(stride),
    );
    let (one, bias, abs, inf, quiet) = (
        _mm512_set1_epi32(1),
        _mm512_set1_epi32(0x7fff),
        _mm512_set1_epi32(0x7fff_ffff),
        _mm512_set1_epi32(0x7f80_0000),
        _mm512_set1_epi32(0x0040_0000),
    );
    // The bf16 bits of 16 f32 values, in the low halves of their 32-bit lanes.
    let round = |bits: __m512i| {
        // Round to nearest even: add 0x7fff plus the lowest kept bit, keep the high half.
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), one);
        let rounded = _mm512_add_epi32(bits, _mm512_add_epi32(bias, lsb));
        // NaN stays NaN (quieted), as `HalfFormat::round` keeps it.
        let nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(bits, abs), inf);
        let value = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(bits, quiet));
        _mm512_srli_epi32::<16>(value)
    };
    // Whole blocks of 16 channels: 16 pixels' rows loaded, rounded and transposed in registers
    // (a gather reads 16 cache lines for 16 values; this reads each line once).
    let blocked = o / 16 * 16;
    for oc0 in (0..blocked).step_by(16) {
        for p0 in (0..whole).step_by(16) {
            // SAFETY: in bounds by the function's contract: rows `p0..p0 + 16 <= whole` of `dy`
            // at channels `oc0..oc0 + 16 <= o`, and channels `oc0..oc0 + 16` of `dy_t`.
            unsafe {
                let rows: [__m512i; 16] = std::array::from_fn(|i| {
                    round(_mm512_loadu_si512(dy.add((p0 + i) * o + oc0).cast()))
                });
                let columns = transpose_16x16(rows);
                for (j, column) in columns.into_iter().enumerate() {
                    let at = dy_t.add((oc0 + j) * pp + p0);
                    _mm256_storeu_si256(at.cast(), _mm512_cvtepi32_epi16(column));
                }
            }
        }
    }
    for oc in blocked..o {
        for p0 in (0..whole).step_by(16) {
            // SAFETY: in bounds by the function's contract.
            unsafe {
                let bits = _mm512_i32gather_epi32::<4>(index, dy.add(p0 * o + oc).cast());
                let high = round(bits);
                _mm256_storeu_si256(dy_t.add(oc * pp + p0).cast(), _mm512_cvtepi32_epi16(high));
            }
        }
    }
}

/// The 16 × 16 matrix of 32-bit values whose row `i` is `rows[i]`, transposed: element `j` of
/// row `i` becomes element `i` of row `j`.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose_16x16(r: [std::arch::x86_64::__m512i; 16]) -> [std::arch::x86_64::__m512i; 16] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved by 32-bit elements, then by 64-bit pairs: within each 128-bit
    // lane, four rows' elements are transposed.
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm512_unpacklo_epi32(a, b)
        } else {
            _mm512_unpackhi_epi32(a, b)
        }
    });
    let u: [__m512i; 16] = std::array::from_fn(|i| {
        let (base, k) = (i / 4 * 4, i % 4);
        let (a, b) = (t[base + k / 2], t[base + k / 2 + 2]);
        if k % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        }
    });
    // Then the 128-bit lanes: rows 4 apart, then 8 apart.
    let v: [__m512i; 16] = std::array::from_fn(|i| {
        let (half, k) = (i / 8, i % 8);
        let (a, b) = (u[half * 8 + k % 4], u[half * 8 + k % 4 + 4]);
        if k < 4 {
            _mm512_shuffle_i32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_i32x4::<0xdd>(a, b)
        }
    });
    std::array::from_fn(|i| {
        let (a, b) = (v[i % 8], v[i % 8 + 8]);
        if i < 8 {
            _mm512_shuffle_i32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_i32x4::<0xdd>(a, b)
        }
    })
}

/// `acc[oc][k] += Σ_p dy_t[oc][p] · patch[p][k]` over one image's (padded) pixels, in groups
/// of accumulator tiles: 2 × 2 where two channel tiles remain, else 1 × up to 4.
fn accumulate_filter(
    tiles: &Tiles,
    dy_t: &[u16],
    right: Right<'_>,
    shape: FilterShape,
    acc: &mut [f32],
) {
    let (kp, pp) = (shape.k_padded, shape.p_padded);
    assert!(
        dy_t.len() >= shape.o_padded * pp
            && right.covers(shape)
            && acc.len() >= shape.o_padded * kp,
        "tile filter gradient out of bounds"
    );
    let (o_tiles, k_blocks) = (shape.o_padded / TILE_ROWS, kp / N_BLOCK);
    let mut ot = 0;
    while ot < o_tiles {
        let rows = if ot + 1 < o_tiles { 2 } else { 1 };
        let width = if rows == 2 { 2 } else { 4 };
        let mut kb = 0;
        while kb < k_blocks {
            let cols = width.min(k_blocks - kb);
            let group = FilterGroup { ot, kb, rows, cols };
            // SAFETY: the group's tiles lie inside the three buffers (asserted above: `ot +
            // rows <= o_tiles`, `kb + cols <= k_blocks`, `pp` a multiple of 32).
            unsafe { filter_group(tiles, dy_t, right, shape, acc, group) };
            kb += cols;
        }
        ot += rows;
    }
}

/// Accumulator tiles `rows × cols` starting at channel tile `ot`, column block `kb`.
#[derive(Clone, Copy)]
struct FilterGroup {
    ot: usize,
    kb: usize,
    rows: usize,
    cols: usize,
}

/// One group of [`accumulate_filter`]: loads its accumulators from `acc`, adds every pixel
/// step, stores them back. Tiles: accumulators 0–3 (row-major over the group), left operands
/// 4–5 (channel tiles), right operands 6–7.
///
/// # Safety
/// As [`accumulate_filter`] asserts; `rows · cols <= 4`, `rows == 2` only with `cols <= 2`.
unsafe fn filter_group(
    _tiles: &Tiles,
    dy_t: &[u16],
    right: Right<'_>,
    shape: FilterShape,
    acc: &mut [f32],
    group: FilterGroup,
) {
    let (kp, pp) = (shape.k_padded, shape.p_padded);
    let (a_stride, b_stride, c_stride) = (2 * pp, right.stride(shape), 4 * kp);
    let FilterGroup { ot, kb, rows, cols } = group;
    // SAFETY (whole block): every tile lies in its buffer (the caller's contract).
    unsafe {
        let acc = acc.as_mut_ptr();
        let c = |r: usize, j: usize| acc.add((ot + r) * TILE_ROWS * kp + (kb + j) * N_BLOCK);
        let a =
            |r: usize, step: usize| dy_t.as_ptr().add((ot + r) * TILE_ROWS * pp + step * K_STEP);
        let b = |step: usize, j: usize| right.tile(shape, step, kb + j);
        let steps = pp / K_STEP;
        if rows == 2 {
            tile_load!(0, c(0, 0), c_stride);
            tile_load!(2, c(1, 0), c_stride);
            if cols == 2 {
                tile_load!(1, c(0, 1), c_stride);
                tile_load!(3, c(1, 1), c_stride);
            }
            for step in 0..steps {
                tile_load!(4, a(0, step), a_stride);
                tile_load!(5, a(1, step), a_stride);
                tile_load!(6, b(step, 0), b_stride);
                tile_dot!(0, 4, 6);
                tile_dot!(2, 5, 6);
                if cols == 2 {
                    tile_load!(7, b(step, 1), b_stride);
                    tile_dot!(1, 4, 7);
                    tile_dot!(3, 5, 7);
                }
            }
            tile_store!(0, c(0, 0), c_stride);
            tile_store!(2, c(1, 0), c_stride);
            if cols == 2 {
                tile_store!(1, c(0, 1), c_stride);
                tile_store!(3, c(1, 1), c_stride);
            }
        } else {
            tile_load!(0, c(0, 0), c_stride);
            if cols > 1 {
                tile_load!(1, c(0, 1), c_stride);
            }
            if cols > 2 {
                tile_load!(2, c(0, 2), c_stride);
            }
            if cols > 3 {
                tile_load!(3, c(0, 3), c_stride);
            }
            for step in 0..steps {
                tile_load!(4, a(0, step), a_stride);
                tile_load!(6, b(step, 0), b_stride);
                tile_dot!(0, 4, 6);
                if cols > 1 {
                    tile_load!(7, b(step, 1), b_stride);
                    tile_dot!(1, 4, 7);
                }
                if cols > 2 {
                    tile_load!(6, b(step, 2), b_stride);
                    tile_dot!(2, 4, 6);
                }
                if cols > 3 {
                    tile_load!(7, b(step, 3), b_stride);
                    tile_dot!(3, 4, 7);
                }
            }
            tile_store!(0, c(0, 0), c_stride);
            if cols > 1 {
                tile_store!(1, c(0, 1), c_stride);
            }
            if cols > 2 {
                tile_store!(2, c(0, 2), c_stride);
            }
            if cols > 3 {
                tile_store!(3, c(0, 3), c_stride);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::conv::Padding2d;
    use crate::backend::cpu::kernels::round::random_values;

    /// Whether this machine runs the tile filter gradient (says so when not).
    fn tiles_here() -> bool {
        let probe = Conv2dGeometry::new(1, [8, 32], 16, 16, [3, 3]);
        let here = super::super::unsupported(&probe, ConvPass::FilterGradient).is_none();
        if !here {
            eprintln!("no AMX tiles here: nothing to compare");
        }
        here
    }

    /// The output gradient transposed and rounded to bf16 for the tiles: every value where the
    /// scalar definition puts it (blocks of 16 channels transposed in registers, the rest
    /// gathered, the last pixels one at a time), nothing written past them.
    #[test]
    fn transposed_output_gradient_is_the_scalar_transpose() {
        if !tiles_here() {
            return;
        }
        for (o, pixels) in [(16, 64), (32, 1024), (48, 37), (20, 40), (5, 16), (64, 7)] {
            let shape = FilterShape {
                k_len: 16,
                k_padded: 16,
                o,
                o_padded: o.next_multiple_of(TILE_ROWS),
                pixels,
                p_padded: pixels.next_multiple_of(K_STEP),
            };
            let dy = random_values(pixels * o, o as u32);
            let mut got = vec![0xffffu16; shape.o_padded * shape.p_padded];
            let mut want = got.clone();
            for p in 0..pixels {
                for oc in 0..o {
                    want[oc * shape.p_padded + p] = bf16_bits(dy[p * o + oc]);
                }
            }
            transpose_to_bf16(&dy, shape, &mut got);
            assert_eq!(got, want, "{o} channels, {pixels} pixels");
        }
    }

    /// Patch pairs read in place give bitwise the gathered path's filter gradient (the same
    /// pairs multiplied in the same order), on 3×3 and 1×1 layers of 16 and 32 channels whose
    /// output rows are 32 and 64 pixels; layers it cannot take (rows of 16, stride 2) do not
    /// take it.
    #[test]
    fn patch_pairs_read_in_place_give_the_gathered_gradient() {
        if !tiles_here() {
            return;
        }
        let mut cases = Vec::new();
        for (c, o, k, w) in [
            (16, 16, 3, 32),
            (32, 48, 3, 64),
            (16, 32, 1, 32),
            (48, 16, 3, 32),
        ] {
            let mut g = Conv2dGeometry::new(3, [5, w], c, o, [k, k]);
            g.padding = Padding2d::uniform(k / 2);
            cases.push(g);
        }
        for (i, g) in cases.iter().enumerate() {
            let out_hw = g.validate().unwrap();
            assert!(InPlacePairs::of(g, out_hw).is_some(), "{g:?}");
            let x = random_values(g.input_len(), 1 + i as u32);
            let dy = random_values(g.output_len(), 7 + i as u32);
            let (mut fast, mut gathered) = (vec![0.0; g.filter_len()], vec![0.0; g.filter_len()]);
            backward_filter_with(g, ConvInput::Tensor(&x), &dy, &mut fast, true).unwrap();
            backward_filter_with(g, ConvInput::Tensor(&x), &dy, &mut gathered, false).unwrap();
            assert!(fast.iter().any(|v| *v != 0.0));
            assert_eq!(fast, gathered, "{g:?}");
        }
        let mut narrow = Conv2dGeometry::new(1, [16, 16], 32, 32, [3, 3]);
        narrow.padding = Padding2d::uniform(1);
        assert_eq!(InPlacePairs::of(&narrow, narrow.validate().unwrap()), None);
        let mut strided = Conv2dGeometry::new(1, [64, 64], 16, 32, [3, 3]);
        strided.strides = [2, 2];
        strided.padding = Padding2d::uniform(1);
        assert_eq!(
            InPlacePairs::of(&strided, strided.validate().unwrap()),
            None
        );
    }
}
