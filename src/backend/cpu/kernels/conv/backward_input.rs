//! The input gradient `dx` of a convolution (the transposed convolution of `dy`).
//!
//! The direct algorithm lives in `direct_input`. On the GEMM path, stride 1 is a forward
//! convolution of `dy` with the flipped, transposed filter (the forward kernel with its blocking
//! and epilogue); other strides multiply each image's `dy` rows by the transposed filter and
//! scatter-add the patches into `dx` (col2im), one image per task.

use super::forward::{conv2d_forward_with, gemm_overwrite};
use super::transpose::{flip_filter, transposed_geometry};
use super::{Conv2dGeometry, ConvAlgorithm, ConvPass, block_rows, check_operands, rounded_copy};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::gemm::MatRef;
use crate::backend::cpu::kernels::parallel::{for_each_row_block, scratch_of, worth_parallel};
use crate::lower::HalfFormat;

/// `dx = epilogue(∂conv2d/∂x · dy)` for the convolution `g` (see
/// [`conv2d_forward`](super::conv2d_forward) for the layouts): `dy` is `[N, OH, OW, O]`, `w` is
/// the HWIO filter, `dx` is `[N, H, W, C]` (overwritten). `epilogue` sees blocks of `dx` rows.
pub fn conv2d_backward_input(
    g: &Conv2dGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    conv2d_backward_input_with(ConvAlgorithm::Auto, g, dy, w, dx, epilogue, None)
}

/// [`conv2d_backward_input`] with a pinned algorithm, of `dy` and `w` rounded to `round`'s
/// 16-bit format when there is one (see [`conv2d_forward_with`]): the direct kernels round as
/// they pad `dy` and transpose the filter.
pub fn conv2d_backward_input_with(
    algorithm: ConvAlgorithm,
    g: &Conv2dGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_backward_input", g, dx.len(), w.len(), dy.len())?;
    let rows = g.batch * g.in_hw[0] * g.in_hw[1];
    epilogue.check(rows, g.in_channels)?;
    if algorithm.use_winograd(g, ConvPass::InputGradient, round)? {
        #[cfg(target_arch = "x86_64")]
        return super::winograd::backward_input(g, out_hw, dy, w, dx, epilogue);
    }
    if algorithm.use_direct(g)? {
        #[cfg(target_arch = "x86_64")]
        return super::direct_input::backward_input(g, out_hw, dy, w, dx, epilogue, round);
    }
    let (dy, w) = (rounded_copy(dy, round), rounded_copy(w, round));
    let (dy, w) = (&*dy, &*w);
    if let Some(transposed) = transposed_geometry(g, out_hw) {
        let flipped = flip_filter(g, w);
        return conv2d_forward_with(
            ConvAlgorithm::Im2colGemm,
            &transposed,
            dy,
            &flipped,
            dx,
            epilogue,
            None,
        );
    }
    col2im_backward(g, out_hw, dy, w, dx, epilogue)
}

/// General strides: per image, `patches = dy_rows · wᵀ` block by block, scattered into `dx`.
fn col2im_backward(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let c = g.in_channels;
    let image_rows = g.in_hw[0] * g.in_hw[1];
    let out_rows = out_hw[0] * out_hw[1];
    if image_rows == 0 || c == 0 {
        return Ok(());
    }
    let (o, og) = (g.out_channels, g.group_out());
    let patch_len = g.patch_len();
    let block = block_rows(patch_len).min(out_rows.max(1));
    let worth = worth_parallel(2 * g.macs());
    let (parallel, inner) = (worth && g.batch > 1, worth && g.batch <= 1);
    for_each_row_block(
        dx,
        c,
        image_rows,
        parallel,
        |dx_image, first_row, scratch| {
            let n = first_row / image_rows;
            dx_image.fill(0.0);
            let patches = scratch_of(scratch, block * patch_len);
            for start in (0..out_rows).step_by(block) {
                let len = block.min(out_rows - start);
                let dy_rows = &dy[(n * out_rows + start) * o..(n * out_rows + start + len) * o];
                for group in 0..g.groups {
                    let a = MatRef::row_major(&dy_rows[group * og..], o);
                    let b = MatRef::new(&w[group * og..], 1, o);
                    let p = &mut patches[..len * patch_len];
                    gemm_overwrite(len, patch_len, og, a, b, p, patch_len, inner)?;
                    col2im_add(g, out_hw, group, start, p, dx_image);
                }
            }
            if !epilogue.is_identity() {
                epilogue.apply(dx_image, first_row, c);
            }
            Ok(())
        },
    )
}

/// Adds the patches of one image's output rows `first..` (flat `(oh, ow)`) of channel group
/// `group` back onto the input pixels they were gathered from: the adjoint of `im2col`.
fn col2im_add(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    group: usize,
    first: usize,
    patches: &[f32],
    dx_image: &mut [f32],
) {
    let [h, w] = g.in_hw;
    let ow_len = out_hw[1];
    let [kh_len, kw_len] = g.kernel_hw;
    let [sh, sw] = g.strides;
    let [dh, dw] = g.dilations;
    let (c, cg) = (g.in_channels, g.group_in());
    let c0 = group * cg;
    for (r, patch) in patches.chunks_exact(g.patch_len()).enumerate() {
        let (oh, ow) = ((first + r) / ow_len, (first + r) % ow_len);
        for kh in 0..kh_len {
            let ih = (oh * sh + kh * dh) as isize - g.padding.top as isize;
            if ih < 0 || ih >= h as isize {
                continue;
            }
            for kw in 0..kw_len {
                let iw = (ow * sw + kw * dw) as isize - g.padding.left as isize;
                if iw < 0 || iw >= w as isize {
                    continue;
                }
                let start = (ih as usize * w + iw as usize) * c + c0;
                let src = &patch[(kh * kw_len + kw) * cg..(kh * kw_len + kw + 1) * cg];
                dx_image[start..start + cg]
                    .iter_mut()
                    .zip(src)
                    .for_each(|(d, s)| *d += s);
            }
        }
    }
}
