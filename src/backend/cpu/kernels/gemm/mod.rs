//! Single-precision matrix product `C = alpha·A·B + beta·C` over strided views: towerpack's own
//! blocked GEMM at `avx2` (module `blocked`), the `gemm` crate (rayon) at `avx512` and `scalar`, a
//! direct loop for tiny products that cannot pay either's setup, and a variant that runs an
//! [`Epilogue`] on the finished rows.
//!
//! Crate choice: `gemm` 0.19 (feature `x86-v4`, AVX-512) against `matrixmultiply` 0.3.11
//! (AVX-512, `threading`), side by side in one run, GFLOP/s from CPU time per thread on one
//! thread (the machine was shared; `BENCH_CPU_TIME=1 RAYON_NUM_THREADS=1 cargo bench --bench
//! cpu_kernels -- gemm-crates`). The CPU reported AMD family 25 model 17 (Zen 4: AVX-512 on
//! 256-bit units), one-core FMA peak measured at 115 GFLOP/s.
//!
//! | m×n×k                          | gemm | matrixmultiply |
//! |--------------------------------|------|----------------|
//! | 256×512×784 (MLP fc1)          | 110  | 88             |
//! | 256×512×512 (fc2)              | 120  | 91             |
//! | 256×10×512 (fc3)               | 69   | 24             |
//! | 784×512×256, Aᵀ (fc1 dW)       | 114  | 99             |
//! | 256×512×512, Bᵀ (fc2 dX)       | 78   | 85             |
//! | 512×10×256, Aᵀ (fc3 dW)        | 68   | 35             |
//! | 256×784×512, Bᵀ (fc1 dX)       | 86   | 47             |
//! | 131072×16×144 (conv 32×32×16)  | 43   | 20             |
//! | 8192×64×576 (conv 8×8×64)      | 94   | 55             |
//! | 8×10×10                        | 0.26 µs | 0.23 µs     |
//!
//! `gemm` wins all but one shape, by up to 2.9×, and splits over two threads on the rayon pool
//! (190 vs 153 GFLOP/s on fc1 with two threads, in an earlier wall-clock run); it is the one
//! used. Neither serves 8×10×10 well (~250 ns of setup): the AVX-512 direct path below takes
//! ~60 ns, the portable one ~290 ns.
//!
//! SIMD level ([`SimdLevel`]): the crate chooses its microkernels by itself, once per process,
//! from CPU detection (`gemm_f32::gemm::f32::get_gemm_fn`), and its per-ISA drivers are private
//! modules: its API cannot cap them. At the detected level towerpack calls the crate as is; at a
//! level capped below it, `gemm_at_level` runs the crate's own AVX2 (`fma`) or scalar driver,
//! assembled exactly as the crate assembles it from public parts (`gemm_common`'s generic driver
//! and `gemm_f32`'s microkernel tables, both pinned to 0.19.0), so a forced `avx2` runs the
//! microkernels an AVX2-only CPU would run.
//!
//! **Why a GEMM of our own at AVX2.** On an AVX2-capped Sapphire Rapids the crate's AVX2 kernels
//! ran the MLP's products at 72–85% of the FMA peak on one thread (98–109 of 126 GFLOP/s,
//! measured with a register-only FMA loop) and its training step 10% behind PyTorch's (MKL).
//! The blocked GEMM (a 6×16 register tile, packing with in-register 8×8 transposes, equal depth
//! blocks) against the crate's AVX2 driver, two threads, GFLOP/s from CPU time, two runs each
//! (`BENCH_CPU_TIME=1 TOWERPACK_SIMD=avx2 cargo bench --bench cpu_kernels -- gemm`, with
//! `TOWERPACK_BLOCKED_GEMM=0` for the crate; 2026-11-28):
//!
//! | m×n×k                          | crate   | blocked |
//! |--------------------------------|---------|---------|
//! | 256×512×784 (MLP fc1)          | 160–161 | 188–195 |
//! | 256×512×512 (fc2)              | 156–157 | 204–206 |
//! | 256×10×512 (fc3)               | 35–38   | 59–65   |
//! | 784×512×256, Aᵀ (fc1 dW)       | 167–172 | 213–220 |
//! | 256×512×512, Bᵀ (fc2 dX)       | 179–181 | 205–209 |
//! | 512×512×256, Aᵀ (fc2 dW)       | 158–166 | 213–215 |
//! | 256×512×10, Bᵀ (fc3 dX)        | 39–42   | 46–47   |
//! | 512×10×256, Aᵀ (fc3 dW)        | 53–58   | 57–60   |
//! | 256×784×512, Bᵀ (fc1 dX)       | 184–189 | 213–214 |
//!
//! The MLP's training step went from 6.2–6.8 to 5.0–5.5 ms at `avx2`. At `avx512` a 14×32 tile
//! in the same driver was 5% slower than the crate on the forward products, faster on the
//! gradients, equal on the step, and 2× slower on the narrow ones: the crate stays there. The
//! blocked GEMM's blocking is fixed (not read from this CPU's caches) and splits the output
//! only, so its results depend on the shapes alone: a forced `avx2` gives an AVX2 machine's
//! bits, with any thread count.

