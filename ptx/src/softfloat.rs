//! Exact rounding in software, for what the host FPU cannot do in one step: fused multiply-add
//! and add/mul/convert with directed rounding (`.rz/.rm/.rp`), to f64, f32, f16 or bf16.
//! Values are handled as sign × integer × 2^exp in 128-bit integers with a sticky bit, so every
//! result is the exactly rounded one (libdevice's `expf` depends on `fma.rm` being exact).
//! Division, square root and reciprocal with directed rounding adjust the correctly rounded
//! nearest result by the sign of an exact residual.

use crate::inst::Rnd;

/// A binary floating-point format: precision in bits (with the implicit bit) and the exponent
/// range of normal numbers (value = 1.f × 2^e, emin ≤ e ≤ emax).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    pub prec: u32,
    pub emin: i32,
    pub emax: i32,
}

pub const F64: Format = Format {
    prec: 53,
    emin: -1022,
    emax: 1023,
};
pub const F32: Format = Format {
    prec: 24,
    emin: -126,
    emax: 127,
};
pub const F16: Format = Format {
    prec: 11,
    emin: -14,
    emax: 15,
};
pub const BF16: Format = Format {
    prec: 8,
    emin: -126,
    emax: 127,
};

/// `m × 2^e` as an f64, exactly (the caller guarantees the value is representable).
fn scale(m: u64, e: i32) -> f64 {
    let pow2 = |k: i32| f64::from_bits(((k + 1023) as u64) << 52);
    let mut x = m as f64;
    let mut e = e;
    // Steps within the normal exponent range keep every intermediate exact.
    while e > 1000 {
        x *= pow2(1000);
        e -= 1000;
    }
    while e < -1000 {
        x *= pow2(-1000);
        e += 1000;
    }
    x * pow2(e)
}

/// The largest finite value of `fmt`.
pub fn max_finite(fmt: Format) -> f64 {
    scale((1u64 << fmt.prec) - 1, fmt.emax - fmt.prec as i32 + 1)
}

/// Rounds `±mant × 2^exp` to `fmt` in mode `rnd`. `mant` may carry a sticky bit in bit 0, as long
/// as it has at least two bits below the rounding position (always true for our callers).
/// Returns an f64 that is exactly representable in `fmt` (or ±inf).
pub fn round_exact(neg: bool, mant: u128, exp: i32, fmt: Format, rnd: Rnd) -> f64 {
    let sign = |x: f64| if neg { -x } else { x };
    if mant == 0 {
        return sign(0.0);
    }
    let msb = 127 - mant.leading_zeros() as i32;
    let top = exp + msb; // exponent of the leading bit
    let prec = fmt.prec as i32;
    let mut q = (top - (prec - 1)).max(fmt.emin - (prec - 1)); // exponent of the kept LSB
    let shift = q - exp;
    let mut m: u128;
    if shift <= 0 {
        // Exact: fewer significant bits than the format keeps.
        m = mant << (-shift) as u32;
    } else {
        let (kept, rem, half) = if shift >= 128 {
            (0u128, mant, None)
        } else {
            let s = shift as u32;
            (mant >> s, mant & ((1u128 << s) - 1), Some(1u128 << (s - 1)))
        };
        let inexact = rem != 0;
        let up = match rnd {
            Rnd::Rn => match half {
                Some(h) => rem > h || (rem == h && kept & 1 == 1),
                None => false, // rem < 2^127 <= half
            },
            Rnd::Rz => false,
            Rnd::Rm => neg && inexact,
            Rnd::Rp => !neg && inexact,
        };
        m = kept + u128::from(up);
        if m == 1u128 << prec {
            m >>= 1;
            q += 1;
        }
    }
    if m == 0 {
        return sign(0.0);
    }
    let top_out = q + (127 - m.leading_zeros() as i32);
    if top_out > fmt.emax {
        let to_inf = match rnd {
            Rnd::Rn => true,
            Rnd::Rz => false,
            Rnd::Rm => neg,
            Rnd::Rp => !neg,
        };
        return sign(if to_inf {
            f64::INFINITY
        } else {
            max_finite(fmt)
        });
    }
    // m < 2^prec <= 2^53 here.
    sign(scale(m as u64, q))
}

