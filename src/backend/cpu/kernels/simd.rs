//! The SIMD level the kernels run at, and the runtime dispatch of the hand-written loops.
//!
//! **Levels.** [`SimdLevel`] is `scalar` (the x86-64 baseline, SSE2), `avx2` (AVX2 + FMA) or
//! `avx512` (AVX-512 F/VL/BW/DQ). The CPU is probed once ([`SimdLevel::detected`]); the
//! environment variable `TOWERPACK_SIMD=scalar|avx2|avx512`, read once, caps it for the whole
//! process ([`SimdLevel::max`], like oneDNN's `ONEDNN_MAX_CPU_ISA`); a session or a caller can
//! lower it further for its own work ([`SimdLevel::run`]; `CpuOptions::simd`). A level above
//! what the CPU runs is capped, never an error, so the same setting works on every machine.
//!
//! **Where the level lives.** In a thread-local (one load per dispatch). [`SimdLevel::run`] sets
//! it for a closure on the calling thread; the kernels that spread work over a rayon pool carry
//! the caller's level into every task (`carry`), so a call runs at one level whatever pool its
//! parallel parts land on. A thread that never set one runs at [`SimdLevel::max`].
//!
//! **Dispatch.** `vectorized!({ ... })` runs its block inside a function compiled for the level
//! in force, so plain Rust loops over slices auto-vectorise to full width; at `scalar` the same
//! code runs portably. The block computes the same values at every level (Rust never contracts
//! `a * b + c` into an FMA). The block becomes an `#[inline(always)]` closure called through
//! `FnMut` from a `#[target_feature]` function, which inlines it and compiles it for that target.
//! Calling it through `FnOnce` instead (as `pulp::Arch::dispatch` does) goes through a
//! compiler-made `call_once` shim that is compiled on its own for the baseline target (SSE2): the
//! loops then ran at a quarter of the vector width (check with `perf annotate`: the hot loops of
//! the fused engine must use `zmm` registers on an AVX-512 machine, `ymm` at `avx2`).
//!
//! The hand-written kernels (direct convolution, tiny GEMMs) and the GEMM crate choose their
//! path from [`SimdLevel::current`] too, and every choice is noted in a process-wide record
//! ([`take_levels_run`]) so tests can check that a forced level is the one that ran.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

/// The environment variable that caps the SIMD level of the process.
pub const SIMD_ENV: &str = "TOWERPACK_SIMD";

/// An instruction-set level of the CPU kernels, ordered from the narrowest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// The x86-64 baseline (SSE2): portable loops, the GEMM crate's scalar kernels, no direct
    /// convolution.
    Scalar,
    /// AVX2 + FMA (256-bit vectors, 16 registers).
    Avx2,
    /// AVX-512 F/VL/BW/DQ (512-bit vectors, 32 registers, lane masks).
    Avx512,
}

/// `TOWERPACK_SIMD` (or a level's name) is not one of the accepted values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}={value:?} is not a SIMD level: accepted values are scalar, avx2, avx512")]
pub struct SimdLevelError {
    /// Where the value came from (`TOWERPACK_SIMD`, or `SimdLevel` when parsed directly).
    pub what: &'static str,
    pub value: String,
}

