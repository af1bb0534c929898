//! The blocked single-precision GEMM of the AVX2 level, after Goto and van de Geijn (the
//! BLIS loop nest): `B` is packed a depth block (`KC`) at a time into slivers `NR` wide that
//! stay in L1, `A` a row block (`MC`) at a time into slivers `MR` tall that stay in L2, and the
//! register tile ([`Microkernel`]) runs over every sliver pair. Edge tiles go through a small
//! buffer; packed slivers are zero-padded, so the tile never branches on the shape. Packing
//! copies rows, or transposes 8×8 blocks in registers where the operand is laid out across the
//! sliver (a row-major `A`, a transposed `B`): gathered element by element, packing took a fifth
//! of the time (measured with `perf`).
//!
//! **Threads.** The output is cut into one part per thread, by columns when `A` is the smaller
//! operand (each part packs all of `A`, its share of `B`), by rows otherwise; the parts run the
//! same loop nest with their own packing buffers. Every output sums its products in the same
//! depth blocks and order whatever the part or the thread count, so results depend on the shapes
//! only.

use std::cell::RefCell;
use std::ops::Range;

use super::MatRef;
use super::microkernels::Microkernel;
use crate::backend::cpu::kernels::parallel::{split_range, threads};
use crate::backend::cpu::kernels::simd::{carry, vectorized};
use rayon::prelude::*;

/// Most depth of a packed block: a `B` sliver (`KC·NR` floats, 16 KiB) and an `A` sliver (6
/// KiB) fit L1 together. A product's depth is cut into equal blocks of at most `KC` (784 = 4 ×
/// 196, not 3 × 256 + 16: a thin last block pays a full pass over `C` for little work).
const KC: usize = 256;

/// Rows of a packed `A` block (`MC·KC` floats, 96 KiB: well inside L2), a multiple of `MR`.
const MC: usize = 96;

/// Columns of a packed `B` panel (`KC·NC` floats, 2 MiB at most).
const NC: usize = 2048;

thread_local! {
    /// This thread's packing buffers for `A` and `B`, reused across calls.
    static PACKS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// The output pointer shared by the parts of one call, which write disjoint tiles.
#[derive(Clone, Copy)]
struct Out {
    c: *mut f32,
    ldc: usize,
}

// SAFETY: the parts of a call write disjoint row or column ranges of `C` (see `gemm`), and the
// call waits for all of them before `C`'s borrow ends.
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

/// `C = alpha·A·B + beta·C` (`beta == 0`: `C` not read) with `K`'s tile, over `threads` parts
/// when `parallel`.
///
/// # Safety
/// The CPU has `K`'s instruction set; the views were checked in bounds for `m×k` and `k×n`, and `c` holds
/// `m` rows of `n` floats `ldc` apart.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm<K: Microkernel>(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &MatRef<'_>,
    b: &MatRef<'_>,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    parallel: bool,
) {
    let out = Out {
        c: c.as_mut_ptr(),
        ldc,
    };
    let parts = if parallel { threads() } else { 1 };
    // Columns when `A` is the smaller operand to pack twice, else rows; in whole tiles.
    let by_columns = m <= n;
    let (extent, unit) = if by_columns { (n, K::NR) } else { (m, K::MR) };
    let units = extent.div_ceil(unit);
    if parts <= 1 || units < 2 {
        // SAFETY: the caller's contract; one part covers all of `C`.
        unsafe { part::<K>(0..m, 0..n, k, alpha, a, b, beta, out) };
        return;
    }
    let ranges: Vec<Range<usize>> = split_range(units, parts)
        .into_iter()
        .map(|r| r.start * unit..(r.end * unit).min(extent))
        .collect();
    let run = carry(|range: Range<usize>| {
        let (rows, cols) = if by_columns {
            (0..m, range)
        } else {
            (range, 0..n)
        };
        // SAFETY: the caller's contract; the parts' ranges are disjoint, so their tiles are.
        unsafe { part::<K>(rows, cols, k, alpha, a, b, beta, out) };
    });
    ranges.into_par_iter().for_each(run);
}