/// A finite f64 as (negative, integer significand, exponent).
fn decompose(x: f64) -> (bool, u64, i32) {
    let bits = x.to_bits();
    let neg = bits >> 63 == 1;
    let e = ((bits >> 52) & 0x7ff) as i32;
    let f = bits & ((1u64 << 52) - 1);
    if e == 0 {
        (neg, f, -1074)
    } else {
        (neg, f | (1u64 << 52), e - 1075)
    }
}

/// Rounds a finite or infinite f64 to `fmt` (NaN passes through).
pub fn round_f64(x: f64, fmt: Format, rnd: Rnd) -> f64 {
    if !x.is_finite() {
        return x;
    }
    let (neg, m, e) = decompose(x);
    round_exact(neg, u128::from(m), e, fmt, rnd)
}

/// Sign of an exact zero sum `x + y` where the exact result is zero (IEEE 754 §6.3).
fn zero_sum_sign(x_neg: bool, y_neg: bool, rnd: Rnd) -> bool {
    if x_neg == y_neg {
        x_neg
    } else {
        rnd == Rnd::Rm
    }
}

/// `a × b + c` with one rounding to `fmt` in mode `rnd`; inputs are any f64 values.
pub fn fma_exact(a: f64, b: f64, c: f64, fmt: Format, rnd: Rnd) -> f64 {
    if a.is_nan() || b.is_nan() || c.is_nan() {
        return f64::NAN;
    }
    if a.is_infinite() || b.is_infinite() {
        // The product is infinite (or 0 × inf = NaN); IEEE f64 arithmetic gets the rest right.
        return a * b + c;
    }
    if c.is_infinite() {
        return c;
    }
    let (na, ma, ea) = decompose(a);
    let (nb, mb, eb) = decompose(b);
    let (nc, mc, ec) = decompose(c);
    let np = na ^ nb;
    let mp = u128::from(ma) * u128::from(mb);
    let ep = ea + eb;
    match (mp == 0, mc == 0) {
        (true, true) => {
            return if zero_sum_sign(np, nc, rnd) {
                -0.0
            } else {
                0.0
            };
        }
        (true, false) => return round_exact(nc, u128::from(mc), ec, fmt, rnd),
        (false, true) => return round_exact(np, mp, ep, fmt, rnd),
        (false, false) => {}
    }
    // Normalise both to a leading bit at 125 (two bits of headroom for the carry).
    let norm = |m: u128, e: i32| {
        let sh = m.leading_zeros() as i32 - 2;
        (m << sh as u32, e - sh)
    };
    let (xp, ep) = norm(mp, ep);
    let (xc, ec) = norm(u128::from(mc), ec);
    let ((x1, e1, n1), (x2, e2, n2)) = if ep >= ec {
        ((xp, ep, np), (xc, ec, nc))
    } else {
        ((xc, ec, nc), (xp, ep, np))
    };
    let d = (e1 - e2) as u32;
    // x1 is even (it has ≥ 20 trailing zeros); OR-ing the lost bits into bit 0 of x2 keeps the
    // sum on the same side of every rounding boundary (bit 0 is far below the kept precision).
    let x2 = if d == 0 {
        x2
    } else if d >= 127 {
        1
    } else {
        (x2 >> d) | u128::from(x2 & ((1u128 << d) - 1) != 0)
    };
    let (neg, m) = if n1 == n2 {
        (n1, x1 + x2)
    } else if x1 >= x2 {
        (n1, x1 - x2)
    } else {
        (n2, x2 - x1)
    };
    if m == 0 {
        return if zero_sum_sign(n1, n2, rnd) {
            -0.0
        } else {
            0.0
        };
    }
    round_exact(neg, m, e1, fmt, rnd)
}

/// `a + b` rounded once to `fmt`.
pub fn add_exact(a: f64, b: f64, fmt: Format, rnd: Rnd) -> f64 {
    fma_exact(a, 1.0, b, fmt, rnd)
}

/// `a × b` rounded once to `fmt`.
pub fn mul_exact(a: f64, b: f64, fmt: Format, rnd: Rnd) -> f64 {
    if !a.is_finite() || !b.is_finite() {
        return a * b;
    }
    let (na, ma, ea) = decompose(a);
    let (nb, mb, eb) = decompose(b);
    round_exact(na ^ nb, u128::from(ma) * u128::from(mb), ea + eb, fmt, rnd)
}

