//! Integer handlers: add/sub/mul/div/rem/min/max/logic on the 32- and 64-bit files, shifts,
//! `mad`, `mul.wide`, bit-field and byte-permute operations, and `mov` packing. Division by zero
//! never traps (PTX leaves the result unspecified): quotients are all-ones, remainders the dividend.

use super::lanes::{WARP, blend, map1_32, map1_64, map2_32, map2_64, map3_32, map3_64};
use crate::inst::{IntOp, IntUnOp, ShiftOp};

pub fn int32(op: IntOp, r: &mut [[u32; WARP]], m: u32, d: u32, a: u32, b: u32) {
    use IntOp::*;
    match op {
        Add => map2_32(r, m, d, a, b, |x, y| x.wrapping_add(y)),
        AddSatS => map2_32(r, m, d, a, b, |x, y| {
            (x as i32).saturating_add(y as i32) as u32
        }),
        Sub => map2_32(r, m, d, a, b, |x, y| x.wrapping_sub(y)),
        SubSatS => map2_32(r, m, d, a, b, |x, y| {
            (x as i32).saturating_sub(y as i32) as u32
        }),
        MulLo => map2_32(r, m, d, a, b, |x, y| x.wrapping_mul(y)),
        MulHiS => map2_32(r, m, d, a, b, |x, y| {
            ((i64::from(x as i32) * i64::from(y as i32)) >> 32) as u32
        }),
        MulHiU => map2_32(r, m, d, a, b, |x, y| {
            ((u64::from(x) * u64::from(y)) >> 32) as u32
        }),
        MinS => map2_32(r, m, d, a, b, |x, y| (x as i32).min(y as i32) as u32),
        MinU => map2_32(r, m, d, a, b, |x, y| x.min(y)),
        MaxS => map2_32(r, m, d, a, b, |x, y| (x as i32).max(y as i32) as u32),
        MaxU => map2_32(r, m, d, a, b, |x, y| x.max(y)),
        And => map2_32(r, m, d, a, b, |x, y| x & y),
        Or => map2_32(r, m, d, a, b, |x, y| x | y),
        Xor => map2_32(r, m, d, a, b, |x, y| x ^ y),
        DivS => map2_32(r, m, d, a, b, |x, y| {
            (x as i32)
                .checked_div(y as i32)
                .map_or(if y == 0 { u32::MAX } else { x }, |q| q as u32)
        }),
        DivU => map2_32(r, m, d, a, b, |x, y| x.checked_div(y).unwrap_or(u32::MAX)),
        RemS => map2_32(r, m, d, a, b, |x, y| {
            (x as i32)
                .checked_rem(y as i32)
                .map_or(if y == 0 { x } else { 0 }, |q| q as u32)
        }),
        RemU => map2_32(r, m, d, a, b, |x, y| x.checked_rem(y).unwrap_or(x)),
    }
}

pub fn int64(op: IntOp, r: &mut [[u64; WARP]], m: u32, d: u32, a: u32, b: u32) {
    use IntOp::*;
    match op {
        Add => map2_64(r, m, d, a, b, |x, y| x.wrapping_add(y)),
        AddSatS => map2_64(r, m, d, a, b, |x, y| {
            (x as i64).saturating_add(y as i64) as u64
        }),
        Sub => map2_64(r, m, d, a, b, |x, y| x.wrapping_sub(y)),
        SubSatS => map2_64(r, m, d, a, b, |x, y| {
            (x as i64).saturating_sub(y as i64) as u64
        }),
        MulLo => map2_64(r, m, d, a, b, |x, y| x.wrapping_mul(y)),
        MulHiS => map2_64(r, m, d, a, b, |x, y| {
            ((i128::from(x as i64) * i128::from(y as i64)) >> 64) as u64
        }),
        MulHiU => map2_64(r, m, d, a, b, |x, y| {
            ((u128::from(x) * u128::from(y)) >> 64) as u64
        }),
        MinS => map2_64(r, m, d, a, b, |x, y| (x as i64).min(y as i64) as u64),
        MinU => map2_64(r, m, d, a, b, |x, y| x.min(y)),
        MaxS => map2_64(r, m, d, a, b, |x, y| (x as i64).max(y as i64) as u64),
        MaxU => map2_64(r, m, d, a, b, |x, y| x.max(y)),
        And => map2_64(r, m, d, a, b, |x, y| x & y),
        Or => map2_64(r, m, d, a, b, |x, y| x | y),
        Xor => map2_64(r, m, d, a, b, |x, y| x ^ y),
        DivS => map2_64(r, m, d, a, b, |x, y| {
            (x as i64)
                .checked_div(y as i64)
                .map_or(if y == 0 { u64::MAX } else { x }, |q| q as u64)
        }),
        DivU => map2_64(r, m, d, a, b, |x, y| x.checked_div(y).unwrap_or(u64::MAX)),
        RemS => map2_64(r, m, d, a, b, |x, y| {
            (x as i64)
                .checked_rem(y as i64)
                .map_or(if y == 0 { x } else { 0 }, |q| q as u64)
        }),
        RemU => map2_64(r, m, d, a, b, |x, y| x.checked_rem(y).unwrap_or(x)),
    }
}

