//! 2-D convolution over NHWC inputs with HWIO filters (`[KH, KW, C/groups, O]`): forward,
//! backward-input and backward-filter, with explicit padding, strides, dilations and groups.
//! This module owns the geometry and the blocked im2col shared by the three passes.
//!
//! The algorithm is a blocked im2col + GEMM: a few hundred output rows (pixels) at a time are
//! gathered into a cache-resident patch matrix and multiplied by the filter, so the patch matrix
//! never leaves L2 and each finished block of rows gets the epilogue while it is hot. 1×1
//! stride-1 convolutions skip the gather (they are plain GEMMs in NHWC).

mod backward_filter;
mod backward_input;
mod forward;

pub use backward_filter::conv2d_backward_filter;
pub use backward_input::conv2d_backward_input;
pub use forward::conv2d_forward;

use super::{KernelError, shape_error};

/// Explicit zero padding of the input, in pixels on each side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Padding2d {
    pub top: usize,
    pub bottom: usize,
    pub left: usize,
    pub right: usize,
}

impl Padding2d {
    /// The same padding on every side.
    pub fn uniform(p: usize) -> Self {
        Padding2d {
            top: p,
            bottom: p,
            left: p,
            right: p,
        }
    }
}

/// The shapes of one convolution: input `[batch, H, W, in_channels]`, filter
/// `[KH, KW, in_channels / groups, out_channels]`, output `[batch, OH, OW, out_channels]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dGeometry {
    pub batch: usize,
    pub in_hw: [usize; 2],
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel_hw: [usize; 2],
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub padding: Padding2d,
    pub groups: usize,
}

impl Conv2dGeometry {
    /// A convolution with unit strides and dilations, no padding and one group.
    pub fn new(
        batch: usize,
        in_hw: [usize; 2],
        in_channels: usize,
        out_channels: usize,
        kernel_hw: [usize; 2],
    ) -> Self {
        Conv2dGeometry {
            batch,
            in_hw,
            in_channels,
            out_channels,
            kernel_hw,
            strides: [1, 1],
            dilations: [1, 1],
            padding: Padding2d::default(),
            groups: 1,
        }
    }

    /// Checks the parameters and returns the output's `[OH, OW]`.
    pub fn validate(&self) -> Result<[usize; 2], KernelError> {
        let err = |m: String| Err(shape_error("conv2d", format!("{m} in {self:?}")));
        if self.strides.contains(&0) || self.dilations.contains(&0) || self.groups == 0 {
            return err("strides, dilations and groups must be positive".into());
        }
        if self.kernel_hw.contains(&0) {
            return err("the filter window is empty".into());
        }
        if !self.in_channels.is_multiple_of(self.groups)
            || !self.out_channels.is_multiple_of(self.groups)
        {
            return err(format!(
                "{} input and {} output channels are not divisible into {} groups",
                self.in_channels, self.out_channels, self.groups
            ));
        }
        let pads = [
            self.padding.top + self.padding.bottom,
            self.padding.left + self.padding.right,
        ];
        let mut out = [0; 2];
        for d in 0..2 {
            let span = self.dilations[d] * (self.kernel_hw[d] - 1) + 1;
            let padded = self.in_hw[d] + pads[d];
            if padded < span {
                return err(format!(
                    "the dilated window ({span}) is larger than the padded input ({padded})"
                ));
            }
            out[d] = (padded - span) / self.strides[d] + 1;
        }
        Ok(out)
    }

    /// The output's `[OH, OW]` (zeros when the geometry is invalid).
    pub fn out_hw(&self) -> [usize; 2] {
        self.validate().unwrap_or([0, 0])
    }

    /// Elements of the input.
    pub fn input_len(&self) -> usize {
        self.batch * self.in_hw[0] * self.in_hw[1] * self.in_channels
    }

    /// Elements of the filter.
    pub fn filter_len(&self) -> usize {
        self.kernel_hw[0] * self.kernel_hw[1] * self.in_channels / self.groups.max(1)
            * self.out_channels
    }

    /// Elements of the output.
    pub fn output_len(&self) -> usize {
        let [oh, ow] = self.out_hw();
        self.batch * oh * ow * self.out_channels
    }

