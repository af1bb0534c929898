//! `cvt`: every supported pair of integer and float types with PTX semantics — float→int rounds
//! with `.rni/.rzi/.rmi/.rpi` and saturates (NaN → 0); int→float and narrowing float→float round
//! once with `.rn/.rz/.rm/.rp`; `.sat`, `.ftz`, `.relu` and `.satfinite`; f32 → tf32 with
//! `.rna` (ties away from zero), `.rn` or `.rz`; `.relu` maps every negative result, −0
//! included, to +0; NaN results are canonical. Narrow integer
//! results are sign- or zero-extended to the register width by the destination type.

use super::float::{f64_to_half, half_to_f64};
use crate::inst::{CvtSpec, Rnd, Scalar, Tf32Rnd};
use crate::softfloat::{self, BF16, F16, F32, F64, Format};

fn format_of(s: Scalar) -> Format {
    match s {
        Scalar::F16 => F16,
        Scalar::BF16 => BF16,
        Scalar::F32 => F32,
        _ => F64,
    }
}

/// The source value: exact as f64 for floats, as i128 for integers.
enum Value {
    Float(f64),
    Int(i128),
}

fn sign_extend(bits: u64, width: u32) -> i128 {
    let shift = 128 - width;
    (i128::from(bits) << shift) >> shift
}

fn zero_extend(bits: u64, width: u32) -> i128 {
    if width == 64 {
        i128::from(bits)
    } else {
        i128::from(bits & ((1u64 << width) - 1))
    }
}

fn decode(spec: &CvtSpec, bits: u64) -> Value {
    let from = spec.from;
    match from {
        Scalar::F16 => Value::Float(half_to_f64(bits as u16, false)),
        Scalar::BF16 => Value::Float(half_to_f64(bits as u16, true)),
        Scalar::F32 => {
            let mut b = bits as u32;
            if spec.ftz {
                b = super::float::ftz32(b);
            }
            Value::Float(f64::from(f32::from_bits(b)))
        }
        Scalar::F64 => Value::Float(f64::from_bits(bits)),
        s if s.is_signed() => Value::Int(sign_extend(bits, s.bits())),
        s => Value::Int(zero_extend(bits, s.bits())),
    }
}

fn round_integral(x: f64, rnd: Rnd) -> f64 {
    match rnd {
        Rnd::Rn => x.round_ties_even(),
        Rnd::Rz => x.trunc(),
        Rnd::Rm => x.floor(),
        Rnd::Rp => x.ceil(),
    }
}

fn int_range(to: Scalar) -> (i128, i128) {
    let n = to.bits();
    if to.is_signed() {
        (-(1i128 << (n - 1)), (1i128 << (n - 1)) - 1)
    } else {
        (0, (1i128 << n) - 1)
    }
}

/// The register bits of an integer result: truncated to the type, extended to the register.
fn int_bits(v: i128, to: Scalar, wide_dst: bool) -> u64 {
    let reg_width = if wide_dst { 64 } else { 32 };
    let t = if to.is_signed() {
        sign_extend(v as u64, to.bits())
    } else {
        zero_extend(v as u64, to.bits())
    };
    let bits = t as u64;
    if reg_width == 32 {
        bits & 0xffff_ffff
    } else {
        bits
    }
}

fn float_bits(y: f64, to: Scalar, ftz: bool) -> u64 {
    match to {
        Scalar::F16 => u64::from(f64_to_half(y, false)),
        Scalar::BF16 => u64::from(f64_to_half(y, true)),
        Scalar::F32 => {
            // `y` is exactly representable in f32 here.
            let b = super::float::canon32(y as f32);
            u64::from(if ftz { super::float::ftz32(b) } else { b })
        }
        _ => super::float::canon64(y),
    }
}

