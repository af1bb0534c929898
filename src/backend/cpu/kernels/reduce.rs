//! Reductions: per-column statistics of `[M, C]` matrices (batch-norm's per-channel sums, moments
//! and backward sums, in one pass each), reductions of an axis of `[outer, len, inner]` tensors
//! (rows when `inner == 1`, columns when `outer == 1`), and full reductions.
//!
//! Column statistics accumulate in `f64` (exact for the squares of `f32`), so batch-norm variances
//! do not cancel catastrophically. Large reductions split their rows into one range per thread and
//! combine the partial results in range order: fixed results for a given thread count.

use rayon::prelude::*;

use super::parallel::{split_range, threads, worth_parallel};
use super::simd::{carry, vectorized};
use super::{KernelError, check_len, shape_error};

/// Which reduction to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
}

/// Running per-column sums of `x` and `x²` over rows of width `cols`. Accumulate blocks with
/// [`ColumnMoments::add_rows`] (e.g. from a convolution epilogue, one accumulator per block) and
/// [`ColumnMoments::merge`] them in block order for a deterministic result.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnMoments {
    rows: usize,
    sum: Vec<f64>,
    sum_sq: Vec<f64>,
}

impl ColumnMoments {
    /// Empty statistics over `cols` columns.
    pub fn new(cols: usize) -> Self {
        ColumnMoments {
            rows: 0,
            sum: vec![0.0; cols],
            sum_sq: vec![0.0; cols],
        }
    }

    /// Adds whole rows (`rows.len()` must be a multiple of the column count; a trailing partial
    /// row is ignored).
    pub fn add_rows(&mut self, rows: &[f32]) {
        let cols = self.sum.len();
        if cols == 0 {
            return;
        }
        let (sum, sum_sq) = (&mut self.sum, &mut self.sum_sq);
        vectorized!({
            for row in rows.chunks_exact(cols) {
                for ((s, q), &v) in sum.iter_mut().zip(sum_sq.iter_mut()).zip(row) {
                    let v = f64::from(v);
                    *s += v;
                    *q += v * v;
                }
            }
        });
        self.rows += rows.len() / cols;
    }

    /// Adds the statistics of other rows (of the same width).
    pub fn merge(&mut self, other: &ColumnMoments) {
        self.rows += other.rows;
        self.sum
            .iter_mut()
            .zip(&other.sum)
            .for_each(|(a, b)| *a += b);
        let sq = self.sum_sq.iter_mut().zip(&other.sum_sq);
        sq.for_each(|(a, b)| *a += b);
    }

    /// Rows seen so far.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Per-column sums.
    pub fn sums(&self) -> &[f64] {
        &self.sum
    }

    /// Per-column sums of squares.
    pub fn sums_of_squares(&self) -> &[f64] {
        &self.sum_sq
    }

    /// Writes per-column means and biased variances (zeros before any row).
    pub fn mean_variance(&self, mean: &mut [f32], var: &mut [f32]) -> Result<(), KernelError> {
        check_len("column_moments", "mean", mean.len(), self.sum.len())?;
        check_len("column_moments", "variance", var.len(), self.sum.len())?;
        let scale = 1.0 / self.rows.max(1) as f64;
        for (i, (m, v)) in mean.iter_mut().zip(var.iter_mut()).enumerate() {
            let mu = self.sum[i] * scale;
            *m = mu as f32;
            *v = (self.sum_sq[i] * scale - mu * mu).max(0.0) as f32;
        }
        Ok(())
    }
}

/// Per-column sums about a shift: over `n` rows, `K` (a row of the data itself, the first),
/// `S = Σ(x − K)` and `Q = Σ(x − K)²` — a convolution epilogue's share of batch norm's variance
/// (`ChannelReduction::Variance`), the same quantities the CUDA kernels merge
/// (`kernels/split.cuh`). Merged in block order with [`ShiftedColumnMoments::merge`], re-centred
/// on the first block's shift, so every term stays of the order of the variance whatever the
/// data's offset.
#[derive(Clone, Debug, PartialEq)]
pub struct ShiftedColumnMoments {
    rows: f64,
    shift: Vec<f64>,
    sum: Vec<f64>,
    sum_sq: Vec<f64>,
}

impl ShiftedColumnMoments {
    /// The sums of whole rows of `cols` values (a trailing partial row is ignored), about the
    /// first row.
    pub fn of_rows(rows: &[f32], cols: usize) -> Self {
        let shift: Vec<f64> = rows
            .get(..cols)
            .unwrap_or_default()
            .iter()
            .map(|&k| f64::from(k))
            .collect();
        let (mut sum, mut sum_sq) = (vec![0.0; shift.len()], vec![0.0; shift.len()]);
        let mut n = 0usize;
        if !shift.is_empty() {
            for row in rows.chunks_exact(cols) {
                for (((s, q), &x), &k) in sum.iter_mut().zip(&mut sum_sq).zip(row).zip(&shift) {
                    let d = f64::from(x) - k;
                    *s += d;
                    *q += d * d;
                }
                n += 1;
            }
        }
        ShiftedColumnMoments {
            rows: n as f64,
            shift,
            sum,
            sum_sq,
        }
    }