impl SimdLevel {
    /// Every level, narrowest first.
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512];

    /// The name `TOWERPACK_SIMD` takes: `scalar`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// The widest level this CPU runs (probed once).
    pub fn detected() -> SimdLevel {
        static DETECTED: AtomicU8 = AtomicU8::new(UNSET);
        let cached = DETECTED.load(Ordering::Relaxed);
        if cached != UNSET {
            return SimdLevel::from_u8(cached);
        }
        let level = probe();
        DETECTED.store(level as u8, Ordering::Relaxed);
        level
    }

    /// The level `TOWERPACK_SIMD` asks for: `Ok(None)` when it is unset or empty, an error
    /// naming the variable and the accepted values when it is set to anything else.
    pub fn from_env() -> Result<Option<SimdLevel>, SimdLevelError> {
        let Some(raw) = std::env::var_os(SIMD_ENV) else {
            return Ok(None);
        };
        let value = raw.to_string_lossy();
        if value.trim().is_empty() {
            return Ok(None);
        }
        parse(value.trim(), SIMD_ENV).map(Some)
    }

    /// The ceiling of this process: [`SimdLevel::detected`] capped by `TOWERPACK_SIMD` (read
    /// once). A value that is not a level is reported once on stderr and ignored here;
    /// `CpuSession::new` refuses it with an error.
    pub fn max() -> SimdLevel {
        static MAX: AtomicU8 = AtomicU8::new(UNSET);
        let cached = MAX.load(Ordering::Relaxed);
        if cached != UNSET {
            return SimdLevel::from_u8(cached);
        }
        let cap = SimdLevel::from_env().unwrap_or_else(|e| {
            eprintln!("towerpack: {e}; running at the detected level");
            None
        });
        let level = cap.map_or(SimdLevel::detected(), |c| c.min(SimdLevel::detected()));
        MAX.store(level as u8, Ordering::Relaxed);
        level
    }

    /// The levels this process can run, narrowest first: `scalar` up to [`SimdLevel::max`].
    /// Tests loop over it to check every path the machine supports.
    pub fn available() -> Vec<SimdLevel> {
        SimdLevel::ALL
            .into_iter()
            .filter(|&l| l <= SimdLevel::max())
            .collect()
    }

    /// This level capped by [`SimdLevel::max`]: the level a request for it runs at.
    pub fn capped(self) -> SimdLevel {
        self.min(SimdLevel::max())
    }

    /// The level in force on the calling thread.
    #[inline(always)]
    pub fn current() -> SimdLevel {
        match CURRENT.get() {
            UNSET => SimdLevel::max(),
            level => SimdLevel::from_u8(level),
        }
    }

    /// Runs `f` with this level (capped by [`SimdLevel::max`]) in force on the calling thread
    /// and in the parallel work of every kernel `f` calls; the previous level is restored after
    /// (also when `f` panics).
    pub fn run<R>(self, f: impl FnOnce() -> R) -> R {
        with_level(self.capped(), f)
    }

    fn from_u8(v: u8) -> SimdLevel {
        match v {
            0 => SimdLevel::Scalar,
            1 => SimdLevel::Avx2,
            _ => SimdLevel::Avx512,
        }
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SimdLevel {
    type Err = SimdLevelError;

    /// `scalar`, `avx2` or `avx512`, in any case.
    fn from_str(s: &str) -> Result<SimdLevel, SimdLevelError> {
        parse(s, "SimdLevel")
    }
}

fn parse(s: &str, what: &'static str) -> Result<SimdLevel, SimdLevelError> {
    SimdLevel::ALL
        .into_iter()
        .find(|l| l.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| SimdLevelError {
            what,
            value: s.to_string(),
        })
}

/// Marks "no level set" in the atomics and the thread-local.
const UNSET: u8 = u8::MAX;

thread_local! {
    /// The level set on this thread by [`with_level`] (`UNSET`: [`SimdLevel::max`]).
    static CURRENT: Cell<u8> = const { Cell::new(UNSET) };
}

/// Runs `f` with `level` (already capped) in force on this thread, restoring the previous value
/// after, also on unwinding.
pub(crate) fn with_level<R>(level: SimdLevel, f: impl FnOnce() -> R) -> R {
    struct Restore(u8);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.set(self.0);
        }
    }
    let _restore = Restore(CURRENT.replace(level as u8));
    f()
}

/// Wraps a parallel task so that it runs at the level in force where `carry` is called: the
/// kernels call it before handing work to rayon, whose workers may be any threads.
pub(crate) fn carry<A, R>(f: impl Fn(A) -> R + Sync + Send) -> impl Fn(A) -> R + Sync + Send {
    let level = SimdLevel::current();
    move |a| with_level(level, || f(a))
}

/// Probes the CPU.
fn probe() -> SimdLevel {
    #[cfg(target_arch = "x86_64")]
    {
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
        if avx512 {
            return SimdLevel::Avx512;
        }
        if avx2 {
            return SimdLevel::Avx2;
        }
    }
    SimdLevel::Scalar
}

/// Levels that kernels have run at (bit `level as u8`), process-wide, since the last
/// [`take_levels_run`].
static RAN: AtomicU8 = AtomicU8::new(0);

/// Notes that a kernel ran at `level` (one load when already noted).
#[inline(always)]
pub(crate) fn note(level: SimdLevel) {
    let bit = 1u8 << (level as u8);
    if RAN.load(Ordering::Relaxed) & bit == 0 {
        RAN.fetch_or(bit, Ordering::Relaxed);
    }
}

/// The levels that vectorised loops, direct convolutions and GEMMs ran at since the previous
/// call, in the whole process (narrowest first), and clears the record: a diagnostic for tests
/// that check a forced level is the path taken (run nothing else concurrently).
pub fn take_levels_run() -> Vec<SimdLevel> {
    let bits = RAN.swap(0, Ordering::Relaxed);
    SimdLevel::ALL
        .into_iter()
        .filter(|&l| bits & (1 << (l as u8)) != 0)
        .collect()
}

/// Runs the block compiled for the SIMD level in force on this thread.
macro_rules! vectorized {
    ($($body:tt)*) => {
        $crate::backend::cpu::kernels::simd::dispatch(
            #[inline(always)]
            || { $($body)* },
        )
    };
}

pub(crate) use vectorized;

/// Calls `f` from a function compiled for the level in force.
#[inline(always)]
pub(crate) fn dispatch<R>(mut f: impl FnMut() -> R) -> R {
    let level = SimdLevel::current();
    note(level);
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the level in force is never above `SimdLevel::detected()` (`max` and `run`
        // cap it), and `detected` probed every feature `with_avx512` enables.
        SimdLevel::Avx512 => return unsafe { with_avx512(&mut f) },
        // SAFETY: as above, for `with_avx2`.
        SimdLevel::Avx2 => return unsafe { with_avx2(&mut f) },
        SimdLevel::Scalar => {}
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
