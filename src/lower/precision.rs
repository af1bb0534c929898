//! The arithmetic precision of a program's matrix products and convolutions, chosen before
//! lowering ([`LowerOptions::precision`](super::LowerOptions::precision)) and recorded on the
//! lowered [`Program`](super::Program), so every backend reads the same choice.
//!
//! Variables (the optimizer's master weights), their slots, gradients of variables and
//! checkpoints are f32 in every precision, and every elementwise op, reduction, batch-norm
//! statistic, softmax, loss and optimizer update computes in f32. What changes is the
//! *operands* of GEMMs (matmul and the three implicit-GEMM convolutions) — products are always
//! accumulated in f32 — and, under bf16 on the CPU, the storage of activations (below):
//!
//! - [`Precision::Fp32`] (the default): f32 operands everywhere.
//! - [`Precision::Tf32`]: on the CUDA backend, GEMM operands are rounded to TF32 (10 explicit
//!   mantissa bits, `cvt.rna.tf32.f32`: round to nearest, ties away from zero) and multiplied
//!   on the tensor cores (`mma.sync…m16n8k8…tf32`) — PyTorch's `allow_tf32` semantics. On the
//!   CPU backend and the reference executor TF32 means f32 arithmetic: like PyTorch's CPU
//!   backend, a CPU has no TF32 units, so a TF32 program gives the same bits as an FP32 one there.
//! - [`Precision::Bf16`] and [`Precision::Fp16`]: automatic mixed precision. The `autocast`
//!   lowering pass ([`crate::lower::autocast`]) rounds both operands of every GEMM to the
//!   16-bit format ([`HalfFormat`], round to nearest even: what a cast to `bf16`/`f16` does),
//!   and *every* backend honours it, the reference executor included, so the same program gives
//!   the same values everywhere up to f32 summation order. The product of two 16-bit values is
//!   exact in f32, so the only rounding beyond f32's is the operands'. FP16's range ends at
//!   65504: a larger operand becomes infinite, which is why FP16 training scales the loss
//!   ([`Precision::loss_scaling`], the trainer's dynamic loss scale).
//!
//! Under [`Precision::Bf16`] the `half-storage` pass ([`crate::lower::half_storage`],
//! `LowerOptions::half_activations`, on for both backends) also stores activations in bf16:
//! a kernel writing one rounds it where it computes it, so it and every later reader see the
//! rounded value, and the reference executor checks it with the value's round trip in the
//! graph ([`crate::lower::half_storage::round_values`]).

use crate::tensor::DType;
use std::fmt;
use std::str::FromStr;

/// How matrix products and convolutions multiply (see the [module docs](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// f32 operands, f32 products and accumulation (the default).
    #[default]
    Fp32,
    /// TF32 products (operands rounded to 10 mantissa bits) with f32 accumulation on CUDA
    /// tensor cores; f32 arithmetic on the CPU backend, which has no TF32 units.
    Tf32,
    /// GEMM operands rounded to bfloat16 (8 exponent bits, 7 mantissa bits), f32
    /// accumulation, on every backend.
    Bf16,
    /// GEMM operands rounded to IEEE half (5 exponent bits, 10 mantissa bits; overflow past
    /// 65504 is infinite), f32 accumulation, on every backend; trained with a dynamic loss scale.
    Fp16,
}

/// A 16-bit float format GEMM operands are rounded to under [`Precision::Bf16`] /
/// [`Precision::Fp16`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HalfFormat {
    /// bfloat16: f32's exponent range, 7 explicit mantissa bits.
    Bf16,
    /// IEEE 754 binary16: largest finite 65504, 10 explicit mantissa bits.
    F16,
}

impl HalfFormat {
    /// The IR dtype of the format.
    pub fn dtype(self) -> DType {
        match self {
            HalfFormat::Bf16 => DType::BF16,
            HalfFormat::F16 => DType::F16,
        }
    }

    /// The name printed in programs: `bf16`, `f16`.
    pub fn name(self) -> &'static str {
        match self {
            HalfFormat::Bf16 => "bf16",
            HalfFormat::F16 => "f16",
        }
    }

    /// `x` rounded to the format (to nearest, ties to even; NaN stays NaN, overflow is
    /// infinite), as an f32: exactly `x as bf16 as f32` / `x as f16 as f32`.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            HalfFormat::Bf16 => round_bf16(x),
            HalfFormat::F16 => half::f16::from_f32(x).to_f32(),
        }
    }

    /// Writes every element of `xs` rounded ([`HalfFormat::round`]) to the same place of `out`
    /// (which must be as long).
    pub fn round_into(self, xs: &[f32], out: &mut [f32]) {
        match self {
            HalfFormat::Bf16 => out
                .iter_mut()
                .zip(xs)
                .for_each(|(o, &x)| *o = round_bf16(x)),
            HalfFormat::F16 => out
                .iter_mut()
                .zip(xs)
                .for_each(|(o, &x)| *o = half::f16::from_f32(x).to_f32()),
        }
    }
}

