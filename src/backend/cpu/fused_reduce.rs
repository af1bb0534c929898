//! The CPU engine for reduction kernels with fused prologues.
//!
//! The prologue (a fused expression over the input space) is evaluated chunk by chunk, and each
//! of its outputs is folded into an accumulator per output element. Partial sums are taken in
//! `f32` within a chunk and added into `f64` accumulators, so long reductions stay accurate at
//! vector speed. The input is split into a fixed number of blocks with private accumulators,
//! combined in block order: results depend on the thread count only through that number.

use super::access::{Access, coalesce};
use super::fused::{FusedProgram, add_column_sums};
use super::kernels::simd::{carry, vectorized};
use super::memory::RawBuf;
use crate::ir::ReduceOp;
use rayon::prelude::*;

/// A reduction kernel prepared for execution.
pub struct ReduceProgram {
    prologue: FusedProgram,
    ops: Vec<ReduceOp>,
    /// Where each input point's result goes.
    out_access: Access,
    points: usize,
    out_len: usize,
    /// Number of input points folded into each output element (for means).
    count: usize,
    /// `(block, inner)` when the output index is `offset + (f / block)·inner + f % inner`
    /// (a reduction over middle axes, e.g. global average pooling of `[N, H, W, C]` over
    /// `H, W`): each block of `block` points folds periodically into its own `inner` outputs.
    blocked: Option<(usize, usize)>,
}

fn identity(op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => 0.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    }
}

fn combine(op: ReduceOp, a: f64, b: f64) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => a + b,
        ReduceOp::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        ReduceOp::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
    }
}

impl ReduceProgram {
    /// Prepares a reduction of `shape` over `axes` with the given prologue and operand views.
    pub fn new(
        prologue: &crate::lower::FusedExpr,
        shape: &[usize],
        axes: &[usize],
        ops: &[ReduceOp],
        views: &[(usize, &[usize])],
    ) -> ReduceProgram {
        let points: usize = shape.iter().product();
        let kept: Vec<usize> = (0..shape.len()).filter(|d| !axes.contains(d)).collect();
        let out_len: usize = kept.iter().map(|&d| shape[d]).product();
        let mut out_strides = vec![0usize; shape.len()];
        let mut acc = 1;
        for &d in kept.iter().rev() {
            out_strides[d] = acc;
            acc *= shape[d];
        }
        let (cshape, cs) = coalesce(shape, &[&out_strides]);
        let blocked = match (cshape.as_slice(), cs[0].as_slice()) {
            (&[_, mid, inner], &[outer_stride, 0, 1]) if outer_stride == inner && inner > 0 => {
                Some((mid * inner, inner))
            }
            _ => None,
        };
        ReduceProgram {
            blocked,
            prologue: FusedProgram::new(prologue, shape, views),
            ops: ops.to_vec(),
            out_access: Access::classify(0, &cshape, &cs[0]),
            points,
            out_len,
            count: points.checked_div(out_len).unwrap_or(0),
        }
    }

    /// The prologue (for bounds checks of its operands).
    pub fn prologue(&self) -> &FusedProgram {
        &self.prologue
    }