/// Converts one lane's register bits.
pub fn convert(spec: &CvtSpec, bits: u64, wide_dst: bool) -> u64 {
    let to = spec.to;
    let value = decode(spec, bits);
    if to.is_float() {
        let fmt = format_of(to);
        let mut y = match value {
            Value::Float(x) if x.is_nan() => f64::NAN,
            Value::Float(x) if spec.integral => round_integral(x, spec.rnd),
            Value::Float(x) if to.bits() < spec.from.bits() => {
                softfloat::round_f64(x, fmt, spec.rnd)
            }
            Value::Float(x) => x,
            Value::Int(v) => softfloat::round_exact(v < 0, v.unsigned_abs(), 0, fmt, spec.rnd),
        };
        if spec.relu && y.is_sign_negative() && !y.is_nan() {
            y = 0.0;
        }
        if spec.sat {
            y = if y > 0.0 { y.min(1.0) } else { 0.0 };
        }
        if spec.satfinite {
            y = saturate_finite(y, fmt);
        }
        float_bits(y, to, spec.ftz)
    } else {
        let (lo, hi) = int_range(to);
        let v = match value {
            Value::Float(x) if x.is_nan() => 0,
            Value::Float(x) => {
                let r = round_integral(x, spec.rnd);
                if r <= lo as f64 {
                    lo
                } else if r >= hi as f64 {
                    hi
                } else {
                    r as i128
                }
            }
            Value::Int(v) if spec.sat => v.clamp(lo, hi),
            Value::Int(v) => v,
        };
        int_bits(v, to, wide_dst)
    }
}

/// `.satfinite`: ±inf (an overflowed or infinite result) becomes ±the largest finite value of
/// `fmt`; NaN and finite values pass.
fn saturate_finite(y: f64, fmt: softfloat::Format) -> f64 {
    if y.is_infinite() {
        let max = softfloat::max_finite(fmt);
        if y > 0.0 { max } else { -max }
    } else {
        y
    }
}

/// `cvt.{rna,rn,rz}[.relu][.satfinite].tf32.f32`: the f32 `x` rounded to tf32 (f32's exponent
/// range, 10 fraction bits), returned as f32 bits whose low 13 bits are zero. Rounding works
/// on the magnitude's bits: a carry out of the fraction moves into the exponent, so subnormals,
/// the binade boundaries and the overflow to infinity come out right.
pub fn to_tf32(rnd: Tf32Rnd, relu: bool, satfinite: bool, x: u32) -> u32 {
    const LOW: u32 = 0x1fff;
    const INF: u32 = 0x7f80_0000;
    if f32::from_bits(x).is_nan() {
        // The canonical NaN with tf32's low bits clear.
        return super::float::NAN32 & !LOW;
    }
    let sign = x & 0x8000_0000;
    let mag = x & 0x7fff_ffff;
    let mut r = if mag >= INF {
        mag
    } else {
        let (base, low) = (mag & !LOW, mag & LOW);
        let up = match rnd {
            Tf32Rnd::Rna => low >= 0x1000,
            Tf32Rnd::Rn => low > 0x1000 || (low == 0x1000 && base & 0x2000 != 0),
            Tf32Rnd::Rz => false,
        };
        if up { base + LOW + 1 } else { base }
    };
    if satfinite && r >= INF {
        r = 0x7f7f_e000;
    }
    if relu && sign != 0 {
        return 0;
    }
    sign | r
}

