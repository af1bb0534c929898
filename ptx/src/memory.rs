//! Device memory: the emulator's address-space layout and global allocations.
//!
//! Layout (generic addresses equal state-space addresses, so `cvta` is the identity):
//! shared memory at `SHARED_BASE..+SHARED_WINDOW`, per-thread local memory at `LOCAL_BASE..`,
//! kernel parameters at `PARAM_BASE..`, and device `d`'s global allocations in
//! `[(d + 1) << 40, (d + 2) << 40)`, so a pointer used on the wrong device is detected.
//! Allocations are never reused and are separated by unmapped guard gaps.
//!
//! Global memory is shared by CTAs running on several host threads, so every access is a relaxed
//! atomic of the access width (plain loads/stores on x86-64 and AArch64). Racy kernels (two CTAs
//! writing one word without atomics) are as nondeterministic here as on a GPU, but never unsound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::error::{Fault, Space};

pub(crate) const SHARED_BASE: u64 = 0x1000_0000;
/// Largest shared memory per CTA (sm_80 allows 163 KiB; we allow 1 MiB).
pub(crate) const SHARED_WINDOW: u64 = 1 << 20;
pub(crate) const LOCAL_BASE: u64 = 0x2000_0000;
/// Largest local memory per thread.
pub(crate) const LOCAL_WINDOW: u64 = 1 << 20;
pub(crate) const PARAM_BASE: u64 = 0x3000_0000;
const PARAM_WINDOW: u64 = 1 << 16;
/// log2 of the size of each device's global address range.
pub(crate) const DEVICE_SHIFT: u32 = 40;
/// Allocation granularity and guard gap.
pub(crate) const ALLOC_ALIGN: u64 = 256;
pub(crate) const GUARD_BYTES: u64 = 4096;

/// The device that owns global address `addr`, if it is in a device range.
pub(crate) fn device_of(addr: u64) -> Option<usize> {
    let d = addr >> DEVICE_SHIFT;
    (d >= 1).then(|| (d - 1) as usize)
}

/// The first global address of device `ordinal`.
pub(crate) fn device_base(ordinal: usize) -> u64 {
    ((ordinal as u64) + 1) << DEVICE_SHIFT
}

/// Which window a generic address falls in.
pub(crate) fn classify(addr: u64) -> Space {
    if (SHARED_BASE..SHARED_BASE + SHARED_WINDOW).contains(&addr) {
        Space::Shared
    } else if (LOCAL_BASE..LOCAL_BASE + LOCAL_WINDOW).contains(&addr) {
        Space::Local
    } else if (PARAM_BASE..PARAM_BASE + PARAM_WINDOW).contains(&addr) {
        Space::Param
    } else {
        Space::Global
    }
}

/// One device allocation: `len` bytes at `base`, stored as 64-bit atomic words.
#[derive(Debug)]
pub(crate) struct Allocation {
    pub base: u64,
    pub len: usize,
    words: Box<[AtomicU64]>,
}

impl Allocation {
    pub fn new(base: u64, len: usize) -> Self {
        let words = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        Allocation { base, len, words }
    }

    fn ptr(&self) -> *mut u8 {
        // AtomicU64 is an UnsafeCell: writing through a pointer derived from `&self` is allowed.
        self.words.as_ptr() as *mut u8
    }

    /// Reads `width` (1, 2, 4, 8) bytes at byte offset `off`, zero-extended.
    /// The caller has checked `off + width <= len` and `off % width == 0`.
    #[inline]
    pub fn load(&self, off: usize, width: u8) -> u64 {
        debug_assert!(
            off + width as usize <= self.words.len() * 8 && off.is_multiple_of(width as usize)
        );
        // SAFETY: in bounds and aligned (checked by the caller, see above); the buffer is 8-aligned
        // and lives as long as `self`; every access to it is atomic.
        unsafe {
            let p = self.ptr().add(off);
            match width {
                1 => u64::from(AtomicU8::from_ptr(p).load(Relaxed)),
                2 => u64::from(AtomicU16::from_ptr(p.cast()).load(Relaxed)),
                4 => u64::from(AtomicU32::from_ptr(p.cast()).load(Relaxed)),
                _ => AtomicU64::from_ptr(p.cast()).load(Relaxed),
            }
        }
    }

    /// Writes the low `width` bytes of `value` at `off` (same contract as [`Allocation::load`]).
    #[inline]
    pub fn store(&self, off: usize, width: u8, value: u64) {
        debug_assert!(
            off + width as usize <= self.words.len() * 8 && off.is_multiple_of(width as usize)
        );
        // SAFETY: as in `load`.
        unsafe {
            let p = self.ptr().add(off);
            match width {
                1 => AtomicU8::from_ptr(p).store(value as u8, Relaxed),
                2 => AtomicU16::from_ptr(p.cast()).store(value as u16, Relaxed),
                4 => AtomicU32::from_ptr(p.cast()).store(value as u32, Relaxed),
                _ => AtomicU64::from_ptr(p.cast()).store(value, Relaxed),
            }
        }
    }

