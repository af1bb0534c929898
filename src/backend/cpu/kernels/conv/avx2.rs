//! AVX2 + FMA microkernels of the direct convolution ([`super::direct`]): register tiles of
//! `R` pixels × `V` vectors of 8 channels, reading the zero-padded input image in place and the
//! HWIO filter rows directly, like the AVX-512 ones ([`super::avx512`]) at half the width.
//!
//! Tile sizes for 16 ymm registers: `R·V` accumulators + `V` operand vectors + one broadcast.
//! Two vectors × 6 rows (12 + 2 + 1 = 15 registers; the shape of the classic Haswell SGEMM
//! microkernel) is the main tile: per reduction step it loads 2 filter vectors and broadcasts
//! 6 inputs for 12 FMAs, so two FMA units stay busy with two load ports to spare. One vector
//! takes up to 12 rows (12 + 1 + 1 = 14). Wider tiles (3 × 4, 4 × 3) leave no room for the
//! operands and spill.
//!
//! AVX2 has no lane masks for FMAs: the microkernels load whole vectors from filter rows
//! (forward, input gradient) and `dy` rows (filter gradient), which the drivers pad to whole
//! vectors when the channel count is not a multiple of 8 ([`TileKernels::PADDED_ROWS`]); only
//! the final stores of a partial vector are masked (`vmaskmovps`, once per tile).

use super::tiles::{Segment, TileKernels};
use crate::backend::cpu::kernels::simd::SimdLevel;
use std::arch::x86_64::*;

/// The AVX2 + FMA microkernels.
pub(super) struct Avx2;

/// The valid lanes of a chunk: how many of its last vector's 8 lanes hold channels, and the
/// matching `vmaskmovps` mask (all lanes when the vector is full).
#[derive(Clone, Copy)]
pub(super) struct Lanes {
    last_vector: usize,
    last_lanes: usize,
    mask: [i32; 8],
}

/// Expands to a `match` over every tile shape `(R, V)` that `max_rows` allows, calling
/// `$call!(R, V)` in the matching arm.
macro_rules! tile_shapes {
    ($r:expr, $v:expr, $call:ident) => {
        tile_shapes!(@arms $r, $v, $call,
            1: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
            2: [1, 2, 3, 4, 5, 6])
    };
    (@arms $r:expr, $v:expr, $call:ident, $($vv:literal: [$($rr:literal),*]),*) => {
        match ($r, $v) {
            $($(($rr, $vv) => $call!($rr, $vv),)*)*
            // The drivers take rows from `max_rows(v)` and v from 1..=2.
            (r, v) => unreachable!("no AVX2 tile of {r} rows × {v} vectors"),
        }
    };
}

impl TileKernels for Avx2 {
    const LEVEL: SimdLevel = SimdLevel::Avx2;
    const LANES: usize = 8;
    const PIXEL_MAX_V: usize = 2;
    const FILTER_MAX_V: usize = 2;
    const PADDED_ROWS: bool = true;
    type Masks = Lanes;

    fn max_rows(v: usize) -> usize {
        if v == 1 { 12 } else { 6 }
    }

    fn masks(width: usize) -> Lanes {
        let vectors = width.div_ceil(8).clamp(1, 2);
        let last_lanes = (width - 8 * (vectors - 1)).min(8);
        Lanes {
            last_vector: vectors - 1,
            last_lanes,
            mask: std::array::from_fn(|l| if l < last_lanes { -1 } else { 0 }),
        }
    }

    unsafe fn forward(
        rows: usize,
        v: usize,
        a: *const f32,
        ps: usize,
        segs: &[Segment],
        w: *const f32,
        w_stride: usize,
        lanes: Lanes,
        out: *mut f32,
        out_ps: usize,
    ) {
        macro_rules! call {
            ($rr:literal, $vv:literal) => {
                // SAFETY: the caller's contract is `forward_tile`'s.
                unsafe { forward_tile::<$rr, $vv>(a, ps, segs, w, w_stride, lanes, out, out_ps) }
            };
        }
        tile_shapes!(rows, v, call)
    }

    unsafe fn filter(
        rows: usize,
        v: usize,
        a: *const f32,
        pixel_offsets: &[usize],
        dy: *const f32,
        dy_stride: usize,
        lanes: Lanes,
        dw: *mut f32,
        dw_stride: usize,
    ) {
        macro_rules! call {
            ($rr:literal, $vv:literal) => {
                // SAFETY: the caller's contract is `filter_tile`'s.
                unsafe {
                    filter_tile::<$rr, $vv>(a, pixel_offsets, dy, dy_stride, lanes, dw, dw_stride)
                }
            };
        }
        tile_shapes!(rows, v, call)
    }
}

