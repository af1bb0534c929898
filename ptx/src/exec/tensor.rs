//! The warp-collective tensor-core instructions: `mma.sync.aligned` and `ldmatrix`.
//!
//! Fragments follow the PTX ISA's tables ("Matrix Fragments for mma.m16n8k16 with floating
//! point type", "... for mma.m16n8k8"; `groupID = lane >> 2`, `threadID_in_group = lane % 4`;
//! the lower 16 bits of a register hold the element with the lower index).
//!
//! **What `mma` computes.** The ISA leaves the accumulation order, its rounding and subnormal
//! handling unspecified ("at least single precision"). The emulator computes every element of
//! D as the exactly rounded value of `c + Σₖ a·b`: products of f16, bf16 or tf32 values are
//! exact in f64 (at most 22 significant bits), their sum is formed without error and rounded
//! once to f32, to nearest even. This is the most accurate result the ISA allows and is
//! deterministic; a GPU's result differs from it by its own accumulation error, at most about
//! `(K + 1) · 2⁻²³ · (|c| + Σ|a·b|)` for a K-deep product (a sequential f32 sum's bound; the
//! hardware's truncating adders stay within it), so tests of GPU kernels compare with
//! tolerances of that form. Subnormal inputs are honoured; NaN in, or ∞ − ∞, gives the
//! canonical NaN. tf32 operands are f32 bit patterns whose low 13 bits are ignored.
//!
//! **Warp-synchronous.** Both instructions are `.sync.aligned`: every thread of the warp must
//! execute the same instruction together. Anything else — a lane that branched around it,
//! exited, waits at a barrier or has a false guard — is `Fault::NotWarpUniform` (undefined
//! behaviour on hardware). `ldmatrix` row addresses must lie in shared memory and be 16-byte
//! aligned (`Fault::Misaligned` / `Fault::OutOfBounds` otherwise, naming the lane).

use super::CtaEnv;
use super::lanes::{Regs, WARP};
use super::memops::{LaneFault, addresses, read_le, shared_wavefronts, window};
use crate::error::{Fault, Space};
use crate::inst::{AddrBase, MmaShape, MmaTy, R};
use crate::memory::SHARED_BASE;
use crate::softfloat::{self, F32};

/// One element of a 16-bit or tf32 multiplicand, exactly, as f64.
#[inline(always)]
fn element(ty: MmaTy, bits: u32) -> f64 {
    match ty {
        MmaTy::BF16 => f64::from(f32::from_bits(bits << 16)),
        MmaTy::F16 => f64::from(half::f16::from_bits(bits as u16).to_f32()),
        MmaTy::TF32 if f32::from_bits(bits).is_nan() => f64::NAN,
        MmaTy::TF32 => f64::from(f32::from_bits(bits & 0xffff_e000)),
    }
}

/// `s + t` as the rounded sum and its exact error (Knuth's TwoSum).
#[inline(always)]
fn two_sum(s: f64, t: f64) -> (f64, f64) {
    let sum = s + t;
    let bp = sum - s;
    let err = (s - (sum - bp)) + (t - bp);
    (sum, err)
}

/// Limbs of the exact accumulator: two's complement, least significant bit 2^LSB. Terms are
/// products of f16/bf16/tf32 values (2⁻²⁷² ≤ |t| < 2²⁵⁶) and an f32 (≥ 2⁻¹⁴⁹), and at most 17
/// are summed, so 640 bits from 2⁻²⁸⁰ hold every sum with room for the sign.
const LIMBS: usize = 10;
const LSB: i32 = -280;

/// A fixed-point accumulator that adds f64 terms without rounding.
struct Exact([u64; LIMBS]);

