//! Runtime CPU-feature dispatch for the hand-written loops. `vectorized!({ ... })` runs its block
//! inside a function compiled for AVX-512 (or AVX2) when the CPU has it, so plain Rust loops over
//! slices auto-vectorise to full width; elsewhere the same code runs portably. The block computes
//! the same values either way (Rust never contracts `a * b + c` into an FMA).
//!
//! The block becomes an `#[inline(always)]` closure: without that, the closure is compiled on its
//! own for the baseline target (SSE2) and the dispatch buys nothing.

/// Runs the block compiled with the best instruction set the CPU supports (via `pulp`).
macro_rules! vectorized {
    ($($body:tt)*) => {
        pulp::Arch::new().dispatch(
            #[inline(always)]
            || { $($body)* },
        )
    };
}

pub(crate) use vectorized;
