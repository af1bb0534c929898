//! The threading policy shared by the kernels: when to spread work over the rayon pool, and how
//! to split it so that results depend only on the shapes (never on scheduling). Parallel tasks
//! run at the caller's SIMD level (`simd::carry`).

use super::KernelError;
use super::simd::{SimdLevel, with_level};
use rayon::prelude::*;

/// Below this many floating-point operations a kernel stays on the calling thread: handing work
/// to rayon costs a few microseconds, which tiny problems (a batch-8 `Linear(10, 10)`) cannot pay.
pub(crate) const PARALLEL_MIN_FLOPS: usize = 1 << 18;

/// The number of threads of the pool the caller runs in.
pub(crate) fn threads() -> usize {
    rayon::current_num_threads()
}

/// Whether `flops` of work is worth spreading over the pool.
pub(crate) fn worth_parallel(flops: usize) -> bool {
    flops >= PARALLEL_MIN_FLOPS && threads() > 1
}

/// Calls `f(block, first_row, scratch)` on consecutive blocks of `block_rows` rows of `out` (each
/// row `row_len` wide; the last block may be shorter), concurrently when `parallel`, and returns
/// the first error. Every worker gets its own scratch vector, created empty; `f` sizes it as it
/// needs. Block boundaries depend only on the arguments, so results do not depend on scheduling.
pub(crate) fn for_each_row_block<F>(
    out: &mut [f32],
    row_len: usize,
    block_rows: usize,
    parallel: bool,
    f: F,
) -> Result<(), KernelError>
where
    F: Fn(&mut [f32], usize, &mut Vec<f32>) -> Result<(), KernelError> + Sync + Send,
{
    let block_len = (block_rows * row_len).max(1);
    if parallel {
        let level = SimdLevel::current();
        out.par_chunks_mut(block_len)
            .enumerate()
            .try_for_each_init(Vec::new, |scratch, (i, block)| {
                with_level(level, || f(block, i * block_rows, scratch))
            })
    } else {
        let mut scratch = Vec::new();
        for (i, block) in out.chunks_mut(block_len).enumerate() {
            f(block, i * block_rows, &mut scratch)?;
        }
        Ok(())
    }
}

/// Splits `0..total` into `parts` nearly equal consecutive ranges (the first ones one longer).
pub(crate) fn split_range(total: usize, parts: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.clamp(1, total.max(1));
    let base = total / parts;
    let extra = total % parts;
    let mut start = 0;
    (0..parts)
        .map(|p| {
            let len = base + usize::from(p < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

/// Resizes `scratch` to `len` elements (contents unspecified) and returns it.
pub(crate) fn scratch_of(scratch: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if scratch.len() < len {
        scratch.resize(len, 0.0);
    }
    &mut scratch[..len]
}

/// Where a task computes its `block` of output rows: the block itself, or, when the epilogue
/// stores the rows elsewhere (`Epilogue::stores_elsewhere`: a bf16 output), as many rows of the
/// thread's `scratch`, in cache for the epilogue.
pub(crate) fn rows_target<'a>(
    block: &'a mut [f32],
    scratch: &'a mut Vec<f32>,
    elsewhere: bool,
) -> &'a mut [f32] {
    if elsewhere {
        scratch_of(scratch, block.len())
    } else {
        block
    }
}
