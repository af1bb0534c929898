//! Direct convolution (implicit GEMM) on AVX-512 or AVX2, one image per task: the image is
//! copied once into a zero-padded, cache-resident buffer, and register tiles of output pixels ×
//! output channels accumulate straight from it and from the HWIO filter rows. No patch matrix
//! is built, which is what makes narrow layers (16–64 channels) fast. One group only.
//!
//! This module owns the passes (forward, filter gradient; the input gradient is in
//! `direct_input`) and picks the microkernels of the SIMD level in force ([`supported`]); the
//! tile drivers are in `tiles`, the microkernels in `avx512` and `avx2`. Both instruction sets
//! give bit-identical results (see `tiles`).

use super::tiles::{Segment, TileKernels, filter_image, row_stride, tile_row, with_row_stride_in};
use super::{Conv2dGeometry, ConvInput, check_operands};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::parallel::{
    for_each_row_block, scratch_of, split_range, threads, worth_parallel,
};
use crate::backend::cpu::kernels::round::copy_rows;
use crate::backend::cpu::kernels::simd::{SimdLevel, carry};
use crate::lower::HalfFormat;
use rayon::prelude::*;

/// Whether the direct kernels can run this convolution at the SIMD level in force (AVX2 or
/// AVX-512, one group).
pub(super) fn supported(g: &Conv2dGeometry) -> bool {
    g.groups == 1 && SimdLevel::current() >= SimdLevel::Avx2
}

/// Runs `$pass::<K>($args)` with the microkernels `K` of the SIMD level in force, which
/// `supported` checked is AVX2 or AVX-512, and notes the level.
macro_rules! at_level {
    ($pass:ident($($args:expr),*)) => {{
        use $crate::backend::cpu::kernels::conv::{avx2::Avx2, avx512::Avx512};
        use $crate::backend::cpu::kernels::simd::{SimdLevel, note};
        match SimdLevel::current() {
            SimdLevel::Avx512 => {
                note(SimdLevel::Avx512);
                $pass::<Avx512>($($args),*)
            }
            _ => {
                note(SimdLevel::Avx2);
                $pass::<Avx2>($($args),*)
            }
        }
    }};
}
pub(super) use at_level;

/// The zero-padded image's `[rows, cols]`.
pub(super) fn padded_hw(g: &Conv2dGeometry) -> [usize; 2] {
    let p = g.padding;
    [g.in_hw[0] + p.top + p.bottom, g.in_hw[1] + p.left + p.right]
}

/// Writes image `n` of `x` (computed first when `x` is computed) into `padded`, rows `wp`
/// pixels wide, at the geometry's top-left padding, rounded to `round`'s format when there is
/// one, and zeroes the rest of `padded` (only the rest: the buffer is rewritten for every
/// image). The direct kernels pass the padded input's width ([`padded_hw`]); Winograd a width
/// of whole tiles.
pub(super) fn pad_image(
    g: &Conv2dGeometry,
    x: &ConvInput<'_>,
    n: usize,
    wp: usize,
    padded: &mut [f32],
    round: Option<HalfFormat>,
) {
    let c = g.in_channels;
    let (row_len, padded_row) = (g.in_hw[1] * c, wp * c);
    let (top, left) = (g.padding.top * padded_row, g.padding.left * c);
    let image_rows = g.in_hw[0];
    padded[..top].fill(0.0);
    for r in 0..image_rows {
        let row = &mut padded[top + r * padded_row..][..padded_row];
        row[..left].fill(0.0);
        row[left + row_len..].fill(0.0);
    }
    padded[top + image_rows * padded_row..].fill(0.0);
    let image_len = image_rows * row_len;
    x.with_image(n * image_len..(n + 1) * image_len, |image| {
        if let Some(rows) = image.len().checked_div(row_len) {
            let dst = &mut padded[top + left..];
            copy_rows(round, &image[..rows * row_len], row_len, dst, padded_row);
        }
    });
}

/// The reduction as contiguous runs of the padded image: one per window row when horizontal taps
/// are adjacent (`KW·C` values), else one per tap (`C` values).
pub(super) fn segments(g: &Conv2dGeometry) -> Vec<Segment> {
    let c = g.in_channels;
    let [_, wp] = padded_hw(g);
    let [kh_len, kw_len] = g.kernel_hw;
    let [dh, dw] = g.dilations;
    let mut segs = Vec::new();
    for kh in 0..kh_len {
        if dw == 1 {
            let a_off = kh * dh * wp * c;
            segs.push(Segment {
                a_off,
                k0: kh * kw_len * c,
                len: kw_len * c,
            });
        } else {
            for kw in 0..kw_len {
                let a_off = (kh * dh * wp + kw * dw) * c;
                segs.push(Segment {
                    a_off,
                    k0: (kh * kw_len + kw) * c,
                    len: c,
                });
            }
        }
    }
    segs
}

/// Window origins (in the padded image) of every output pixel, in row-major order.
pub(super) fn pixel_origins(g: &Conv2dGeometry, out_hw: [usize; 2]) -> Vec<usize> {
    let [_, wp] = padded_hw(g);
    let c = g.in_channels;
    let mut origins = Vec::with_capacity(out_hw[0] * out_hw[1]);
    for oh in 0..out_hw[0] {
        for ow in 0..out_hw[1] {
            origins.push((oh * g.strides[0] * wp + ow * g.strides[1]) * c);
        }
    }
    origins
}

