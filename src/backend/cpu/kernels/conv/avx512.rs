//! AVX-512 microkernels of the direct convolution ([`super::direct`]): register tiles of
//! `R` pixels × `V` vectors of 16 channels, reading the zero-padded input image in place (no
//! im2col) and the HWIO filter rows directly (no packing).
//!
//! Callers must have checked `is_x86_feature_detected!("avx512f")` and the index bounds listed on
//! each function; masked loads and stores keep partial channel vectors inside their rows.

use std::arch::x86_64::*;

/// One contiguous run of the reduction: for `j in 0..len`, the input value `a_off + j` elements
/// past a pixel's window origin multiplies filter row `k0 + j` (a row is `O` output channels).
#[derive(Clone, Copy, Debug)]
pub(super) struct Segment {
    pub a_off: usize,
    pub k0: usize,
    pub len: usize,
}

/// Lane masks of `V` vectors covering channels `0..width` (bits past `width` are clear).
pub(super) fn lane_masks(width: usize) -> [__mmask16; 4] {
    std::array::from_fn(|v| {
        let lanes = width.saturating_sub(16 * v).min(16);
        ((1u32 << lanes) - 1) as __mmask16
    })
}

/// Forward tile: `out[r, 16v + l] = Σ_seg Σ_j a[r·ps + seg.a_off + j] · w[(seg.k0 + j)·o + 16v + l]`
/// for `r < R`, `v < V`, lanes enabled in `masks[v]`. A nonzero `PS` must equal `ps`: a
/// compile-time pixel stride lets every input load address one base register plus a constant
/// (a runtime stride costs a chain of address additions that bounds the one-vector tiles).
///
/// # Safety
/// AVX-512F is available; for every segment and `r < R`, `a + r·ps + a_off + len` is inside the
/// padded image; `w` points at the tile's first channel of filter row 0 and rows `k0..k0 + len`
/// are inside the filter for the enabled lanes; `out + r·out_ps` rows are writable for them.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn forward_tile<const R: usize, const V: usize, const PS: usize>(
    a: *const f32,
    ps: usize,
    segments: &[Segment],
    w: *const f32,
    o: usize,
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
            let mut w_row = w.add(seg.k0 * o);
            for j in 0..seg.len {
                let wv: [__m512; V] =
                    std::array::from_fn(|v| _mm512_maskz_loadu_ps(masks[v], w_row.add(16 * v)));
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*a_seg.add(r * ps + j));
                    for v in 0..V {
                        acc_r[v] = _mm512_fmadd_ps(av, wv[v], acc_r[v]);
                    }
                }
                w_row = w_row.add(o);
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
/// `dw[(k0 + j0 + r)·o + 16v + l] += Σ_p a[p_off(p) + a_off + j0 + r] · dy[p·o + 16v + l]` over
/// the `pixels` output pixels of one image, where `p_off(p)` is `pixel_offsets[p]`.
///
/// # Safety
/// AVX-512F is available; every `a + pixel_offsets[p] + a_off + j0 + R` is inside the padded
/// image; `dy` points at the tile's first channel of pixel 0 with `pixel_offsets.len()` rows of
/// `o`; `dw` points at the tile's first channel of filter row `k0 + j0`, rows `R` of them.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn filter_tile<const R: usize, const V: usize>(
    a: *const f32,
    pixel_offsets: &[usize],
    dy: *const f32,
    o: usize,
    masks: [__mmask16; 4],
    dw: *mut f32,
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
            dy_row = dy_row.add(o);
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for v in 0..V {
                let dst = dw.add(r * o + 16 * v);
                let old = _mm512_maskz_loadu_ps(masks[v], dst);
                _mm512_mask_storeu_ps(dst, masks[v], _mm512_add_ps(old, acc_r[v]));
            }
        }
    }
}
