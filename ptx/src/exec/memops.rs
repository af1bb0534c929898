//! Loads, stores and atomics for the lanes of a warp. Every lane's address is checked against
//! its window (shared: the CTA's buffer; local: the lane's slice; param: the parameter buffer;
//! global: the device's allocations) for bounds and natural alignment of the whole (vector)
//! access; a failure names the lane and the address. Lanes access memory in lane order, so
//! conflicting stores within a warp are deterministic (the highest lane wins).

use super::CtaEnv;
use super::lanes::{Regs, WARP, blend, lanes};
use crate::error::{Fault, Space};
use crate::inst::{AddrBase, AtomOp, AtomTy, MemAccess, MemSpace, R};
use crate::memory::{LOCAL_BASE, PARAM_BASE, SHARED_BASE, classify};

/// A fault at one lane.
pub type LaneFault = (usize, Fault);

pub(super) fn addresses(regs: &Regs, base: AddrBase, offset: i64) -> [u64; WARP] {
    let off = offset as u64;
    match base {
        AddrBase::None => [off; WARP],
        AddrBase::R32(r) => regs.r32[r as usize].map(|a| u64::from(a).wrapping_add(off)),
        AddrBase::R64(r) => regs.r64[r as usize].map(|a| a.wrapping_add(off)),
    }
}

fn effective(space: MemSpace, addr: u64) -> Space {
    match space {
        MemSpace::Global => Space::Global,
        MemSpace::Shared => Space::Shared,
        MemSpace::Local => Space::Local,
        MemSpace::Param => Space::Param,
        MemSpace::Generic => classify(addr),
    }
}

/// Offset of `[addr, addr + bytes)` in a window of `len` bytes at `base`.
#[inline]
pub(super) fn window(
    addr: u64,
    base: u64,
    len: usize,
    bytes: u32,
    space: Space,
) -> Result<usize, Fault> {
    let off = addr.wrapping_sub(base);
    if addr < base || off + u64::from(bytes) > len as u64 {
        return Err(Fault::OutOfBounds { space, addr, bytes });
    }
    // Access sizes are powers of two (1 to 16 bytes): a mask instead of a division.
    if addr & (u64::from(bytes) - 1) != 0 {
        return Err(Fault::Misaligned { space, addr, bytes });
    }
    Ok(off as usize)
}

/// Reads `width` (1, 2, 4, 8) bytes little-endian; fixed-size copies, no `memcpy` calls.
#[inline(always)]
pub(super) fn read_le(buf: &[u8], off: usize, width: u8) -> u64 {
    match width {
        4 => {
            let mut b = [0u8; 4];
            b.copy_from_slice(&buf[off..off + 4]);
            u64::from(u32::from_le_bytes(b))
        }
        8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[off..off + 8]);
            u64::from_le_bytes(b)
        }
        2 => {
            let mut b = [0u8; 2];
            b.copy_from_slice(&buf[off..off + 2]);
            u64::from(u16::from_le_bytes(b))
        }
        _ => u64::from(buf[off]),
    }
}

#[inline(always)]
fn write_le(buf: &mut [u8], off: usize, width: u8, v: u64) {
    match width {
        4 => buf[off..off + 4].copy_from_slice(&(v as u32).to_le_bytes()),
        8 => buf[off..off + 8].copy_from_slice(&v.to_le_bytes()),
        2 => buf[off..off + 2].copy_from_slice(&(v as u16).to_le_bytes()),
        _ => buf[off] = v as u8,
    }
}

/// Where one lane's access lands.
#[derive(Clone, Copy)]
enum Target {
    Global(usize, usize),
    Shared(usize),
    Local(usize),
    Param(usize),
}

