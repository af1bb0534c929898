//! Comparison and selection: `setp` (ordered and unordered float comparisons, signed and unsigned
//! integers, optional `.and/.or/.xor` with a third predicate and the complement destination),
//! `testp`, `selp`, and predicate logic. Predicates are per-warp bitmasks.

use super::float::half_to_f64;
use super::lanes::{Regs, WARP, blend, blend_pred, cmp_bits};
use crate::inst::{BoolOp, Cmp, CmpTy, R};

macro_rules! float_cmp {
    ($cmp:expr, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        match $cmp {
            Cmp::Eq => cmp_bits(&a, &b, |x, y| x == y),
            Cmp::Ne => cmp_bits(&a, &b, |x, y| !x.is_nan() && !y.is_nan() && x != y),
            Cmp::Lt => cmp_bits(&a, &b, |x, y| x < y),
            Cmp::Le => cmp_bits(&a, &b, |x, y| x <= y),
            Cmp::Gt => cmp_bits(&a, &b, |x, y| x > y),
            Cmp::Ge => cmp_bits(&a, &b, |x, y| x >= y),
            Cmp::Equ => cmp_bits(&a, &b, |x, y| x.is_nan() || y.is_nan() || x == y),
            Cmp::Neu => cmp_bits(&a, &b, |x, y| x != y),
            Cmp::Ltu => cmp_bits(&a, &b, |x, y| x.is_nan() || y.is_nan() || x < y),
            Cmp::Leu => cmp_bits(&a, &b, |x, y| x.is_nan() || y.is_nan() || x <= y),
            Cmp::Gtu => cmp_bits(&a, &b, |x, y| x.is_nan() || y.is_nan() || x > y),
            Cmp::Geu => cmp_bits(&a, &b, |x, y| x.is_nan() || y.is_nan() || x >= y),
            Cmp::Num => cmp_bits(&a, &b, |x, y| !x.is_nan() && !y.is_nan()),
            Cmp::Nan => cmp_bits(&a, &b, |x, y| x.is_nan() || y.is_nan()),
        }
    }};
}

macro_rules! int_cmp {
    ($cmp:expr, $a:expr, $b:expr) => {{
        let (a, b) = ($a, $b);
        match $cmp {
            Cmp::Eq => cmp_bits(&a, &b, |x, y| x == y),
            Cmp::Ne => cmp_bits(&a, &b, |x, y| x != y),
            Cmp::Lt => cmp_bits(&a, &b, |x, y| x < y),
            Cmp::Le => cmp_bits(&a, &b, |x, y| x <= y),
            Cmp::Gt => cmp_bits(&a, &b, |x, y| x > y),
            Cmp::Ge => cmp_bits(&a, &b, |x, y| x >= y),
            // The decoder only accepts the six ordered comparisons on integers.
            _ => 0,
        }
    }};
}

fn comparison(regs: &Regs, cmp: Cmp, ty: CmpTy, a: R, b: R) -> u32 {
    let (a, b) = (a as usize, b as usize);
    let r32 = |i: usize| &regs.r32[i];
    let r64 = |i: usize| &regs.r64[i];
    match ty {
        CmpTy::S16 => int_cmp!(
            cmp,
            r32(a).map(|x| x as u16 as i16),
            r32(b).map(|x| x as u16 as i16)
        ),
        CmpTy::U16 => int_cmp!(cmp, r32(a).map(|x| x as u16), r32(b).map(|x| x as u16)),
        CmpTy::S32 => int_cmp!(cmp, r32(a).map(|x| x as i32), r32(b).map(|x| x as i32)),
        CmpTy::U32 => int_cmp!(cmp, *r32(a), *r32(b)),
        CmpTy::S64 => int_cmp!(cmp, r64(a).map(|x| x as i64), r64(b).map(|x| x as i64)),
        CmpTy::U64 => int_cmp!(cmp, *r64(a), *r64(b)),
        CmpTy::F32 => float_cmp!(cmp, r32(a).map(f32::from_bits), r32(b).map(f32::from_bits)),
        CmpTy::F64 => float_cmp!(cmp, r64(a).map(f64::from_bits), r64(b).map(f64::from_bits)),
        CmpTy::F16 | CmpTy::BF16 => {
            let bf = ty == CmpTy::BF16;
            float_cmp!(
                cmp,
                r32(a).map(|x| half_to_f64(x as u16, bf)),
                r32(b).map(|x| half_to_f64(x as u16, bf))
            )
        }
    }
}

fn combine(op: BoolOp, x: u32, y: u32) -> u32 {
    match op {
        BoolOp::And => x & y,
        BoolOp::Or => x | y,
        BoolOp::Xor => x ^ y,
    }
}