/// `cvt.{rn,rz,...}[.relu][.satfinite].{f16x2,bf16x2}.f32 d, a, b`: `a` → high half, `b` →
/// low half.
pub fn convert_pack(bf16: bool, rnd: Rnd, relu: bool, satfinite: bool, a: u32, b: u32) -> u32 {
    let fmt = if bf16 { BF16 } else { F16 };
    let one = |x: u32| {
        let v = f64::from(f32::from_bits(x));
        let mut y = if v.is_nan() {
            v
        } else {
            softfloat::round_f64(v, fmt, rnd)
        };
        if relu && y.is_sign_negative() && !y.is_nan() {
            y = 0.0;
        }
        if satfinite {
            y = saturate_finite(y, fmt);
        }
        u32::from(f64_to_half(y, bf16))
    };
    (one(a) << 16) | one(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(from: Scalar, to: Scalar, rnd: Rnd, integral: bool) -> CvtSpec {
        CvtSpec {
            from,
            to,
            rnd,
            integral,
            ftz: false,
            sat: false,
            relu: false,
            satfinite: false,
        }
    }

    fn f2i(x: f32, rnd: Rnd) -> i32 {
        convert(
            &spec(Scalar::F32, Scalar::S32, rnd, true),
            u64::from(x.to_bits()),
            false,
        ) as u32 as i32
    }

    #[test]
    fn float_to_int_rounding_and_saturation() {
        assert_eq!(f2i(2.5, Rnd::Rn), 2, "ties to even");
        assert_eq!(f2i(3.5, Rnd::Rn), 4);
        assert_eq!(f2i(-2.5, Rnd::Rn), -2);
        assert_eq!(
            f2i(-2.7, Rnd::Rz),
            -2,
            "rzi truncates negatives toward zero"
        );
        assert_eq!(f2i(-2.2, Rnd::Rm), -3);
        assert_eq!(f2i(2.2, Rnd::Rp), 3);
        assert_eq!(f2i(f32::NAN, Rnd::Rn), 0);
        assert_eq!(f2i(1e20, Rnd::Rz), i32::MAX);
        assert_eq!(f2i(-1e20, Rnd::Rz), i32::MIN);
        let u = convert(
            &spec(Scalar::F32, Scalar::U32, Rnd::Rz, true),
            u64::from((-5.0f32).to_bits()),
            false,
        );
        assert_eq!(u, 0, "negative to unsigned saturates at 0");
    }

    #[test]
    fn int_to_float_directed() {
        let big = (1u64 << 24) + 1; // not representable in f32
        let up = convert(&spec(Scalar::U64, Scalar::F32, Rnd::Rp, false), big, false);
        let down = convert(&spec(Scalar::U64, Scalar::F32, Rnd::Rz, false), big, false);
        assert_eq!(f32::from_bits(up as u32), 16_777_218.0);
        assert_eq!(f32::from_bits(down as u32), 16_777_216.0);
        let neg = convert(
            &spec(Scalar::S32, Scalar::F32, Rnd::Rm, false),
            (-(big as i64)) as u64 & 0xffff_ffff,
            false,
        );
        assert_eq!(f32::from_bits(neg as u32), -16_777_218.0);
    }

    #[test]
    fn integer_widths() {
        let s = spec(Scalar::S16, Scalar::S32, Rnd::Rn, false);
        assert_eq!(
            convert(&s, 0xffff, false),
            0xffff_ffff,
            "s16 → s32 sign-extends"
        );
        let s = spec(Scalar::S32, Scalar::S8, Rnd::Rn, false);
        assert_eq!(
            convert(&s, 0x180, false),
            0xffff_ff80,
            "truncates then extends by type"
        );
        let mut s = spec(Scalar::S32, Scalar::U8, Rnd::Rn, false);
        s.sat = true;
        assert_eq!(convert(&s, 300, false), 255);
        assert_eq!(convert(&s, (-3i32) as u32 as u64, false), 0);
    }

    #[test]
    fn f16_widens_to_f32_exactly_with_subnormals_infinities_and_nan() {
        // `cvt.f32.f16` after `cvt.rn.f16.f32`: the round trip the GEMM core's tp_round makes.
        let from_h = spec(Scalar::F16, Scalar::F32, Rnd::Rn, false);
        let f = |h: u16| f32::from_bits(convert(&from_h, u64::from(h), false) as u32);
        assert_eq!(f(0x3c01), 1.0 + 2f32.powi(-10));
        assert_eq!(f(0x0001), 2f32.powi(-24), "smallest subnormal");
        assert_eq!(f(0x03ff), 1023.0 * 2f32.powi(-24), "largest subnormal");
        assert_eq!(f(0x7bff), 65504.0, "largest finite");
        assert_eq!(f(0xfc00), f32::NEG_INFINITY);
        assert_eq!(
            f(0x8000).to_bits(),
            0x8000_0000,
            "negative zero keeps its sign"
        );
        assert!(f(0x7e00).is_nan());
    }

    #[test]
    fn half_conversions_round_to_nearest_even_with_subnormals_and_nan() {
        let to_h = spec(Scalar::F32, Scalar::F16, Rnd::Rn, false);
        let h = |x: f32| convert(&to_h, u64::from(x.to_bits()), false) as u16;
        assert_eq!(h(1.0 + 2f32.powi(-11)), 0x3c00, "tie to even stays at 1.0");
        assert_eq!(
            h(1.0 + 3.0 * 2f32.powi(-11)),
            0x3c02,
            "tie rounds up to even"
        );
        assert_eq!(h(2f32.powi(-24)), 0x0001, "smallest subnormal");
        assert_eq!(h(2f32.powi(-25)), 0x0000, "half of it ties to zero");
        assert_eq!(h(65520.0), 0x7c00, "overflow to inf");
        assert_eq!(h(f32::NAN), 0x7fff);
        let to_b = spec(Scalar::F32, Scalar::BF16, Rnd::Rn, false);
        let b = |x: f32| convert(&to_b, u64::from(x.to_bits()), false) as u16;
        assert_eq!(b(f32::from_bits(0x3f80_8000)), 0x3f80, "bf16 tie to even");
        assert_eq!(b(f32::from_bits(0x3f81_8000)), 0x3f82);
        let back = spec(Scalar::BF16, Scalar::F32, Rnd::Rn, false);
        assert_eq!(convert(&back, 0x3f82, false), 0x3f82_0000);
        assert_eq!(
            convert_pack(
                false,
                Rnd::Rn,
                false,
                false,
                1.0f32.to_bits(),
                2.0f32.to_bits()
            ),
            0x3c00_4000
        );
    }

    #[test]
    fn tf32_rounding_modes() {
        let t = |rnd, bits: u32| to_tf32(rnd, false, false, bits);
        // Halfway between two tf32 values with an even lower neighbour: only rna goes up.
        assert_eq!(t(Tf32Rnd::Rna, 0x3f80_1000), 0x3f80_2000);
        assert_eq!(t(Tf32Rnd::Rn, 0x3f80_1000), 0x3f80_0000);
        assert_eq!(
            t(Tf32Rnd::Rn, 0x3f80_3000),
            0x3f80_4000,
            "tie to the even neighbour"
        );
        assert_eq!(t(Tf32Rnd::Rz, 0xbf80_1fff), 0xbf80_0000);
        assert_eq!(
            t(Tf32Rnd::Rna, 0x7f7f_ffff),
            0x7f80_0000,
            "overflow to infinity"
        );
        assert_eq!(to_tf32(Tf32Rnd::Rna, false, true, 0x7f7f_ffff), 0x7f7f_e000);
        assert_eq!(to_tf32(Tf32Rnd::Rn, true, false, 0xbf80_0000), 0, ".relu");
        assert_eq!(
            t(Tf32Rnd::Rna, 0x7fc0_0001),
            0x7fff_e000,
            "canonical tf32 NaN"
        );
    }

    #[test]
    fn float_integral_rounding_and_sat() {
        let mut s = spec(Scalar::F32, Scalar::F32, Rnd::Rn, true);
        let r =
            |s: &CvtSpec, x: f32| f32::from_bits(convert(s, u64::from(x.to_bits()), false) as u32);
        assert_eq!(r(&s, 0.5), 0.0);
        assert_eq!(r(&s, 1.5), 2.0);
        s.rnd = Rnd::Rm;
        assert_eq!(r(&s, -0.5), -1.0);
        let mut sat = spec(Scalar::F32, Scalar::F32, Rnd::Rn, false);
        sat.sat = true;
        assert_eq!(r(&sat, 1.5), 1.0);
        assert_eq!(r(&sat, f32::NAN), 0.0);
        assert_eq!(r(&sat, -0.25), 0.0);
    }
}