    /// Adds the sums of other rows of the same width, re-centred on this one's shift: with
    /// `d = K_other − K`, `S += S_other + n_other·d` and `Q += Q_other + d·(2·S_other + n_other·d)`.
    pub fn merge(&mut self, other: &ShiftedColumnMoments) {
        if self.rows == 0.0 {
            *self = other.clone();
            return;
        }
        let n = other.rows;
        for c in 0..self.shift.len().min(other.shift.len()) {
            let d = other.shift[c] - self.shift[c];
            self.sum_sq[c] += other.sum_sq[c] + d * (2.0 * other.sum[c] + n * d);
            self.sum[c] += other.sum[c] + n * d;
        }
        self.rows += n;
    }

    /// The biased variance of each column, `Q/n − (S/n)²` (never below 0).
    pub fn variances(&self) -> Vec<f64> {
        let n = self.rows.max(1.0);
        self.sum
            .iter()
            .zip(&self.sum_sq)
            .map(|(s, q)| (q / n - (s / n) * (s / n)).max(0.0))
            .collect()
    }
}

/// Per-column means and biased variances of `x` (`[M, cols]`), one pass over `x`.
pub fn column_moments(
    x: &[f32],
    cols: usize,
    mean: &mut [f32],
    var: &mut [f32],
) -> Result<(), KernelError> {
    let rows = whole_rows("column_moments", x.len(), cols)?;
    let parts = over_row_ranges(rows, x.len(), |range| {
        let mut m = ColumnMoments::new(cols);
        m.add_rows(&x[range.start * cols..range.end * cols]);
        m
    });
    let mut total = ColumnMoments::new(cols);
    parts.iter().for_each(|p| total.merge(p));
    total.mean_variance(mean, var)
}

/// Per-column sums of `x` (`[M, cols]`): `sums[c] = Σ_m x[m, c]`.
pub fn column_sums(x: &[f32], cols: usize, sums: &mut [f32]) -> Result<(), KernelError> {
    let rows = whole_rows("column_sums", x.len(), cols)?;
    check_len("column_sums", "sums", sums.len(), cols)?;
    let parts = over_row_ranges(rows, x.len(), |range| {
        let mut acc = vec![0.0f64; cols];
        vectorized!({
            for row in x[range.start * cols..range.end * cols].chunks_exact(cols) {
                acc.iter_mut()
                    .zip(row)
                    .for_each(|(a, &v)| *a += f64::from(v));
            }
        });
        acc
    });
    for (c, s) in sums.iter_mut().enumerate() {
        *s = parts.iter().map(|p| p[c]).sum::<f64>() as f32;
    }
    Ok(())
}

/// Batch-norm backward's sums in one pass over `[M, cols]` operands: `sum_dy[c] = Σ dy[m, c]` and
/// `sum_dy_xhat[c] = Σ dy[m, c] · x̂[m, c]` with `x̂ = (x - mean[c]) · inv_std[c]`.
pub fn column_sums_dy_xhat(
    dy: &[f32],
    x: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    sum_dy: &mut [f32],
    sum_dy_xhat: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "column_sums_dy_xhat";
    let cols = mean.len();
    let rows = whole_rows(K, dy.len(), cols)?;
    check_len(K, "x", x.len(), dy.len())?;
    check_len(K, "inv_std", inv_std.len(), cols)?;
    check_len(K, "sum_dy", sum_dy.len(), cols)?;
    check_len(K, "sum_dy_xhat", sum_dy_xhat.len(), cols)?;
    let parts = over_row_ranges(rows, 2 * dy.len(), |range| {
        let mut acc = vec![0.0f64; 2 * cols];
        let (acc_dy, acc_dyx) = acc.split_at_mut(cols);
        let span = range.start * cols..range.end * cols;
        vectorized!({
            for (d_row, x_row) in dy[span.clone()]
                .chunks_exact(cols)
                .zip(x[span.clone()].chunks_exact(cols))
            {
                let columns = acc_dy.iter_mut().zip(acc_dyx.iter_mut());
                let values = d_row.iter().zip(x_row).zip(mean.iter().zip(inv_std));
                for ((s_dy, s_dyx), ((&d, &xv), (&mu, &is))) in columns.zip(values) {
                    let d = f64::from(d);
                    *s_dy += d;
                    *s_dyx += d * f64::from((xv - mu) * is);
                }
            }
        });
        acc
    });
    for c in 0..cols {
        sum_dy[c] = parts.iter().map(|p| p[c]).sum::<f64>() as f32;
        sum_dy_xhat[c] = parts.iter().map(|p| p[cols + c]).sum::<f64>() as f32;
    }
    Ok(())
}

