//! Runtime CPU-feature dispatch for the hand-written loops. `vectorized!({ ... })` runs its block
//! inside a function compiled for AVX-512 (or AVX2) when the CPU has it, so plain Rust loops over
//! slices auto-vectorise to full width; elsewhere the same code runs portably. The block computes
//! the same values either way (Rust never contracts `a * b + c` into an FMA).
//!
//! The block becomes an `#[inline(always)]` closure called through `FnMut` from a
//! `#[target_feature]` function, which inlines it and compiles it for that target. Calling it
//! through `FnOnce` instead (as `pulp::Arch::dispatch` does) goes through a compiler-made
//! `call_once` shim that is compiled on its own for the baseline target (SSE2): the loops then
//! ran at a quarter of the vector width (check with `perf annotate`: the hot loops of the fused
//! engine must use `zmm` registers on an AVX-512 machine).

/// Runs the block compiled with the best instruction set the CPU supports.
macro_rules! vectorized {
    ($($body:tt)*) => {
        $crate::backend::cpu::kernels::simd::dispatch(
            #[inline(always)]
            || { $($body)* },
        )
    };
}

pub(crate) use vectorized;

/// The instruction set level of this CPU: 2 = AVX-512, 1 = AVX2, 0 = baseline; detected once
/// (every fused-engine chunk dispatches, so the check must cost one load).
#[cfg(target_arch = "x86_64")]
fn level() -> u8 {
    use std::sync::atomic::{AtomicU8, Ordering};
    static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
    let cached = LEVEL.load(Ordering::Relaxed);
    if cached != u8::MAX {
        return cached;
    }
    let avx2 = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("bmi1")
        && std::arch::is_x86_feature_detected!("bmi2")
        && std::arch::is_x86_feature_detected!("lzcnt")
        && std::arch::is_x86_feature_detected!("popcnt");
    let avx512 = avx2
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512dq");
    let level = if avx512 { 2 } else { u8::from(avx2) };
    LEVEL.store(level, Ordering::Relaxed);
    level
}

/// Calls `f` from a function compiled for the widest instruction set the CPU has.
#[inline(always)]
pub(crate) fn dispatch<R>(mut f: impl FnMut() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: `level` detected every feature `with_avx512` enables.
        2 => return unsafe { with_avx512(&mut f) },
        // SAFETY: as above, for `with_avx2`.
        1 => return unsafe { with_avx2(&mut f) },
        _ => {}
    }
    f()
}

/// Runs `f` (inlined here) compiled for AVX-512.
///
/// # Safety
/// The CPU has every enabled feature.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
unsafe fn with_avx512<R>(f: &mut impl FnMut() -> R) -> R {
    f()
}

/// Runs `f` (inlined here) compiled for AVX2.
///
/// # Safety
/// The CPU has every enabled feature.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,lzcnt,popcnt")]
unsafe fn with_avx2<R>(f: &mut impl FnMut() -> R) -> R {
    f()
}
