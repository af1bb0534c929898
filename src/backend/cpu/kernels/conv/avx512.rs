//! AVX-512 microkernels of the direct convolution ([`super::direct`]): register tiles of
//! `R` pixels × `V` vectors of 16 channels, reading the zero-padded input image in place (no
//! im2col) and the HWIO filter rows directly (no packing). 32 zmm registers: up to 24
//! accumulators next to the `V` filter vectors ([`Avx512::max_rows`]).
//!
//! Masked loads and stores keep partial channel vectors inside their rows, so rows need no
//! padding. The drivers in [`super::tiles`] check the bounds and that the CPU runs AVX-512.

use super::tiles::{Segment, TileKernels};
use crate::backend::cpu::kernels::simd::SimdLevel;
use std::arch::x86_64::*;

/// The AVX-512 microkernels.
pub(super) struct Avx512;

/// Lane masks of `V` vectors covering channels `0..width` (bits past `width` are clear).
fn lane_masks(width: usize) -> [__mmask16; 4] {
    std::array::from_fn(|v| {
        let lanes = width.saturating_sub(16 * v).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    })
}

/// Expands to a `match` over every tile shape `(R, V)` that `max_rows` allows, calling
/// `$call!(R, V)` in the matching arm.
macro_rules! tile_shapes {
    ($r:expr, $v:expr, $call:ident) => {
        tile_shapes!(@arms $r, $v, $call,
            1: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
            2: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
            3: [1, 2, 3, 4, 5, 6, 7, 8],
            4: [1, 2, 3, 4, 5, 6])
    };
    (@arms $r:expr, $v:expr, $call:ident, $($vv:literal: [$($rr:literal),*]),*) => {
        match ($r, $v) {
            $($(($rr, $vv) => $call!($rr, $vv),)*)*
            // The drivers take rows from `max_rows(v)` and v from 1..=4.
            (r, v) => unreachable!("no AVX-512 tile of {r} rows × {v} vectors"),
        }
    };
}

impl TileKernels for Avx512 {
    const LEVEL: SimdLevel = SimdLevel::Avx512;
    const LANES: usize = 16;
    /// Two vectors let a pixel tile hold 8–12 pixels, so each filter vector loaded from L2 feeds
    /// twice the multiply-adds of four vectors × at most 6 pixels (deep filters, e.g.
    /// 3×3×64×64 = 147 KiB, do not fit in L1). On the machine this was tuned on (one FMA per
    /// cycle) both ran at the same speed; with two FMA units the filter traffic of the wider
    /// chunk would start to bind.
    const PIXEL_MAX_V: usize = 2;
    const FILTER_MAX_V: usize = 4;
    const PADDED_ROWS: bool = false;
    type Masks = [__mmask16; 4];

    /// `R·V` accumulators (at most 24) stay in registers next to the `V` filter vectors.
    fn max_rows(v: usize) -> usize {
        match v {
            1 => 16,
            2 => 12,
            3 => 8,
            _ => 6,
        }
    }

    fn masks(width: usize) -> Self::Masks {
        lane_masks(width)
    }