/// Shifts clamp: amounts ≥ the width give 0 (or the sign fill for `shr.s`).
pub fn shift32(op: ShiftOp, r: &mut [[u32; WARP]], m: u32, d: u32, a: u32, b: u32) {
    match op {
        ShiftOp::Shl => map2_32(r, m, d, a, b, |x, s| x.checked_shl(s).unwrap_or(0)),
        ShiftOp::ShrU => map2_32(r, m, d, a, b, |x, s| x.checked_shr(s).unwrap_or(0)),
        ShiftOp::ShrS => map2_32(r, m, d, a, b, |x, s| ((x as i32) >> s.min(31)) as u32),
    }
}

/// A 16-bit shift: amounts of 16 or more shift everything out (sign fill for `shr.s16`).
pub fn shift16(op: ShiftOp, r: &mut [[u32; WARP]], m: u32, d: u32, a: u32, b: u32) {
    match op {
        ShiftOp::Shl => map2_32(r, m, d, a, b, |x, s| x.checked_shl(s).unwrap_or(0) & 0xffff),
        ShiftOp::ShrU => map2_32(r, m, d, a, b, |x, s| {
            (x & 0xffff).checked_shr(s).unwrap_or(0)
        }),
        ShiftOp::ShrS => map2_32(r, m, d, a, b, |x, s| {
            ((i32::from(x as u16 as i16) >> s.min(15)) as u32) & 0xffff
        }),
    }
}

pub fn shift64(
    op: ShiftOp,
    r64: &mut [[u64; WARP]],
    r32: &[[u32; WARP]],
    m: u32,
    d: u32,
    a: u32,
    b: u32,
) {
    let (av, sv) = (r64[a as usize], r32[b as usize]);
    let out: [u64; WARP] = match op {
        ShiftOp::Shl => std::array::from_fn(|l| av[l].checked_shl(sv[l]).unwrap_or(0)),
        ShiftOp::ShrU => std::array::from_fn(|l| av[l].checked_shr(sv[l]).unwrap_or(0)),
        ShiftOp::ShrS => std::array::from_fn(|l| ((av[l] as i64) >> sv[l].min(63)) as u64),
    };
    blend(&mut r64[d as usize], &out, m);
}

pub fn unary32(op: IntUnOp, r: &mut [[u32; WARP]], m: u32, d: u32, a: u32) {
    match op {
        IntUnOp::Neg => map1_32(r, m, d, a, |x| x.wrapping_neg()),
        IntUnOp::Not => map1_32(r, m, d, a, |x| !x),
        IntUnOp::Cnot => map1_32(r, m, d, a, |x| u32::from(x == 0)),
        IntUnOp::Abs => map1_32(r, m, d, a, |x| (x as i32).wrapping_abs() as u32),
        IntUnOp::Brev => map1_32(r, m, d, a, u32::reverse_bits),
    }
}

pub fn unary64(op: IntUnOp, r: &mut [[u64; WARP]], m: u32, d: u32, a: u32) {
    match op {
        IntUnOp::Neg => map1_64(r, m, d, a, |x| x.wrapping_neg()),
        IntUnOp::Not => map1_64(r, m, d, a, |x| !x),
        IntUnOp::Cnot => map1_64(r, m, d, a, |x| u64::from(x == 0)),
        IntUnOp::Abs => map1_64(r, m, d, a, |x| (x as i64).wrapping_abs() as u64),
        IntUnOp::Brev => map1_64(r, m, d, a, u64::reverse_bits),
    }
}

/// `popc`/`clz` of a 64-bit register into a 32-bit one.
pub fn count64(r32: &mut [[u32; WARP]], r64: &[[u64; WARP]], m: u32, d: u32, a: u32, clz: bool) {
    let av = r64[a as usize];
    let out: [u32; WARP] = if clz {
        std::array::from_fn(|l| av[l].leading_zeros())
    } else {
        std::array::from_fn(|l| av[l].count_ones())
    };
    blend(&mut r32[d as usize], &out, m);
}