    fn fold_block(&self, start: usize, end: usize, inputs: &[RawBuf]) -> Vec<Vec<f64>> {
        let mut acc: Vec<Vec<f64>> = self
            .ops
            .iter()
            .map(|&op| vec![identity(op); self.out_len])
            .collect();
        let mut idx = vec![0usize; super::fused::CHUNK];
        let ops = &self.ops;
        let out_access = &self.out_access;
        let blocked = self.blocked;
        // Per-column f32 partials of the periodic case, reused across chunks.
        let period = match out_access {
            Access::Periodic { period, .. } => *period,
            _ => 0,
        };
        let mut parts: Vec<Vec<f32>> = ops
            .iter()
            .map(|&op| vec![identity(op) as f32; period])
            .collect();
        // The folding loops run compiled for the widest vector unit (see `vectorized!`).
        let sink = |s: usize, lanes: &[&[f32]]| {
            vectorized!({
                let n = lanes.first().map_or(0, |l| l.len());
                if period > 0 {
                    // Row segments of the chunk fold into the columns they cover (vectorised).
                    for (j, &op) in ops.iter().enumerate() {
                        let part = &mut parts[j];
                        let sums = matches!(op, ReduceOp::Sum | ReduceOp::Mean);
                        if sums && s.is_multiple_of(period) && n.is_multiple_of(period) {
                            // Whole rows (the common case), without per-column index
                            // arithmetic: 16, 32 or 64 columns are summed in registers, others
                            // in the same order as below. Chunks start at multiples of `CHUNK`
                            // whatever the blocks, so which way a chunk goes depends on the
                            // shape only.
                            if add_column_sums(lanes[j], None, &mut acc[j][..period]) {
                                continue;
                            }
                            for seg in lanes[j].chunks_exact(period) {
                                part.iter_mut().zip(seg).for_each(|(a, &x)| *a += x);
                            }
                            for (a, p) in acc[j][..period].iter_mut().zip(part.iter_mut()) {
                                *a += f64::from(*p);
                                *p = 0.0;
                            }
                            continue;
                        }
                        if period >= n {
                            // Each column sees at most one element of the chunk: fold straight
                            // into the f64 accumulators (what the partials would yield).
                            let (mut at, mut phase) = (0, s % period);
                            while at < n {
                                let m = (period - phase).min(n - at);
                                let seg = &lanes[j][at..at + m];
                                let cols = &mut acc[j][phase..phase + m];
                                if sums {
                                    cols.iter_mut().zip(seg).for_each(|(a, &x)| {
                                        *a += f64::from(x);
                                    });
                                } else {
                                    cols.iter_mut().zip(seg).for_each(|(a, &x)| {
                                        *a = combine(op, *a, f64::from(x));
                                    });
                                }
                                at += m;
                                phase = 0;
                            }
                            continue;
                        }
                        let (mut at, mut phase) = (0, s % period);
                        while at < n {
                            let m = (period - phase).min(n - at);
                            let seg = &lanes[j][at..at + m];
                            let cols = &mut part[phase..phase + m];
                            match op {
                                ReduceOp::Sum | ReduceOp::Mean => {
                                    cols.iter_mut().zip(seg).for_each(|(a, &x)| *a += x)
                                }
                                _ => cols
                                    .iter_mut()
                                    .zip(seg)
                                    .for_each(|(a, &x)| *a = combine_f32(op, *a, x)),
                            }
                            at += m;
                            phase = 0;
                        }
                        // Flush the touched columns into the f64 accumulators.
                        let first = s % period;
                        let touched = n.min(period);
                        for t in 0..touched {
                            let c = (first + t) % period;
                            acc[j][c] = combine(op, acc[j][c], f64::from(part[c]));
                            part[c] = identity(op) as f32;
                        }
                    }
                    return;
                }
                if let (Some((block, inner)), Access::General { offset, .. }) =
                    (blocked, out_access)
                {
                    for (j, &op) in ops.iter().enumerate() {
                        if matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
                            fold_blocked(lanes[j], s, block, inner, &mut acc[j][*offset..]);
                        } else {
                            for (t, &x) in lanes[j].iter().enumerate() {
                                let f = s + t;
                                let o = offset + f / block * inner + f % inner;
                                acc[j][o] = combine(op, acc[j][o], f64::from(x));
                            }
                        }
                    }
                    return;
                }
                // Runs of positions folding into one output element, found arithmetically.
                let run_len = match out_access {
                    Access::Scalar { .. } => Some(usize::MAX),
                    Access::Repeat { inner, .. } if *inner > 0 => Some(*inner),
                    _ => None,
                };
                if let (Some(len), Access::Scalar { offset } | Access::Repeat { offset, .. }) =
                    (run_len, out_access)
                {
                    for (j, &op) in ops.iter().enumerate() {
                        let x = lanes[j];
                        let mut k = 0;
                        while k < n {
                            let f = s + k;
                            let (target, e) = if len == usize::MAX {
                                (*offset, n)
                            } else {
                                (offset + f / len, (k + len - f % len).min(n))
                            };
                            let run = fold_run(op, &x[k..e]);
                            acc[j][target] = combine(op, acc[j][target], f64::from(run));
                            k = e;
                        }
                    }
                    return;
                }
                let idx = &mut idx[..n];
                out_access.indices(s, idx);
                for (j, &op) in ops.iter().enumerate() {
                    let x = lanes[j];
                    let mut k = 0;
                    while k < n {
                        // A run of positions folding into the same output element.
                        let target = idx[k];
                        let mut e = k + 1;
                        while e < n && idx[e] == target {
                            e += 1;
                        }
                        let run = fold_run(op, &x[k..e]);
                        acc[j][target] = combine(op, acc[j][target], f64::from(run));
                        k = e;
                    }
                }
            })
        };
        // SAFETY: the executor checked the prologue's operand extents before running.
        unsafe { self.prologue.for_each_chunk(start, end, inputs, sink) };
        acc
    }

    /// Runs the reduction, writing output `j` (of `out_len` elements) to `outputs[j]`.
    ///
    /// # Safety
    /// Operand extents were checked against their buffers; outputs hold `out_len` elements and
    /// are not accessed by anyone else meanwhile.
    pub unsafe fn run(&self, inputs: &[RawBuf], outputs: &[RawBuf], threads: usize) {
        let chunk = super::fused::CHUNK;
        let chunks = self.points.div_ceil(chunk);
        let blocks = if self.points < (1 << 15) {
            1
        } else {
            (threads * 4).min(chunks).max(1)
        };
        let per = chunks.div_ceil(blocks) * chunk;
        let fold = |b: usize| {
            let start = (b * per).min(self.points);
            let end = ((b + 1) * per).min(self.points);
            self.fold_block(start, end, inputs)
        };
        // One block runs on the calling thread (small kernels never touch a thread pool).
        let partials: Vec<Vec<Vec<f64>>> = if blocks == 1 {
            vec![fold(0)]
        } else {
            (0..blocks).into_par_iter().map(carry(fold)).collect()
        };
        for (j, &op) in self.ops.iter().enumerate() {
            let mut total = vec![identity(op); self.out_len];
            for p in &partials {
                for (t, x) in total.iter_mut().zip(&p[j]) {
                    *t = combine(op, *t, *x);
                }
            }
            for (i, t) in total.iter().enumerate() {
                let v = if op == ReduceOp::Mean {
                    t / self.count.max(1) as f64
                } else {
                    *t
                };
                // SAFETY: `i < out_len`, exclusive by the caller's contract.
                unsafe { outputs[j].set_f64(i, v) };
            }
        }
    }
}

