//! `cp.async`: per-thread asynchronous copies from global to shared memory, in groups.
//!
//! A copy reads its source when it is issued (faults — misalignment, bounds — are reported
//! then, at its PTX line) and is held per thread until a `cp.async.wait_group n` of that thread
//! completes its group (every committed group but the `n` most recent; `wait_all` commits the
//! open copies first and waits for all). Only then do the bytes land in shared memory. This is
//! one of the executions the PTX memory model allows, chosen because it is deterministic and
//! strict: a kernel that reads a destination before waiting for it sees the old contents every
//! time, rather than the new ones by luck. `src-size` bytes come from the source and the rest
//! of the `size` bytes are zero; with a true `ignore-src` predicate all are zero (no source
//! bytes are read, so the source address is not checked).

use super::CtaEnv;
use super::lanes::{Regs, WARP, lanes};
use super::memops::{LaneFault, addresses, global_sectors, shared_wavefronts, window};
use crate::error::{Fault, Space};
use crate::inst::{AddrBase, CpAsyncSrc};
use crate::memory::SHARED_BASE;

/// One issued copy that has not landed yet.
#[derive(Debug, Clone, Copy)]
struct Pending {
    lane: u8,
    /// The thread's group index, or `OPEN` before `commit_group`.
    group: u32,
    /// Offset in the CTA's shared memory.
    dst: usize,
    len: u8,
    data: [u8; 16],
    /// Whether it read global memory (not all zero fill).
    global: bool,
}

const OPEN: u32 = u32::MAX;

/// The copies in flight of one warp's threads.
#[derive(Debug, Default)]
pub struct AsyncCopies {
    pending: Vec<Pending>,
    /// Groups committed so far, per lane.
    committed: [u32; WARP],
}

impl AsyncCopies {
    pub fn reset(&mut self) {
        self.pending.clear();
        self.committed = [0; WARP];
    }
}

/// The operands of one `cp.async`.
pub struct CopyArgs {
    pub dst: (AddrBase, i64),
    pub src: (AddrBase, i64),
    pub size: u8,
    pub from: CpAsyncSrc,
}

/// `cp.async` for the lanes of `mask`: checks both addresses, reads the source now.
pub fn issue(
    env: &mut CtaEnv,
    regs: &Regs,
    copies: &mut AsyncCopies,
    x: &CopyArgs,
    mask: u32,
) -> Result<(), LaneFault> {
    let size = u32::from(x.size);
    let dsts = addresses(regs, x.dst.0, x.dst.1);
    let srcs = addresses(regs, x.src.0, x.src.1);
    let mut reading = 0u32;
    for l in lanes(mask) {
        let dst = window(dsts[l], SHARED_BASE, env.shared.len(), size, Space::Shared)
            .map_err(|f| (l, f))?;
        let n = match x.from {
            CpAsyncSrc::Full => size,
            CpAsyncSrc::Bytes(r) => regs.r32[r as usize][l].min(size),
            CpAsyncSrc::Ignore(p, neg) => {
                if ((regs.pred[p as usize] >> l) & 1 == 1) != neg {
                    0
                } else {
                    size
                }
            }
        };
        let mut data = [0u8; 16];
        if n > 0 {
            reading |= 1 << l;
            let addr = srcs[l];
            if addr & u64::from(size - 1) != 0 {
                let fault = Fault::Misaligned {
                    space: Space::Global,
                    addr,
                    bytes: size,
                };
                return Err((l, fault));
            }
            let (a, off) = env
                .global
                .resolve(addr, 1, &mut env.hint)
                .map_err(|f| (l, f))?;
            let alloc = &env.global.allocs[a];
            if off + n as usize > alloc.len {
                let fault = Fault::OutOfBounds {
                    space: Space::Global,
                    addr,
                    bytes: n,
                };
                return Err((l, fault));
            }
            alloc.read_bytes(off, &mut data[..n as usize]);
        }
        copies.pending.push(Pending {
            lane: l as u8,
            group: OPEN,
            dst,
            len: x.size,
            data,
            global: n > 0,
        });
    }
    if reading != 0 {
        env.mem.global_loads += 1;
        env.mem.global_bytes += u64::from(size) * u64::from(reading.count_ones());
        env.mem.global_sectors += global_sectors(&srcs, reading, size);
    }
    env.mem.shared_wavefronts += shared_wavefronts(&dsts, mask, size);
    Ok(())
}

/// `cp.async.commit_group` for the lanes of `mask`.
pub fn commit(copies: &mut AsyncCopies, mask: u32) {
    for l in lanes(mask) {
        let group = copies.committed[l];
        for p in copies.pending.iter_mut() {
            if usize::from(p.lane) == l && p.group == OPEN {
                p.group = group;
            }
        }
        copies.committed[l] += 1;
    }
}

/// `cp.async.wait_group n` for the lanes of `mask`: lands every copy of a committed group but
/// the `n` most recent, in issue order. A wait that lands a copy read from global memory waits
/// for memory once, however many copies and branches came before it: it counts one load epoch
/// ([`super::MemCounts::load_epochs`]; the copies themselves, being asynchronous, open none).
pub fn wait(env: &mut CtaEnv, copies: &mut AsyncCopies, n: u32, mask: u32) {
    let committed = copies.committed;
    let shared = &mut env.shared;
    let mut from_global = false;
    copies.pending.retain(|p| {
        let lane = usize::from(p.lane);
        let done = (mask >> lane) & 1 == 1
            && p.group != OPEN
            && p.group < committed[lane].saturating_sub(n);
        if done {
            let len = usize::from(p.len);
            shared[p.dst..p.dst + len].copy_from_slice(&p.data[..len]);
            from_global |= p.global;
        }
        !done
    });
    if from_global {
        env.mem.load_epochs += 1;
    }
}
