//! Direct convolution (implicit GEMM) on AVX-512, one image per task: the image is copied once
//! into a zero-padded, cache-resident buffer, and register tiles of output pixels × output
//! channels accumulate straight from it and from the HWIO filter rows. No patch matrix is
//! built, which is what makes narrow layers (16–64 channels) fast. One group only.

use super::avx512::{Segment, filter_tile, forward_tile, lane_masks};
use super::{Conv2dGeometry, check_operands};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::parallel::{
    for_each_row_block, scratch_of, split_range, threads, worth_parallel,
};
use crate::backend::cpu::kernels::simd::{SimdLevel, carry, note};
use rayon::prelude::*;

/// Whether the direct kernels can run this convolution at the SIMD level in force.
pub(super) fn supported(g: &Conv2dGeometry) -> bool {
    g.groups == 1 && SimdLevel::current() == SimdLevel::Avx512
}

/// Largest tile for `v` channel vectors: `R·V` accumulators (at most 24) stay in registers
/// next to the `V` filter vectors.
fn max_tile_rows(v: usize) -> usize {
    match v {
        1 => 16,
        2 => 12,
        3 => 8,
        _ => 6,
    }
}

/// Widest channel chunk of the pixel tiles (forward and input gradient): two vectors let a tile
/// hold 8–12 pixels, so each filter vector loaded from L2 feeds twice the multiply-adds of four
/// vectors × at most 6 pixels (deep filters, e.g. 3×3×64×64 = 147 KiB, do not fit in L1). On this
/// machine (one FMA per cycle) both run at the same speed; with two FMA units the filter traffic
/// of the wider chunk would start to bind.
const PIXEL_TILE_MAX_V: usize = 2;

/// Splits `len` rows into the fewest tiles of at most `max_tile_rows(v)`, as even as possible
/// (the first `len % tiles` one row longer), and returns the size of the tile starting at `done`.
fn tile_rows(v: usize, len: usize, done: usize) -> usize {
    let tiles = len.div_ceil(max_tile_rows(v));
    let (base, longer) = (len / tiles, len % tiles);
    if done < longer * (base + 1) {
        base + 1
    } else {
        base
    }
}

/// Output channel chunks `(first channel, vectors)`: up to `max_v` vectors of 16 channels each.
fn channel_chunks(o: usize, max_v: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..o)
        .step_by(16 * max_v)
        .map(move |start| (start, (o - start).div_ceil(16).min(max_v)))
}

/// Expands to a `match` over every tile shape `(R, V)` that `tile_rows` can return, calling
/// `$call!(R, V)` in the matching arm.
macro_rules! tile_shapes {
    ($r:expr, $v:expr, $call:ident) => {
        tile_shapes!(@arms $r, $v, $call,
            1: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
            2: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
            3: [1, 2, 3, 4, 5, 6, 7, 8],
            4: [1, 2, 3, 4, 5, 6])
    };
    (@arms $r:expr, $v:expr, $call:ident, $($vv:literal: [$($rr:literal),*]),*) => {
        match ($r, $v) {
            $($(($rr, $vv) => $call!($rr, $vv),)*)*
            // `tile_rows` returns 1..=max_tile_rows(v) and `channel_chunks` v in 1..=4.
            (r, v) => unreachable!("no tile of {r} rows × {v} vectors"),
        }
    };
}

/// The zero-padded image's `[rows, cols]`.
fn padded_hw(g: &Conv2dGeometry) -> [usize; 2] {
    let p = g.padding;
    [g.in_hw[0] + p.top + p.bottom, g.in_hw[1] + p.left + p.right]
}

/// Copies one `[H, W, C]` image into the middle of a zeroed padded buffer.
fn pad_image(g: &Conv2dGeometry, image: &[f32], padded: &mut [f32]) {
    let c = g.in_channels;
    let [_, wp] = padded_hw(g);
    let row_len = g.in_hw[1] * c;
    padded.fill(0.0);
    for (ih, row) in image.chunks_exact(row_len.max(1)).enumerate() {
        let start = ((ih + g.padding.top) * wp + g.padding.left) * c;
        padded[start..start + row_len].copy_from_slice(row);
    }
}

