//! The lane operations of the fused engine: one tight loop over a chunk of lanes per
//! instruction class — constants, unary and binary arithmetic, select and casts — for each
//! register class, rounding as the reference does (f16/bf16 on store, integer wrap-around).

use super::{Class, Regs};
use crate::backend::cpu::memory::Lanes;
use crate::ir::{BinaryOp, UnaryOp};
use crate::tensor::DType;

#[inline(always)]
pub(super) fn c_slice(r: &mut Regs, c: Class, out: usize, n: usize) -> Lanes<'_> {
    match c {
        Class::F32 => Lanes::F32(&mut r.f32[out..out + n]),
        Class::F64 => Lanes::F64(&mut r.f64[out..out + n]),
        Class::I64 => Lanes::I64(&mut r.i64[out..out + n]),
        Class::Bool => Lanes::Bool(&mut r.bool[out..out + n]),
    }
}

#[inline(always)]
pub(super) fn fill_const(r: &mut Regs, c: Class, out: usize, n: usize, x: f64, dt: DType) {
    let x = crate::ir::scalar::round_to(x, dt);
    match c {
        Class::F32 => r.f32[out..out + n].fill(x as f32),
        Class::F64 => r.f64[out..out + n].fill(x),
        Class::I64 => r.i64[out..out + n].fill(x as i64),
        Class::Bool => r.bool[out..out + n].fill(x != 0.0),
    }
}

/// Applies `f` lane by lane from register `a` to register `out` of one class. Operands precede
/// their result in SSA order, so `a < out` and the two are disjoint slices (which lets the loop
/// vectorise without bounds checks).
macro_rules! map1 {
    ($v:expr, $a:expr, $out:expr, $n:expr, |$x:ident| $body:expr) => {{
        let (src, dst) = $v.split_at_mut($out);
        for (o, &$x) in dst[..$n].iter_mut().zip(&src[$a..$a + $n]) {
            *o = $body;
        }
    }};
}

#[inline(always)]
pub(super) fn unary(r: &mut Regs, c: Class, u: UnaryOp, a: usize, out: usize, n: usize) {
    match c {
        Class::F32 => {
            let v = &mut r.f32;
            match u {
                UnaryOp::Neg => map1!(v, a, out, n, |x| -x),
                UnaryOp::Abs => map1!(v, a, out, n, |x| x.abs()),
                UnaryOp::Sign => map1!(v, a, out, n, |x| if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    x
                }),
                UnaryOp::Exp => map1!(v, a, out, n, |x| x.exp()),
                UnaryOp::Log => map1!(v, a, out, n, |x| x.ln()),
                UnaryOp::Sqrt => map1!(v, a, out, n, |x| x.sqrt()),
                UnaryOp::Rsqrt => map1!(v, a, out, n, |x| 1.0 / x.sqrt()),
                UnaryOp::Square => map1!(v, a, out, n, |x| x * x),
                UnaryOp::Recip => map1!(v, a, out, n, |x| 1.0 / x),
                // `x > 0` is false for NaN, and `x != x` keeps it: NaN propagates.
                UnaryOp::Relu => map1!(v, a, out, n, |x| if x > 0.0 || x.is_nan() {
                    x
                } else {
                    0.0
                }),
                UnaryOp::Sigmoid => map1!(v, a, out, n, |x| {
                    if x >= 0.0 {
                        1.0 / (1.0 + (-x).exp())
                    } else {
                        let e = x.exp();
                        e / (1.0 + e)
                    }
                }),
                UnaryOp::Tanh => map1!(v, a, out, n, |x| x.tanh()),
                UnaryOp::Floor => map1!(v, a, out, n, |x| x.floor()),
                UnaryOp::Not => {}
            }
        }
        Class::F64 => {
            let v = &mut r.f64;
            map1!(v, a, out, n, |x| crate::ir::scalar::unary(u, x, DType::F64));
        }
        Class::I64 => {
            let v = &mut r.i64;
            match u {
                UnaryOp::Neg => map1!(v, a, out, n, |x| x.wrapping_neg()),
                UnaryOp::Abs => map1!(v, a, out, n, |x| x.wrapping_abs()),
                UnaryOp::Sign => map1!(v, a, out, n, |x| x.signum()),
                UnaryOp::Square => map1!(v, a, out, n, |x| x.wrapping_mul(x)),
                _ => map1!(v, a, out, n, |x| x),
            }
        }
        Class::Bool => {
            let v = &mut r.bool;
            map1!(v, a, out, n, |x| !x);
        }
    }
}

