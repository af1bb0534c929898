//! 2-D convolution over NHWC inputs with HWIO filters (`[KH, KW, C/groups, O]`): forward,
//! backward-input and backward-filter, with explicit padding, strides, dilations and groups.
//! This module owns the geometry, the algorithm choice and the blocked im2col.
//!
//! Three algorithms, chosen per call ([`ConvAlgorithm`]):
//! - Winograd F(4×4, 3×3) (`winograd`; AVX2 + FMA or AVX-512, 3×3 stride-1 undilated layers of
//!   one group with channels in whole vectors of 8, f32 operands): 36 products per 4×4 block of
//!   outputs instead of 144, the products as GEMMs on the direct kernels' register tiles. The
//!   default for such layers from 16 channels in and out: on the ResNet-20 shapes at the `avx2`
//!   level it takes 1.6–2.9× less time than the direct kernels, all three passes
//!   (`BENCH_CPU_TIME=1 TOWERPACK_SIMD=avx2 cargo bench --bench cpu_kernels -- conv-algos`,
//!   2026-11-28), at ~10× their rounding error (its module docs).
//! - direct (AVX-512 or AVX2 + FMA, one group): register tiles of pixels × output channels
//!   accumulate straight from a zero-padded copy of each image, with no patch matrix; the input
//!   gradient gathers per stride phase (`direct_input`). The default wherever it runs (at the
//!   `avx2` and `avx512` SIMD levels) and Winograd does not; both levels give bit-identical
//!   results.
//! - blocked im2col + GEMM (portable, any geometry): a few hundred output rows at a time are
//!   gathered into an L2-resident patch matrix and multiplied by the filter through the GEMM
//!   crate; strided input gradients scatter the patches back (col2im).
//!
//! All apply the epilogue to each finished block of output rows while it is hot. Measured on
//! the ResNet-20 shapes (`BENCH_CPU_TIME=1 RAYON_NUM_THREADS=1 cargo bench --bench cpu_kernels --
//! conv-algos`), direct is 1.1–1.45× faster than im2col + GEMM on the 3×3 layers and 2.9× on the
//! 3-channel first layer, running at 85–100% of the FMA peak: the GEMM crate's microkernels waste
//! lanes on 16–32 output channels, and im2col copies every input value nine times.
//! `conv-algos` runs every vector SIMD level the machine allows side by side: on an AVX-512 Xeon
//! (busy, CPU time), at the `avx2` level the AVX2 direct kernels take 1.2–2.0× less time than
//! im2col + the GEMM crate's AVX2 kernels on the 3×3 layers (55–75 GFLOP/s on one core); the
//! AVX-512 direct kernels are 1.5–1.7× faster again.

#[cfg(target_arch = "x86_64")]
pub mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod backward_filter;
mod backward_input;
#[cfg(target_arch = "x86_64")]
mod direct;
#[cfg(target_arch = "x86_64")]
mod direct_input;
mod forward;
mod input;
#[cfg(target_arch = "x86_64")]
mod tiles;
mod transpose;
#[cfg(target_arch = "x86_64")]
mod winograd;

pub use backward_filter::{conv2d_backward_filter, conv2d_backward_filter_with};
pub use backward_input::{conv2d_backward_input, conv2d_backward_input_with};
pub use forward::{conv2d_forward, conv2d_forward_with};
pub use input::{ComputeInput, ConvInput};

use super::epilogue::Epilogue;
use super::{KernelError, parallel, shape_error};
use crate::lower::HalfFormat;

/// `x` rounded to `round`'s 16-bit format in a copy, or `x` itself without one: the operands of
/// the paths that do not copy them anyway.
fn rounded_copy(x: &[f32], round: Option<HalfFormat>) -> std::borrow::Cow<'_, [f32]> {
    match round {
        Some(format) => {
            let mut out = vec![0.0; x.len()];
            super::round::round_operand(format, x, &mut out);
            std::borrow::Cow::Owned(out)
        }
        None => std::borrow::Cow::Borrowed(x),
    }
}

/// A pass of a convolution, as the bf16 tile kernels ([`amx`]) tell them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConvPass {
    Forward,
    /// The input gradient.
    InputGradient,
    FilterGradient,
}

/// Why the bf16 AMX tile kernels ([`amx`]) cannot run `pass` of `g` on this machine at the SIMD
/// level in force (`None`: they can).
pub fn bf16_tiles_unsupported(g: &Conv2dGeometry, pass: ConvPass) -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    return amx::unsupported(g, pass);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, pass);
        Some("AMX tiles exist on x86-64 only")
    }
}

/// Whether the bf16 AMX tile kernels run `pass` of `g` on this machine and are faster there
/// than the vector kernels on the same rounded operands ([`amx::pays_off`]).
pub fn bf16_tiles_preferred(g: &Conv2dGeometry, pass: ConvPass) -> bool {
    #[cfg(target_arch = "x86_64")]
    return amx::unsupported(g, pass).is_none() && amx::pays_off(g, pass);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (g, pass);
        false
    }
}

/// `y = epilogue(conv2d(bf16(x), bf16(w)))`, f32 accumulation, on AMX tiles (see [`amx`]); an
/// error where [`bf16_tiles_unsupported`] says why not.
pub fn conv2d_forward_bf16<'a>(
    g: &Conv2dGeometry,
    x: impl Into<ConvInput<'a>>,
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let x = x.into();
    #[cfg(target_arch = "x86_64")]
    return amx::forward(g, x, w, y, epilogue);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, w, y, epilogue);
        Err(shape_error(
            "conv2d_forward_bf16",
            format!("no AMX tiles for {g:?}"),
        ))
    }
}