#[allow(clippy::too_many_arguments)]
pub fn setp(
    regs: &mut Regs,
    m: u32,
    cmp: Cmp,
    ty: CmpTy,
    (p, q): (R, Option<R>),
    a: R,
    b: R,
    comb: Option<(BoolOp, R, bool)>,
) {
    let t = comparison(regs, cmp, ty, a, b);
    let (tp, tq) = match comb {
        None => (t, !t),
        Some((op, c, neg)) => {
            let cv = regs.pred[c as usize] ^ if neg { u32::MAX } else { 0 };
            (combine(op, t, cv), combine(op, !t, cv))
        }
    };
    blend_pred(&mut regs.pred[p as usize], tp, m);
    if let Some(q) = q {
        blend_pred(&mut regs.pred[q as usize], tq, m);
    }
}

/// `testp`: 0 finite, 1 infinite, 2 number, 3 notanumber, 4 normal, 5 subnormal.
pub fn testp(regs: &mut Regs, m: u32, kind: u8, wide: bool, p: R, a: R) {
    let classify = |x: f64, sub: bool| match kind {
        0 => x.is_finite(),
        1 => x.is_infinite(),
        2 => !x.is_nan(),
        3 => x.is_nan(),
        4 => x.is_normal() && !sub,
        _ => sub,
    };
    let mut bits = 0u32;
    for l in 0..WARP {
        let (x, sub) = if wide {
            let v = f64::from_bits(regs.r64[a as usize][l]);
            (v, v.is_subnormal())
        } else {
            let v = f32::from_bits(regs.r32[a as usize][l]);
            (f64::from(v), v.is_subnormal())
        };
        bits |= u32::from(classify(x, sub)) << l;
    }
    blend_pred(&mut regs.pred[p as usize], bits, m);
}

pub fn selp32(regs: &mut Regs, m: u32, d: R, a: R, b: R, p: R) {
    let (av, bv, pb) = (
        regs.r32[a as usize],
        regs.r32[b as usize],
        regs.pred[p as usize],
    );
    let out: [u32; WARP] = std::array::from_fn(|l| if (pb >> l) & 1 != 0 { av[l] } else { bv[l] });
    blend(&mut regs.r32[d as usize], &out, m);
}

pub fn selp64(regs: &mut Regs, m: u32, d: R, a: R, b: R, p: R) {
    let (av, bv, pb) = (
        regs.r64[a as usize],
        regs.r64[b as usize],
        regs.pred[p as usize],
    );
    let out: [u64; WARP] = std::array::from_fn(|l| if (pb >> l) & 1 != 0 { av[l] } else { bv[l] });
    blend(&mut regs.r64[d as usize], &out, m);
}

pub fn pred_bin(regs: &mut Regs, m: u32, op: BoolOp, d: R, a: R, b: R) {
    let v = combine(op, regs.pred[a as usize], regs.pred[b as usize]);
    blend_pred(&mut regs.pred[d as usize], v, m);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs_with(a: f32, b: f32) -> Regs {
        Regs {
            r32: vec![[a.to_bits(); WARP], [b.to_bits(); WARP]],
            r64: vec![],
            pred: vec![0; 2],
        }
    }

    #[test]
    fn ordered_and_unordered_float_comparisons() {
        let cases = [
            (Cmp::Lt, 1.0, 2.0, true),
            (Cmp::Lt, f32::NAN, 2.0, false),
            (Cmp::Ltu, f32::NAN, 2.0, true),
            (Cmp::Ne, f32::NAN, 2.0, false),
            (Cmp::Neu, f32::NAN, 2.0, true),
            (Cmp::Eq, 0.0, -0.0, true),
            (Cmp::Geu, 1.0, 2.0, false),
            (Cmp::Nan, 1.0, f32::NAN, true),
            (Cmp::Num, 1.0, 2.0, true),
        ];
        for (cmp, a, b, want) in cases {
            let mut r = regs_with(a, b);
            setp(&mut r, u32::MAX, cmp, CmpTy::F32, (0, Some(1)), 0, 1, None);
            assert_eq!(r.pred[0] == u32::MAX, want, "{cmp:?} {a} {b}");
            assert_eq!(r.pred[1] == 0, want, "complement of {cmp:?} {a} {b}");
        }
    }

    #[test]
    fn signed_versus_unsigned() {
        let mut r = Regs {
            r32: vec![[u32::MAX; WARP], [1; WARP]],
            r64: vec![],
            pred: vec![0],
        };
        setp(&mut r, u32::MAX, Cmp::Lt, CmpTy::S32, (0, None), 0, 1, None);
        assert_eq!(r.pred[0], u32::MAX, "-1 < 1 signed");
        setp(&mut r, u32::MAX, Cmp::Lt, CmpTy::U32, (0, None), 0, 1, None);
        assert_eq!(r.pred[0], 0, "0xffffffff > 1 unsigned");
    }
}
