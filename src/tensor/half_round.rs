//! Correctly rounded conversion of `f64` to `bf16`.
//!
//! `half` 2.7's `bf16::from_f64` is not correctly rounded: a value just above a tie between two
//! bf16 neighbours (an f32 whose low 16 bits are `0x8001..=0x80ff`, about one f32 value in
//! 18,000) is rounded down, as if it were the tie. (`bf16::from_f32` and both `f16`
//! conversions are correct.) Every `f64 → bf16` conversion of the crate goes through
//! [`bf16_from_f64`] instead: the reference executor's casts, the CPU backend's stores and
//! [`HostTensor`](super::HostTensor) construction, so that a cast to bf16 means
//! round-to-nearest-even everywhere — the rounding GEMM kernels apply to their operands under
//! bf16 precision.

use half::bf16;

/// `x` rounded to the nearest bf16, ties to even (NaN stays NaN; overflow is infinite).
///
/// Rounds `x` to f32 *to odd* first (truncate toward zero, then set the last bit when
/// anything was cut off): f32 keeps 16 more bits than bf16, so the second rounding (f32 to
/// bf16, to nearest even) sees exactly where `x` lies relative to the tie and the result is
/// the correctly rounded one (round-to-odd makes double rounding innocuous when the
/// intermediate format has at least two extra bits).
pub fn bf16_from_f64(x: f64) -> bf16 {
    let y = x as f32;
    if x.is_nan() || f64::from(y) == x {
        return bf16::from_f32(y);
    }
    // `y` is `x` rounded to nearest: step back toward zero when it went past `x` (bits minus
    // one shrinks the magnitude of any nonzero f32, infinities included).
    let toward_zero = if f64::from(y).abs() > x.abs() {
        f32::from_bits(y.to_bits() - 1)
    } else {
        y
    };
    bf16::from_f32(f32::from_bits(toward_zero.to_bits() | 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_values_round_as_from_f32_does() {
        // from_f32 is correctly rounded; from_f64 of the same values is not (the first case).
        let x = f32::from_bits(0x3c00_8001);
        assert_eq!(bf16_from_f64(f64::from(x)), bf16::from_f32(x));
        assert_ne!(
            bf16::from_f64(f64::from(x)),
            bf16::from_f32(x),
            "half fixed it?"
        );
        let mut s = 0x2545_f491_u32;
        for _ in 0..1_000_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(s);
            let (got, want) = (bf16_from_f64(f64::from(x)), bf16::from_f32(x));
            if x.is_nan() {
                assert!(got.is_nan());
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{x:e}");
            }
        }
    }

    #[test]
    fn f64_values_are_not_double_rounded() {
        let ulp = 2f64.powi(-7);
        // Just above, at and just below the tie 1 + ulp/2, further than f32 can see.
        assert_eq!(
            bf16_from_f64(1.0 + ulp / 2.0 + 2f64.powi(-40)).to_f64(),
            1.0 + ulp
        );
        assert_eq!(bf16_from_f64(1.0 + ulp / 2.0).to_f64(), 1.0);
        assert_eq!(
            bf16_from_f64(1.0 + ulp / 2.0 - 2f64.powi(-40)).to_f64(),
            1.0
        );
        assert_eq!(
            bf16_from_f64(-(1.0 + ulp / 2.0 + 2f64.powi(-40))).to_f64(),
            -(1.0 + ulp)
        );
        assert_eq!(bf16_from_f64(1e300).to_f64(), f64::INFINITY);
        assert_eq!(bf16_from_f64(-1e300).to_f64(), f64::NEG_INFINITY);
        assert_eq!(bf16_from_f64(1e-300).to_f64(), 0.0);
        assert!(bf16_from_f64(f64::NAN).is_nan());
        assert_eq!(bf16_from_f64(0.0).to_bits(), 0);
        assert_eq!(bf16_from_f64(-0.0).to_bits(), 0x8000);
    }
}