/// The forward convolution (see [`super::conv2d_forward`]); `supported(g)` must hold. With
/// `round`, both operands are rounded to its format as they are copied (padded image, filter).
pub(super) fn forward(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    at_level!(forward_with(g, x, w, y, epilogue, round))
}

fn forward_with<K: TileKernels>(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_forward", g, x.len(), w.len(), y.len())?;
    let (c, o) = (g.in_channels, g.out_channels);
    let out_rows = out_hw[0] * out_hw[1];
    epilogue.check(g.batch * out_rows, o)?;
    if out_rows == 0 || o == 0 {
        return Ok(());
    }
    let [hp, wp] = padded_hw(g);
    let segs = segments(g);
    // Filter rows padded to whole vectors where the microkernels need it.
    let w_stride = row_stride::<K>(o);
    let mut w_copy = Vec::new();
    let w = with_row_stride_in(w, o, w_stride, round, &mut w_copy);
    let parallel = worth_parallel(2 * g.macs()) && g.batch > 1;
    // An epilogue that stores the rows itself (a bf16 output) gets each image from scratch.
    let elsewhere = epilogue.stores_elsewhere();
    for_each_row_block(y, o, out_rows, parallel, |y_image, first_row, scratch| {
        let n = first_row / out_rows;
        let image_len = if elsewhere { y_image.len() } else { 0 };
        let (padded, image) =
            scratch_of(scratch, hp * wp * c + image_len).split_at_mut(hp * wp * c);
        let y_image = if elsewhere { image } else { y_image };
        pad_image(g, &x, n, wp, padded, round);
        forward_image::<K>(g, out_hw, &segs, padded, w, w_stride, y_image);
        if !epilogue.is_identity() {
            epilogue.apply(y_image, first_row, o);
        }
        Ok(())
    })
}

fn forward_image<K: TileKernels>(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    segs: &[Segment],
    padded: &[f32],
    w: &[f32],
    w_stride: usize,
    y_image: &mut [f32],
) {
    let (c, o) = (g.in_channels, g.out_channels);
    let [_, wp] = padded_hw(g);
    let [oh_len, ow_len] = out_hw;
    for oh in 0..oh_len {
        let row_origin = oh * g.strides[0] * wp * c;
        let out_row = &mut y_image[oh * ow_len * o..(oh + 1) * ow_len * o];
        // The windows of the row's pixels (and every segment) lie inside the padded image: the
        // geometry was validated, so each window fits the padded input.
        tile_row::<K>(
            &padded[row_origin..],
            g.strides[1] * c,
            ow_len,
            segs,
            w,
            w_stride,
            o,
            out_row,
            o,
        );
    }
}

/// The filter gradient (see [`super::conv2d_backward_filter`]); `supported(g)` must hold. Images
/// are split into one range per thread; partial gradients are summed in range order. With
/// `round`, each image of both operands is rounded to its format as it is copied.
pub(super) fn backward_filter(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    dy: &[f32],
    dw: &mut [f32],
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    at_level!(backward_filter_with(g, x, dy, dw, round))
}

fn backward_filter_with<K: TileKernels>(
    g: &Conv2dGeometry,
    x: ConvInput<'_>,
    dy: &[f32],
    dw: &mut [f32],
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_backward_filter", g, x.len(), dw.len(), dy.len())?;
    let parts = if worth_parallel(2 * g.macs()) {
        threads()
    } else {
        1
    };
    let ranges = split_range(g.batch, parts);
    let origins = pixel_origins(g, out_hw);
    let segs = segments(g);
    let o = g.out_channels;
    let dy_stride = row_stride::<K>(o);
    let run = |images: std::ops::Range<usize>, dw: &mut [f32]| {
        dw.fill(0.0);
        let [hp, wp] = padded_hw(g);
        let mut padded = vec![0.0; hp * wp * g.in_channels];
        let dy_len = origins.len() * o;
        let mut dy_copy = Vec::new();
        for n in images {
            pad_image(g, &x, n, wp, &mut padded, round);
            // `dy` rows padded to whole vectors where the microkernels need it.
            let dy_n = &dy[n * dy_len..(n + 1) * dy_len];
            let dy_image = with_row_stride_in(dy_n, o, dy_stride, round, &mut dy_copy);
            filter_image::<K>(&segs, &origins, &padded, dy_image, dy_stride, o, dw);
        }
    };
    if ranges.len() <= 1 {
        run(0..g.batch, dw);
        return Ok(());
    }
    let partials: Vec<Vec<f32>> = ranges
        .into_par_iter()
        .map(carry(|images: std::ops::Range<usize>| {
            let mut partial = vec![0.0; dw.len()];
            run(images, &mut partial);
            partial
        }))
        .collect();
    dw.copy_from_slice(&partials[0]);
    for partial in &partials[1..] {
        dw.iter_mut().zip(partial).for_each(|(d, p)| *d += p);
    }
    Ok(())
}
