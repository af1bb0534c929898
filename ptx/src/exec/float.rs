//! Float handlers: f32 and f64 arithmetic with `.ftz`/`.sat`, NaN results canonicalised as PTX
//! does (0x7fffffff), fused multiply-add on the host's FMA unit when it has one (exact by IEEE
//! 754 either way), directed rounding through `softfloat`, `.approx` functions evaluated in f64,
//! and f16/bf16 (scalar and x2) arithmetic rounded once from exact values.

use super::lanes::{WARP, blend, map1_32, map1_64, map2_32, map2_64, map3_64};
use crate::inst::{FBinOp, FFlags, FUnOp, HalfOp, HalfTy, Rnd};
use crate::softfloat::{self, BF16, F16, F32, F64, Format};

pub const NAN32: u32 = 0x7fff_ffff;
pub const NAN64: u64 = 0x7fff_ffff_ffff_ffff;

#[inline(always)]
pub fn canon32(x: f32) -> u32 {
    if x.is_nan() { NAN32 } else { x.to_bits() }
}

#[inline(always)]
pub fn canon64(x: f64) -> u64 {
    if x.is_nan() { NAN64 } else { x.to_bits() }
}

/// Flushes an f32 subnormal (as bits) to a zero of the same sign.
#[inline(always)]
pub fn ftz32(b: u32) -> u32 {
    if b & 0x7f80_0000 == 0 {
        b & 0x8000_0000
    } else {
        b
    }
}

/// Clamps to [0, 1]; NaN becomes 0.
#[inline(always)]
pub fn sat32(x: f32) -> f32 {
    if x > 0.0 { x.min(1.0) } else { 0.0 }
}

#[inline(always)]
fn f(b: u32) -> f32 {
    f32::from_bits(b)
}

#[inline(always)]
fn g(b: u64) -> f64 {
    f64::from_bits(b)
}

/// PTX `min`: a NaN operand yields the other one (both NaN: NaN); −0 < +0. Equal operands
/// differ at most in the sign of zero, which OR-ing the bits resolves (branch-free, vectorises).
#[inline(always)]
fn fmin32(x: f32, y: f32) -> f32 {
    if x == y {
        f32::from_bits(x.to_bits() | y.to_bits())
    } else {
        x.min(y)
    }
}

#[inline(always)]
fn fmax32(x: f32, y: f32) -> f32 {
    if x == y {
        f32::from_bits(x.to_bits() & y.to_bits())
    } else {
        x.max(y)
    }
}

#[inline(always)]
fn fmin64(x: f64, y: f64) -> f64 {
    if x == y {
        f64::from_bits(x.to_bits() | y.to_bits())
    } else {
        x.min(y)
    }
}

#[inline(always)]
fn fmax64(x: f64, y: f64) -> f64 {
    if x == y {
        f64::from_bits(x.to_bits() & y.to_bits())
    } else {
        x.max(y)
    }
}

/// Applies `.ftz` (inputs and result) and `.sat` around an f32 operation, canonicalising NaN.
macro_rules! with_flags2 {
    ($r:expr, $m:expr, $d:expr, $a:expr, $b:expr, $fl:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($fl.ftz, $fl.sat) {
            (false, false) => map2_32($r, $m, $d, $a, $b, |p, q| {
                let ($x, $y) = (f(p), f(q));
                canon32($body)
            }),
            (true, false) => map2_32($r, $m, $d, $a, $b, |p, q| {
                let ($x, $y) = (f(ftz32(p)), f(ftz32(q)));
                ftz32(canon32($body))
            }),
            (false, true) => map2_32($r, $m, $d, $a, $b, |p, q| {
                let ($x, $y) = (f(p), f(q));
                sat32($body).to_bits()
            }),
            (true, true) => map2_32($r, $m, $d, $a, $b, |p, q| {
                let ($x, $y) = (f(ftz32(p)), f(ftz32(q)));
                ftz32(sat32($body).to_bits())
            }),
        }
    };
}

/// The sign of `exact − q` for a division `x / y` rounded to `q`, from an exact f64 residual.
fn div_residual32(x: f32, y: f32, q: f32) -> i32 {
    // q × y is exact in f64 (24 × 24 bits) and x − q×y is exact by Sterbenz's lemma.
    let rho = f64::from(x) - f64::from(q) * f64::from(y);
    let s = if rho > 0.0 {
        1
    } else if rho < 0.0 {
        -1
    } else {
        0
    };
    if y < 0.0 { -s } else { s }
}

