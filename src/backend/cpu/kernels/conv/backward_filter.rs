//! The filter gradient `dw` of a convolution: `dw = Σ_rows patches(x)ᵀ · dy`, a GEMM whose inner
//! dimension is every output pixel of the batch.
//!
//! The pixel rows are split into one range per thread; each range accumulates its own partial
//! filter block by block (im2col of a block, GEMM with the block's `dy` rows), and the partials
//! are summed in range order, so the result is fixed for a given thread count.

use rayon::prelude::*;

use super::{
    Conv2dGeometry, ConvAlgorithm, ConvInput, ConvPass, block_rows, check_operands, im2col,
    rounded_copy,
};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::gemm::{MatRef, sgemm_on};
use crate::backend::cpu::kernels::parallel::{split_range, threads, worth_parallel};
use crate::backend::cpu::kernels::simd::carry;
use crate::lower::HalfFormat;

/// `dw = ∂conv2d/∂w · dy` for the convolution `g`: `x` is `[N, H, W, C]`, `dy` is
/// `[N, OH, OW, O]`, `dw` is the HWIO filter `[KH, KW, C/groups, O]` (overwritten).
pub fn conv2d_backward_filter(
    g: &Conv2dGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) -> Result<(), KernelError> {
    conv2d_backward_filter_with(ConvAlgorithm::Auto, g, x, dy, dw, None)
}

/// [`conv2d_backward_filter`] with a pinned algorithm, of `x` and `dy` rounded to `round`'s
/// 16-bit format when there is one (see
/// [`conv2d_forward_with`](super::conv2d_forward_with)): the direct kernels round each image
/// as they copy it. `x` may be computed as it is read, as in `conv2d_forward_with`.
pub fn conv2d_backward_filter_with<'a>(
    algorithm: ConvAlgorithm,
    g: &Conv2dGeometry,
    x: impl Into<ConvInput<'a>>,
    dy: &[f32],
    dw: &mut [f32],
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    let x = x.into();
    if algorithm.use_winograd(g, ConvPass::FilterGradient, round)? {
        #[cfg(target_arch = "x86_64")]
        return super::winograd::backward_filter(g, x, dy, dw);
    }
    if algorithm.use_direct(g)? {
        #[cfg(target_arch = "x86_64")]
        return super::direct::backward_filter(g, x, dy, dw, round);
    }
    let x = x.whole();
    let (x, dy) = (rounded_copy(&x, round), rounded_copy(dy, round));
    let (x, dy) = (&*x, &*dy);
    let out_hw = check_operands("conv2d_backward_filter", g, x.len(), dw.len(), dy.len())?;
    let rows = g.batch * out_hw[0] * out_hw[1];
    let parts = if worth_parallel(2 * g.macs()) {
        threads()
    } else {
        1
    };
    let ranges = split_range(rows, parts);
    if ranges.len() <= 1 {
        return accumulate_range(g, out_hw, x, dy, 0..rows, dw);
    }
    let partials = ranges
        .into_par_iter()
        .map(carry(|range: std::ops::Range<usize>| {
            let mut partial = vec![0.0; dw.len()];
            accumulate_range(g, out_hw, x, dy, range, &mut partial).map(|()| partial)
        }))
        .collect::<Result<Vec<_>, _>>()?;
    dw.copy_from_slice(&partials[0]);
    for partial in &partials[1..] {
        dw.iter_mut().zip(partial).for_each(|(d, p)| *d += p);
    }
    Ok(())
}

/// Overwrites `dw` with the filter gradient of the output rows in `range`.
fn accumulate_range(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    x: &[f32],
    dy: &[f32],
    range: std::ops::Range<usize>,
    dw: &mut [f32],
) -> Result<(), KernelError> {
    let (o, og, cg) = (g.out_channels, g.group_out(), g.group_in());
    let patch_len = g.patch_len();
    if range.is_empty() {
        dw.fill(0.0);
        return Ok(());
    }
    let block = block_rows(patch_len);
    let mut patches = Vec::new();
    for start in range.clone().step_by(block) {
        let len = block.min(range.end - start);
        let beta = if start == range.start { 0.0 } else { 1.0 };
        let dy_rows = &dy[start * o..(start + len) * o];
        if g.is_pointwise() {
            let a = MatRef::transposed(&x[start * cg..(start + len) * cg], cg);
            let b = MatRef::row_major(dy_rows, o);
            sgemm_on(cg, o, len, 1.0, a, b, beta, dw, o, false)?;
            continue;
        }
        patches.resize(len * patch_len, 0.0);
        for group in 0..g.groups {
            im2col(g, out_hw, x, group, start, &mut patches);
            let a = MatRef::transposed(&patches, patch_len);
            let b = MatRef::row_major(&dy_rows[group * og..], o);
            let dw_group = &mut dw[group * og..];
            sgemm_on(patch_len, og, len, 1.0, a, b, beta, dw_group, o, false)?;
        }
    }
    Ok(())
}