mod blocked;
mod microkernels;

use super::epilogue::Epilogue;
use super::parallel::{for_each_row_block, threads, worth_parallel};
use super::simd::{SimdLevel, note, vectorized};
use super::{KernelError, shape_error};

/// Products with at most this many multiply-adds use the direct loop instead of the crate.
const DIRECT_MAX_MACS: usize = 4096;

/// Deepest tiny product whose strided `B` is packed on the stack for the AVX-512 path.
#[cfg(target_arch = "x86_64")]
const PACK_MAX_K: usize = 64;

/// A read-only strided matrix: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A view with explicit strides.
    pub fn new(data: &'a [f32], row_stride: usize, col_stride: usize) -> Self {
        MatRef {
            data,
            row_stride,
            col_stride,
        }
    }

    /// A row-major matrix whose rows are `ld` elements apart.
    pub fn row_major(data: &'a [f32], ld: usize) -> Self {
        MatRef::new(data, ld, 1)
    }

    /// The transpose of a row-major matrix stored with rows `ld` apart: the view's element
    /// `(i, j)` is the stored `(j, i)` (BLAS's `trans = 'T'`).
    pub fn transposed(data: &'a [f32], ld: usize) -> Self {
        MatRef::new(data, 1, ld)
    }

    /// The same data viewed transposed.
    pub fn t(self) -> Self {
        MatRef::new(self.data, self.col_stride, self.row_stride)
    }

    /// Checks that a `rows × cols` view stays inside `data`.
    fn check(&self, operand: &'static str, rows: usize, cols: usize) -> Result<(), KernelError> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let last = (rows - 1)
            .checked_mul(self.row_stride)
            .and_then(|r| (cols - 1).checked_mul(self.col_stride)?.checked_add(r));
        match last {
            Some(last) if last < self.data.len() => Ok(()),
            _ => Err(shape_error(
                "sgemm",
                format!(
                    "`{operand}` is a {rows}×{cols} view with strides ({}, {}) over {} elements",
                    self.row_stride,
                    self.col_stride,
                    self.data.len()
                ),
            )),
        }
    }

    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.row_stride + j * self.col_stride]
    }
}

/// `C = alpha·A·B + beta·C` with `A` `m×k`, `B` `k×n` and `C` row-major `m×n` with rows `ldc`
/// apart. With `beta == 0` the old `C` is not read (NaNs in it do not propagate).
///
/// Large products run on the rayon pool; the crate splits them over output blocks only, so every
/// element sums its `k` products in one order for a given thread count.
#[allow(clippy::too_many_arguments)] // BLAS's own argument list.
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) -> Result<(), KernelError> {
    let parallel = worth_parallel(2 * m * n * k);
    sgemm_on(m, n, k, alpha, a, b, beta, c, ldc, parallel)
}