pub fn mad32(r: &mut [[u32; WARP]], m: u32, hi: bool, signed: bool, regs: (u32, u32, u32, u32)) {
    match (hi, signed) {
        (false, _) => map3_32(r, m, regs, |x, y, z| x.wrapping_mul(y).wrapping_add(z)),
        (true, true) => map3_32(r, m, regs, |x, y, z| {
            (((i64::from(x as i32) * i64::from(y as i32)) >> 32) as u32).wrapping_add(z)
        }),
        (true, false) => map3_32(r, m, regs, |x, y, z| {
            (((u64::from(x) * u64::from(y)) >> 32) as u32).wrapping_add(z)
        }),
    }
}

pub fn mad64(r: &mut [[u64; WARP]], m: u32, hi: bool, signed: bool, regs: (u32, u32, u32, u32)) {
    match (hi, signed) {
        (false, _) => map3_64(r, m, regs, |x, y, z| x.wrapping_mul(y).wrapping_add(z)),
        (true, true) => map3_64(r, m, regs, |x, y, z| {
            (((i128::from(x as i64) * i128::from(y as i64)) >> 64) as u64).wrapping_add(z)
        }),
        (true, false) => map3_64(r, m, regs, |x, y, z| {
            (((u128::from(x) * u128::from(y)) >> 64) as u64).wrapping_add(z)
        }),
    }
}

/// `mul.wide` (and `mad.wide` when `c` is given): 32×32 → 64.
pub fn mul_wide(
    r64: &mut [[u64; WARP]],
    r32: &[[u32; WARP]],
    m: u32,
    signed: bool,
    (d, a, b): (u32, u32, u32),
    c: Option<u32>,
) {
    let (av, bv) = (r32[a as usize], r32[b as usize]);
    let cv = c.map_or([0u64; WARP], |c| r64[c as usize]);
    let out: [u64; WARP] = if signed {
        std::array::from_fn(|l| {
            (i64::from(av[l] as i32) * i64::from(bv[l] as i32)).wrapping_add(cv[l] as i64) as u64
        })
    } else {
        std::array::from_fn(|l| (u64::from(av[l]) * u64::from(bv[l])).wrapping_add(cv[l]))
    };
    blend(&mut r64[d as usize], &out, m);
}

/// 16-bit `op`: operands extended from 16 bits (sign-extended when `signed`), evaluated as the
/// 32-bit op, truncated back to 16 bits (the low bits of every op on extended values are the
/// 16-bit result).
pub fn int16(op: IntOp, signed: bool, r: &mut [[u32; WARP]], m: u32, d: u32, a: u32, b: u32) {
    let ext = |x: u32| {
        if signed {
            i32::from(x as u16 as i16) as u32
        } else {
            x & 0xffff
        }
    };
    let mut t = [r[a as usize].map(ext), r[b as usize].map(ext), [0u32; WARP]];
    int32(op, &mut t, m, 2, 0, 1);
    blend(&mut r[d as usize], &t[2].map(|x| x & 0xffff), m);
}

/// `mul.wide.{s,u}16`: 16×16 → 32.
pub fn mul_wide16(r: &mut [[u32; WARP]], m: u32, signed: bool, d: u32, a: u32, b: u32) {
    if signed {
        map2_32(r, m, d, a, b, |x, y| {
            (i32::from(x as i16) * i32::from(y as i16)) as u32
        });
    } else {
        map2_32(r, m, d, a, b, |x, y| (x & 0xffff) * (y & 0xffff));
    }
}

/// Bit-field extract on a value of `width` bits (PTX `bfe` semantics).
pub fn bfe(x: u64, pos: u32, len: u32, width: u32, signed: bool) -> u64 {
    let (pos, len) = (pos & 0xff, len & 0xff);
    let msb = width - 1;
    let sbit = if signed && len > 0 {
        (x >> (pos + len - 1).min(msb)) & 1
    } else {
        0
    };
    let mut out = 0u64;
    for i in 0..width {
        let bit = if i < len && pos + i <= msb {
            (x >> (pos + i)) & 1
        } else {
            sbit
        };
        out |= bit << i;
    }
    out
}