fn directed32(q: f32, residual: i32, rnd: Rnd, finite_inputs: bool) -> f32 {
    if q.is_infinite() && finite_inputs {
        return softfloat::directed_overflow(q < 0.0, rnd, f64::from(f32::MAX)) as f32;
    }
    if q.is_nan() {
        return q;
    }
    softfloat::directed_from_nearest(q, residual, rnd, f32::next_up, f32::next_down, |v| {
        v.is_sign_negative()
    })
}

fn directed64(q: f64, residual: i32, rnd: Rnd, finite_inputs: bool) -> f64 {
    if q.is_infinite() && finite_inputs {
        return softfloat::directed_overflow(q < 0.0, rnd, f64::MAX);
    }
    if q.is_nan() {
        return q;
    }
    softfloat::directed_from_nearest(q, residual, rnd, f64::next_up, f64::next_down, |v| {
        v.is_sign_negative()
    })
}

fn sign_of(x: f64) -> i32 {
    if x > 0.0 {
        1
    } else if x < 0.0 {
        -1
    } else {
        0
    }
}

pub fn f32_bin(op: FBinOp, fl: FFlags, r: &mut [[u32; WARP]], m: u32, d: u32, a: u32, b: u32) {
    use FBinOp::*;
    let ex = |x: f32, y: f32, fmt: Format, rnd: Rnd, op: FBinOp| -> f32 {
        let (x, y) = (f64::from(x), f64::from(y));
        (match op {
            AddR(_) => softfloat::add_exact(x, y, fmt, rnd),
            SubR(_) => softfloat::add_exact(x, -y, fmt, rnd),
            _ => softfloat::mul_exact(x, y, fmt, rnd),
        }) as f32
    };
    match op {
        Add => with_flags2!(r, m, d, a, b, fl, |x, y| x + y),
        Sub => with_flags2!(r, m, d, a, b, fl, |x, y| x - y),
        Mul => with_flags2!(r, m, d, a, b, fl, |x, y| x * y),
        AddR(rnd) | SubR(rnd) | MulR(rnd) => {
            with_flags2!(r, m, d, a, b, fl, |x, y| ex(x, y, F32, rnd, op))
        }
        Div => with_flags2!(r, m, d, a, b, fl, |x, y| x / y),
        DivApprox => with_flags2!(r, m, d, a, b, fl, |x, y| (f64::from(x) / f64::from(y))
            as f32),
        DivR(rnd) => with_flags2!(r, m, d, a, b, fl, |x, y| {
            let q = x / y;
            directed32(q, div_residual32(x, y, q), rnd, x.is_finite() && y != 0.0)
        }),
        Min => with_flags2!(r, m, d, a, b, fl, |x, y| fmin32(x, y)),
        Max => with_flags2!(r, m, d, a, b, fl, |x, y| fmax32(x, y)),
        Copysign => map2_32(r, m, d, a, b, |x, y| (y & 0x7fff_ffff) | (x & 0x8000_0000)),
    }
}

pub fn f64_bin(op: FBinOp, r: &mut [[u64; WARP]], m: u32, d: u32, a: u32, b: u32) {
    use FBinOp::*;
    match op {
        Add => map2_64(r, m, d, a, b, |x, y| canon64(g(x) + g(y))),
        Sub => map2_64(r, m, d, a, b, |x, y| canon64(g(x) - g(y))),
        Mul => map2_64(r, m, d, a, b, |x, y| canon64(g(x) * g(y))),
        AddR(rnd) => map2_64(r, m, d, a, b, |x, y| {
            canon64(softfloat::add_exact(g(x), g(y), F64, rnd))
        }),
        SubR(rnd) => map2_64(r, m, d, a, b, |x, y| {
            canon64(softfloat::add_exact(g(x), -g(y), F64, rnd))
        }),
        MulR(rnd) => map2_64(r, m, d, a, b, |x, y| {
            canon64(softfloat::mul_exact(g(x), g(y), F64, rnd))
        }),
        Div | DivApprox => map2_64(r, m, d, a, b, |x, y| canon64(g(x) / g(y))),
        DivR(rnd) => map2_64(r, m, d, a, b, |x, y| {
            let (x, y) = (g(x), g(y));
            let q = x / y;
            // The residual x − q·y of a correctly rounded quotient is exact with one fma.
            let rho = (-q).mul_add(y, x);
            let s = if y < 0.0 { -sign_of(rho) } else { sign_of(rho) };
            canon64(directed64(q, s, rnd, x.is_finite() && y != 0.0))
        }),
        Min => map2_64(r, m, d, a, b, |x, y| canon64(fmin64(g(x), g(y)))),
        Max => map2_64(r, m, d, a, b, |x, y| canon64(fmax64(g(x), g(y)))),
        Copysign => map2_64(r, m, d, a, b, |x, y| (y & !(1 << 63)) | (x & (1 << 63))),
    }
}