/// [`sgemm`], spread over the rayon pool only when `parallel` (kernels that already split their
/// work into blocks over the pool call it with `false`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_on(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    parallel: bool,
) -> Result<(), KernelError> {
    check_operands(m, n, k, &a, &b, c, ldc)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 || alpha == 0.0 {
        scale_rows(m, n, beta, c, ldc);
    } else if m * n * k <= DIRECT_MAX_MACS {
        #[cfg(target_arch = "x86_64")]
        if n <= 16 && SimdLevel::current() == SimdLevel::Avx512 {
            note(SimdLevel::Avx512);
            if b.col_stride == 1 {
                // SAFETY: the level in force is never above the detected one, so AVX-512F is
                // present; `check_operands` proved the views in bounds.
                unsafe { narrow_avx512(m, n, k, alpha, &a, &b, beta, c, ldc) };
                return Ok(());
            }
            if k <= PACK_MAX_K {
                // A transposed or strided B: copy it row-major first (at most 1024 values).
                let mut packed = [0.0f32; PACK_MAX_K * 16];
                for p in 0..k {
                    for j in 0..n {
                        packed[p * n + j] = b.at(p, j);
                    }
                }
                let b = MatRef::row_major(&packed[..k * n], n);
                // SAFETY: as above; `b` now views the packed copy, `k` rows of `n`.
                unsafe { narrow_avx512(m, n, k, alpha, &a, &b, beta, c, ldc) };
                return Ok(());
            }
        }
        // The same values at every level: each element sums its products in `p` order.
        vectorized!(direct(m, n, k, alpha, &a, &b, beta, c, ldc));
    } else {
        let parallelism = if parallel {
            gemm::Parallelism::Rayon(threads())
        } else {
            gemm::Parallelism::None
        };
        let level = SimdLevel::current();
        #[cfg(target_arch = "x86_64")]
        #[cfg(target_arch = "x86_64")]
        if level == SimdLevel::Avx2 && blocked_enabled() {
            note(level);
            // SAFETY: the level in force is never above the detected one, so AVX2 + FMA are
            // present; `check_operands` proved the views in bounds and `c` holds `m` rows of
            // `n` at `ldc`.
            unsafe {
                blocked::gemm::<microkernels::Avx2>(m, n, k, alpha, &a, &b, beta, c, ldc, parallel)
            };
            return Ok(());
        }
        // SAFETY: `check_operands` proved every index the crate touches in bounds: A's and B's
        // extents through their strides, C's `m` rows of `n` at `ldc`. `c` is borrowed mutably,
        // so it does not alias `a` or `b`. Strides fit `isize` because the slices are in memory.
        unsafe {
            gemm_at_level(
                level,
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                ldc as isize,
                beta != 0.0,
                a.data.as_ptr(),
                a.col_stride as isize,
                a.row_stride as isize,
                b.data.as_ptr(),
                b.col_stride as isize,
                b.row_stride as isize,
                beta,
                alpha,
                parallelism,
            );
        }
    }
    Ok(())
}

/// The environment variable that, set to `0`, `off` or `false`, sends AVX2 products to the GEMM
/// crate's kernels instead of towerpack's blocked GEMM (read once; for comparisons).
pub const BLOCKED_GEMM_ENV: &str = "TOWERPACK_BLOCKED_GEMM";

/// Whether [`BLOCKED_GEMM_ENV`] leaves the blocked GEMM on.
#[cfg(target_arch = "x86_64")]
fn blocked_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !super::switched_off_by_env(BLOCKED_GEMM_ENV))
}