    unsafe fn forward(
        rows: usize,
        v: usize,
        a: *const f32,
        ps: usize,
        segs: &[Segment],
        w: *const f32,
        w_stride: usize,
        masks: Self::Masks,
        out: *mut f32,
        out_ps: usize,
    ) {
        macro_rules! call {
            ($rr:literal, $vv:literal) => {
                // SAFETY: the caller's contract is `forward_tile`'s. One-vector tiles are bound
                // by address arithmetic unless the pixel stride is a constant: specialise the
                // common ones.
                unsafe {
                    match (ps, $vv) {
                        (16, 1) => forward_tile::<$rr, $vv, 16>(
                            a, ps, segs, w, w_stride, masks, out, out_ps,
                        ),
                        (3, 1) => forward_tile::<$rr, $vv, 3>(
                            a, ps, segs, w, w_stride, masks, out, out_ps,
                        ),
                        _ => forward_tile::<$rr, $vv, 0>(
                            a, ps, segs, w, w_stride, masks, out, out_ps,
                        ),
                    }
                }
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
        masks: Self::Masks,
        dw: *mut f32,
        dw_stride: usize,
    ) {
        macro_rules! call {
            ($rr:literal, $vv:literal) => {
                // SAFETY: the caller's contract is `filter_tile`'s.
                unsafe {
                    filter_tile::<$rr, $vv>(a, pixel_offsets, dy, dy_stride, masks, dw, dw_stride)
                }
            };
        }
        tile_shapes!(rows, v, call)
    }
}

/// Forward tile: `out[r, 16v + l] = Σ_seg Σ_j a[r·ps + seg.a_off + j] ·
/// w[(seg.k0 + j)·w_stride + 16v + l]`
/// for `r < R`, `v < V`, lanes enabled in `masks[v]`. A nonzero `PS` must equal `ps`: a
/// compile-time pixel stride lets every input load address one base register plus a constant
/// (a runtime stride costs a chain of address additions that bounds the one-vector tiles).
///
/// # Safety
/// AVX-512F is available; for every segment and `r < R`, `a + r·ps + a_off + len` is inside the
/// padded image; `w` points at the tile's first channel of filter row 0 and rows `k0..k0 + len`
/// (`w_stride` apart) are inside the filter for the enabled lanes; `out + r·out_ps` rows are
/// writable for them.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn forward_tile<const R: usize, const V: usize, const PS: usize>(
    a: *const f32,
    ps: usize,
    segments: &[Segment],
    w: *const f32,
    w_stride: usize,
    masks: [__mmask16; 4],
    out: *mut f32,
    out_ps: usize,
) {
    let ps = if PS == 0 { ps } else { PS };
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for seg in segments {
        // SAFETY (whole block): in bounds by the function's contract.
        unsafe {
            let a_seg = a.add(seg.a_off);
            let mut w_row = w.add(seg.k0 * w_stride);
            for j in 0..seg.len {
                let wv: [__m512; V] =
                    std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], w_row.add(16 * v)));
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*a_seg.add(r * ps + j));
                    for v in 0..V {
                        acc_r[v] = _mm512_fmadd_ps(av, wv[v], acc_r[v]);
                    }
                }
                w_row = w_row.add(w_stride);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for v in 0..V {
            // SAFETY: the output rows are writable for the enabled lanes.
            unsafe { _mm512_mask_storeu_ps(out.add(r * out_ps + 16 * v), masks[v], acc_r[v]) };
        }
    }
}

/// Filter-gradient tile: for `r < R` (reduction indices `j0 + r` of one segment) and `v < V`,
/// `dw[r·dw_stride + 16v + l] += Σ_p a[p_off(p) + r] · dy[p·dy_stride + 16v + l]` over the
/// output pixels of one image, where `p_off(p)` is `pixel_offsets[p]` (`a` points at the
/// segment's reduction index `j0`).
///
/// # Safety
/// AVX-512F is available; every `a + pixel_offsets[p] + R` is inside the padded image; `dy`
/// points at the tile's first channel of pixel 0 with `pixel_offsets.len()` rows of
/// `dy_stride`; `dw` points at the tile's first channel of filter row `k0 + j0`, `R` rows of
/// `dw_stride`; the enabled lanes of every row are in bounds.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn filter_tile<const R: usize, const V: usize>(
    a: *const f32,
    pixel_offsets: &[usize],
    dy: *const f32,
    dy_stride: usize,
    masks: [__mmask16; 4],
    dw: *mut f32,
    dw_stride: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    // SAFETY (whole block): in bounds by the function's contract.
    unsafe {
        let mut dy_row = dy;
        for &p_off in pixel_offsets {
            let gv: [__m512; V] =
                std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], dy_row.add(16 * v)));
            let a_p = a.add(p_off);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a_p.add(r));
                for v in 0..V {
                    acc_r[v] = _mm512_fmadd_ps(av, gv[v], acc_r[v]);
                }
            }
            dy_row = dy_row.add(dy_stride);
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for v in 0..V {
                let dst = dw.add(r * dw_stride + 16 * v);
                let old = _mm512_maskz_loadu_ps(masks[v], dst);
                _mm512_mask_storeu_ps(dst, masks[v], _mm512_add_ps(old, acc_r[v]));
            }
        }
    }
}