/// Two operands of one class into a result of the same class (`x, y < out`).
macro_rules! map2 {
    ($v:expr, $x:expr, $y:expr, $out:expr, $n:expr, |$a:ident, $b:ident| $body:expr) => {{
        let (src, dst) = $v.split_at_mut($out);
        let (xs, ys) = (&src[$x..$x + $n], &src[$y..$y + $n]);
        for ((o, &$a), &$b) in dst[..$n].iter_mut().zip(xs).zip(ys) {
            *o = $body;
        }
    }};
}

/// A comparison of two operands of one class into a boolean register.
macro_rules! cmp2 {
    ($src:expr, $bools:expr, $x:expr, $y:expr, $out:expr, $n:expr, |$a:ident, $b:ident| $body:expr) => {{
        let (xs, ys) = (&$src[$x..$x + $n], &$src[$y..$y + $n]);
        for ((o, &$a), &$b) in $bools[$out..$out + $n].iter_mut().zip(xs).zip(ys) {
            *o = $body;
        }
    }};
}

macro_rules! cmp {
    ($src:expr, $bools:expr, $b:expr, $x:expr, $y:expr, $out:expr, $n:expr) => {{
        match $b {
            BinaryOp::Eq => cmp2!($src, $bools, $x, $y, $out, $n, |a, b| a == b),
            BinaryOp::Ne => cmp2!($src, $bools, $x, $y, $out, $n, |a, b| a != b),
            BinaryOp::Lt => cmp2!($src, $bools, $x, $y, $out, $n, |a, b| a < b),
            BinaryOp::Le => cmp2!($src, $bools, $x, $y, $out, $n, |a, b| a <= b),
            BinaryOp::Gt => cmp2!($src, $bools, $x, $y, $out, $n, |a, b| a > b),
            _ => cmp2!($src, $bools, $x, $y, $out, $n, |a, b| a >= b),
        }
    }};
}

#[allow(clippy::too_many_arguments)] // registers, classes, op and three lane offsets.
#[inline(always)]
pub(super) fn binary(
    r: &mut Regs,
    operand: Class,
    result: Class,
    b: BinaryOp,
    x: usize,
    y: usize,
    out: usize,
    n: usize,
) {
    if b.is_comparison() {
        let Regs {
            f32,
            f64,
            i64,
            bool,
            ..
        } = r;
        match operand {
            Class::F32 => cmp!(f32, bool, b, x, y, out, n),
            Class::F64 => cmp!(f64, bool, b, x, y, out, n),
            Class::I64 => cmp!(i64, bool, b, x, y, out, n),
            Class::Bool => {
                let v = bool;
                match b {
                    BinaryOp::Eq => map2!(v, x, y, out, n, |a, c| a == c),
                    BinaryOp::Ne => map2!(v, x, y, out, n, |a, c| a != c),
                    BinaryOp::Lt => map2!(v, x, y, out, n, |a, c| !a & c),
                    BinaryOp::Le => map2!(v, x, y, out, n, |a, c| a <= c),
                    BinaryOp::Gt => map2!(v, x, y, out, n, |a, c| a & !c),
                    _ => map2!(v, x, y, out, n, |a, c| a >= c),
                }
            }
        }
        return;
    }
    debug_assert_eq!(operand, result);
    match operand {
        Class::F32 => {
            let v = &mut r.f32;
            match b {
                BinaryOp::Add => map2!(v, x, y, out, n, |a, c| a + c),
                BinaryOp::Sub => map2!(v, x, y, out, n, |a, c| a - c),
                BinaryOp::Mul => map2!(v, x, y, out, n, |a, c| a * c),
                BinaryOp::Div => map2!(v, x, y, out, n, |a, c| a / c),
                BinaryOp::Pow => map2!(v, x, y, out, n, |a, c| a.powf(c)),
                BinaryOp::Maximum => map2!(v, x, y, out, n, |a, c| if a.is_nan() || c.is_nan() {
                    f32::NAN
                } else if a > c {
                    a
                } else {
                    c
                }),
                BinaryOp::Minimum => map2!(v, x, y, out, n, |a, c| if a.is_nan() || c.is_nan() {
                    f32::NAN
                } else if a < c {
                    a
                } else {
                    c
                }),
                _ => {}
            }
        }
        Class::F64 => {
            let v = &mut r.f64;
            map2!(v, x, y, out, n, |a, c| crate::ir::scalar::binary(
                b,
                a,
                c,
                DType::F64
            ));
        }
        Class::I64 => {
            let v = &mut r.i64;
            match b {
                BinaryOp::Add => map2!(v, x, y, out, n, |a, c| a.wrapping_add(c)),
                BinaryOp::Sub => map2!(v, x, y, out, n, |a, c| a.wrapping_sub(c)),
                BinaryOp::Mul => map2!(v, x, y, out, n, |a, c| a.wrapping_mul(c)),
                BinaryOp::Div => map2!(v, x, y, out, n, |a, c| if c == 0 {
                    0
                } else {
                    a.wrapping_div(c)
                }),
                BinaryOp::Pow => map2!(v, x, y, out, n, |a, c| (a as f64).powf(c as f64) as i64),
                BinaryOp::Maximum => map2!(v, x, y, out, n, |a, c| a.max(c)),
                BinaryOp::Minimum => map2!(v, x, y, out, n, |a, c| a.min(c)),
                _ => {}
            }
        }
        Class::Bool => {
            let v = &mut r.bool;
            match b {
                BinaryOp::And => map2!(v, x, y, out, n, |a, c| a & c),
                BinaryOp::Or => map2!(v, x, y, out, n, |a, c| a | c),
                _ => {}
            }
        }
    }
}

