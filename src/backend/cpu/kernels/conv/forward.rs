//! The forward convolution: `y = conv(x, w)` then the epilogue, one block of output rows at a
//! time (im2col of the block, GEMM against the filter, epilogue while the block is hot).

use super::{
    Conv2dGeometry, ConvAlgorithm, ConvInput, ConvPass, block_rows, check_operands, im2col,
    rounded_copy,
};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::epilogue::{Epilogue, aligned_block_rows};
use crate::backend::cpu::kernels::gemm::{MatRef, sgemm_on};
use crate::backend::cpu::kernels::parallel::{for_each_row_block, scratch_of, worth_parallel};
use crate::lower::HalfFormat;

/// `y = epilogue(conv2d(x, w))`: `x` is NHWC `[N, H, W, C]`, `w` is HWIO
/// `[KH, KW, C/groups, O]`, `y` is NHWC `[N, OH, OW, O]`. `epilogue` sees blocks of `y`'s rows
/// (one row per output pixel, `O` wide). The algorithm is chosen by shape and CPU.
pub fn conv2d_forward(
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    conv2d_forward_with(ConvAlgorithm::Auto, g, x, w, y, epilogue, None)
}

/// [`conv2d_forward`] with a pinned algorithm, of `x` and `w` rounded to `round`'s 16-bit
/// format when there is one (the autocast's operands: f32 products and sums of the rounded
/// values). The direct kernels round as they copy the operands anyway (the padded image, the
/// filter's rows), so rounding costs no pass of its own; the im2col path multiplies rounded
/// copies. `x` may be computed as it is read ([`ConvInput::Computed`]): the direct kernels
/// compute each image as they copy it, the im2col path computes the whole input first.
pub fn conv2d_forward_with<'a>(
    algorithm: ConvAlgorithm,
    g: &Conv2dGeometry,
    x: impl Into<ConvInput<'a>>,
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    let x = x.into();
    if algorithm.use_winograd(g, ConvPass::Forward, round)? {
        #[cfg(target_arch = "x86_64")]
        return super::winograd::forward(g, x, w, y, epilogue);
    }
    if algorithm.use_direct(g)? {
        #[cfg(target_arch = "x86_64")]
        return super::direct::forward(g, x, w, y, epilogue, round);
    }
    let x = x.whole();
    let (x, w) = (rounded_copy(&x, round), rounded_copy(w, round));
    im2col_forward(g, &x, &w, y, epilogue)
}

/// The portable forward pass: blocked im2col + GEMM.
fn im2col_forward(
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_forward", g, x.len(), w.len(), y.len())?;
    let rows = g.batch * out_hw[0] * out_hw[1];
    let o = g.out_channels;
    epilogue.check(rows, o)?;
    if rows == 0 || o == 0 {
        return Ok(());
    }
    let patch_len = g.patch_len();
    let (og, cg) = (g.group_out(), g.group_in());
    let block = aligned_block_rows(epilogue, block_rows(patch_len), o);
    let worth = worth_parallel(2 * g.macs());
    // Spread blocks over the pool, or (a single block) let the GEMM spread itself.
    let (parallel, inner) = (worth && rows > block, worth && rows <= block);
    for_each_row_block(y, o, block, parallel, |y_block, first_row, scratch| {
        let block_len = y_block.len() / o;
        if g.is_pointwise() {
            let x_rows = &x[first_row * cg..(first_row + block_len) * cg];
            let (a, b) = (MatRef::row_major(x_rows, cg), MatRef::row_major(w, o));
            gemm_overwrite(block_len, o, cg, a, b, y_block, o, inner)?;
        } else {
            let patches = scratch_of(scratch, block_len * patch_len);
            for group in 0..g.groups {
                im2col(g, out_hw, x, group, first_row, patches);
                let a = MatRef::row_major(patches, patch_len);
                let b = MatRef::row_major(&w[group * og..], o);
                let y_group = &mut y_block[group * og..];
                gemm_overwrite(block_len, og, patch_len, a, b, y_group, o, inner)?;
            }
        }
        if !epilogue.is_identity() {
            epilogue.apply(y_block, first_row, o);
        }
        Ok(())
    })
}

/// `c = a·b`, spread over the pool only when `parallel`.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_overwrite(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<'_>,
    b: MatRef<'_>,
    c: &mut [f32],
    ldc: usize,
    parallel: bool,
) -> Result<(), KernelError> {
    sgemm_on(m, n, k, 1.0, a, b, 0.0, c, ldc, parallel)
}