/// The loop nest over the block `rows × cols` of `C`.
///
/// # Safety
/// As [`gemm`], for the rows and columns given.
#[allow(clippy::too_many_arguments)]
unsafe fn part<K: Microkernel>(
    rows: Range<usize>,
    cols: Range<usize>,
    k: usize,
    alpha: f32,
    a: &MatRef<'_>,
    b: &MatRef<'_>,
    beta: f32,
    out: Out,
) {
    let loop_nest = |a_pack: &mut Vec<f32>, b_pack: &mut Vec<f32>| {
        let mut jc = cols.start;
        while jc < cols.end {
            let nc = NC.min(cols.end - jc);
            let b_slivers = nc.div_ceil(K::NR);
            // Depth blocks of equal size (784 = 4 × 196, not 3 × 256 + 16).
            let depth_block = k.div_ceil(k.div_ceil(KC).max(1));
            let mut pc = 0;
            while pc < k {
                let kc = depth_block.min(k - pc);
                let bp = aligned(b_pack, b_slivers * kc * K::NR);
                vectorized!(pack_slivers(&b.t(), jc..jc + nc, pc..pc + kc, K::NR, bp));
                let first = pc == 0;
                let mut ic = rows.start;
                while ic < rows.end {
                    let mc = MC.min(rows.end - ic);
                    let a_slivers = mc.div_ceil(K::MR);
                    let ap = aligned(a_pack, a_slivers * kc * K::MR);
                    vectorized!(pack_slivers(a, ic..ic + mc, pc..pc + kc, K::MR, ap));
                    for jr in 0..b_slivers {
                        let width = K::NR.min(nc - jr * K::NR);
                        let b_sliver = bp[jr * kc * K::NR..].as_ptr();
                        for ir in 0..a_slivers {
                            let height = K::MR.min(mc - ir * K::MR);
                            let a_sliver = ap[ir * kc * K::MR..].as_ptr();
                            let origin = (ic + ir * K::MR) * out.ldc + jc + jr * K::NR;
                            // SAFETY: the caller's contract covers the tile at `origin`
                            // (`height` rows of `width` inside `C`); the slivers hold `kc`
                            // depth indices each.
                            unsafe {
                                store_tile::<K>(
                                    kc,
                                    a_sliver,
                                    b_sliver,
                                    out.c.add(origin),
                                    out.ldc,
                                    (height, width),
                                    alpha,
                                    if first { beta } else { 1.0 },
                                    first && beta == 0.0,
                                )
                            };
                        }
                    }
                    ic += mc;
                }
                pc += kc;
            }
            jc += nc;
        }
    };
    PACKS.with(|packs| match packs.try_borrow_mut() {
        Ok(mut packs) => {
            let (a_pack, b_pack) = &mut *packs;
            loop_nest(a_pack, b_pack);
        }
        // Only if a product ran inside another on this thread: buffers of its own.
        Err(_) => loop_nest(&mut Vec::new(), &mut Vec::new()),
    });
}

/// Runs the tile on `C`'s `height × width` block at `c`, through a buffer when it is partial.
///
/// # Safety
/// As [`Microkernel::tile`] for a `height × width` block of `C` (`height <= MR`, `width <= NR`).
#[allow(clippy::too_many_arguments)]
unsafe fn store_tile<K: Microkernel>(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    (height, width): (usize, usize),
    alpha: f32,
    beta: f32,
    overwrite: bool,
) {
    if height == K::MR && width == K::NR {
        // SAFETY: a whole tile, as the caller promised.
        unsafe { K::tile(kc, a, b, c, ldc, alpha, beta, overwrite) };
        return;
    }
    const { assert!(K::MR * K::NR <= 96, "the edge buffer holds the tile") };
    let mut buffer = [0.0f32; 96];
    let buf = buffer.as_mut_ptr();
    // SAFETY: `height` rows of `width` from `c` are the caller's; the buffer holds `MR` rows of
    // `NR`.
    unsafe {
        if !overwrite {
            for r in 0..height {
                std::ptr::copy_nonoverlapping(c.add(r * ldc), buf.add(r * K::NR), width);
            }
        }
        K::tile(kc, a, b, buf, K::NR, alpha, beta, overwrite);
        for r in 0..height {
            std::ptr::copy_nonoverlapping(buf.add(r * K::NR), c.add(r * ldc), width);
        }
    }
}

/// `len` floats of `buffer` starting on a 64-byte boundary (contents unspecified).
fn aligned(buffer: &mut Vec<f32>, len: usize) -> &mut [f32] {
    const LINE: usize = 16;
    if buffer.len() < len + LINE {
        buffer.resize(len + LINE, 0.0);
    }
    let skip = buffer.as_ptr().align_offset(64).min(LINE);
    &mut buffer[skip..skip + len]
}