#[inline(always)]
pub(super) fn select(
    r: &mut Regs,
    c: Class,
    cond: usize,
    a: usize,
    b: usize,
    out: usize,
    n: usize,
) {
    let Regs {
        f32,
        f64,
        i64,
        bool,
        ..
    } = r;
    macro_rules! blend {
        ($v:expr, $m:expr) => {{
            let (src, dst) = $v.split_at_mut(out);
            let (xs, ys) = (&src[a..a + n], &src[b..b + n]);
            for (((o, &m), &x), &y) in dst[..n].iter_mut().zip($m).zip(xs).zip(ys) {
                *o = if m { x } else { y };
            }
        }};
    }
    match c {
        // A bitwise blend (the same bits as choosing), which vectorises where `if` does not.
        Class::F32 => {
            let (src, dst) = f32.split_at_mut(out);
            let (xs, ys) = (&src[a..a + n], &src[b..b + n]);
            let mask = &bool[cond..cond + n];
            for (((o, &m), &x), &y) in dst[..n].iter_mut().zip(mask).zip(xs).zip(ys) {
                let keep = 0u32.wrapping_sub(u32::from(m));
                *o = f32::from_bits((x.to_bits() & keep) | (y.to_bits() & !keep));
            }
        }
        Class::F64 => blend!(f64, &bool[cond..cond + n]),
        Class::I64 => blend!(i64, &bool[cond..cond + n]),
        Class::Bool => {
            // The mask and the branches share the boolean registers; all precede `out`.
            let (src, dst) = bool.split_at_mut(out);
            for j in 0..n {
                dst[j] = if src[cond + j] {
                    src[a + j]
                } else {
                    src[b + j]
                };
            }
        }
    }
}