impl Exact {
    fn add(&mut self, x: f64) {
        if x == 0.0 {
            return;
        }
        let bits = x.to_bits();
        let neg = bits >> 63 == 1;
        let e = ((bits >> 52) & 0x7ff) as i32;
        let frac = bits & ((1u64 << 52) - 1);
        let (mant, exp) = if e == 0 {
            (frac, -1074)
        } else {
            (frac | (1u64 << 52), e - 1075)
        };
        // Terms are within the window by the types of the operands (see LSB); the position is
        // clamped only so an impossible value cannot index out of the limbs.
        let pos = (exp - LSB).clamp(0, (64 * (LIMBS - 2)) as i32) as u32;
        let (limb, shift) = ((pos / 64) as usize, pos % 64);
        let lo = mant << shift;
        let hi = if shift == 0 { 0 } else { mant >> (64 - shift) };
        let mut carry;
        if neg {
            let (v, b0) = self.0[limb].overflowing_sub(lo);
            self.0[limb] = v;
            let (v, b1) = self.0[limb + 1].overflowing_sub(hi);
            let (v, b2) = v.overflowing_sub(u64::from(b0));
            self.0[limb + 1] = v;
            carry = b1 || b2;
            for l in &mut self.0[limb + 2..] {
                if !carry {
                    break;
                }
                let (v, b) = l.overflowing_sub(1);
                *l = v;
                carry = b;
            }
        } else {
            let (v, c0) = self.0[limb].overflowing_add(lo);
            self.0[limb] = v;
            let (v, c1) = self.0[limb + 1].overflowing_add(hi);
            let (v, c2) = v.overflowing_add(u64::from(c0));
            self.0[limb + 1] = v;
            carry = c1 || c2;
            for l in &mut self.0[limb + 2..] {
                if !carry {
                    break;
                }
                let (v, c) = l.overflowing_add(1);
                *l = v;
                carry = c;
            }
        }
    }

    /// The sum rounded once to f32, to nearest even (an exact zero is +0).
    fn round_f32(mut self) -> f32 {
        let neg = self.0[LIMBS - 1] >> 63 == 1;
        if neg {
            // Two's complement negation.
            let mut carry = true;
            for l in &mut self.0 {
                let (v, c) = (!*l).overflowing_add(u64::from(carry));
                *l = v;
                carry = c;
            }
        }
        let Some(top_limb) = (0..LIMBS).rev().find(|&i| self.0[i] != 0) else {
            return 0.0;
        };
        let top = top_limb as i32 * 64 + 63 - self.0[top_limb].leading_zeros() as i32;
        let bit = |i: i32| (self.0[(i / 64) as usize] >> (i % 64)) & 1;
        // The 64 bits ending at the leading one, and a sticky bit for everything below.
        let low = (top - 63).max(0);
        let mut mant: u128 = 0;
        for i in (low..=top).rev() {
            mant = (mant << 1) | u128::from(bit(i));
        }
        let sticky = (0..low).any(|i| bit(i) == 1);
        let mant = (mant << 1) | u128::from(sticky);
        let y = softfloat::round_exact(neg, mant, low + LSB - 1, F32, crate::inst::Rnd::Rn);
        y as f32
    }
}

/// `c + Σ a[k]·b[k]`, exactly rounded to f32 (see the module doc).
fn dot_exact(c: f32, a: &[f64], b: &[f64]) -> f32 {
    let c = f64::from(c);
    let mut s = c;
    let mut exact = true;
    let mut special = c.is_nan() || c.is_infinite();
    for (&x, &y) in a.iter().zip(b) {
        let t = x * y;
        special |= !t.is_finite();
        if exact && !special {
            let (sum, err) = two_sum(s, t);
            s = sum;
            exact = err == 0.0;
        }
    }
    if special {
        // NaN or infinities: IEEE addition of the terms decides (∞ − ∞ is NaN).
        let mut v = c;
        for (&x, &y) in a.iter().zip(b) {
            v += x * y;
        }
        return if v.is_nan() {
            f32::from_bits(super::float::NAN32)
        } else {
            v as f32
        };
    }
    if exact {
        // `s` is the exact sum: one rounding to f32.
        return s as f32;
    }
    let mut acc = Exact([0; LIMBS]);
    acc.add(c);
    for (&x, &y) in a.iter().zip(b) {
        acc.add(x * y);
    }
    acc.round_f32()
}