/// f32 unary ops; `.approx` functions are evaluated in f64 and rounded (within hardware bounds).
pub fn f32_un(op: FUnOp, fl: FFlags, r: &mut [[u32; WARP]], m: u32, d: u32, a: u32) {
    use FUnOp::*;
    let pre = |x: u32| if fl.ftz { ftz32(x) } else { x };
    let post = |x: u32| if fl.ftz { ftz32(x) } else { x };
    let approx = |h: fn(f64) -> f64| move |x: u32| post(canon32(h(f64::from(f(pre(x)))) as f32));
    match op {
        Neg => map1_32(r, m, d, a, |x| pre(x) ^ 0x8000_0000),
        Abs => map1_32(r, m, d, a, |x| pre(x) & 0x7fff_ffff),
        Sqrt => map1_32(r, m, d, a, |x| post(canon32(f(pre(x)).sqrt()))),
        Rcp => map1_32(r, m, d, a, |x| post(canon32(1.0 / f(pre(x))))),
        SqrtR(rnd) => map1_32(r, m, d, a, |x| {
            let v = f(pre(x));
            let q = v.sqrt();
            let rho = f64::from(v) - f64::from(q) * f64::from(q);
            post(canon32(directed32(q, sign_of(rho), rnd, v.is_finite())))
        }),
        RcpR(rnd) => map1_32(r, m, d, a, |x| {
            let v = f(pre(x));
            let q = 1.0 / v;
            post(canon32(directed32(
                q,
                div_residual32(1.0, v, q),
                rnd,
                v != 0.0,
            )))
        }),
        SqrtApprox => map1_32(r, m, d, a, approx(f64::sqrt)),
        RcpApprox => map1_32(r, m, d, a, approx(|x| 1.0 / x)),
        Rsqrt => map1_32(r, m, d, a, approx(|x| 1.0 / x.sqrt())),
        Ex2 => map1_32(r, m, d, a, approx(f64::exp2)),
        Lg2 => map1_32(r, m, d, a, approx(f64::log2)),
        Sin => map1_32(r, m, d, a, approx(f64::sin)),
        Cos => map1_32(r, m, d, a, approx(f64::cos)),
        Tanh => map1_32(r, m, d, a, approx(f64::tanh)),
    }
}

pub fn f64_un(op: FUnOp, r: &mut [[u64; WARP]], m: u32, d: u32, a: u32) {
    use FUnOp::*;
    match op {
        Neg => map1_64(r, m, d, a, |x| x ^ (1 << 63)),
        Abs => map1_64(r, m, d, a, |x| x & !(1 << 63)),
        Sqrt | SqrtApprox => map1_64(r, m, d, a, |x| canon64(g(x).sqrt())),
        Rcp | RcpApprox => map1_64(r, m, d, a, |x| canon64(1.0 / g(x))),
        Rsqrt => map1_64(r, m, d, a, |x| canon64(1.0 / g(x).sqrt())),
        SqrtR(rnd) => map1_64(r, m, d, a, |x| {
            let v = g(x);
            let q = v.sqrt();
            let rho = (-q).mul_add(q, v);
            canon64(directed64(q, sign_of(rho), rnd, v.is_finite()))
        }),
        RcpR(rnd) => map1_64(r, m, d, a, |x| {
            let v = g(x);
            let q = 1.0 / v;
            let rho = (-q).mul_add(v, 1.0);
            let s = if v < 0.0 { -sign_of(rho) } else { sign_of(rho) };
            canon64(directed64(q, s, rnd, v != 0.0))
        }),
        Ex2 | Lg2 | Sin | Cos | Tanh => map1_64(r, m, d, a, |x| canon64(g(x))),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_lanes_avx2(a: &[u32; WARP], b: &[u32; WARP], c: &[u32; WARP]) -> [u32; WARP] {
    std::array::from_fn(|l| canon32(f(a[l]).mul_add(f(b[l]), f(c[l]))))
}

fn fma_lanes_generic(a: &[u32; WARP], b: &[u32; WARP], c: &[u32; WARP]) -> [u32; WARP] {
    std::array::from_fn(|l| canon32(f(a[l]).mul_add(f(b[l]), f(c[l]))))
}

/// Whether the host has an FMA unit we can use (checked once per launch).
pub fn host_has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        true
    }
}