#[inline(always)]
fn locate(
    env: &mut CtaEnv,
    space: Space,
    addr: u64,
    bytes: u32,
    lane: usize,
) -> Result<Target, Fault> {
    match space {
        Space::Global | Space::Generic => {
            let (a, off) = env.global.resolve(addr, bytes, &mut env.hint)?;
            Ok(Target::Global(a, off))
        }
        Space::Shared => Ok(Target::Shared(window(
            addr,
            SHARED_BASE,
            env.shared.len(),
            bytes,
            space,
        )?)),
        Space::Local => {
            let lb = env.kernel.local_bytes;
            Ok(Target::Local(
                lane * lb + window(addr, LOCAL_BASE, lb, bytes, space)?,
            ))
        }
        Space::Param => Ok(Target::Param(window(
            addr,
            PARAM_BASE,
            env.params.len(),
            bytes,
            space,
        )?)),
    }
}

#[inline(always)]
fn extend(v: u64, width: u8, signed: bool) -> u64 {
    if !signed || width == 8 {
        return v;
    }
    let shift = 64 - 8 * u32::from(width);
    (((v << shift) as i64) >> shift) as u64
}

/// Writes one lane of a load result (inactive lanes are never touched, so no blend is needed).
#[inline(always)]
fn put(regs: &mut Regs, wide: bool, reg: R, lane: usize, v: u64) {
    if wide {
        regs.r64[reg as usize][lane] = v;
    } else {
        regs.r32[reg as usize][lane] = v as u32;
    }
}

#[inline(always)]
fn get(regs: &Regs, wide: bool, reg: R, lane: usize) -> u64 {
    if wide {
        regs.r64[reg as usize][lane]
    } else {
        u64::from(regs.r32[reg as usize][lane])
    }
}

/// Lowest and highest active address, and whether every active address is `bytes`-aligned.
#[inline(always)]
fn span(addrs: &[u64; WARP], mask: u32, bytes: u32) -> (u64, u64, bool) {
    let (mut lo, mut hi, mut bits) = (u64::MAX, 0u64, 0u64);
    for l in lanes(mask) {
        lo = lo.min(addrs[l]);
        hi = hi.max(addrs[l]);
        bits |= addrs[l];
    }
    (lo, hi, bits & (u64::from(bytes) - 1) == 0)
}

/// Shared-memory wavefronts of one warp access of `bytes` per lane: 32 banks of 4-byte words;
/// lanes reading the same word share it (broadcast), distinct words in one bank take one
/// wavefront each, so the access takes as many wavefronts as its busiest bank has words.
pub(super) fn shared_wavefronts(addrs: &[u64; WARP], mask: u32, bytes: u32) -> u64 {
    // At most 16 bytes (4 words) per lane.
    let words = u64::from(bytes.div_ceil(4)).min(4);
    let mut seen = [0u64; WARP * 4];
    let mut n = 0;
    for l in lanes(mask) {
        let first = addrs[l] / 4;
        for w in first..first + words {
            seen[n] = w;
            n += 1;
        }
    }
    let seen = &mut seen[..n];
    seen.sort_unstable();
    let mut per_bank = [0u64; 32];
    let mut last = None;
    for &w in seen.iter() {
        if last != Some(w) {
            per_bank[(w % 32) as usize] += 1;
            last = Some(w);
        }
    }
    per_bank.iter().copied().max().unwrap_or(0).max(1)
}

/// Where a whole warp's access lands when every active lane is inside one region and aligned:
/// the fast paths then index memory without per-lane checks.
enum Region {
    Shared,
    Global(usize, u64),
    None,
}

fn region(env: &CtaEnv, space: MemSpace, addrs: &[u64; WARP], mask: u32, bytes: u32) -> Region {
    let (lo, hi, aligned) = span(addrs, mask, bytes);
    let Some(end) = hi.checked_add(u64::from(bytes)) else {
        return Region::None;
    };
    if !aligned {
        return Region::None;
    }
    match space {
        MemSpace::Shared if lo >= SHARED_BASE && end <= SHARED_BASE + env.shared.len() as u64 => {
            Region::Shared
        }
        MemSpace::Global => match env.global.find_span(lo, end, env.hint) {
            Some(a) => Region::Global(a, env.global.allocs[a].base),
            None => Region::None,
        },
        _ => Region::None,
    }
}

