//! A warp's register files (structure of arrays: one `[T; 32]` per register) and the lane loops
//! every handler is built from. A handler computes all 32 lanes in a branch-free loop the
//! compiler vectorises, then blends the result into the destination under the active mask.

use crate::kernel::Kernel;

/// Lanes per warp.
pub const WARP: usize = 32;
/// All 32 lanes.
pub const FULL: u32 = u32::MAX;

/// The three register files of one warp.
#[derive(Debug, Clone, Default)]
pub struct Regs {
    pub r32: Vec<[u32; WARP]>,
    pub r64: Vec<[u64; WARP]>,
    /// One bit per lane.
    pub pred: Vec<u32>,
}

impl Regs {
    /// Prepares the files for a warp of `kernel`: sizes them, zeroes the registers that may be
    /// read before written, and writes the constant registers. Other registers keep stale
    /// values, which the kernel provably overwrites before reading (`decode::undef`).
    pub fn reset(&mut self, kernel: &Kernel) {
        let r = &kernel.regs;
        self.r32.resize(r.r32, [0; WARP]);
        self.r64.resize(r.r64, [0; WARP]);
        self.pred.resize(r.pred, 0);
        for &i in &kernel.zero32 {
            self.r32[i as usize] = [0; WARP];
        }
        for &i in &kernel.zero64 {
            self.r64[i as usize] = [0; WARP];
        }
        for &i in &kernel.zero_pred {
            self.pred[i as usize] = 0;
        }
        for &(i, v) in &kernel.consts32 {
            self.r32[i as usize] = [v; WARP];
        }
        for &(i, v) in &kernel.consts64 {
            self.r64[i as usize] = [v; WARP];
        }
    }
}

/// Writes `val` into `dst` for the lanes of `mask`.
#[inline(always)]
pub fn blend<T: Copy>(dst: &mut [T; WARP], val: &[T; WARP], mask: u32) {
    if mask == FULL {
        *dst = *val;
    } else {
        for l in 0..WARP {
            if (mask >> l) & 1 != 0 {
                dst[l] = val[l];
            }
        }
    }
}

/// Sets predicate bits `bits` for the lanes of `mask`.
#[inline(always)]
pub fn blend_pred(dst: &mut u32, bits: u32, mask: u32) {
    *dst = (*dst & !mask) | (bits & mask);
}

/// Iterates over the set lanes of `mask`, lowest first.
#[inline(always)]
pub fn lanes(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if mask == 0 {
            None
        } else {
            let l = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            Some(l)
        }
    })
}

/// `d = f(a)` on the 32-bit file.
#[inline(always)]
pub fn map1_32(r: &mut [[u32; WARP]], mask: u32, d: u32, a: u32, f: impl Fn(u32) -> u32) {
    let av = &r[a as usize];
    let out: [u32; WARP] = std::array::from_fn(|l| f(av[l]));
    blend(&mut r[d as usize], &out, mask);
}

/// `d = f(a, b)` on the 32-bit file.
#[inline(always)]
pub fn map2_32(
    r: &mut [[u32; WARP]],
    mask: u32,
    d: u32,
    a: u32,
    b: u32,
    f: impl Fn(u32, u32) -> u32,
) {
    let (av, bv) = (&r[a as usize], &r[b as usize]);
    let out: [u32; WARP] = std::array::from_fn(|l| f(av[l], bv[l]));
    blend(&mut r[d as usize], &out, mask);
}

/// `d = f(a, b, c)` on the 32-bit file.
#[inline(always)]
pub fn map3_32(
    r: &mut [[u32; WARP]],
    mask: u32,
    (d, a, b, c): (u32, u32, u32, u32),
    f: impl Fn(u32, u32, u32) -> u32,
) {
    let (av, bv, cv) = (&r[a as usize], &r[b as usize], &r[c as usize]);
    let out: [u32; WARP] = std::array::from_fn(|l| f(av[l], bv[l], cv[l]));
    blend(&mut r[d as usize], &out, mask);
}

/// `d = f(a)` on the 64-bit file.
#[inline(always)]
pub fn map1_64(r: &mut [[u64; WARP]], mask: u32, d: u32, a: u32, f: impl Fn(u64) -> u64) {
    let av = &r[a as usize];
    let out: [u64; WARP] = std::array::from_fn(|l| f(av[l]));
    blend(&mut r[d as usize], &out, mask);
}

/// `d = f(a, b)` on the 64-bit file.
#[inline(always)]
pub fn map2_64(
    r: &mut [[u64; WARP]],
    mask: u32,
    d: u32,
    a: u32,
    b: u32,
    f: impl Fn(u64, u64) -> u64,
) {
    let (av, bv) = (&r[a as usize], &r[b as usize]);
    let out: [u64; WARP] = std::array::from_fn(|l| f(av[l], bv[l]));
    blend(&mut r[d as usize], &out, mask);
}

/// `d = f(a, b, c)` on the 64-bit file.
#[inline(always)]
pub fn map3_64(
    r: &mut [[u64; WARP]],
    mask: u32,
    (d, a, b, c): (u32, u32, u32, u32),
    f: impl Fn(u64, u64, u64) -> u64,
) {
    let (av, bv, cv) = (&r[a as usize], &r[b as usize], &r[c as usize]);
    let out: [u64; WARP] = std::array::from_fn(|l| f(av[l], bv[l], cv[l]));
    blend(&mut r[d as usize], &out, mask);
}

/// Predicate bits of `f(a[l], b[l])` over all lanes.
#[inline(always)]
pub fn cmp_bits<T: Copy>(a: &[T; WARP], b: &[T; WARP], f: impl Fn(T, T) -> bool) -> u32 {
    let mut bits = 0u32;
    for l in 0..WARP {
        bits |= u32::from(f(a[l], b[l])) << l;
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blend_respects_mask() {
        let mut d = [7u32; WARP];
        let v: [u32; WARP] = std::array::from_fn(|l| l as u32);
        blend(&mut d, &v, 0b1010);
        assert_eq!(&d[..4], &[7, 1, 7, 3]);
        assert!(d[4..].iter().all(|&x| x == 7));
        blend(&mut d, &v, FULL);
        assert_eq!(d, v);
    }

    #[test]
    fn lanes_iterates_set_bits() {
        let got: Vec<usize> = lanes(0x8000_0005).collect();
        assert_eq!(got, vec![0, 2, 31]);
    }
}