impl fmt::Display for HalfFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` rounded to bfloat16 (nearest, ties to even), kept as f32. NaNs stay quiet NaNs with
/// their sign; infinities and values that round past bf16's largest finite become infinite.
#[inline]
fn round_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    f32::from_bits(if nan {
        (b | 0x0040_0000) & 0xffff_0000
    } else {
        rounded
    })
}

impl Precision {
    /// Every precision, in the order `--precision` lists them.
    pub const ALL: [Precision; 4] = [
        Precision::Fp32,
        Precision::Tf32,
        Precision::Bf16,
        Precision::Fp16,
    ];

    /// The spelling [`FromStr`] reads and [`Display`](fmt::Display) writes: `fp32`, `tf32`,
    /// `bf16`, `fp16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    /// Whether GEMMs multiply on tensor cores where a backend has them (every precision but
    /// FP32). The operands reach them rounded to TF32 or to the 16-bit format, so the
    /// products are exact either way.
    pub fn tensor_cores(self) -> bool {
        self != Precision::Fp32
    }

    /// The 16-bit format the autocast pass rounds GEMM operands to, if any.
    pub fn half_operands(self) -> Option<HalfFormat> {
        match self {
            Precision::Bf16 => Some(HalfFormat::Bf16),
            Precision::Fp16 => Some(HalfFormat::F16),
            Precision::Fp32 | Precision::Tf32 => None,
        }
    }

    /// Whether training in this precision needs a dynamic loss scale (FP16: gradients under
    /// 2⁻²⁴ flush to zero and over 65504 overflow once rounded as GEMM operands).
    pub fn loss_scaling(self) -> bool {
        self == Precision::Fp16
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A precision name that is not one of [`Precision::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision `{0}` (expected fp32, tf32, bf16 or fp16)")]
pub struct PrecisionParseError(pub String);

impl FromStr for Precision {
    type Err = PrecisionParseError;

    /// `fp32`, `tf32`, `bf16` or `fp16` (case-insensitive).
    fn from_str(s: &str) -> Result<Precision, PrecisionParseError> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| PrecisionParseError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_errors() {
        for p in Precision::ALL {
            assert_eq!(p.to_string().parse::<Precision>(), Ok(p));
        }
        assert_eq!("TF32".parse::<Precision>(), Ok(Precision::Tf32));
        assert_eq!(Precision::default(), Precision::Fp32);
        let e = "fp8".parse::<Precision>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown precision `fp8` (expected fp32, tf32, bf16 or fp16)"
        );
    }

    #[test]
    fn rounding_is_the_cast_to_the_format_on_edge_cases_and_random_bits() {
        let mut edge = vec![
            0.0f32,
            -0.0,
            1.0,
            f32::MIN_POSITIVE,
            f32::MAX,
            -f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            65504.0,
            65519.99,
            65520.0,
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            5.9604645e-8,
            2.9802322e-8,
        ];
        let mut s = 0x9e37_79b9_u32;
        for _ in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            edge.push(f32::from_bits(s));
        }
        for x in edge {
            let bf = HalfFormat::Bf16.round(x);
            let want = half::bf16::from_f32(x).to_f32();
            let f = HalfFormat::F16.round(x);
            let want_f = half::f16::from_f32(x).to_f32();
            if x.is_nan() {
                assert!(bf.is_nan() && f.is_nan(), "{x:e}");
                assert_eq!(bf.is_sign_negative(), x.is_sign_negative());
            } else {
                assert_eq!(bf.to_bits(), want.to_bits(), "bf16 of {x:e}");
                assert_eq!(f.to_bits(), want_f.to_bits(), "f16 of {x:e}");
            }
        }
        let xs = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), 7e4];
        let mut out = [0.0; 3];
        HalfFormat::Bf16.round_into(&xs, &mut out);
        assert_eq!(out, [1.0, 1.0 + 4.0 * 2f32.powi(-8), 70144.0]);
        HalfFormat::F16.round_into(&out.clone(), &mut out);
        assert_eq!(out[2], f32::INFINITY);
        let mut out = [0.0; 2];
        HalfFormat::Bf16.round_into(&[1.0 + 3.0 * 2f32.powi(-8), -7e4], &mut out);
        assert_eq!(out, [1.0 + 4.0 * 2f32.powi(-8), -70144.0]);
        assert_eq!(Precision::Bf16.half_operands(), Some(HalfFormat::Bf16));
        assert!(Precision::Fp16.loss_scaling() && !Precision::Bf16.loss_scaling());
    }
}