/// Distinct 32-byte sectors a warp's global access touches (what the memory system moves:
/// one per lane when the lanes scatter, four per 128 contiguous bytes when they do not).
pub(super) fn global_sectors(addrs: &[u64; WARP], mask: u32, bytes: u32) -> u64 {
    let mut seen = [0u64; WARP * 2];
    let mut n = 0;
    for l in lanes(mask) {
        let (first, last) = (addrs[l] / 32, (addrs[l] + u64::from(bytes.max(1)) - 1) / 32);
        seen[n] = first;
        n += 1;
        if last != first {
            seen[n] = last;
            n += 1;
        }
    }
    let seen = &mut seen[..n];
    seen.sort_unstable();
    let mut count = 0;
    let mut last = None;
    for &s in seen.iter() {
        if last != Some(s) {
            count += 1;
            last = Some(s);
        }
    }
    count
}

/// `ld`: up to four elements per lane. Addresses are computed for all lanes before any
/// destination is written, so a destination may be the address register.
pub fn load(
    env: &mut CtaEnv,
    regs: &mut Regs,
    local: &[u8],
    m: &MemAccess,
    d: &[R; 4],
    mask: u32,
) -> Result<(), LaneFault> {
    let addrs = addresses(regs, m.base, m.offset);
    let (w, n, wide) = (m.width, m.count as usize, m.wide_regs);
    let bytes = u32::from(w) * n as u32;
    let step = usize::from(w);
    // Uniform parameter loads (`ld.param [name+off]`): read once, broadcast.
    if m.space == MemSpace::Param && m.base == AddrBase::None {
        let first = mask.trailing_zeros() as usize;
        let off = window(addrs[0], PARAM_BASE, env.params.len(), bytes, Space::Param)
            .map_err(|f| (first, f))?;
        for (k, &reg) in d.iter().enumerate().take(n) {
            let v = extend(read_le(env.params, off + k * step, w), w, m.signed);
            if wide {
                blend(&mut regs.r64[reg as usize], &[v; WARP], mask);
            } else {
                blend(&mut regs.r32[reg as usize], &[v as u32; WARP], mask);
            }
        }
        return Ok(());
    }
    match region(env, m.space, &addrs, mask, bytes) {
        Region::Shared => {
            env.mem.shared_wavefronts += shared_wavefronts(&addrs, mask, bytes);
            for l in lanes(mask) {
                let off = (addrs[l] - SHARED_BASE) as usize;
                for (k, &reg) in d.iter().enumerate().take(n) {
                    put(
                        regs,
                        wide,
                        reg,
                        l,
                        extend(read_le(&env.shared, off + k * step, w), w, m.signed),
                    );
                }
            }
        }
        Region::Global(a, base) => {
            env.hint = a;
            env.mem.global_sectors += global_sectors(&addrs, mask, bytes);
            let alloc = &env.global.allocs[a];
            for l in lanes(mask) {
                let off = (addrs[l] - base) as usize;
                for (k, &reg) in d.iter().enumerate().take(n) {
                    put(
                        regs,
                        wide,
                        reg,
                        l,
                        extend(alloc.load(off + k * step, w), w, m.signed),
                    );
                }
            }
        }
        Region::None => {
            // Per lane, with the space of each address and a precise fault.
            for l in lanes(mask) {
                let addr = addrs[l];
                let t =
                    locate(env, effective(m.space, addr), addr, bytes, l).map_err(|f| (l, f))?;
                for (k, &reg) in d.iter().enumerate().take(n) {
                    let at = k * step;
                    let raw = match t {
                        Target::Global(a, off) => env.global.allocs[a].load(off + at, w),
                        Target::Shared(off) => read_le(&env.shared, off + at, w),
                        Target::Local(off) => read_le(local, off + at, w),
                        Target::Param(off) => read_le(env.params, off + at, w),
                    };
                    put(regs, wide, reg, l, extend(raw, w, m.signed));
                }
            }
        }
    }
    Ok(())
}