/// `mma`: gathers A (16×K), B (K×8) and C (16×8) from the warp's registers by the fragment
/// tables, computes D and scatters it. All operands are read before `d` is written.
pub fn mma(
    regs: &mut Regs,
    shape: MmaShape,
    ty: MmaTy,
    d: &[R; 4],
    ra: &[R; 4],
    rb: &[R; 2],
    rc: &[R; 4],
) {
    let k = match shape {
        MmaShape::M16N8K16 => 16,
        MmaShape::M16N8K8 => 8,
    };
    let mut a = [[0f64; 16]; 16]; // [row][k]
    let mut b = [[0f64; 16]; 8]; // [col][k]
    let mut c = [[0f32; 8]; 16];
    for lane in 0..WARP {
        let (g, t) = (lane / 4, lane % 4);
        let reg = |r: R| regs.r32[r as usize][lane];
        match (shape, ty) {
            (MmaShape::M16N8K16, _) => {
                for (r, &x) in ra.iter().enumerate() {
                    let v = reg(x);
                    for h in 0..2 {
                        let (row, col) = (g + 8 * (r & 1), 2 * t + h + 8 * (r >> 1));
                        a[row][col] = element(ty, v >> (16 * h) & 0xffff);
                    }
                }
                for (r, &x) in rb.iter().enumerate() {
                    let v = reg(x);
                    for h in 0..2 {
                        b[g][2 * t + h + 8 * r] = element(ty, v >> (16 * h) & 0xffff);
                    }
                }
            }
            (MmaShape::M16N8K8, MmaTy::TF32) => {
                for (r, &x) in ra.iter().enumerate() {
                    a[g + 8 * (r & 1)][t + 4 * (r >> 1)] = element(ty, reg(x));
                }
                for (r, &x) in rb.iter().enumerate() {
                    b[g][t + 4 * r] = element(ty, reg(x));
                }
            }
            (MmaShape::M16N8K8, _) => {
                for (r, &x) in ra.iter().take(2).enumerate() {
                    let v = reg(x);
                    for h in 0..2 {
                        a[g + 8 * r][2 * t + h] = element(ty, v >> (16 * h) & 0xffff);
                    }
                }
                let v = reg(rb[0]);
                for h in 0..2 {
                    b[g][2 * t + h] = element(ty, v >> (16 * h) & 0xffff);
                }
            }
        }
        for (i, &r) in rc.iter().enumerate() {
            c[g + 8 * (i >> 1)][2 * t + (i & 1)] = f32::from_bits(reg(r));
        }
    }
    let mut out = [[0u32; WARP]; 4];
    for lane in 0..WARP {
        let (g, t) = (lane / 4, lane % 4);
        for (i, o) in out.iter_mut().enumerate() {
            let (row, col) = (g + 8 * (i >> 1), 2 * t + (i & 1));
            let v = dot_exact(c[row][col], &a[row][..k], &b[col][..k]);
            o[lane] = super::float::canon32(v);
        }
    }
    for (i, &r) in d.iter().enumerate() {
        regs.r32[r as usize] = out[i];
    }
}

/// `ldmatrix.m8n8.x{num}[.trans].b16`: lanes `8i..8i+8` give the row addresses of matrix `i`;
/// lane `l` receives, for each matrix, row `l/4`'s elements `2(l%4)` and `2(l%4)+1` (with
/// `.trans`: column `l/4`'s elements `2(l%4)` and `2(l%4)+1`).
pub fn ldmatrix(
    env: &mut CtaEnv,
    regs: &mut Regs,
    (num, trans): (u8, bool),
    d: &[R; 4],
    base: AddrBase,
    offset: i64,
) -> Result<(), LaneFault> {
    let addrs = addresses(regs, base, offset);
    let rows = 8 * usize::from(num);
    let mut offs = [0usize; WARP];
    for l in 0..rows {
        offs[l] = window(addrs[l], SHARED_BASE, env.shared.len(), 16, Space::Shared)
            .map_err(|f| (l, f))?;
    }
    for m in 0..usize::from(num) {
        env.mem.shared_wavefronts += shared_wavefronts(&addrs, 0xff << (8 * m), 16);
    }
    let half = |row: usize, col: usize| read_le(&env.shared, offs[row] + 2 * col, 2) as u32;
    for (m, &dst) in d.iter().take(usize::from(num)).enumerate() {
        let out: [u32; WARP] = std::array::from_fn(|l| {
            let (q, p) = (l / 4, l % 4);
            if trans {
                half(8 * m + 2 * p, q) | (half(8 * m + 2 * p + 1, q) << 16)
            } else {
                half(8 * m + q, 2 * p) | (half(8 * m + q, 2 * p + 1) << 16)
            }
        });
        regs.r32[dst as usize] = out;
    }
    Ok(())
}

