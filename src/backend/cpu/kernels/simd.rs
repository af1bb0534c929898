//! Runtime CPU-feature dispatch for the hand-written loops. `vectorized(|| ...)` runs its closure
//! inside a function compiled for AVX-512 (or AVX2) when the CPU has it, so plain Rust loops over
//! lane arrays auto-vectorise to full width; elsewhere the same code runs portably. The closure
//! computes the same values either way (Rust never contracts `a * b + c` into an FMA).

/// Runs `f` compiled with the best instruction set the CPU supports (via `pulp`).
#[inline(always)]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}
