//! The arithmetic precision of a program's matrix products and convolutions, chosen before
//! lowering ([`LowerOptions::precision`](super::LowerOptions::precision)) and recorded on the
//! lowered [`Program`](super::Program), so every backend reads the same choice.
//!
//! Storage stays f32 in every precision this enum has today: variables, activations, gradients,
//! checkpoints and every elementwise op, reduction, batch-norm statistic, loss and optimizer
//! update are f32 whatever the precision. Only the *products* inside GEMMs (matmul and the
//! three implicit-GEMM convolutions) may be taken at lower precision, and only where a backend
//! has the units for it:
//!
//! - [`Precision::Fp32`] (the default): f32 products, f32 accumulation, everywhere.
//! - [`Precision::Tf32`]: on the CUDA backend, GEMM operands are rounded to TF32 (10 explicit
//!   mantissa bits, `cvt.rna.tf32.f32`: round to nearest, ties away from zero) and multiplied
//!   on the tensor cores (`mma.sync…m16n8k8…tf32`) with f32 accumulation — PyTorch's
//!   `allow_tf32` semantics. On the CPU backend and the reference executor TF32 means f32
//!   arithmetic: like PyTorch's CPU backend, a CPU has no TF32 units, so the products are
//!   exact f32 products (a TF32 program gives the same bits as an FP32 one there).
//!
//! The variants are the precisions some backend implements; 16-bit storage precisions (bf16,
//! fp16 with loss scaling) are meant to be added here when lowering gains the autocast pass they
//! need.

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
}

impl Precision {
    /// Every precision, in the order `--precision` lists them.
    pub const ALL: [Precision; 2] = [Precision::Fp32, Precision::Tf32];

    /// The spelling [`FromStr`] reads and [`Display`](fmt::Display) writes: `fp32`, `tf32`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
        }
    }

    /// Whether GEMM operands are rounded to TF32 and multiplied on tensor cores (where a backend
    /// has them).
    pub fn tensor_cores(self) -> bool {
        self == Precision::Tf32
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A precision name that is not one of [`Precision::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision `{0}` (expected fp32 or tf32)")]
pub struct PrecisionParseError(pub String);

impl FromStr for Precision {
    type Err = PrecisionParseError;

    /// `fp32` or `tf32` (case-insensitive).
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
        let e = "bf16".parse::<Precision>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown precision `bf16` (expected fp32 or tf32)"
        );
    }
}