    /// The 32-bit atomic at `off` (4-aligned, in bounds: checked by the caller).
    pub fn atomic32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= self.words.len() * 8 && off.is_multiple_of(4));
        // SAFETY: as in `load`; the reference borrows `self`.
        unsafe { AtomicU32::from_ptr(self.ptr().add(off).cast()) }
    }

    /// The 64-bit atomic at `off` (8-aligned, in bounds: checked by the caller).
    pub fn atomic64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.words.len() * 8 && off.is_multiple_of(8));
        // SAFETY: as in `load`.
        unsafe { AtomicU64::from_ptr(self.ptr().add(off).cast()) }
    }

    /// Copies bytes out, `[off, off + out.len())` (checked by the caller).
    pub fn read_bytes(&self, off: usize, out: &mut [u8]) {
        let mut i = 0;
        while i < out.len() {
            let pos = off + i;
            if pos.is_multiple_of(8) && out.len() - i >= 8 {
                out[i..i + 8].copy_from_slice(&self.load(pos, 8).to_le_bytes());
                i += 8;
            } else {
                out[i] = self.load(pos, 1) as u8;
                i += 1;
            }
        }
    }

    /// Copies bytes in, `[off, off + data.len())` (checked by the caller).
    pub fn write_bytes(&self, off: usize, data: &[u8]) {
        let mut i = 0;
        while i < data.len() {
            let pos = off + i;
            if pos.is_multiple_of(8) && data.len() - i >= 8 {
                let mut w = [0u8; 8];
                w.copy_from_slice(&data[i..i + 8]);
                self.store(pos, 8, u64::from_le_bytes(w));
                i += 8;
            } else {
                self.store(pos, 1, u64::from(data[i]));
                i += 1;
            }
        }
    }

    /// Fills `[off, off + len)` with `byte` (checked by the caller).
    pub fn fill(&self, off: usize, len: usize, byte: u8) {
        let word = u64::from_le_bytes([byte; 8]);
        let mut i = 0;
        while i < len {
            let pos = off + i;
            if pos.is_multiple_of(8) && len - i >= 8 {
                self.store(pos, 8, word);
                i += 8;
            } else {
                self.store(pos, 1, u64::from(byte));
                i += 1;
            }
        }
    }
}

/// The allocations of one device, sorted by base, as a kernel sees them during a launch.
#[derive(Debug, Clone)]
pub(crate) struct GlobalView {
    pub device: usize,
    pub allocs: Vec<Arc<Allocation>>,
}

impl GlobalView {
    /// Resolves `[addr, addr + bytes)` to (allocation index, byte offset); `hint` caches the
    /// index of the last hit.
    #[inline]
    pub fn resolve(
        &self,
        addr: u64,
        bytes: u32,
        hint: &mut usize,
    ) -> Result<(usize, usize), Fault> {
        if let Some(a) = self.allocs.get(*hint)
            && addr >= a.base
            && addr + u64::from(bytes) <= a.base + a.len as u64
        {
            return check_align(*hint, a, addr, bytes);
        }
        self.resolve_slow(addr, bytes, hint)
    }

    /// The index of the allocation holding all of `[lo, end)`, if one does (`hint` first).
    #[inline]
    pub fn find_span(&self, lo: u64, end: u64, hint: usize) -> Option<usize> {
        let inside = |a: &Allocation| lo >= a.base && end <= a.base + a.len as u64;
        if self.allocs.get(hint).is_some_and(|a| inside(a)) {
            return Some(hint);
        }
        let i = self.allocs.partition_point(|a| a.base <= lo);
        (i > 0 && inside(&self.allocs[i - 1])).then(|| i - 1)
    }

    #[cold]
    fn resolve_slow(
        &self,
        addr: u64,
        bytes: u32,
        hint: &mut usize,
    ) -> Result<(usize, usize), Fault> {
        match device_of(addr) {
            Some(owner) if owner != self.device => {
                return Err(Fault::WrongDevice {
                    addr,
                    owner,
                    device: self.device,
                });
            }
            _ => {}
        }
        let i = self.allocs.partition_point(|a| a.base <= addr);
        if i > 0 {
            let a = &self.allocs[i - 1];
            if addr
                .checked_add(u64::from(bytes))
                .is_some_and(|end| end <= a.base + a.len as u64)
            {
                *hint = i - 1;
                return check_align(i - 1, a, addr, bytes);
            }
        }
        Err(Fault::OutOfBounds {
            space: Space::Global,
            addr,
            bytes,
        })
    }
}

#[inline]
fn check_align(
    index: usize,
    a: &Allocation,
    addr: u64,
    bytes: u32,
) -> Result<(usize, usize), Fault> {
    // Access sizes are powers of two (1 to 16 bytes): a mask instead of a division.
    if addr & (u64::from(bytes) - 1) != 0 {
        return Err(Fault::Misaligned {
            space: Space::Global,
            addr,
            bytes,
        });
    }
    Ok((index, (addr - a.base) as usize))
}
