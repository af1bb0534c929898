//! Softmax, log-softmax and sparse softmax cross-entropy over the last axis of `[rows, cols]`
//! matrices, forward and backward. Every row subtracts its maximum before exponentiating, so large
//! logits do not overflow. Rows are independent; large inputs spread rows over the pool.

use rayon::prelude::*;

use super::parallel::worth_parallel;
use super::simd::carry;
use super::{KernelError, check_len, shape_error};

/// Rows per parallel task (fixed so results never depend on scheduling; rows are independent).
const ROWS_PER_TASK: usize = 64;

/// Runs `f(row_index, out_row)` over the rows of `out`, spread over the pool when large.
fn per_row(out: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if cols == 0 {
        return;
    }
    if worth_parallel(out.len() * 16) {
        out.par_chunks_mut(cols * ROWS_PER_TASK)
            .enumerate()
            .for_each(carry(|(t, rows): (usize, &mut [f32])| {
                for (i, row) in rows.chunks_exact_mut(cols).enumerate() {
                    f(t * ROWS_PER_TASK + i, row);
                }
            }));
    } else {
        for (i, row) in out.chunks_exact_mut(cols).enumerate() {
            f(i, row);
        }
    }
}

fn row_max(row: &[f32]) -> f32 {
    row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

/// `log Σ exp(row)`, computed stably.
fn log_sum_exp(row: &[f32]) -> f32 {
    let max = row_max(row);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
    max + sum.ln()
}

fn check_pair(kernel: &'static str, a: usize, b: usize, cols: usize) -> Result<(), KernelError> {
    check_len(kernel, "output", b, a)?;
    if cols == 0 && a != 0 || cols != 0 && !a.is_multiple_of(cols) {
        return Err(shape_error(
            kernel,
            format!("{a} elements do not form rows of {cols}"),
        ));
    }
    Ok(())
}

/// `y = softmax(x)` along rows of `cols`.
pub fn softmax(x: &[f32], cols: usize, y: &mut [f32]) -> Result<(), KernelError> {
    check_pair("softmax", x.len(), y.len(), cols)?;
    per_row(y, cols, |i, out| {
        let row = &x[i * cols..(i + 1) * cols];
        let max = row_max(row);
        let mut sum = 0.0;
        for (o, &v) in out.iter_mut().zip(row) {
            *o = (v - max).exp();
            sum += *o;
        }
        let inv = 1.0 / sum;
        out.iter_mut().for_each(|o| *o *= inv);
    });
    Ok(())
}

/// `y = log_softmax(x) = x - log Σ exp(x)` along rows of `cols`.
pub fn log_softmax(x: &[f32], cols: usize, y: &mut [f32]) -> Result<(), KernelError> {
    check_pair("log_softmax", x.len(), y.len(), cols)?;
    per_row(y, cols, |i, out| {
        let row = &x[i * cols..(i + 1) * cols];
        let lse = log_sum_exp(row);
        out.iter_mut().zip(row).for_each(|(o, &v)| *o = v - lse);
    });
    Ok(())
}

/// Gradient of softmax from its output `y`: `dx = y · (dy - Σ dy·y)` per row.
pub fn softmax_backward(
    y: &[f32],
    dy: &[f32],
    cols: usize,
    dx: &mut [f32],
) -> Result<(), KernelError> {
    check_pair("softmax_backward", y.len(), dx.len(), cols)?;
    check_len("softmax_backward", "dy", dy.len(), y.len())?;
    per_row(dx, cols, |i, out| {
        let (y, dy) = (&y[i * cols..(i + 1) * cols], &dy[i * cols..(i + 1) * cols]);
        let dot: f32 = y.iter().zip(dy).map(|(a, b)| a * b).sum();
        for ((o, &y), &d) in out.iter_mut().zip(y).zip(dy) {
            *o = y * (d - dot);
        }
    });
    Ok(())
}

/// Gradient of log-softmax from its output `y`: `dx = dy - exp(y) · Σ dy` per row.
pub fn log_softmax_backward(
    y: &[f32],
    dy: &[f32],
    cols: usize,
    dx: &mut [f32],
) -> Result<(), KernelError> {
    check_pair("log_softmax_backward", y.len(), dx.len(), cols)?;
    check_len("log_softmax_backward", "dy", dy.len(), y.len())?;
    per_row(dx, cols, |i, out| {
        let (y, dy) = (&y[i * cols..(i + 1) * cols], &dy[i * cols..(i + 1) * cols]);
        let sum: f32 = dy.iter().sum();
        for ((o, &y), &d) in out.iter_mut().zip(y).zip(dy) {
            *o = d - y.exp() * sum;
        }
    });
    Ok(())
}

/// Checks the labels of a `[rows, classes]` cross-entropy.
fn check_labels<L: Copy + Into<i64>>(
    kernel: &'static str,
    labels: &[L],
    classes: usize,
) -> Result<(), KernelError> {
    for (i, &l) in labels.iter().enumerate() {
        let l: i64 = l.into();
        if l < 0 || l as u64 >= classes as u64 {
            return Err(shape_error(
                kernel,
                format!("label {l} of row {i} is outside the {classes} classes"),
            ));
        }
    }
    Ok(())
}

/// A label already checked by [`check_labels`] as an index.
fn index<L: Copy + Into<i64>>(label: L) -> usize {
    let l: i64 = label.into();
    l as usize
}

/// Per-row cross-entropy of `softmax(logits)` against integer labels:
/// `loss[i] = log Σ exp(logits[i]) - logits[i, labels[i]]`. `logits` is `[rows, classes]`,
/// `labels` and `loss` have `rows` entries; a label outside `0..classes` is an error (as TF).
pub fn sparse_softmax_cross_entropy<L: Copy + Into<i64>>(
    logits: &[f32],
    labels: &[L],
    classes: usize,
    loss: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "sparse_softmax_cross_entropy";
    check_len(K, "logits", logits.len(), labels.len() * classes)?;
    check_len(K, "loss", loss.len(), labels.len())?;
    check_labels(K, labels, classes)?;
    for (i, (l, &label)) in loss.iter_mut().zip(labels).enumerate() {
        let row = &logits[i * classes..(i + 1) * classes];
        *l = log_sum_exp(row) - row[index(label)];
    }
    Ok(())
}

/// Gradient of [`sparse_softmax_cross_entropy`] with respect to the logits:
/// `dlogits[i] = dloss[i] · (softmax(logits[i]) - one_hot(labels[i]))`.
pub fn sparse_softmax_cross_entropy_backward<L: Copy + Into<i64>>(
    logits: &[f32],
    labels: &[L],
    classes: usize,
    dloss: &[f32],
    dlogits: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "sparse_softmax_cross_entropy_backward";
    check_len(K, "dloss", dloss.len(), labels.len())?;
    check_len(K, "dlogits", dlogits.len(), logits.len())?;
    sparse_softmax_cross_entropy_with_grad(logits, labels, classes, None, dlogits)?;
    for (row, &d) in dlogits.chunks_exact_mut(classes.max(1)).zip(dloss) {
        row.iter_mut().for_each(|v| *v *= d);
    }
    Ok(())
}

/// Loss and logit gradient in one pass, as TF's `SparseSoftmaxCrossEntropyWithLogits` computes
/// them: `loss` as [`sparse_softmax_cross_entropy`] (skipped when `None`) and
/// `grad[i] = softmax(logits[i]) - one_hot(labels[i])`, the gradient for `dloss = 1` (scale rows
/// by `dloss` for the full backward pass). Each row is exponentiated once.
pub fn sparse_softmax_cross_entropy_with_grad<L: Copy + Into<i64>>(
    logits: &[f32],
    labels: &[L],
    classes: usize,
    mut loss: Option<&mut [f32]>,
    grad: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "sparse_softmax_cross_entropy_with_grad";
    check_len(K, "logits", logits.len(), labels.len() * classes)?;
    check_len(K, "grad", grad.len(), logits.len())?;
    if let Some(loss) = loss.as_deref() {
        check_len(K, "loss", loss.len(), labels.len())?;
    }
    check_labels(K, labels, classes)?;
    for (i, &label) in labels.iter().enumerate() {
        let row = &logits[i * classes..(i + 1) * classes];
        let out = &mut grad[i * classes..(i + 1) * classes];
        let max = row_max(row);
        let mut sum = 0.0;
        for (o, &v) in out.iter_mut().zip(row) {
            *o = (v - max).exp();
            sum += *o;
        }
        let inv = 1.0 / sum;
        out.iter_mut().for_each(|o| *o *= inv);
        let label = index(label);
        out[label] -= 1.0;
        if let Some(loss) = loss.as_deref_mut() {
            loss[i] = max + sum.ln() - row[label];
        }
    }
    Ok(())
}