    /// Multiply-adds of the forward pass (each backward pass does as many).
    pub fn macs(&self) -> usize {
        self.output_len() * self.patch_len()
    }

    /// Whether the convolution is a plain GEMM over the pixels (1×1, stride 1, no padding, one
    /// group).
    fn is_pointwise(&self) -> bool {
        self.kernel_hw == [1, 1]
            && self.strides == [1, 1]
            && self.padding == Padding2d::default()
            && self.groups == 1
    }

    /// Input channels per group.
    fn group_in(&self) -> usize {
        self.in_channels / self.groups
    }

    /// Output channels per group.
    fn group_out(&self) -> usize {
        self.out_channels / self.groups
    }

    /// Length of one im2col row: `KH · KW · C/groups`, ordered like the filter's first three axes.
    fn patch_len(&self) -> usize {
        self.kernel_hw[0] * self.kernel_hw[1] * self.group_in()
    }
}

/// Rows per im2col block: the patch matrix of a block stays around 128 KiB (L2-resident), and
/// blocks are large enough for the GEMM microkernels to run at speed.
fn block_rows(patch_len: usize) -> usize {
    (32 * 1024 / patch_len.max(1)).clamp(64, 1024)
}

/// Gathers the patches of output rows `first_row..first_row + rows` (flat `(n, oh, ow)` indices)
/// for channel group `group` into `patches` (`rows × patch_len`, row-major), zeros where the
/// window covers padding.
fn im2col(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    x: &[f32],
    group: usize,
    first_row: usize,
    patches: &mut [f32],
) {
    let [h, w] = g.in_hw;
    let [oh_len, ow_len] = out_hw;
    let [kh_len, kw_len] = g.kernel_hw;
    let [sh, sw] = g.strides;
    let [dh, dw] = g.dilations;
    let c = g.in_channels;
    let cg = g.group_in();
    let c0 = group * cg;
    let patch_len = g.patch_len();
    let kw_run = kw_len * cg;
    // Whole window rows can be copied at once when taps are adjacent and span all channels.
    let contiguous_taps = dw == 1 && cg == c;
    for (r, patch) in patches.chunks_exact_mut(patch_len).enumerate() {
        let row = first_row + r;
        let ow = row % ow_len;
        let oh = (row / ow_len) % oh_len;
        let n = row / (ow_len * oh_len);
        let image = &x[n * h * w * c..(n + 1) * h * w * c];
        let iw0 = (ow * sw) as isize - g.padding.left as isize;
        for kh in 0..kh_len {
            let dst = &mut patch[kh * kw_run..(kh + 1) * kw_run];
            let ih = (oh * sh + kh * dh) as isize - g.padding.top as isize;
            if ih < 0 || ih >= h as isize {
                dst.fill(0.0);
                continue;
            }
            let in_row = &image[ih as usize * w * c..(ih as usize + 1) * w * c];
            let iw_last = iw0 + ((kw_len - 1) * dw) as isize;
            if contiguous_taps && iw0 >= 0 && iw_last < w as isize {
                let start = iw0 as usize * c;
                dst.copy_from_slice(&in_row[start..start + kw_run]);
                continue;
            }
            for (kw, tap) in dst.chunks_exact_mut(cg).enumerate() {
                let iw = iw0 + (kw * dw) as isize;
                if iw < 0 || iw >= w as isize {
                    tap.fill(0.0);
                } else {
                    let start = iw as usize * c + c0;
                    tap.copy_from_slice(&in_row[start..start + cg]);
                }
            }
        }
    }
}

/// Checks the geometry and the lengths of the three operands of a pass.
fn check_operands(
    kernel: &'static str,
    g: &Conv2dGeometry,
    x_len: usize,
    w_len: usize,
    y_len: usize,
) -> Result<[usize; 2], KernelError> {
    let out_hw = g.validate()?;
    let check = |operand, got, expected| super::check_len(kernel, operand, got, expected);
    check("input", x_len, g.input_len())?;
    check("filter", w_len, g.filter_len())?;
    check("output", y_len, g.output_len())?;
    Ok(out_hw)
}
