//! Small fixed-function kernels of the CPU backend that need no tuning: argmax, in-top-k,
//! concatenation and zero padding (the last two for any dtype, by bytes).

use super::kernels::KernelError;
use super::memory::RawBuf;
use crate::lower::View;

fn check(raw: &RawBuf, offset: usize, len: usize, what: &'static str) -> Result<(), KernelError> {
    if offset + len > raw.len {
        return Err(KernelError::Shape {
            kernel: what,
            message: format!("buffer of {} elements read at {offset}+{len}", raw.len),
        });
    }
    Ok(())
}

/// Index of the first maximum along the middle axis of `[outer, len, inner]`, as `i64`.
pub fn argmax(
    x: &RawBuf,
    v: &View,
    y: &RawBuf,
    outer: usize,
    len: usize,
    inner: usize,
) -> Result<(), KernelError> {
    check(x, v.offset, outer * len * inner, "argmax")?;
    check(y, 0, outer * inner, "argmax")?;
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0;
            let mut best_v = f64::NEG_INFINITY;
            for l in 0..len {
                // SAFETY: bounds checked above.
                let val = unsafe { x.get_f64(v.offset + (o * len + l) * inner + i) };
                // NaN counts as the largest value; the first maximum wins ties (as the oracle).
                if !best_v.is_nan() && (val.is_nan() || val > best_v || l == 0) {
                    best = l;
                    best_v = val;
                }
            }
            // SAFETY: bounds checked above; the output is this kernel's own.
            unsafe { y.set_f64(o * inner + i, best as f64) };
        }
    }
    Ok(())
}

/// Whether each row's target is among its `k` largest predictions (TF's `in_top_k`: fewer than
/// `k` entries strictly greater than the target's; a row with a non-finite score or an
/// out-of-range target is never in the top k).
pub fn in_top_k(
    preds: &[f32],
    targets: &[i64],
    classes: usize,
    k: usize,
    y: &RawBuf,
) -> Result<(), KernelError> {
    check(y, 0, targets.len(), "in_top_k")?;
    for (r, &t) in targets.iter().enumerate() {
        let row = &preds[r * classes..(r + 1) * classes];
        let hit = row.iter().all(|p| p.is_finite())
            && usize::try_from(t)
                .ok()
                .filter(|&t| t < classes)
                .is_some_and(|t| {
                    let score = row[t];
                    row.iter().filter(|&&p| p > score).count() < k
                });
        // SAFETY: bounds checked above; the output is this kernel's own.
        unsafe { y.set_f64(r, f64::from(u8::from(hit))) };
    }
    Ok(())
}

/// Joins the inputs along the middle axis of `[outer, size_i, inner]` (`sizes` already multiplied
/// by `inner`).
pub fn concat(
    ins: &[RawBuf],
    views: &[View],
    y: &RawBuf,
    outer: usize,
    sizes: &[usize],
) -> Result<(), KernelError> {
    let total: usize = sizes.iter().sum();
    check(y, 0, outer * total, "concat")?;
    let bytes = y.dtype.size_bytes();
    let mut col = 0;
    for ((x, v), &size) in ins.iter().zip(views).zip(sizes) {
        check(x, v.offset, outer * size, "concat")?;
        for o in 0..outer {
            // SAFETY: both ranges checked above; input and output never overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    x.ptr.add((v.offset + o * size) * bytes),
                    y.ptr.add((o * total + col) * bytes),
                    size * bytes,
                );
            }
        }
        col += size;
    }
    Ok(())
}

/// Zero padding of a `shape` tensor by `(before, after)` per axis.
pub fn pad(
    x: &RawBuf,
    v: &View,
    y: &RawBuf,
    shape: &[usize],
    pads: &[(usize, usize)],
) -> Result<(), KernelError> {
    let n: usize = shape.iter().product();
    let out_shape: Vec<usize> = shape
        .iter()
        .zip(pads)
        .map(|(d, (b, a))| d + b + a)
        .collect();
    let m: usize = out_shape.iter().product();
    check(x, v.offset, n, "pad")?;
    check(y, 0, m, "pad")?;
    let bytes = y.dtype.size_bytes();
    // SAFETY: the output range was checked; it is this kernel's own.
    unsafe { std::ptr::write_bytes(y.ptr, 0, m * bytes) };
    if n == 0 {
        return Ok(());
    }
    // Copy one innermost row at a time.
    let rank = shape.len();
    let row = shape[rank - 1];
    let mut idx = vec![0usize; rank.saturating_sub(1)];
    for r in 0..n / row {
        let mut out_off = pads[rank - 1].0;
        let mut stride = out_shape[rank - 1];
        for d in (0..rank - 1).rev() {
            out_off += (idx[d] + pads[d].0) * stride;
            stride *= out_shape[d];
        }
        // SAFETY: both rows lie inside the checked ranges.
        unsafe {
            std::ptr::copy_nonoverlapping(
                x.ptr.add((v.offset + r * row) * bytes),
                y.ptr.add(out_off * bytes),
                row * bytes,
            );
        }
        for d in (0..rank - 1).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(())
}