/// `fma.rn.f32` over 32 lanes. `hw` must come from [`host_has_fma`].
#[inline]
fn fma_lanes(hw: bool, a: &[u32; WARP], b: &[u32; WARP], c: &[u32; WARP]) -> [u32; WARP] {
    #[cfg(target_arch = "x86_64")]
    if hw {
        // SAFETY: `hw` is true only when the CPU reports AVX2 and FMA (`host_has_fma`).
        return unsafe { fma_lanes_avx2(a, b, c) };
    }
    let _ = hw;
    fma_lanes_generic(a, b, c)
}

/// `fma.rn.f32` without modifiers, in place, compiled for AVX2 + FMA (the SGEMM inner loop).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_rn_in_place_avx2(r: &mut [[u32; WARP]], m: u32, (d, a, b, c): (u32, u32, u32, u32)) {
    let (av, bv, cv) = (&r[a as usize], &r[b as usize], &r[c as usize]);
    let out: [u32; WARP] = std::array::from_fn(|l| canon32(f(av[l]).mul_add(f(bv[l]), f(cv[l]))));
    blend(&mut r[d as usize], &out, m);
}

#[allow(clippy::too_many_arguments)]
pub fn f32_fma(
    rnd: Rnd,
    fl: FFlags,
    hw: bool,
    r: &mut [[u32; WARP]],
    m: u32,
    regs: (u32, u32, u32, u32),
) {
    #[cfg(target_arch = "x86_64")]
    if hw && rnd == Rnd::Rn && !fl.ftz && !fl.sat {
        // SAFETY: `hw` is true only when the CPU reports AVX2 and FMA (`host_has_fma`).
        unsafe { fma_rn_in_place_avx2(r, m, regs) };
        return;
    }
    let (d, a, b, c) = regs;
    let (mut av, mut bv, mut cv) = (r[a as usize], r[b as usize], r[c as usize]);
    if fl.ftz {
        for l in 0..WARP {
            av[l] = ftz32(av[l]);
            bv[l] = ftz32(bv[l]);
            cv[l] = ftz32(cv[l]);
        }
    }
    let mut out = if rnd == Rnd::Rn {
        fma_lanes(hw, &av, &bv, &cv)
    } else {
        let mut out = [0u32; WARP];
        for l in super::lanes::lanes(m) {
            let v =
                softfloat::fma_exact(f(av[l]).into(), f(bv[l]).into(), f(cv[l]).into(), F32, rnd);
            out[l] = canon32(v as f32);
        }
        out
    };
    if fl.sat {
        out = std::array::from_fn(|l| sat32(f(out[l])).to_bits());
    }
    if fl.ftz {
        out = std::array::from_fn(|l| ftz32(out[l]));
    }
    blend(&mut r[d as usize], &out, m);
}

pub fn f64_fma(rnd: Rnd, r: &mut [[u64; WARP]], m: u32, regs: (u32, u32, u32, u32)) {
    if rnd == Rnd::Rn {
        map3_64(r, m, regs, |x, y, z| canon64(g(x).mul_add(g(y), g(z))));
    } else {
        map3_64(r, m, regs, |x, y, z| {
            canon64(softfloat::fma_exact(g(x), g(y), g(z), F64, rnd))
        });
    }
}

/// A half-precision element (low 16 bits) as an exact f64.
pub fn half_to_f64(bits: u16, bf16: bool) -> f64 {
    if bf16 {
        f64::from(half::bf16::from_bits(bits).to_f32())
    } else {
        f64::from(half::f16::from_bits(bits).to_f32())
    }
}

/// An f64 exactly representable in the half format (or ±inf/NaN) as bits; NaN is 0x7fff.
pub fn f64_to_half(x: f64, bf16: bool) -> u16 {
    if x.is_nan() {
        0x7fff
    } else if bf16 {
        half::bf16::from_f64(x).to_bits()
    } else {
        half::f16::from_f64(x).to_bits()
    }
}