/// `st`: up to four elements per lane, lanes in order.
pub fn store(
    env: &mut CtaEnv,
    regs: &Regs,
    local: &mut [u8],
    m: &MemAccess,
    s: &[R; 4],
    mask: u32,
) -> Result<(), LaneFault> {
    let addrs = addresses(regs, m.base, m.offset);
    let (w, n, wide) = (m.width, m.count as usize, m.wide_regs);
    let bytes = u32::from(w) * n as u32;
    let step = usize::from(w);
    match region(env, m.space, &addrs, mask, bytes) {
        Region::Shared => {
            env.mem.shared_wavefronts += shared_wavefronts(&addrs, mask, bytes);
            for l in lanes(mask) {
                let off = (addrs[l] - SHARED_BASE) as usize;
                for (k, &reg) in s.iter().enumerate().take(n) {
                    write_le(&mut env.shared, off + k * step, w, get(regs, wide, reg, l));
                }
            }
        }
        Region::Global(a, base) => {
            env.hint = a;
            env.mem.global_sectors += global_sectors(&addrs, mask, bytes);
            let alloc = &env.global.allocs[a];
            for l in lanes(mask) {
                let off = (addrs[l] - base) as usize;
                for (k, &reg) in s.iter().enumerate().take(n) {
                    alloc.store(off + k * step, w, get(regs, wide, reg, l));
                }
            }
        }
        Region::None => {
            for l in lanes(mask) {
                let addr = addrs[l];
                let space = effective(m.space, addr);
                if space == Space::Param {
                    return Err((l, Fault::OutOfBounds { space, addr, bytes }));
                }
                let t = locate(env, space, addr, bytes, l).map_err(|f| (l, f))?;
                for (k, &reg) in s.iter().enumerate().take(n) {
                    let (v, at) = (get(regs, wide, reg, l), k * step);
                    match t {
                        Target::Global(a, off) => env.global.allocs[a].store(off + at, w, v),
                        Target::Shared(off) => write_le(&mut env.shared, off + at, w, v),
                        Target::Local(off) => write_le(local, off + at, w, v),
                        Target::Param(_) => {}
                    }
                }
            }
        }
    }
    Ok(())
}

fn apply32(op: AtomOp, ty: AtomTy, old: u32, b: u32, c: u32) -> u32 {
    use super::float::{canon32, ftz32};
    let f = f32::from_bits;
    match (op, ty) {
        // atom.add.f32 rounds to nearest and flushes subnormals (PTX ISA).
        (AtomOp::Add, AtomTy::F32) => ftz32(canon32(f(ftz32(old)) + f(ftz32(b)))),
        (AtomOp::Add, _) => old.wrapping_add(b),
        (AtomOp::Min, AtomTy::S32) => (old as i32).min(b as i32) as u32,
        (AtomOp::Min, AtomTy::F32) => canon32(f(old).min(f(b))),
        (AtomOp::Min, _) => old.min(b),
        (AtomOp::Max, AtomTy::S32) => (old as i32).max(b as i32) as u32,
        (AtomOp::Max, AtomTy::F32) => canon32(f(old).max(f(b))),
        (AtomOp::Max, _) => old.max(b),
        (AtomOp::And, _) => old & b,
        (AtomOp::Or, _) => old | b,
        (AtomOp::Xor, _) => old ^ b,
        (AtomOp::Exch, _) => b,
        (AtomOp::Cas, _) => {
            if old == b {
                c
            } else {
                old
            }
        }
        (AtomOp::Inc, _) => {
            if old >= b {
                0
            } else {
                old + 1
            }
        }
        (AtomOp::Dec, _) => {
            if old == 0 || old > b {
                b
            } else {
                old - 1
            }
        }
    }
}

