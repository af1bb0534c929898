//! Epilogues: elementwise work applied to blocks of GEMM/convolution output rows while they are
//! still hot in cache. The compiler fuses bias+activation, batch-norm apply+ReLU and residual adds
//! into them; any fused elementwise expression can run as a closure, and [`MomentsEpilogue`]
//! gathers batch-norm statistics of the output on the way.

use std::sync::Mutex;

use super::reduce::ColumnMoments;
use super::simd::vectorized;
use super::{KernelError, check_len};

/// Work applied to finished output rows. `rows` holds whole rows `first_row..first_row + r`, each
/// `cols` wide (row-major, NHWC: a row is one pixel's channels). Blocks are disjoint and cover the
/// output once; their boundaries depend only on the shapes, so an epilogue may keep per-block
/// partial results keyed by `first_row` and combine them in order for deterministic reductions.
/// Blocks may be processed concurrently on different threads.
pub trait Epilogue: Sync {
    fn apply(&self, rows: &mut [f32], first_row: usize, cols: usize);

    /// Checks, before a kernel runs, that the epilogue's operands fit an output of
    /// `rows × cols`. Every kernel calls it first, so `apply` may index its operands freely.
    fn check(&self, _rows: usize, _cols: usize) -> Result<(), KernelError> {
        Ok(())
    }

    /// Whether [`Epilogue::apply`] does nothing (lets kernels skip the call).
    fn is_identity(&self) -> bool {
        false
    }

    /// The multiple of rows a kernel's blocks should be, for outputs `cols` wide, when the
    /// kernel chooses its own block length (rather than one image per block): 1 by default.
    /// An epilogue that sums its rows in fixed-size chunks of values (the fused engine's
    /// per-channel reductions) asks for blocks of whole chunks, so that its sums do not depend
    /// on the kernel's blocking and equal, bit for bit, those of the reduction kernel an
    /// unfused program runs.
    fn block_rows_multiple(&self, _cols: usize) -> usize {
        1
    }

    /// Whether [`Epilogue::apply`] stores the finished rows somewhere of its own, so nothing
    /// reads them where the kernel computed them: a kernel may then compute each block in
    /// scratch memory of its own (kept in cache) instead of in its output.
    fn stores_elsewhere(&self) -> bool {
        false
    }

    /// [`Epilogue::apply`] for an output kept in bf16: the finished rows rounded (nearest
    /// even) into `bits` (as long as `rows`) as bf16 bit patterns; `rows` may be left with any
    /// values. By default the rows are finished in place, then rounded; an epilogue that
    /// computes its result elsewhere anyway rounds it from there.
    fn apply_to_bf16(&self, rows: &mut [f32], first_row: usize, cols: usize, bits: &mut [u16]) {
        if !self.is_identity() {
            self.apply(rows, first_row, cols);
        }
        super::round::to_bf16_bits(rows, bits);
    }
}

/// `rows` rounded up to a multiple of `epilogue`'s [`Epilogue::block_rows_multiple`] for
/// outputs `cols` wide: the block length of a kernel that picks its own.
pub fn aligned_block_rows(epilogue: &dyn Epilogue, rows: usize, cols: usize) -> usize {
    rows.next_multiple_of(epilogue.block_rows_multiple(cols).max(1))
}

/// The epilogue that leaves the output as computed.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoEpilogue;

impl Epilogue for NoEpilogue {
    fn apply(&self, _rows: &mut [f32], _first_row: usize, _cols: usize) {}

    fn is_identity(&self) -> bool {
        true
    }
}

/// Any `Fn(rows, first_row, cols)` closure is an epilogue.
impl<F: Fn(&mut [f32], usize, usize) + Sync> Epilogue for F {
    fn apply(&self, rows: &mut [f32], first_row: usize, cols: usize) {
        self(rows, first_row, cols)
    }
}