/// Reduces the middle axis of `x` viewed as `[outer, len, inner]` into `out` (`[outer, inner]`).
/// `len == 0` gives the reduction's identity (0 for sums, NaN for the mean, ∓∞ for max/min).
pub fn reduce_axis(
    x: &[f32],
    outer: usize,
    len: usize,
    inner: usize,
    kind: ReduceKind,
    out: &mut [f32],
) -> Result<(), KernelError> {
    check_len("reduce_axis", "x", x.len(), outer * len * inner)?;
    check_len("reduce_axis", "out", out.len(), outer * inner)?;
    if inner == 0 || outer == 0 {
        return Ok(());
    }
    let slab = len * inner;
    let reduce_slab = |slab_x: &[f32], out: &mut [f32]| {
        if inner == 1 {
            out[0] = reduce_contiguous(slab_x, kind);
        } else {
            reduce_strided(slab_x, inner, kind, out);
        }
    };
    if outer == 1 && inner == 1 {
        out[0] = reduce_all(x, kind);
    } else if worth_parallel(x.len()) && outer > 1 {
        out.par_chunks_mut(inner)
            .enumerate()
            .for_each(carry(|(o, out): (usize, &mut [f32])| {
                reduce_slab(&x[o * slab..(o + 1) * slab], out)
            }));
    } else {
        for (o, out) in out.chunks_mut(inner).enumerate() {
            reduce_slab(&x[o * slab..(o + 1) * slab], out);
        }
    }
    Ok(())
}

/// Reduces all of `x` to one value (identity for an empty `x`, as [`reduce_axis`]).
pub fn reduce_all(x: &[f32], kind: ReduceKind) -> f32 {
    if !worth_parallel(x.len()) {
        return reduce_contiguous(x, kind);
    }
    let ranges = split_range(x.len(), threads());
    let parts: Vec<f32> = ranges
        .into_par_iter()
        .map(carry(|r: std::ops::Range<usize>| {
            reduce_contiguous(&x[r], kind.accumulator())
        }))
        .collect();
    let step = kind.accumulator();
    let combined = parts.iter().fold(step.identity(), |a, &p| step.step(a, p));
    finish(combined, x.len(), kind)
}

impl ReduceKind {
    /// The kind partial results are computed with (`Mean` sums, then divides once).
    fn accumulator(self) -> ReduceKind {
        match self {
            ReduceKind::Mean => ReduceKind::Sum,
            other => other,
        }
    }

    fn identity(self) -> f32 {
        match self {
            ReduceKind::Sum | ReduceKind::Mean => 0.0,
            ReduceKind::Max => f32::NEG_INFINITY,
            ReduceKind::Min => f32::INFINITY,
        }
    }

    fn step(self, acc: f32, v: f32) -> f32 {
        match self {
            ReduceKind::Sum | ReduceKind::Mean => acc + v,
            ReduceKind::Max => acc.max(v),
            ReduceKind::Min => acc.min(v),
        }
    }
}

/// Turns a sum into a mean; other kinds pass through.
fn finish(value: f32, len: usize, kind: ReduceKind) -> f32 {
    match kind {
        ReduceKind::Mean => value / len as f32,
        _ => value,
    }
}

/// Reduces a contiguous run with 16 independent lanes (so it vectorises), combined in lane order.
fn reduce_contiguous(x: &[f32], kind: ReduceKind) -> f32 {
    const LANES: usize = 16;
    let step = kind.accumulator();
    let value = vectorized!({
        let mut lanes = [step.identity(); LANES];
        let mut chunks = x.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (l, &v) in lanes.iter_mut().zip(chunk) {
                *l = step.step(*l, v);
            }
        }
        let tail = chunks.remainder();
        let lanes_total = lanes.iter().fold(step.identity(), |a, &l| step.step(a, l));
        tail.iter().fold(lanes_total, |a, &v| step.step(a, v))
    });
    finish(value, x.len(), kind)
}

/// Reduces `[len, inner]` over its rows into `out` (`inner` wide), row by row.
fn reduce_strided(x: &[f32], inner: usize, kind: ReduceKind, out: &mut [f32]) {
    let step = kind.accumulator();
    out.fill(step.identity());
    vectorized!({
        for row in x.chunks_exact(inner) {
            out.iter_mut()
                .zip(row)
                .for_each(|(o, &v)| *o = step.step(*o, v));
        }
    });
    let len = x.len() / inner;
    out.iter_mut().for_each(|o| *o = finish(*o, len, kind));
}

/// The number of rows of a `[M, cols]` operand of `len` elements.
fn whole_rows(kernel: &'static str, len: usize, cols: usize) -> Result<usize, KernelError> {
    if cols == 0 {
        return if len == 0 {
            Ok(0)
        } else {
            Err(shape_error(kernel, format!("{len} elements in rows of 0")))
        };
    }
    if !len.is_multiple_of(cols) {
        return Err(shape_error(
            kernel,
            format!("{len} elements do not form rows of {cols}"),
        ));
    }
    Ok(len / cols)
}

/// Runs `f` on one range of rows per thread (or one range when small) and returns the partial
/// results in range order.
fn over_row_ranges<T: Send>(
    rows: usize,
    work: usize,
    f: impl Fn(std::ops::Range<usize>) -> T + Sync + Send,
) -> Vec<T> {
    if !worth_parallel(work) {
        return vec![f(0..rows)];
    }
    split_range(rows, threads())
        .into_par_iter()
        .map(carry(f))
        .collect()
}