/// `gemm::gemm` (same arguments, no conjugation) with the crate's microkernels for `level`: the
/// crate's own choice when `level` is the detected one, else its AVX2 or scalar driver built
/// the way `gemm_common::__inject_mod!` builds them inside the crate. Notes the level that ran.
///
/// # Safety
/// As `gemm::gemm`: every element the strides address is in bounds, `dst` does not alias the
/// operands, and `level` is not above [`SimdLevel::detected`].
#[allow(clippy::too_many_arguments)] // `gemm::gemm`'s argument list.
unsafe fn gemm_at_level(
    level: SimdLevel,
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_cs: isize,
    dst_rs: isize,
    read_dst: bool,
    lhs: *const f32,
    lhs_cs: isize,
    lhs_rs: isize,
    rhs: *const f32,
    rhs_cs: isize,
    rhs_rs: isize,
    alpha: f32,
    beta: f32,
    parallelism: gemm::Parallelism,
) {
    macro_rules! driver {
        ($simd:expr, $isa:ident, $lanes:expr) => {{
            use gemm_f32::microkernel::$isa::f32::{H_M, H_N, H_UKR, MR_DIV_N, NR, UKR};
            const N: usize = $lanes;
            // SAFETY: the caller's contract is `gemm::gemm`'s, which this driver implements.
            unsafe {
                gemm_common::gemm::gemm_basic_generic::<
                    _,
                    f32,
                    N,
                    { MR_DIV_N * N },
                    NR,
                    MR_DIV_N,
                    H_M,
                    H_N,
                >(
                    $simd,
                    m,
                    n,
                    k,
                    dst,
                    dst_cs,
                    dst_rs,
                    read_dst,
                    lhs,
                    lhs_cs,
                    lhs_rs,
                    rhs,
                    rhs_cs,
                    rhs_rs,
                    alpha,
                    beta,
                    false,
                    false,
                    false,
                    |a, b, c| a * b + c,
                    &UKR,
                    &H_UKR,
                    false,
                    parallelism,
                )
            }
        }};
    }
    note(level);
    #[cfg(target_arch = "x86_64")]
    if level < SimdLevel::detected() {
        match level {
            SimdLevel::Avx2 => {
                // `try_new` probes AVX2 + FMA, which `level` implies; `None` cannot happen.
                if let Some(simd) = gemm_common::simd::V3::try_new() {
                    driver!(simd, fma, 8);
                    return;
                }
            }
            SimdLevel::Scalar => {
                driver!(gemm_common::simd::Scalar, scalar, 1);
                return;
            }
            SimdLevel::Avx512 => {}
        }
    }
    // SAFETY: the caller's contract is `gemm::gemm`'s.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            dst_cs,
            dst_rs,
            read_dst,
            lhs,
            lhs_cs,
            lhs_rs,
            rhs,
            rhs_cs,
            rhs_rs,
            alpha,
            beta,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// [`sgemm`], then `epilogue` on blocks of finished rows of `C` (which must be dense: `ldc == n`).
#[allow(clippy::too_many_arguments)] // BLAS's argument list plus the epilogue.
pub fn sgemm_with_epilogue(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: MatRef<'_>,
    b: MatRef<'_>,
    beta: f32,
    c: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    super::check_len("sgemm_with_epilogue", "c", c.len(), m * n)?;
    epilogue.check(m, n)?;
    sgemm(m, n, k, alpha, a, b, beta, c, n)?;
    if !epilogue.is_identity() && n > 0 {
        let block_rows = super::epilogue::aligned_block_rows(epilogue, (16384 / n).max(1), n);
        for_each_row_block(
            c,
            n,
            block_rows,
            worth_parallel(m * n * 8),
            |rows, first, _| {
                epilogue.apply(rows, first, n);
                Ok(())
            },
        )?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn check_operands(
    m: usize,
    n: usize,
    k: usize,
    a: &MatRef<'_>,
    b: &MatRef<'_>,
    c: &[f32],
    ldc: usize,
) -> Result<(), KernelError> {
    a.check("a", m, k)?;
    b.check("b", k, n)?;
    if m > 0 && n > 0 {
        if ldc < n {
            return Err(shape_error("sgemm", format!("ldc {ldc} < n {n}")));
        }
        let needed = (m - 1)
            .checked_mul(ldc)
            .and_then(|x| x.checked_add(n))
            .unwrap_or(usize::MAX);
        if c.len() < needed {
            return Err(KernelError::BufferLength {
                kernel: "sgemm",
                operand: "c",
                expected: needed,
                got: c.len(),
            });
        }
    }
    Ok(())
}

/// `C = beta·C` (zeros when `beta == 0`, whatever `C` held).
fn scale_rows(m: usize, n: usize, beta: f32, c: &mut [f32], ldc: usize) {
    for i in 0..m {
        let row = &mut c[i * ldc..i * ldc + n];
        if beta == 0.0 {
            row.fill(0.0);
        } else {
            row.iter_mut().for_each(|x| *x *= beta);
        }
    }
}

/// The tiny-product path for at most 16 columns with unit-stride rows of `B`: each row of `C` is
/// one masked AVX-512 vector, four rows at a time (independent accumulation chains). About 5×
/// faster than the portable loop below on 8×10×10, which the GEMM crate takes ~250 ns to set up.
///
/// # Safety
/// AVX-512F is available, `n <= 16`, `b.col_stride == 1`, and the views were checked in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn narrow_avx512(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &MatRef<'_>,
    b: &MatRef<'_>,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    use std::arch::x86_64::*;
    let mask = ((1u32 << n) - 1) as __mmask16;
    // SAFETY: row `p` of B has `n` elements from `p·row_stride` (checked view), and the mask
    // keeps the loads to them.
    let b_row =
        |p: usize| unsafe { _mm512_maskz_loadu_ps(mask, b.data.as_ptr().add(p * b.row_stride)) };
    let finish = |acc: __m512, row: &mut [f32]| {
        // SAFETY: `row` holds `n` elements and the mask keeps the accesses to them.
        unsafe {
            let scaled = _mm512_mul_ps(acc, _mm512_set1_ps(alpha));
            let out = if beta == 0.0 {
                scaled
            } else {
                let old = _mm512_maskz_loadu_ps(mask, row.as_ptr());
                _mm512_fmadd_ps(old, _mm512_set1_ps(beta), scaled)
            };
            _mm512_mask_storeu_ps(row.as_mut_ptr(), mask, out);
        }
    };
    let mut i = 0;
    while i + 4 <= m {
        let mut acc = [_mm512_setzero_ps(); 4];
        for p in 0..k {
            let bv = b_row(p);
            for (r, acc_r) in acc.iter_mut().enumerate() {
                *acc_r = _mm512_fmadd_ps(_mm512_set1_ps(a.at(i + r, p)), bv, *acc_r);
            }
        }
        for (r, &acc_r) in acc.iter().enumerate() {
            finish(acc_r, &mut c[(i + r) * ldc..(i + r) * ldc + n]);
        }
        i += 4;
    }
    for i in i..m {
        let mut acc = _mm512_setzero_ps();
        for p in 0..k {
            acc = _mm512_fmadd_ps(_mm512_set1_ps(a.at(i, p)), b_row(p), acc);
        }
        finish(acc, &mut c[i * ldc..i * ldc + n]);
    }
}

/// The direct loop for tiny products: row `i` of `C` accumulates `alpha·A[i, p]·B[p, :]` over `p`.
#[allow(clippy::too_many_arguments)]
fn direct(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &MatRef<'_>,
    b: &MatRef<'_>,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
) {
    scale_rows(m, n, beta, c, ldc);
    for i in 0..m {
        let row = &mut c[i * ldc..i * ldc + n];
        for p in 0..k {
            let a_ip = alpha * a.at(i, p);
            if b.col_stride == 1 {
                let b_row = &b.data[p * b.row_stride..p * b.row_stride + n];
                row.iter_mut().zip(b_row).for_each(|(c, &b)| *c += a_ip * b);
            } else {
                row.iter_mut()
                    .enumerate()
                    .for_each(|(j, c)| *c += a_ip * b.at(p, j));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The portable direct loop on the narrow shapes the AVX-512 path takes on this CPU (the
    /// integration tests exercise whichever path `sgemm` picks): against a naive f64 loop,
    /// tolerance 1e-5 absolute + 1e-5 relative.
    #[test]
    fn the_portable_tiny_loop_matches_a_naive_product() {
        let value = |i: usize| ((i * 7919) % 97) as f32 / 48.5 - 1.0;
        for (m, n, k) in [(8, 10, 10), (1, 1, 1), (5, 16, 3), (7, 3, 16)] {
            let a: Vec<f32> = (0..m * k).map(value).collect();
            let b: Vec<f32> = (0..k * n).map(|i| value(i + 1000)).collect();
            for beta in [0.0, 0.5] {
                let mut c: Vec<f32> = (0..m * n).map(|i| value(i + 2000)).collect();
                let mut want = c.clone();
                for i in 0..m {
                    for j in 0..n {
                        let dot: f64 = (0..k)
                            .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                            .sum();
                        want[i * n + j] =
                            (1.5 * dot + f64::from(beta) * f64::from(c[i * n + j])) as f32;
                    }
                }
                let (av, bv) = (MatRef::row_major(&a, k), MatRef::row_major(&b, n));
                direct(m, n, k, 1.5, &av, &bv, beta, &mut c, n);
                for (g, w) in c.iter().zip(&want) {
                    assert!(
                        (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                        "{m}x{n}x{k}: {g} vs {w}"
                    );
                }
            }
        }
    }
}
