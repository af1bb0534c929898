//! The input gradient on the direct AVX-512 or AVX2 kernels, for any stride, as a gather: the pixels of
//! `dx` are split into `stride_h × stride_w` phases (`h mod s_h`, `w mod s_w`); within one phase
//! every pixel receives the same taps, at fixed offsets in `dy`, so a phase is a stride-1
//! correlation of the zero-padded `dy` with the taps' filter slices — the forward tile kernel,
//! with no wasted multiplications by inserted zeros and no scatter (so no write conflicts).

use super::Conv2dGeometry;
use super::direct::at_level;
use super::tiles::{Segment, TileKernels, row_stride, tile_row};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::parallel::{for_each_row_block, scratch_of, worth_parallel};
use crate::backend::cpu::kernels::round::copy_rows;
use crate::lower::HalfFormat;

/// One dimension's phase: the `dx` positions `phase + stride·i` for `i < count`, and each
/// contributing tap `k` with the `dy` offset `off` (position `i + off`).
pub(super) struct Phase {
    pub(super) phase: usize,
    pub(super) count: usize,
    pub(super) taps: Vec<(usize, isize)>,
}

/// The phases of dimension `d` and the `dy` padding `(before, after)` they need.
pub(super) fn phases(g: &Conv2dGeometry, d: usize, out_len: usize) -> (Vec<Phase>, [usize; 2]) {
    let (len, s, dil, k) = (g.in_hw[d], g.strides[d], g.dilations[d], g.kernel_hw[d]);
    let before = [g.padding.top, g.padding.left][d] as isize;
    let (mut pad_before, mut pad_after) = (0isize, 0isize);
    let list = (0..s)
        .map(|phase| {
            let count = len.saturating_sub(phase).div_ceil(s);
            let taps: Vec<(usize, isize)> = (0..k)
                .filter_map(|tap| {
                    let num = phase as isize + before - (tap * dil) as isize;
                    (num.rem_euclid(s as isize) == 0).then_some((tap, num.div_euclid(s as isize)))
                })
                .collect();
            if count > 0 {
                for &(_, off) in &taps {
                    pad_before = pad_before.max(-off);
                    pad_after = pad_after.max(count as isize - 1 + off - (out_len as isize - 1));
                }
            }
            Phase { phase, count, taps }
        })
        .collect();
    (list, [pad_before as usize, pad_after as usize])
}

/// `dx` for the convolution `g` (see [`super::conv2d_backward_input`]); `direct::supported(g)`
/// must hold and the operands must have been checked against `g` (`out_hw` is its output size).
/// With `round`, both operands are rounded to its format as they are copied (padded `dy`,
/// transposed filter).
pub(super) fn backward_input(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    at_level!(backward_input_with(g, out_hw, dy, w, dx, epilogue, round))
}

fn backward_input_with<K: TileKernels>(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
    round: Option<HalfFormat>,
) -> Result<(), KernelError> {
    let (c, o) = (g.in_channels, g.out_channels);
    let [h, wd] = g.in_hw;
    let image_rows = h * wd;
    if image_rows == 0 || c == 0 {
        return Ok(());
    }
    let (rows, [pt, pb]) = phases(g, 0, out_hw[0]);
    let (cols, [pl, pr]) = phases(g, 1, out_hw[1]);
    let [hp, wp] = [out_hw[0] + pt + pb, out_hw[1] + pl + pr];
    // The filter with each tap's `[C, O]` block transposed to `[O, C]`: rows are `dy` channels
    // (padded to whole vectors where the microkernels need it).
    let taps = g.kernel_hw[0] * g.kernel_hw[1];
    let w_stride = row_stride::<K>(c);
    let mut w_t = vec![0.0; taps * o * w_stride];
    for tap in 0..taps {
        for ci in 0..c {
            for oi in 0..o {
                let v = w[(tap * c + ci) * o + oi];
                w_t[(tap * o + oi) * w_stride + ci] = round.map_or(v, |f| f.round(v));
            }
        }
    }
    let out_image = out_hw[0] * out_hw[1] * o;
    let parallel = worth_parallel(2 * g.macs()) && g.batch > 1;
    // An epilogue that stores the rows itself (a bf16 output) gets each image from scratch.
    let elsewhere = epilogue.stores_elsewhere();
    for_each_row_block(
        dx,
        c,
        image_rows,
        parallel,
        |dx_image, first_row, scratch| {
            let n = first_row / image_rows;
            let image_len = if elsewhere { dx_image.len() } else { 0 };
            let (padded, image) =
                scratch_of(scratch, hp * wp * o + image_len).split_at_mut(hp * wp * o);
            let dx_image = if elsewhere { image } else { dx_image };
            pad_dy(
                &dy[n * out_image..(n + 1) * out_image],
                out_hw,
                [pt, pl],
                wp,
                o,
                padded,
                round,
            );
            for row in rows.iter().filter(|r| r.count > 0) {
                for col in cols.iter().filter(|c| c.count > 0) {
                    let segs: Vec<Segment> = row
                        .taps
                        .iter()
                        .flat_map(|&(kh, off_h)| {
                            col.taps.iter().map(move |&(kw, off_w)| Segment {
                                a_off: ((off_h + pt as isize) as usize * wp
                                    + (off_w + pl as isize) as usize)
                                    * o,
                                k0: (kh * g.kernel_hw[1] + kw) * o,
                                len: o,
                            })
                        })
                        .collect();
                    let out_ps = g.strides[1] * c;
                    for i in 0..row.count {
                        let first = ((row.phase + g.strides[0] * i) * wd + col.phase) * c;
                        let out = &mut dx_image[first..];
                        if segs.is_empty() {
                            // No tap reaches these pixels (a stride larger than the window).
                            for pixel in 0..col.count {
                                out[pixel * out_ps..pixel * out_ps + c].fill(0.0);
                            }
                            continue;
                        }
                        let source = &padded[i * wp * o..];
                        tile_row::<K>(source, o, col.count, &segs, &w_t, w_stride, c, out, out_ps);
                    }
                }
            }
            if !epilogue.is_identity() {
                epilogue.apply(dx_image, first_row, c);
            }
            Ok(())
        },
    )
}

/// Copies one `[OH, OW, O]` image of `dy` into a zeroed buffer with `before = [top, left]`
/// padding and rows `wp` pixels wide, rounded to `round`'s format when there is one.
fn pad_dy(
    image: &[f32],
    out_hw: [usize; 2],
    before: [usize; 2],
    wp: usize,
    o: usize,
    padded: &mut [f32],
    round: Option<HalfFormat>,
) {
    padded.fill(0.0);
    let row_len = out_hw[1] * o;
    if row_len == 0 {
        return;
    }
    let rows = out_hw[0].min(image.len() / row_len);
    let start = (before[0] * wp + before[1]) * o;
    copy_rows(
        round,
        &image[..rows * row_len],
        row_len,
        &mut padded[start..],
        wp * o,
    );
}