/// The fault of a `.sync.aligned` instruction that not every thread of the warp executes.
pub fn not_uniform(active: u32, missing: u32, detail: String) -> Fault {
    Fault::NotWarpUniform {
        active,
        missing,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact sum by brute force in rationals with a common power-of-two denominator.
    fn reference(c: f32, terms: &[(f64, f64)]) -> f32 {
        let mut acc = Exact([0; LIMBS]);
        acc.add(f64::from(c));
        for &(x, y) in terms {
            acc.add(x * y);
        }
        acc.round_f32()
    }

    #[test]
    fn exact_sum_survives_cancellation_that_f64_loses() {
        // 2^100 + 1 - 2^100: f64 loses the 1; the exact accumulator keeps it.
        let (a, b) = (
            [2f64.powi(50), 1.0, -(2f64.powi(50))],
            [2f64.powi(50), 1.0, 2f64.powi(50)],
        );
        assert_eq!(dot_exact(0.0, &a, &b), 1.0);
        // A tie just below an f32 rounding boundary must not double-round: 1 + 2^-24 + 2^-80
        // rounds up (the tiny term breaks the tie), 1 + 2^-24 alone rounds to even (down).
        let a = [1.0, 2f64.powi(-24), 2f64.powi(-40)];
        let b = [1.0, 1.0, 2f64.powi(-40)];
        assert_eq!(dot_exact(0.0, &a, &b), 1.0 + f32::EPSILON);
        assert_eq!(dot_exact(0.0, &a[..2], &b[..2]), 1.0);
    }

    #[test]
    fn exact_accumulator_rounds_like_f64_when_f64_is_exact() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f64::from(f32::from_bits((x as u32 & 0x807f_0000) | 0x3f00_0000)) // bf16 in [0.5, 2)
        };
        for _ in 0..1000 {
            let terms: Vec<(f64, f64)> = (0..16).map(|_| (next(), next())).collect();
            let c = next() as f32;
            let f64_sum = terms.iter().fold(f64::from(c), |s, (x, y)| s + x * y);
            // 16-bit products of values in [0.25, 4): every partial sum is exact in f64.
            assert_eq!(reference(c, &terms), f64_sum as f32);
        }
    }

    #[test]
    fn subnormal_results_round_once_in_the_exact_path() {
        let ulp = 2f64.powi(-149); // the least f32 subnormal
        // 2.5 ulp is a tie between 2 and 3 ulp: to even (2) alone, up (3) with a tiny term
        // that TwoSum cannot keep exactly (the accumulator's path).
        assert_eq!(dot_exact(0.0, &[2.5 * ulp], &[1.0]), (2.0 * ulp) as f32);
        let tiny = 2f64.powi(-260);
        assert_eq!(
            dot_exact(0.0, &[2.5 * ulp, 1.0], &[1.0, tiny]),
            (3.0 * ulp) as f32
        );
        assert_eq!(
            dot_exact(0.0, &[-2.5 * ulp, -1.0], &[1.0, tiny]),
            (-3.0 * ulp) as f32
        );
        // Cancellation to an exact zero is +0, as IEEE addition gives.
        assert_eq!(
            dot_exact(1.0, &[-1.0, tiny], &[1.0, 0.0]).to_bits(),
            0.0f32.to_bits()
        );
    }

    #[test]
    fn specials() {
        assert!(dot_exact(0.0, &[f64::INFINITY], &[0.0]).is_nan());
        assert!(dot_exact(f32::INFINITY, &[-f64::INFINITY], &[1.0]).is_nan());
        assert_eq!(dot_exact(1.0, &[f64::INFINITY], &[2.0]), f32::INFINITY);
        assert_eq!(
            dot_exact(0.0, &[1e30], &[1e30]),
            f32::INFINITY,
            "overflow rounds to inf"
        );
        assert_eq!(dot_exact(-0.0, &[0.0], &[-1.0]), -0.0);
    }
}
