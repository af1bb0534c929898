//! Rounding GEMM operands to a 16-bit format ([`HalfFormat`]) under bf16/fp16 precision: the
//! casts the `autocast` pass put on a matrix product's or convolution's operands, applied by
//! the kernel as it takes them. bf16 is branch-free bit arithmetic the compiler vectorises;
//! f16 uses the F16C conversions (`vcvtps2ph` with round-to-nearest-even, then `vcvtph2ps`)
//! where the CPU has them — every x86-64 CPU with AVX2 does — and `half`'s portable conversion
//! elsewhere. Both give exactly [`HalfFormat::round`] (tested on random bit patterns).

use super::simd::vectorized;
use crate::lower::HalfFormat;

/// Writes `xs` rounded to `format` into `out` (as long as `xs`).
pub fn round_operand(format: HalfFormat, xs: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if format == HalfFormat::F16 && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: F16C was detected on this CPU just above.
        unsafe { f16_round_f16c(xs, out) };
        return;
    }
    match format {
        // Branch-free bit arithmetic: vectorised at the SIMD level in force.
        HalfFormat::Bf16 => vectorized!({
            for (o, &x) in out.iter_mut().zip(xs) {
                *o = HalfFormat::Bf16.round(x);
            }
        }),
        HalfFormat::F16 => format.round_into(xs, out),
    }
}

/// Copies the rows of `src` (`channels` values each) to rows `stride` apart in `dst`, rounded to
/// `format` when there is one; what lies between the rows in `dst` is left as it is. One
/// dispatch to the SIMD level for every row: rows are often a single vector long.
pub fn copy_rows(
    format: Option<HalfFormat>,
    src: &[f32],
    channels: usize,
    dst: &mut [f32],
    stride: usize,
) {
    if channels == stride {
        return copy_operand(format, src, &mut dst[..src.len()]);
    }
    match format {
        Some(HalfFormat::Bf16) => vectorized!({
            for (s, d) in src.chunks_exact(channels).zip(dst.chunks_mut(stride)) {
                for (o, &x) in d[..channels].iter_mut().zip(s) {
                    *o = HalfFormat::Bf16.round(x);
                }
            }
        }),
        _ => {
            for (s, d) in src.chunks_exact(channels).zip(dst.chunks_mut(stride)) {
                copy_operand(format, s, &mut d[..channels]);
            }
        }
    }
}

/// Copies `src` into `dst` (as long), rounded to `format` when there is one: how a kernel that
/// copies an operand anyway (a padded image, a filter re-laid out) applies the autocast's
/// rounding on the way, with no pass of its own over the operand.
pub fn copy_operand(format: Option<HalfFormat>, src: &[f32], dst: &mut [f32]) {
    match format {
        Some(format) => round_operand(format, src, dst),
        None => dst.copy_from_slice(src),
    }
}

/// Writes `xs` rounded to bf16 (nearest even, NaN kept a quiet NaN) into `out` (as long) as
/// bf16 bit patterns: how a kernel stores an activation kept in bf16
/// (`lower::half_storage`), vectorised at the SIMD level in force.
pub fn to_bf16_bits(xs: &[f32], out: &mut [u16]) {
    vectorized!({
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = (HalfFormat::Bf16.round(x).to_bits() >> 16) as u16;
        }
    })
}

/// The f32 value of one bf16 bit pattern: exact (the pattern is the f32's high half).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Widens bf16 bit patterns `xs` to f32 into `out` (as long): exact.
pub fn from_bf16_bits(xs: &[u16], out: &mut [f32]) {
    vectorized!({
        for (o, &x) in out.iter_mut().zip(xs) {
            *o = bf16_to_f32(x);
        }
    })
}

/// f32 → f16 (nearest even) → f32 on eight lanes at a time with F16C; the tail in software.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f16_round_f16c(xs: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::{
        _MM_FROUND_TO_NEAREST_INT, _mm256_cvtph_ps, _mm256_cvtps_ph, _mm256_loadu_ps,
        _mm256_storeu_ps,
    };
    let n = xs.len().min(out.len());
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        // SAFETY: `i + 8 <= n` for both slices; unaligned loads and stores.
        unsafe {
            let v = _mm256_loadu_ps(xs.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    HalfFormat::F16.round_into(&xs[whole..n], &mut out[whole..n]);
}

/// `n` f32 values of random bit patterns (xorshift from `seed`): NaNs, infinities,
/// subnormals and every exponent, for the tests of conversions.
#[cfg(test)]
pub(crate) fn random_bit_patterns(seed: u32, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            f32::from_bits(s)
        })
        .collect()
}

/// `n` values in [-0.5, 0.5) (xorshift from `seed`), for the tests of kernels on ordinary data.
#[cfg(test)]
pub(crate) fn random_values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / 16_777_216.0 - 0.5
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows copied to rows further apart: each rounded as the format defines (or copied), what
    /// lies between them untouched.
    #[test]
    fn rows_are_copied_rounded_and_gaps_kept() {
        let src = random_bit_patterns(0x5eed, 5 * 16);
        for format in [None, Some(HalfFormat::Bf16), Some(HalfFormat::F16)] {
            for stride in [16, 19] {
                let mut dst = vec![7.5f32; 4 * stride + 16 + 3];
                copy_rows(format, &src, 16, &mut dst, stride);
                for (i, d) in dst.iter().enumerate() {
                    let (row, col) = (i / stride, i % stride);
                    let want = match src.get(row * 16 + col) {
                        Some(&x) if col < 16 => format.map_or(x, |f| f.round(x)),
                        _ => 7.5,
                    };
                    let same = d.to_bits() == want.to_bits() || (d.is_nan() && want.is_nan());
                    assert!(same, "{format:?} stride {stride} at {i}: {d:e} vs {want:e}");
                }
            }
        }
    }

    #[test]
    fn every_path_rounds_as_the_format_defines() {
        let mut xs = random_bit_patterns(0x1234_5678, 100_003);
        xs.extend([
            65504.0,
            65519.99,
            65520.0,
            -1e6,
            5.9604645e-8,
            2.9802322e-8,
            1.0,
        ]);
        for format in [HalfFormat::Bf16, HalfFormat::F16] {
            let mut out = vec![0.0; xs.len()];
            round_operand(format, &xs, &mut out);
            for (x, y) in xs.iter().zip(&out) {
                let want = format.round(*x);
                if x.is_nan() {
                    assert!(y.is_nan(), "{format} of NaN");
                } else {
                    assert_eq!(y.to_bits(), want.to_bits(), "{format} of {x:e}");
                }
            }
        }
    }
}