/// Bit-field insert: the low `len` bits of `field` into `base` at `pos` (PTX `bfi`).
pub fn bfi(field: u64, base: u64, pos: u32, len: u32, width: u32) -> u64 {
    let (pos, len) = (pos & 0xff, len & 0xff);
    let mut out = base;
    for i in 0..len {
        if pos + i >= width {
            break;
        }
        let bit = (field >> i) & 1;
        out = (out & !(1 << (pos + i))) | (bit << (pos + i));
    }
    out
}

/// `dp4a` (`half: None`) and `dp2a.lo`/`.hi` (`half: Some(hi)`): `c` plus the products of
/// `a`'s bytes (or 16-bit halves) with `b`'s bytes (all four, or 0-1 / 2-3), each extended by
/// its signedness, the sum modulo 2^32.
pub fn dot(half: Option<bool>, a_signed: bool, b_signed: bool, a: u32, b: u32, c: u32) -> u32 {
    let part = |x: u32, bits: u32, signed: bool| -> i64 {
        let v = x & ((1u32 << bits) - 1);
        if signed && v >> (bits - 1) != 0 {
            i64::from(v) - (1i64 << bits)
        } else {
            i64::from(v)
        }
    };
    let byte = |i: u32| part(b >> (8 * i), 8, b_signed);
    let sum: i64 = match half {
        None => (0..4)
            .map(|i| part(a >> (8 * i), 8, a_signed) * byte(i))
            .sum(),
        Some(hi) => {
            let first = if hi { 2 } else { 0 };
            (0..2)
                .map(|i| part(a >> (16 * i), 16, a_signed) * byte(first + i))
                .sum()
        }
    };
    (i64::from(c) + sum) as u32
}

/// Byte permute, default mode.
pub fn prmt(a: u32, b: u32, c: u32) -> u32 {
    let bytes = (u64::from(b) << 32) | u64::from(a);
    let mut out = 0u32;
    for i in 0..4 {
        let sel = (c >> (4 * i)) & 0xf;
        let mut byte = ((bytes >> (8 * (sel & 7))) & 0xff) as u32;
        if sel & 8 != 0 {
            byte = if byte & 0x80 != 0 { 0xff } else { 0 };
        }
        out |= byte << (8 * i);
    }
    out
}

/// Three-input logic by lookup table.
pub fn lop3(a: u32, b: u32, c: u32, lut: u8) -> u32 {
    let mut out = 0u32;
    for i in 0..8 {
        if (lut >> i) & 1 != 0 {
            let pa = if i & 4 != 0 { a } else { !a };
            let pb = if i & 2 != 0 { b } else { !b };
            let pc = if i & 1 != 0 { c } else { !c };
            out |= pa & pb & pc;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_field_ops_follow_ptx() {
        assert_eq!(bfe(0xF0, 4, 4, 32, false), 0xF);
        assert_eq!(bfe(0xF0, 4, 4, 32, true), 0xFFFF_FFFF);
        assert_eq!(bfe(0x80, 4, 0, 32, true), 0);
        assert_eq!(bfe(0x8000_0000, 31, 8, 32, true), 0xFFFF_FFFF);
        assert_eq!(bfi(0b101, 0xFF00, 4, 3, 32), 0xFF50);
        assert_eq!(bfi(0xF, 0, 30, 4, 32), 0xC000_0000);
        assert_eq!(prmt(0x4433_2211, 0x8877_6655, 0x3210), 0x4433_2211);
        assert_eq!(prmt(0x4433_2211, 0x8877_6655, 0x7654), 0x8877_6655);
        assert_eq!(prmt(0x0000_0080, 0, 0x0008), 0x8080_80ff);
        assert_eq!(lop3(0xF0, 0xCC, 0xAA, 0x80), 0xF0 & 0xCC & 0xAA);
        assert_eq!(lop3(0xF0, 0xCC, 0xAA, 0x96), 0xF0 ^ 0xCC ^ 0xAA);
    }

    #[test]
    fn division_by_zero_does_not_trap() {
        let mut r = vec![[0u32; WARP]; 3];
        r[0] = [7; WARP];
        int32(IntOp::DivU, &mut r, u32::MAX, 2, 0, 1);
        assert_eq!(r[2][0], u32::MAX);
        int32(IntOp::RemS, &mut r, u32::MAX, 2, 0, 1);
        assert_eq!(r[2][0], 7);
        r[0] = [i32::MIN as u32; WARP];
        r[1] = [-1i32 as u32; WARP];
        int32(IntOp::DivS, &mut r, u32::MAX, 2, 0, 1);
        assert_eq!(r[2][0], i32::MIN as u32);
    }
}