/// Adds the lanes of a chunk at flat position `s` to `acc[(f / block)·inner + f % inner]`
/// (`block` a multiple of `inner`): per block segment, f32 partials per column, then one f64
/// addition per column.
fn fold_blocked(lanes: &[f32], s: usize, block: usize, inner: usize, acc: &mut [f64]) {
    let mut part = vec![0.0f32; inner];
    let mut k = 0;
    while k < lanes.len() {
        let f = s + k;
        let (o, within) = (f / block, f % block);
        let seg = &lanes[k..k + (block - within).min(lanes.len() - k)];
        let (mut at, mut phase) = (0, within % inner);
        while at < seg.len() {
            let m = (inner - phase).min(seg.len() - at);
            part[phase..phase + m]
                .iter_mut()
                .zip(&seg[at..at + m])
                .for_each(|(p, &x)| *p += x);
            at += m;
            phase = 0;
        }
        for (a, p) in acc[o * inner..(o + 1) * inner].iter_mut().zip(&mut part) {
            *a += f64::from(*p);
            *p = 0.0;
        }
        k += seg.len();
    }
}

/// Folds a contiguous run with eight independent lanes (so sums vectorise).
fn fold_run(op: ReduceOp, x: &[f32]) -> f32 {
    let id = identity(op) as f32;
    let mut lanes = [id; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = combine_f32(op, *l, v);
        }
    }
    let mut total = chunks
        .remainder()
        .iter()
        .fold(id, |a, &v| combine_f32(op, a, v));
    for l in lanes {
        total = combine_f32(op, total, l);
    }
    total
}

#[inline]
fn combine_f32(op: ReduceOp, a: f32, b: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => a + b,
        ReduceOp::Max => {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else if a > b {
                a
            } else {
                b
            }
        }
        ReduceOp::Min => {
            if a.is_nan() || b.is_nan() {
                f32::NAN
            } else if a < b {
                a
            } else {
                b
            }
        }
    }
}