#[inline(always)]
pub(super) fn cast(
    r: &mut Regs,
    from: Class,
    to: Class,
    dt: DType,
    a: usize,
    out: usize,
    n: usize,
) {
    let Regs {
        f32,
        f64,
        i64,
        bool,
        ..
    } = r;
    // The hot casts (masks to floats, labels to floats, same-class copies) without widening.
    match (from, to, dt) {
        (Class::Bool, Class::F32, DType::F32) => {
            for (o, &m) in f32[out..out + n].iter_mut().zip(&bool[a..a + n]) {
                *o = if m { 1.0 } else { 0.0 };
            }
            return;
        }
        (Class::I64, Class::F32, DType::F32) => {
            for (o, &x) in f32[out..out + n].iter_mut().zip(&i64[a..a + n]) {
                *o = x as f32;
            }
            return;
        }
        (Class::F32, Class::Bool, _) => {
            for (o, &x) in bool[out..out + n].iter_mut().zip(&f32[a..a + n]) {
                *o = x != 0.0;
            }
            return;
        }
        (Class::I64, Class::I64, DType::I64) => {
            i64.copy_within(a..a + n, out);
            return;
        }
        (Class::F32, Class::F32, DType::F32) => {
            f32.copy_within(a..a + n, out);
            return;
        }
        (Class::F32, Class::F32, DType::BF16) if a + n <= out || out + n <= a => {
            // A bf16 value held in f32 lanes: rounded to nearest even (what the store of an
            // activation kept in bf16 does, `lower::half_storage`).
            let (x, y) = if a < out {
                let (lo, hi) = f32.split_at_mut(out);
                (&lo[a..a + n], &mut hi[..n])
            } else {
                let (lo, hi) = f32.split_at_mut(a);
                (&hi[..n], &mut lo[out..out + n])
            };
            round_bf16(x, y);
            return;
        }
        _ => {}
    }
    for j in 0..n {
        let x = match from {
            Class::F32 => f64::from(f32[a + j]),
            Class::F64 => f64[a + j],
            Class::I64 => i64[a + j] as f64,
            Class::Bool => f64::from(u8::from(bool[a + j])),
        };
        let y = crate::ir::scalar::cast(x, dt);
        match to {
            Class::F32 => f32[out + j] = y as f32,
            Class::F64 => f64[out + j] = y,
            Class::I64 => i64[out + j] = y as i64,
            Class::Bool => bool[out + j] = y != 0.0,
        }
    }
}

/// A lane of a chain's `x` as stored: `f32`, or bf16 bits (widened exactly).
pub(super) trait Lane: Copy {
    fn widen(self) -> f32;
}

impl Lane for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Lane for u16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        crate::backend::cpu::kernels::round::bf16_to_f32(self)
    }
}

/// An affine chain ([`super::plan::AffineChain`]) in one pass: `relu?(((x − a)·b)·c + d)`
/// lane by lane into `dst` from `xs` and the registers at `steps = [a, b, c, d]` of `src`,
/// the operations in that order and the ReLU as [`unary`]'s, so the lanes are bit-identical
/// to the instructions' one pass each.
#[inline(always)]
pub(super) fn affine<X: Lane>(
    xs: &[X],
    src: &[f32],
    steps: [usize; 4],
    relu: bool,
    dst: &mut [f32],
) {
    let n = dst.len();
    let xs = &xs[..n];
    let [a, b, c, d] = steps.map(|k| &src[k..k + n]);
    let lanes = dst.iter_mut().zip(xs).zip(a).zip(b).zip(c).zip(d);
    if relu {
        for (((((o, &x), &a), &b), &c), &d) in lanes {
            let v = (x.widen() - a) * b * c + d;
            *o = if v > 0.0 || v.is_nan() { v } else { 0.0 };
        }
    } else {
        for (((((o, &x), &a), &b), &c), &d) in lanes {
            *o = (x.widen() - a) * b * c + d;
        }
    }
}

/// `cmp(p, q) ? a : b` lane by lane in one pass into `dst`, from `lanes = [p, q, a, b]`: the
/// comparison as [`binary`]'s and the choice as [`select`]'s bitwise blend, so the lanes are
/// bit-identical to the two passes it replaces.
#[inline(always)]
pub(super) fn select_compared(lanes: [&[f32]; 4], cmp: BinaryOp, dst: &mut [f32]) {
    let n = dst.len();
    let [p, q, a, b] = lanes.map(|l| &l[..n]);
    let lanes = dst.iter_mut().zip(p).zip(q).zip(a).zip(b);
    macro_rules! blend {
        (|$x:ident, $y:ident| $test:expr) => {
            for ((((o, &$x), &$y), &a), &b) in lanes {
                let keep = 0u32.wrapping_sub(u32::from($test));
                *o = f32::from_bits((a.to_bits() & keep) | (b.to_bits() & !keep));
            }
        };
    }
    match cmp {
        BinaryOp::Eq => blend!(|x, y| x == y),
        BinaryOp::Ne => blend!(|x, y| x != y),
        BinaryOp::Lt => blend!(|x, y| x < y),
        BinaryOp::Le => blend!(|x, y| x <= y),
        BinaryOp::Gt => blend!(|x, y| x > y),
        _ => blend!(|x, y| x >= y),
    }
}

/// `xs` rounded to bf16 (nearest even), kept in f32 lanes: the cast of an `f32` value to a bf16
/// one.
#[inline(always)]
pub(super) fn round_bf16(xs: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(xs) {
        *o = crate::lower::HalfFormat::Bf16.round(x);
    }
}