/// `y = relu?(y * scale[c] + shift[c] + residual)`, per output channel `c` (the last axis):
/// bias + ReLU, batch-norm apply + ReLU, and a residual add in one pass.
///
/// `scale` and `shift` have one entry per channel; `residual` is shaped like the whole output and
/// is read at the rows being finished.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChannelEpilogue<'a> {
    pub scale: Option<&'a [f32]>,
    pub shift: Option<&'a [f32]>,
    pub residual: Option<&'a [f32]>,
    pub relu: bool,
}

impl Epilogue for ChannelEpilogue<'_> {
    fn check(&self, rows: usize, cols: usize) -> Result<(), KernelError> {
        const K: &str = "channel_epilogue";
        if let Some(scale) = self.scale {
            check_len(K, "scale", scale.len(), cols)?;
        }
        if let Some(shift) = self.shift {
            check_len(K, "shift", shift.len(), cols)?;
        }
        if let Some(residual) = self.residual {
            check_len(K, "residual", residual.len(), rows * cols)?;
        }
        Ok(())
    }

    fn apply(&self, rows: &mut [f32], first_row: usize, cols: usize) {
        if cols == 0 {
            return;
        }
        // Kernels call `check` before running, so the residual covers these rows.
        let residual = self
            .residual
            .map(|r| &r[first_row * cols..first_row * cols + rows.len()]);
        vectorized!({
            for (i, row) in rows.chunks_exact_mut(cols).enumerate() {
                if let Some(scale) = self.scale {
                    row.iter_mut().zip(scale).for_each(|(y, s)| *y *= s);
                }
                if let Some(shift) = self.shift {
                    row.iter_mut().zip(shift).for_each(|(y, b)| *y += b);
                }
                if let Some(res) = residual {
                    let res = &res[i * cols..(i + 1) * cols];
                    row.iter_mut().zip(res).for_each(|(y, r)| *y += r);
                }
                if self.relu {
                    row.iter_mut().for_each(|y| *y = y.max(0.0));
                }
            }
        })
    }

    fn is_identity(&self) -> bool {
        self.scale.is_none() && self.shift.is_none() && self.residual.is_none() && !self.relu
    }
}

/// Runs `inner`, then gathers per-channel sums and sums of squares of the finished rows: a
/// convolution feeding batch normalisation yields its batch statistics without a second pass over
/// its output. [`MomentsEpilogue::finish`] merges the blocks in row order, so the statistics do
/// not depend on thread count or scheduling (only on the algorithm's block boundaries).
#[derive(Debug)]
pub struct MomentsEpilogue<E> {
    inner: E,
    cols: usize,
    blocks: Mutex<Vec<(usize, ColumnMoments)>>,
}

impl<E: Epilogue> MomentsEpilogue<E> {
    /// Statistics over rows of `cols` channels, after `inner`.
    pub fn new(inner: E, cols: usize) -> Self {
        MomentsEpilogue {
            inner,
            cols,
            blocks: Mutex::new(Vec::new()),
        }
    }

    /// The moments of every row seen, merged in row order.
    pub fn finish(self) -> ColumnMoments {
        // A poisoned lock only means a worker panicked after pushing; the data is still whole.
        let mut blocks = self.blocks.into_inner().unwrap_or_else(|e| e.into_inner());
        blocks.sort_by_key(|(first_row, _)| *first_row);
        let mut total = ColumnMoments::new(self.cols);
        blocks.iter().for_each(|(_, m)| total.merge(m));
        total
    }
}

impl<E: Epilogue> Epilogue for MomentsEpilogue<E> {
    fn apply(&self, rows: &mut [f32], first_row: usize, cols: usize) {
        self.inner.apply(rows, first_row, cols);
        let mut moments = ColumnMoments::new(cols);
        moments.add_rows(rows);
        let mut blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        blocks.push((first_row, moments));
    }

    fn block_rows_multiple(&self, cols: usize) -> usize {
        self.inner.block_rows_multiple(cols)
    }

    fn check(&self, rows: usize, cols: usize) -> Result<(), KernelError> {
        if cols != self.cols {
            return Err(super::shape_error(
                "moments_epilogue",
                format!("built for {} channels, the output has {cols}", self.cols),
            ));
        }
        self.inner.check(rows, cols)
    }
}
