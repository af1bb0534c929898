//! The register tile of the blocked GEMM ([`super::blocked`]): `MR × NR` outputs accumulated in
//! registers over one packed depth block, then stored as `C = alpha·acc + beta·C`. Every output
//! sums its products in depth order, in one FMA chain that starts from zero.
//!
//! Only AVX2 has one: at AVX-512 the `gemm` crate's own kernels were as fast on the MLP's
//! training step, and faster on its forward and narrow products, than a 12×32 or 14×32 tile in
//! this driver (see `super`'s table).

/// One instruction set's register tile.
pub(super) trait Microkernel {
    /// Rows of the tile (values of a packed `A` sliver per depth index).
    const MR: usize;
    /// Columns of the tile (values of a packed `B` sliver per depth index).
    const NR: usize;

    /// `C[r][j] = alpha·Σ_p a[p·MR + r]·b[p·NR + j] + beta·C[r][j]` for `r < MR`, `j < NR`, with
    /// `C[r][j]` at `c + r·ldc + j`; when `overwrite`, `C` is not read (`beta` is ignored).
    ///
    /// # Safety
    /// The CPU has the tile's instruction set; `a` is readable for `kc·MR` floats and `b` for
    /// `kc·NR`; `MR` rows of `NR` floats from `c`, `ldc` apart, are writable (and readable unless
    /// `overwrite`), and do not overlap `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: f32,
        overwrite: bool,
    );
}

/// The AVX2 + FMA tile: 6 rows × 2 vectors of 8 (12 accumulators, 2 `B` vectors and a broadcast
/// of the 16 `ymm` registers).
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Microkernel for Avx2 {
    const MR: usize = 6;
    const NR: usize = 16;

    unsafe fn tile(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        alpha: f32,
        beta: f32,
        overwrite: bool,
    ) {
        // SAFETY: the caller's contract is this function's.
        unsafe { avx2_6x16(kc, a, b, c, ldc, alpha, beta, overwrite) }
    }
}

/// [`Avx2::tile`].
///
/// # Safety
/// As [`Microkernel::tile`] with `MR = 6`, `NR = 16`, on a CPU with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx2_6x16(
    kc: usize,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    alpha: f32,
    beta: f32,
    overwrite: bool,
) {
    use std::arch::x86_64::*;
    const MR: usize = 6;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    // SAFETY (whole body): every pointer offset stays inside the extents the caller promised:
    // `p·16 + 8 + 8 <= kc·16` for `b`, `p·6 + r < kc·6` for `a`, rows `r < 6` of 16 for `c`.
    unsafe {
        for p in 0..kc {
            let bp = b.add(p * 16);
            let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
            let ap = a.add(p * MR);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let x = _mm256_broadcast_ss(&*ap.add(r));
                acc_r[0] = _mm256_fmadd_ps(x, b0, acc_r[0]);
                acc_r[1] = _mm256_fmadd_ps(x, b1, acc_r[1]);
            }
        }
        let (va, vb) = (_mm256_set1_ps(alpha), _mm256_set1_ps(beta));
        for (r, acc_r) in acc.iter().enumerate() {
            for (v, &sum) in acc_r.iter().enumerate() {
                let out = c.add(r * ldc + v * 8);
                let value = if overwrite {
                    _mm256_mul_ps(sum, va)
                } else {
                    _mm256_fmadd_ps(sum, va, _mm256_mul_ps(_mm256_loadu_ps(out), vb))
                };
                _mm256_storeu_ps(out, value);
            }
        }
    }
}