/// Turns a correctly rounded-to-nearest result `q` into the `rnd`-rounded one, given the sign of
/// `exact − q` (`residual`: −1, 0 or +1). `next_up`/`next_down` step in the result's format;
/// `max` is its largest finite value.
pub fn directed_from_nearest<T: Copy + PartialEq>(
    q: T,
    residual: i32,
    rnd: Rnd,
    next_up: impl Fn(T) -> T,
    next_down: impl Fn(T) -> T,
    is_neg: impl Fn(T) -> bool,
) -> T {
    let toward_zero_is_down = !is_neg(q);
    match (rnd, residual) {
        (Rnd::Rn, _) | (_, 0) => q,
        (Rnd::Rp, r) => {
            if r > 0 {
                next_up(q)
            } else {
                q
            }
        }
        (Rnd::Rm, r) => {
            if r < 0 {
                next_down(q)
            } else {
                q
            }
        }
        (Rnd::Rz, r) => {
            if r < 0 && toward_zero_is_down {
                next_down(q)
            } else if r > 0 && !toward_zero_is_down {
                next_up(q)
            } else {
                q
            }
        }
    }
}

/// Overflowed nearest results (`q` infinite from finite inputs) under a directed mode.
pub fn directed_overflow(q_neg: bool, rnd: Rnd, max: f64) -> f64 {
    let finite = match rnd {
        Rnd::Rn => false,
        Rnd::Rz => true,
        Rnd::Rm => !q_neg,
        Rnd::Rp => q_neg,
    };
    let v = if finite { max } else { f64::INFINITY };
    if q_neg { -v } else { v }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random_f32(rng: &mut ChaCha8Rng) -> f32 {
        // Mix of arbitrary bit patterns (subnormals, huge, tiny) and moderate values.
        if rng.random_bool(0.5) {
            f32::from_bits(rng.random::<u32>())
        } else {
            rng.random_range(-4.0f32..4.0)
        }
    }

    #[test]
    fn nearest_fma_matches_hardware_fma_f32_and_f64() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..200_000 {
            let (a, b, c) = (
                random_f32(&mut rng),
                random_f32(&mut rng),
                random_f32(&mut rng),
            );
            let want = a.mul_add(b, c);
            let got = fma_exact(a.into(), b.into(), c.into(), F32, Rnd::Rn) as f32;
            assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "fma({a:e}, {b:e}, {c:e}): {want:e} vs {got:e}"
            );
            let (x, y, z) = (
                f64::from_bits(rng.random::<u64>()),
                f64::from_bits(rng.random::<u64>() >> rng.random_range(0..12)),
                f64::from(c) * rng.random_range(-1e3..1e3),
            );
            let want = x.mul_add(y, z);
            let got = fma_exact(x, y, z, F64, Rnd::Rn);
            assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "fma({x:e}, {y:e}, {z:e}): {want:e} vs {got:e}"
            );
        }
    }

    /// Independent oracle: with small exponents, a×b+c is an exact i128 multiple of 2^-80.
    #[test]
    fn directed_fma_is_exactly_rounded_f32() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        // x × 2^80 as an integer, when exact and small enough.
        let to_fixed = |x: f32| -> Option<i128> {
            let s = f64::from(x) * 2f64.powi(80);
            (x.is_finite() && s.fract() == 0.0 && s.abs() < 2f64.powi(110)).then_some(s as i128)
        };
        let mut checked = 0;
        for _ in 0..100_000 {
            // Multiples of 2^-40 below 2^4: products are multiples of 2^-80 below 2^8.
            let pick = |rng: &mut ChaCha8Rng| {
                let m: i32 = rng.random_range(-(1 << 24)..(1 << 24));
                let e: i32 = rng.random_range(-40..-20);
                (m as f32 * 2f32.powi(e), i128::from(m), e)
            };
            let ((a, ma, ea), (b, mb, eb), (c, _, _)) =
                (pick(&mut rng), pick(&mut rng), pick(&mut rng));
            let Some(fc) = to_fixed(c) else { continue };
            let exact = ((ma * mb) << (ea + eb + 80)) + fc;
            for rnd in [Rnd::Rn, Rnd::Rz, Rnd::Rm, Rnd::Rp] {
                let r = fma_exact(a.into(), b.into(), c.into(), F32, rnd) as f32;
                let Some(fr) = to_fixed(r) else {
                    panic!("result {r:e} is not a multiple of 2^-80")
                };
                // Neighbours that are not multiples of 2^-80 lie strictly between multiples,
                // so they cannot be a better answer than an exact multiple; skip those bounds.
                let up = to_fixed(r.next_up());
                let down = to_fixed(r.next_down());
                let ok = match rnd {
                    Rnd::Rm => fr <= exact && up.is_none_or(|u| exact < u),
                    Rnd::Rp => fr >= exact && down.is_none_or(|d| exact > d),
                    Rnd::Rz if exact >= 0 => fr <= exact && up.is_none_or(|u| exact < u),
                    Rnd::Rz => fr >= exact && down.is_none_or(|d| exact > d),
                    Rnd::Rn => {
                        let err = (fr - exact).abs();
                        let tie_ok = |n: i128| {
                            let e2 = (n - exact).abs();
                            err < e2 || (err == e2 && r.to_bits() & 1 == 0)
                        };
                        up.is_none_or(tie_ok) && down.is_none_or(tie_ok)
                    }
                };
                assert!(ok, "{rnd:?}: fma({a:e}, {b:e}, {c:e}) = {r:e}");
                checked += 1;
            }
        }
        assert!(checked > 300_000, "only {checked} cases were checked");
    }

    #[test]
    fn rounding_edges() {
        // 1 + 2^-24 is a tie between 1 and 1 + 2^-23: ties-to-even gives 1.
        let tie = 1.0 + 2f64.powi(-24);
        assert_eq!(round_f64(tie, F32, Rnd::Rn), 1.0);
        assert_eq!(round_f64(tie, F32, Rnd::Rp), 1.0 + 2f64.powi(-23));
        assert_eq!(round_f64(-tie, F32, Rnd::Rm), -(1.0 + 2f64.powi(-23)));
        assert_eq!(round_f64(-tie, F32, Rnd::Rz), -1.0);
        // Overflow: rn → inf, rz → max.
        assert_eq!(round_f64(1e39, F32, Rnd::Rn), f64::INFINITY);
        assert_eq!(round_f64(1e39, F32, Rnd::Rz), f64::from(f32::MAX));
        assert_eq!(round_f64(-1e39, F32, Rnd::Rp), -f64::from(f32::MAX));
        // Subnormals: the smallest f32 subnormal, and half of it (a tie to even → 0).
        let tiny = 2f64.powi(-149);
        assert_eq!(round_f64(tiny, F32, Rnd::Rn), tiny);
        assert_eq!(round_f64(tiny / 2.0, F32, Rnd::Rn), 0.0);
        assert_eq!(round_f64(tiny / 2.0, F32, Rnd::Rp), tiny);
        assert_eq!(round_f64(tiny * 1.5, F32, Rnd::Rn), 2.0 * tiny);
        // f16: 65520 is the tie between 65504 (max) and overflow → inf.
        assert_eq!(round_f64(65520.0, F16, Rnd::Rn), f64::INFINITY);
        assert_eq!(round_f64(65519.0, F16, Rnd::Rn), 65504.0);
        // Exact zero sums: +0 except under rm.
        assert!(fma_exact(1.0, 1.0, -1.0, F32, Rnd::Rn).is_sign_positive());
        assert!(fma_exact(1.0, 1.0, -1.0, F32, Rnd::Rm).is_sign_negative());
        assert!(fma_exact(-0.0, 1.0, -0.0, F32, Rnd::Rn).is_sign_negative());
        // Infinite c with finite product, and 0 × inf.
        assert_eq!(
            fma_exact(f64::MAX, 2.0, f64::NEG_INFINITY, F64, Rnd::Rn),
            f64::NEG_INFINITY
        );
        assert!(fma_exact(0.0, f64::INFINITY, 1.0, F32, Rnd::Rn).is_nan());
    }

    #[test]
    fn half_rounding_matches_the_half_crate() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..100_000 {
            let x = f32::from_bits(rng.random::<u32>());
            if x.is_nan() {
                continue;
            }
            let f16 = half::f16::from_f32(x);
            assert_eq!(
                round_f64(x.into(), F16, Rnd::Rn),
                f64::from(f16.to_f32()),
                "{x:e}"
            );
            let bf16 = half::bf16::from_f32(x);
            assert_eq!(
                round_f64(x.into(), BF16, Rnd::Rn),
                f64::from(bf16.to_f32()),
                "{x:e}"
            );
        }
    }
}