/// Stores vector `v` of a tile row at `dst`: whole, or only its valid lanes when it is the
/// chunk's partial last vector.
///
/// # Safety
/// AVX is available and the valid lanes of `dst` are writable.
#[inline(always)]
unsafe fn store(dst: *mut f32, v: usize, lanes: Lanes, value: __m256) {
    // SAFETY: by the contract; the mask keeps a partial vector's store to its valid lanes.
    unsafe {
        if v == lanes.last_vector && lanes.last_lanes < 8 {
            let mask = _mm256_loadu_si256(lanes.mask.as_ptr().cast());
            _mm256_maskstore_ps(dst, mask, value);
        } else {
            _mm256_storeu_ps(dst, value);
        }
    }
}

/// Loads the valid lanes of vector `v` of a tile row (zeros elsewhere).
///
/// # Safety
/// AVX is available and the valid lanes of `src` are readable.
#[inline(always)]
unsafe fn load(src: *const f32, v: usize, lanes: Lanes) -> __m256 {
    // SAFETY: by the contract; the mask keeps a partial vector's load to its valid lanes.
    unsafe {
        if v == lanes.last_vector && lanes.last_lanes < 8 {
            let mask = _mm256_loadu_si256(lanes.mask.as_ptr().cast());
            _mm256_maskload_ps(src, mask)
        } else {
            _mm256_loadu_ps(src)
        }
    }
}

/// Forward tile: `out[r, 8v + l] = Σ_seg Σ_j a[r·ps + seg.a_off + j] ·
/// w[(seg.k0 + j)·w_stride + 8v + l]` for `r < R`, `v < V` and the valid lanes.
///
/// # Safety
/// AVX2 and FMA are available; for every segment and `r < R`, `a + r·ps + a_off + len` is
/// inside the padded image; `w` points at the tile's first channel of filter row 0, and rows
/// `k0..k0 + len` (`w_stride` apart) hold `8·V` readable values from there; `out + r·out_ps` is
/// writable for the valid lanes.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn forward_tile<const R: usize, const V: usize>(
    a: *const f32,
    ps: usize,
    segments: &[Segment],
    w: *const f32,
    w_stride: usize,
    lanes: Lanes,
    out: *mut f32,
    out_ps: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    for seg in segments {
        // SAFETY (whole block): in bounds by the function's contract.
        unsafe {
            let a_seg = a.add(seg.a_off);
            let mut w_row = w.add(seg.k0 * w_stride);
            for j in 0..seg.len {
                let wv: [__m256; V] = std::array::from_fn(|v| _mm256_loadu_ps(w_row.add(8 * v)));
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let av = _mm256_broadcast_ss(&*a_seg.add(r * ps + j));
                    for v in 0..V {
                        acc_r[v] = _mm256_fmadd_ps(av, wv[v], acc_r[v]);
                    }
                }
                w_row = w_row.add(w_stride);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (v, &value) in acc_r.iter().enumerate() {
            // SAFETY: the output rows are writable for the valid lanes.
            unsafe { store(out.add(r * out_ps + 8 * v), v, lanes, value) };
        }
    }
}

/// Filter-gradient tile: for `r < R` (reduction indices `j0 + r` of one segment) and `v < V`,
/// `dw[r·dw_stride + 8v + l] += Σ_p a[p_off(p) + r] · dy[p·dy_stride + 8v + l]` over the output
/// pixels of one image, where `p_off(p)` is `pixel_offsets[p]` (`a` points at index `j0`).
///
/// # Safety
/// AVX2 and FMA are available; every `a + pixel_offsets[p] + R` is inside the padded image;
/// `dy` points at the tile's first channel of pixel 0, with `pixel_offsets.len()` rows of
/// `dy_stride` that hold `8·V` readable values from there; `dw` points at the tile's first
/// channel of filter row `k0 + j0`, `R` rows of `dw_stride` whose valid lanes are in bounds.
#[target_feature(enable = "avx2,fma")]
unsafe fn filter_tile<const R: usize, const V: usize>(
    a: *const f32,
    pixel_offsets: &[usize],
    dy: *const f32,
    dy_stride: usize,
    lanes: Lanes,
    dw: *mut f32,
    dw_stride: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); V]; R];
    // SAFETY (whole block): in bounds by the function's contract.
    unsafe {
        let mut dy_row = dy;
        for &p_off in pixel_offsets {
            let gv: [__m256; V] = std::array::from_fn(|v| _mm256_loadu_ps(dy_row.add(8 * v)));
            let a_p = a.add(p_off);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av = _mm256_broadcast_ss(&*a_p.add(r));
                for v in 0..V {
                    acc_r[v] = _mm256_fmadd_ps(av, gv[v], acc_r[v]);
                }
            }
            dy_row = dy_row.add(dy_stride);
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for (v, &value) in acc_r.iter().enumerate() {
                let dst = dw.add(r * dw_stride + 8 * v);
                store(dst, v, lanes, _mm256_add_ps(load(dst, v, lanes), value));
            }
        }
    }
}