/// The reduction as contiguous runs of the padded image: one per window row when horizontal taps
/// are adjacent (`KW·C` values), else one per tap (`C` values).
fn segments(g: &Conv2dGeometry) -> Vec<Segment> {
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
fn pixel_origins(g: &Conv2dGeometry, out_hw: [usize; 2]) -> Vec<usize> {
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

/// The forward convolution (see [`super::conv2d_forward`]); `supported(g)` must hold.
pub(super) fn forward(
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_forward", g, x.len(), w.len(), y.len())?;
    let (c, o) = (g.in_channels, g.out_channels);
    let image_len = g.in_hw[0] * g.in_hw[1] * c;
    let out_rows = out_hw[0] * out_hw[1];
    epilogue.check(g.batch * out_rows, o)?;
    if out_rows == 0 || o == 0 {
        return Ok(());
    }
    note(SimdLevel::Avx512);
    let [hp, wp] = padded_hw(g);
    let segs = segments(g);
    let parallel = worth_parallel(2 * g.macs()) && g.batch > 1;
    for_each_row_block(y, o, out_rows, parallel, |y_image, first_row, scratch| {
        let n = first_row / out_rows;
        let padded = scratch_of(scratch, hp * wp * c);
        pad_image(g, &x[n * image_len..(n + 1) * image_len], padded);
        forward_image(g, out_hw, &segs, padded, w, y_image);
        if !epilogue.is_identity() {
            epilogue.apply(y_image, first_row, o);
        }
        Ok(())
    })
}

fn forward_image(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    segs: &[Segment],
    padded: &[f32],
    w: &[f32],
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
        tile_row(
            &padded[row_origin..],
            g.strides[1] * c,
            ow_len,
            segs,
            w,
            o,
            out_row,
            o,
        );
    }
}

/// Computes `count` output pixels: pixel `t` reads the source from `source[t·ps..]` (plus each
/// segment's offset) and writes `channels` values at `out[t·out_ps..]`, where
/// `out[p, c] = Σ_seg Σ_j source[p·ps + a_off + j] · w[(k0 + j)·channels + c]`.
///
/// Panics (a bug, not a user error) unless every read lies in `source`, every filter row in `w`
/// and every written pixel in `out`; these are checked once per call, not per element.
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_row(
    source: &[f32],
    ps: usize,
    count: usize,
    segs: &[Segment],
    w: &[f32],
    channels: usize,
    out: &mut [f32],
    out_ps: usize,
) {
    if count == 0 || channels == 0 {
        return;
    }
    let reach = segs.iter().map(|s| s.a_off + s.len).max().unwrap_or(0);
    let rows = segs.iter().map(|s| s.k0 + s.len).max().unwrap_or(0);
    assert!(
        (count - 1) * ps + reach <= source.len()
            && rows * channels <= w.len()
            && (count - 1) * out_ps + channels <= out.len(),
        "direct convolution tile out of bounds"
    );
    assert!(std::arch::is_x86_feature_detected!("avx512f"));
    for (first, v) in channel_chunks(channels, PIXEL_TILE_MAX_V) {
        let masks = lane_masks(channels - first);
        let mut t = 0;
        while t < count {
            let r = tile_rows(v, count, t);
            // SAFETY: AVX-512F is present and the bounds were asserted above: the tile's pixels
            // `t..t + r` read below `(count - 1)·ps + reach`, filter rows below `rows`, and write
            // pixels below `count` (lanes past `channels` are masked off).
            unsafe {
                let a = source.as_ptr().add(t * ps);
                let dst = out.as_mut_ptr().add(t * out_ps + first);
                let wt = w.as_ptr().add(first);
                let ch = channels;
                macro_rules! call {
                    ($rr:literal, $vv:literal) => {
                        // One-vector tiles are bound by address arithmetic unless the pixel
                        // stride is a constant: specialise the common ones.
                        match (ps, $vv) {
                            (16, 1) => forward_tile::<$rr, $vv, 16>(
                                a, ps, segs, wt, ch, masks, dst, out_ps,
                            ),
                            (3, 1) => {
                                forward_tile::<$rr, $vv, 3>(a, ps, segs, wt, ch, masks, dst, out_ps)
                            }
                            _ => {
                                forward_tile::<$rr, $vv, 0>(a, ps, segs, wt, ch, masks, dst, out_ps)
                            }
                        }
                    };
                }
                tile_shapes!(r, v, call);
            }
            t += r;
        }
    }
}

/// The filter gradient (see [`super::conv2d_backward_filter`]); `supported(g)` must hold. Images
/// are split into one range per thread; partial gradients are summed in range order.
pub(super) fn backward_filter(
    g: &Conv2dGeometry,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) -> Result<(), KernelError> {
    let out_hw = check_operands("conv2d_backward_filter", g, x.len(), dw.len(), dy.len())?;
    let parts = if worth_parallel(2 * g.macs()) {
        threads()
    } else {
        1
    };
    note(SimdLevel::Avx512);
    let ranges = split_range(g.batch, parts);
    let origins = pixel_origins(g, out_hw);
    let segs = segments(g);
    let run = |images: std::ops::Range<usize>, dw: &mut [f32]| {
        dw.fill(0.0);
        let [hp, wp] = padded_hw(g);
        let mut padded = vec![0.0; hp * wp * g.in_channels];
        let image_len = g.in_hw[0] * g.in_hw[1] * g.in_channels;
        let dy_len = origins.len() * g.out_channels;
        for n in images {
            pad_image(g, &x[n * image_len..(n + 1) * image_len], &mut padded);
            let dy_image = &dy[n * dy_len..(n + 1) * dy_len];
            filter_image(g, &segs, &origins, &padded, dy_image, dw);
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

/// Adds one image's filter gradient to `dw`.
///
/// Panics (a bug, not a user error) unless every read lies in `padded` and `dy_image` and every
/// filter row in `dw`; checked once per image, not per element.
fn filter_image(
    g: &Conv2dGeometry,
    segs: &[Segment],
    origins: &[usize],
    padded: &[f32],
    dy_image: &[f32],
    dw: &mut [f32],
) {
    let o = g.out_channels;
    let reach = segs.iter().map(|s| s.a_off + s.len).max().unwrap_or(0);
    let rows = segs.iter().map(|s| s.k0 + s.len).max().unwrap_or(0);
    let last_origin = origins.iter().copied().max().unwrap_or(0);
    assert!(
        last_origin + reach <= padded.len()
            && origins.len() * o <= dy_image.len()
            && rows * o <= dw.len(),
        "direct filter-gradient tile out of bounds"
    );
    assert!(std::arch::is_x86_feature_detected!("avx512f"));
    for (first, v) in channel_chunks(o, 4) {
        let masks = lane_masks(o - first);
        for seg in segs {
            let mut j = 0;
            while j < seg.len {
                let r = tile_rows(v, seg.len, j);
                // SAFETY: AVX-512F is present and the bounds were asserted above: every window
                // origin plus `a_off + j + r <= a_off + len` stays below `last_origin + reach`;
                // `dy_image` holds `origins.len()` rows of `o`; filter rows `k0 + j + r <= rows`
                // exist, and lanes past `o` are masked.
                unsafe {
                    let a = padded.as_ptr().add(seg.a_off + j);
                    let dyp = dy_image.as_ptr().add(first);
                    let dwp = dw.as_mut_ptr().add((seg.k0 + j) * o + first);
                    macro_rules! call {
                        ($rr:literal, $vv:literal) => {
                            filter_tile::<$rr, $vv>(a, origins, dyp, o, masks, dwp)
                        };
                    }
                    tile_shapes!(r, v, call);
                }
                j += r;
            }
        }
    }
}