/// The filter gradient of `g` with `x` and `dy` rounded to bf16, f32 accumulation, on AMX tiles
/// (see [`amx`]); an error where [`bf16_tiles_unsupported`] says why not.
pub fn conv2d_backward_filter_bf16<'a>(
    g: &Conv2dGeometry,
    x: impl Into<ConvInput<'a>>,
    dy: &[f32],
    dw: &mut [f32],
) -> Result<(), KernelError> {
    let x = x.into();
    #[cfg(target_arch = "x86_64")]
    return amx::backward_filter(g, x, dy, dw);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, dy, dw);
        Err(shape_error(
            "conv2d_backward_filter_bf16",
            format!("no AMX tiles for {g:?}"),
        ))
    }
}

/// The input gradient of `g` with `dy` and `w` rounded to bf16, f32 accumulation, on AMX tiles
/// (see [`amx`]); an error where [`bf16_tiles_unsupported`] says why not.
pub fn conv2d_backward_input_bf16(
    g: &Conv2dGeometry,
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    #[cfg(target_arch = "x86_64")]
    return amx::backward_input(g, dy, w, dx, epilogue);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dy, w, dx, epilogue);
        Err(shape_error(
            "conv2d_backward_input_bf16",
            format!("no AMX tiles for {g:?}"),
        ))
    }
}

/// How a convolution pass is computed. [`ConvAlgorithm::Auto`] (what the plain entry points use)
/// picks by shape and CPU; the others pin one, for tests and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvAlgorithm {
    #[default]
    Auto,
    /// Blocked im2col + GEMM (col2im for strided input gradients): portable, every geometry.
    Im2colGemm,
    /// Direct register-tiled kernels (AVX-512 or AVX2 + FMA, by the SIMD level in force) reading
    /// the padded input in place; one group only. An error at the `scalar` level or where the
    /// geometry has several groups.
    Direct,
    /// [`ConvAlgorithm::Auto`] without Winograd: the direct kernels where they run, im2col +
    /// GEMM elsewhere, so that every output is the f32 sum of the exact products of its
    /// operands (what a bf16 or fp16 program's convolutions promise, and what
    /// `CpuOptions::winograd` off or `TOWERPACK_WINOGRAD=0` asks for).
    AutoDirect,
    /// Winograd F(4×4, 3×3) on the direct kernels' GEMM tiles (the `winograd` module's docs): the
    /// three passes of 3×3, stride-1, undilated, one-group convolutions with channel counts in
    /// whole vectors of 8, of unrounded f32 operands (the input gradient: padding of at most 2
    /// on each side). An error anywhere else.
    Winograd,
}

impl ConvAlgorithm {
    /// Whether to run the Winograd kernels for `pass` of `g` with operands rounded to `round`.
    fn use_winograd(
        self,
        g: &Conv2dGeometry,
        pass: ConvPass,
        round: Option<HalfFormat>,
    ) -> Result<bool, KernelError> {
        #[cfg(target_arch = "x86_64")]
        let supported = match pass {
            ConvPass::Forward => winograd::supported(g),
            ConvPass::InputGradient => winograd::supported_input(g),
            ConvPass::FilterGradient => winograd::supported(g),
        } && round.is_none();
        #[cfg(not(target_arch = "x86_64"))]
        let supported = {
            let _ = (pass, round);
            false
        };
        match self {
            #[cfg(target_arch = "x86_64")]
            ConvAlgorithm::Auto => Ok(supported
                && winograd::pays_off(g)
                && !winograd::disabled_by_env()
                && (g.batch >= parallel::threads() || !parallel::worth_parallel(2 * g.macs()))),
            ConvAlgorithm::Winograd if supported => Ok(true),
            ConvAlgorithm::Winograd => Err(shape_error(
                "conv2d",
                format!(
                    "Winograd runs 3×3, stride-1, undilated, one-group convolutions of f32 \
                     operands with channels in whole vectors of 8 (input gradients: padding of \
                     at most 2 on each side), at the avx2 or avx512 SIMD level (in force: {}); \
                     not the {pass:?} pass of {g:?}{}",
                    super::SimdLevel::current(),
                    if round.is_some() {
                        " with rounded operands"
                    } else {
                        ""
                    }
                ),
            )),
            _ => Ok(false),
        }
    }

    /// Whether to run the direct kernels for `g`.
    fn use_direct(self, g: &Conv2dGeometry) -> Result<bool, KernelError> {
        #[cfg(target_arch = "x86_64")]
        let supported = direct::supported(g);
        #[cfg(not(target_arch = "x86_64"))]
        let supported = false;
        match self {
            // The direct kernels spread images over the pool: with fewer images than threads,
            // large problems go to the GEMM path, which splits pixel blocks instead.
            ConvAlgorithm::Auto | ConvAlgorithm::AutoDirect => Ok(supported
                && (g.batch >= parallel::threads() || !parallel::worth_parallel(2 * g.macs()))),
            // The passes ask `use_winograd` first, which runs Winograd or refuses.
            ConvAlgorithm::Im2colGemm | ConvAlgorithm::Winograd => Ok(false),
            ConvAlgorithm::Direct if supported => Ok(true),
            ConvAlgorithm::Direct => Err(shape_error(
                "conv2d",
                format!(
                    "the direct kernels need the avx2 or avx512 SIMD level (in force: {}) \
                     and one group: {g:?}",
                    super::SimdLevel::current()
                ),
            )),
        }
    }
}

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