fn half_elem(op: HalfOp, fl: FFlags, bf16: bool, a: u16, b: u16, c: u16) -> u16 {
    let fmt = if bf16 { BF16 } else { F16 };
    let exp_mask: u16 = if bf16 { 0x7f80 } else { 0x7c00 };
    let flush = |h: u16| {
        if fl.ftz && h & exp_mask == 0 {
            h & 0x8000
        } else {
            h
        }
    };
    let (a, b, c) = (flush(a), flush(b), flush(c));
    let (x, y, z) = (
        half_to_f64(a, bf16),
        half_to_f64(b, bf16),
        half_to_f64(c, bf16),
    );
    let v = match op {
        HalfOp::Neg => return a ^ 0x8000,
        HalfOp::Abs => return a & 0x7fff,
        HalfOp::Add => softfloat::add_exact(x, y, fmt, Rnd::Rn),
        HalfOp::Sub => softfloat::add_exact(x, -y, fmt, Rnd::Rn),
        HalfOp::Mul => softfloat::mul_exact(x, y, fmt, Rnd::Rn),
        HalfOp::Fma => softfloat::fma_exact(x, y, z, fmt, Rnd::Rn),
        HalfOp::Min => fmin64(x, y),
        HalfOp::Max => fmax64(x, y),
    };
    let v = if fl.sat && !v.is_nan() {
        v.clamp(0.0, 1.0)
    } else if fl.sat {
        0.0
    } else {
        v
    };
    flush(f64_to_half(v, bf16))
}

pub fn half(
    op: HalfOp,
    ty: HalfTy,
    fl: FFlags,
    r: &mut [[u32; WARP]],
    m: u32,
    regs: (u32, u32, u32, u32),
) {
    let bf16 = matches!(ty, HalfTy::BF16 | HalfTy::BF16x2);
    let pair = matches!(ty, HalfTy::F16x2 | HalfTy::BF16x2);
    super::lanes::map3_32(r, m, regs, |x, y, z| {
        let lo = half_elem(op, fl, bf16, x as u16, y as u16, z as u16);
        if pair {
            let hi = half_elem(
                op,
                fl,
                bf16,
                (x >> 16) as u16,
                (y >> 16) as u16,
                (z >> 16) as u16,
            );
            u32::from(lo) | (u32::from(hi) << 16)
        } else {
            u32::from(lo)
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_max_follow_ptx_nan_and_zero_rules() {
        let (nan, one) = (f32::NAN, 1.0f32);
        assert_eq!(fmin32(nan, one), one);
        assert_eq!(fmin32(one, nan), one);
        assert!(fmin32(nan, nan).is_nan());
        assert!(fmin32(0.0, -0.0).is_sign_negative());
        assert!(fmin32(-0.0, 0.0).is_sign_negative());
        assert!(fmax32(-0.0, 0.0).is_sign_positive());
        assert!(fmax32(0.0, -0.0).is_sign_positive());
        assert_eq!(fmax32(nan, -one), -one);
        assert_eq!(fmax32(2.0, -one), 2.0);
        assert_eq!(fmin64(-3.0, 2.0), -3.0);
        assert!(fmax64(f64::NAN, f64::NAN).is_nan());
    }

    #[test]
    fn ftz_and_sat() {
        let sub = f32::from_bits(1);
        assert_eq!(ftz32(sub.to_bits()), 0);
        assert_eq!(ftz32((-sub).to_bits()), 0x8000_0000);
        assert_eq!(ftz32(1.0f32.to_bits()), 1.0f32.to_bits());
        assert_eq!(sat32(f32::NAN), 0.0);
        assert_eq!(sat32(-3.0), 0.0);
        assert_eq!(sat32(3.0), 1.0);
    }

    #[test]
    fn fma_paths_agree() {
        let a: [u32; WARP] = std::array::from_fn(|l| (1.0f32 + l as f32 * 1e-7).to_bits());
        let b: [u32; WARP] = std::array::from_fn(|l| (3.0f32 - l as f32).to_bits());
        let c: [u32; WARP] = std::array::from_fn(|l| (-3.0f32 + l as f32 * 0.5).to_bits());
        assert_eq!(
            fma_lanes(host_has_fma(), &a, &b, &c),
            fma_lanes_generic(&a, &b, &c)
        );
    }
}