/// Packs `M[rows, depth]` into slivers of `width` rows: sliver `s` holds, for each depth index
/// `p`, the `width` values `M[rows.start + s·width + r, depth.start + p]` (zeros past the rows).
/// `A` packs as itself with `width = MR`; `B` as its transpose (`b.t()`) with `width = NR`.
#[inline(always)]
fn pack_slivers(
    m: &MatRef<'_>,
    rows: Range<usize>,
    depth: Range<usize>,
    width: usize,
    dst: &mut [f32],
) {
    let kc = depth.len();
    for (s, sliver) in dst.chunks_exact_mut(kc * width).enumerate() {
        let r0 = rows.start + s * width;
        let height = width.min(rows.end - r0);
        let origin = r0 * m.row_stride + depth.start * m.col_stride;
        if height == width {
            // SAFETY: the caller checked the view in bounds for every row of `rows` and depth
            // index of `depth`; the sliver holds `kc·width` floats.
            unsafe {
                gather(
                    m.data.as_ptr().add(origin),
                    width,
                    m.row_stride,
                    m.col_stride,
                    kc,
                    sliver,
                )
            };
        } else {
            for p in 0..kc {
                for r in 0..width {
                    sliver[p * width + r] = if r < height {
                        m.data[origin + r * m.row_stride + p * m.col_stride]
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// `dst[p·width + i] = src[i·across + p·along]` for `i < width`, `p < len`.
///
/// # Safety
/// Every source index is in bounds, `dst` holds `len·width` floats, and the CPU has AVX2.
#[inline(always)]
unsafe fn gather(
    src: *const f32,
    width: usize,
    across: usize,
    along: usize,
    len: usize,
    dst: &mut [f32],
) {
    let d = dst.as_mut_ptr();
    unsafe {
        if across == 1 {
            for p in 0..len {
                std::ptr::copy_nonoverlapping(src.add(p * along), d.add(p * width), width);
            }
        } else if along == 1 {
            transpose_avx2(src, across, width, len, d);
        } else {
            for p in 0..len {
                for i in 0..width {
                    *d.add(p * width + i) = *src.add(i * across + p * along);
                }
            }
        }
    }
}

/// `dst[p·width + i] = src[i·across + p]` for `i < width`, `p < len`, by 8×8 blocks transposed
/// in registers.
///
/// # Safety
/// The CPU has AVX2 (every vector level does); as [`gather`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(src: *const f32, across: usize, width: usize, len: usize, dst: *mut f32) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): loads read `src[i·across + p..p + 8]` for `i < width`, `p + 8 <=
    // len`; stores write `dst[(p + q)·width + i0..]`, at most `width - i0` lanes.
    unsafe {
        let mut p = 0;
        while p + 8 <= len {
            let mut i0 = 0;
            while i0 < width {
                let g = (width - i0).min(8);
                let mut v = [_mm256_setzero_ps(); 8];
                for (r, row) in v.iter_mut().enumerate().take(g) {
                    *row = _mm256_loadu_ps(src.add((i0 + r) * across + p));
                }
                // 8×8 transpose: pairs, then quads, then halves.
                let t0 = _mm256_unpacklo_ps(v[0], v[1]);
                let t1 = _mm256_unpackhi_ps(v[0], v[1]);
                let t2 = _mm256_unpacklo_ps(v[2], v[3]);
                let t3 = _mm256_unpackhi_ps(v[2], v[3]);
                let t4 = _mm256_unpacklo_ps(v[4], v[5]);
                let t5 = _mm256_unpackhi_ps(v[4], v[5]);
                let t6 = _mm256_unpacklo_ps(v[6], v[7]);
                let t7 = _mm256_unpackhi_ps(v[6], v[7]);
                let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                let out = [
                    _mm256_permute2f128_ps::<0x20>(u0, u4),
                    _mm256_permute2f128_ps::<0x20>(u1, u5),
                    _mm256_permute2f128_ps::<0x20>(u2, u6),
                    _mm256_permute2f128_ps::<0x20>(u3, u7),
                    _mm256_permute2f128_ps::<0x31>(u0, u4),
                    _mm256_permute2f128_ps::<0x31>(u1, u5),
                    _mm256_permute2f128_ps::<0x31>(u2, u6),
                    _mm256_permute2f128_ps::<0x31>(u3, u7),
                ];
                if g == 8 {
                    for (q, &o) in out.iter().enumerate() {
                        _mm256_storeu_ps(dst.add((p + q) * width + i0), o);
                    }
                } else {
                    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(g as i32), lanes);
                    for (q, &o) in out.iter().enumerate() {
                        _mm256_maskstore_ps(dst.add((p + q) * width + i0), mask, o);
                    }
                }
                i0 += 8;
            }
            p += 8;
        }
        for p in p..len {
            for i in 0..width {
                *dst.add(p * width + i) = *src.add(i * across + p);
            }
        }
    }
}