fn apply64(op: AtomOp, ty: AtomTy, old: u64, b: u64, c: u64) -> u64 {
    let f = f64::from_bits;
    let canon = super::float::canon64;
    match (op, ty) {
        (AtomOp::Add, AtomTy::F64) => canon(f(old) + f(b)),
        (AtomOp::Add, _) => old.wrapping_add(b),
        (AtomOp::Min, AtomTy::S64) => (old as i64).min(b as i64) as u64,
        (AtomOp::Min, AtomTy::F64) => canon(f(old).min(f(b))),
        (AtomOp::Min, _) => old.min(b),
        (AtomOp::Max, AtomTy::S64) => (old as i64).max(b as i64) as u64,
        (AtomOp::Max, AtomTy::F64) => canon(f(old).max(f(b))),
        (AtomOp::Max, _) => old.max(b),
        (AtomOp::And, _) => old & b,
        (AtomOp::Or, _) => old | b,
        (AtomOp::Xor, _) => old ^ b,
        (AtomOp::Exch, _) => b,
        (AtomOp::Cas, _) => {
            if old == b {
                c
            } else {
                old
            }
        }
        // The decoder rejects 64-bit inc/dec.
        (AtomOp::Inc | AtomOp::Dec, _) => old,
    }
}

/// The operands of one atomic instruction.
pub struct AtomArgs {
    pub space: MemSpace,
    pub base: AddrBase,
    pub offset: i64,
    pub op: AtomOp,
    pub ty: AtomTy,
    pub d: Option<R>,
    pub b: R,
    pub c: R,
}

/// `atom`/`red`: lanes in order, each a real atomic on global memory (CTAs run concurrently).
pub fn atomic(env: &mut CtaEnv, regs: &mut Regs, x: &AtomArgs, mask: u32) -> Result<(), LaneFault> {
    use std::sync::atomic::Ordering::Relaxed;
    let addrs = addresses(regs, x.base, x.offset);
    let wide = matches!(x.ty, AtomTy::U64 | AtomTy::S64 | AtomTy::F64);
    let bytes = if wide { 8 } else { 4 };
    let mut old = [0u64; WARP];
    for l in lanes(mask) {
        let addr = addrs[l];
        let space = effective(x.space, addr);
        if matches!(space, Space::Local | Space::Param) {
            return Err((l, Fault::OutOfBounds { space, addr, bytes }));
        }
        let t = locate(env, space, addr, bytes, l).map_err(|f| (l, f))?;
        let (b, c) = if wide {
            (regs.r64[x.b as usize][l], regs.r64[x.c as usize][l])
        } else {
            (
                u64::from(regs.r32[x.b as usize][l]),
                u64::from(regs.r32[x.c as usize][l]),
            )
        };
        old[l] = match t {
            Target::Global(a, off) if wide => {
                let cell = env.global.allocs[a].atomic64(off);
                let prev =
                    cell.fetch_update(Relaxed, Relaxed, |o| Some(apply64(x.op, x.ty, o, b, c)));
                prev.unwrap_or_else(|o| o)
            }
            Target::Global(a, off) => {
                let cell = env.global.allocs[a].atomic32(off);
                let prev = cell.fetch_update(Relaxed, Relaxed, |o| {
                    Some(apply32(x.op, x.ty, o, b as u32, c as u32))
                });
                u64::from(prev.unwrap_or_else(|o| o))
            }
            Target::Shared(off) => {
                let o = read_le(&env.shared, off, bytes as u8);
                let n = if wide {
                    apply64(x.op, x.ty, o, b, c)
                } else {
                    u64::from(apply32(x.op, x.ty, o as u32, b as u32, c as u32))
                };
                write_le(&mut env.shared, off, bytes as u8, n);
                o
            }
            Target::Local(_) | Target::Param(_) => 0,
        };
    }
    if let Some(d) = x.d {
        if wide {
            blend(&mut regs.r64[d as usize], &old, mask);
        } else {
            blend(&mut regs.r32[d as usize], &old.map(|v| v as u32), mask);
        }
    }
    Ok(())
}
