//! The input gradient of a strided convolution on AMX tiles, phase by phase.
//!
//! As on the direct kernels (`direct_input`), the pixels of `dx` split into `stride_h ×
//! stride_w` phases (`h mod s_h`, `w mod s_w`); within one phase every pixel receives the same
//! taps, at fixed offsets into the zero-padded `dy`, so a phase is a stride-1 correlation of
//! `dy` with those taps' filter slices — an implicit GEMM whose window is the taps' runs of `O`
//! channels, times the phase's packed filter (`[taps·O, C]`). Nothing multiplies the zeros a
//! transposed convolution would insert, and nothing is scattered by addition: each phase's
//! products are copied to its pixels of `dx`, which no other phase writes. `dy` is padded and
//! rounded to bf16 once per image; the windows are read in place where `O` is whole 16- or
//! 32-deep steps and the phase's rows are wide enough (as [`super::implicit_gemm`]'s stride-1
//! convolutions), gathered otherwise.

use super::implicit_gemm::{InPlace, PackedB, image_gemm};
use super::{BUFFERS, Buffers, K_STEP, PANEL_ROWS, Tiles, pad_image_bf16};
use crate::backend::cpu::kernels::KernelError;
use crate::backend::cpu::kernels::conv::direct::padded_hw;
use crate::backend::cpu::kernels::conv::direct_input::phases;
use crate::backend::cpu::kernels::conv::tiles::Segment;
use crate::backend::cpu::kernels::conv::{Conv2dGeometry, Padding2d};
use crate::backend::cpu::kernels::epilogue::Epilogue;
use crate::backend::cpu::kernels::parallel::{for_each_row_block, rows_target, worth_parallel};

/// How one phase's windows are read from the padded `dy`.
enum PhaseWindows {
    /// In place: pixel `(i, j)`'s window starts at `(i·Wp + j)·O`, its steps `offsets` past
    /// that (bf16 elements).
    InPlace { k_step: usize, offsets: Vec<usize> },
    /// Gathered from the runs `segs` past each pixel's origin.
    Gathered {
        segs: Vec<Segment>,
        origins: Vec<usize>,
    },
}

/// One phase of `dx`: its first pixel, its extent, and its product (none when no tap reaches
/// its pixels: a stride larger than the window).
struct Phase {
    first: [usize; 2],
    counts: [usize; 2],
    product: Option<(PackedB, PhaseWindows)>,
}

/// `dx = epilogue(∂conv2d/∂x · bf16(dy))` with the bf16 filter on AMX tiles, for any stride and
/// padding (`out_hw` is `g`'s output size; the operands were checked against `g`).
pub(super) fn backward_input(
    g: &Conv2dGeometry,
    out_hw: [usize; 2],
    dy: &[f32],
    w: &[f32],
    dx: &mut [f32],
    epilogue: &dyn Epilogue,
) -> Result<(), KernelError> {
    let (c, o) = (g.in_channels, g.out_channels);
    let image_rows = g.in_hw[0] * g.in_hw[1];
    epilogue.check(g.batch * image_rows, c)?;
    if image_rows == 0 || c == 0 {
        return Ok(());
    }
    let (rows, [pt, pb]) = phases(g, 0, out_hw[0]);
    let (cols, [pl, pr]) = phases(g, 1, out_hw[1]);
    // `dy` as the input of a stride-1 convolution: the geometry its padded bf16 copy is laid
    // out by (`pad_image_bf16`).
    let dy_layout = Conv2dGeometry {
        batch: 1,
        in_hw: out_hw,
        in_channels: o,
        out_channels: c,
        kernel_hw: [1, 1],
        strides: [1, 1],
        dilations: [1, 1],
        padding: Padding2d {
            top: pt,
            bottom: pb,
            left: pl,
            right: pr,
        },
        groups: 1,
    };
    let [_, wp] = padded_hw(&dy_layout);
    let kw_len = g.kernel_hw[1];
    let mut plan = Vec::new();
    for row in rows.iter().filter(|r| r.count > 0) {
        for col in cols.iter().filter(|c| c.count > 0) {
            let counts = [row.count, col.count];
            // The phase's taps (filter tap, `a_off` into the padded `dy`), in filter order.
            let taps: Vec<(usize, usize)> = row
                .taps
                .iter()
                .flat_map(|&(kh, off_h)| {
                    col.taps.iter().map(move |&(kw, off_w)| {
                        let h = (off_h + pt as isize) as usize;
                        let w = (off_w + pl as isize) as usize;
                        (kh * kw_len + kw, (h * wp + w) * o)
                    })
                })
                .collect();
            let product = (!taps.is_empty() && o > 0).then(|| {
                let windows = phase_windows(&taps, counts, wp, o);
                let k_step = match &windows {
                    PhaseWindows::InPlace { k_step, .. } => *k_step,
                    PhaseWindows::Gathered { .. } => K_STEP,
                };
                let filter = PackedB::new(taps.len() * o, c, k_step, |k, n| {
                    w[(taps[k / o].0 * c + n) * o + k % o]
                });
                (filter, windows)
            });
            plan.push(Phase {
                first: [row.phase, col.phase],
                counts,
                product,
            });
        }
    }
    let out_image = out_hw[0] * out_hw[1] * o;
    let parallel = worth_parallel(2 * g.macs()) && g.batch > 1;
    // An epilogue that stores the rows itself (a bf16 output) gets each image from scratch.
    let elsewhere = epilogue.stores_elsewhere();
    let [sh, sw] = g.strides;
    let width = g.in_hw[1];
    for_each_row_block(
        dx,
        c,
        image_rows,
        parallel,
        |dx_image, first_row, scratch| {
            let n = first_row / image_rows;
            let dx_image = rows_target(dx_image, scratch, elsewhere);
            BUFFERS.with_borrow_mut(|b| {
                let Buffers {
                    padded,
                    padded_for,
                    panel,
                    panel_for,
                    products,
                    phase_out,
                    ..
                } = b;
                let image = &dy[n * out_image..(n + 1) * out_image];
                pad_image_bf16(&dy_layout, image, padded, padded_for);
                for phase in &plan {
                    let [ch, cw] = phase.counts;
                    let pixel = |i: usize, j: usize| {
                        let at = ((phase.first[0] + sh * i) * width + phase.first[1] + sw * j) * c;
                        at..at + c
                    };
                    let Some((filter, windows)) = &phase.product else {
                        for (i, j) in (0..ch).flat_map(|i| (0..cw).map(move |j| (i, j))) {
                            dx_image[pixel(i, j)].fill(0.0);
                        }
                        continue;
                    };
                    phase_out.resize(ch * cw * c, 0.0);
                    match windows {
                        PhaseWindows::InPlace { k_step, offsets } => {
                            // SAFETY: `backward_input` runs only where `unsupported` found AMX
                            // available; the step is 16 or 32 (`phase_windows`).
                            let tiles = unsafe { Tiles::configure_for(*k_step) };
                            let plan = InPlace {
                                c: o,
                                wp,
                                out_hw: phase.counts,
                                offsets,
                            };
                            plan.image_gemm(&tiles, padded, filter, products, phase_out);
                        }
                        PhaseWindows::Gathered { segs, origins } => {
                            // SAFETY: as above.
                            let tiles = unsafe { Tiles::configure() };
                            let buffers = (&mut *panel, &mut *panel_for, &mut *products);
                            image_gemm(
                                &tiles, segs, origins, padded, filter, buffers, phase_out, c,
                            );
                        }
                    }
                    for (p, src) in phase_out.chunks_exact(c).enumerate() {
                        dx_image[pixel(p / cw, p % cw)].copy_from_slice(src);
                    }
                }
            });
            if !epilogue.is_identity() {
                epilogue.apply(dx_image, first_row, c);
            }
            Ok(())
        },
    )
}

/// How a phase of `counts` pixels reads its windows from the padded `dy` (rows `wp` pixels of
/// `o` channels): in place when every tap's run of `o` is whole 16- or 32-deep steps and
/// counting the phase's pixels along the padded rows costs at most a quarter more tile work
/// (the rule of the stride-1 convolutions, `implicit_gemm`'s `Windows::of`), else gathered.
fn phase_windows(taps: &[(usize, usize)], counts: [usize; 2], wp: usize, o: usize) -> PhaseWindows {
    let [ch, cw] = counts;
    let spanned = (ch - 1) * wp + cw;
    let cheap = 4 * spanned.div_ceil(PANEL_ROWS) <= 5 * (ch * cw).div_ceil(PANEL_ROWS);
    let step = [K_STEP, K_STEP / 2]
        .into_iter()
        .find(|&step| o.is_multiple_of(step));
    match step {
        Some(k_step) if cheap => PhaseWindows::InPlace {
            k_step,
            offsets: taps
                .iter()
                .flat_map(|&(_, a_off)| (0..o / k_step).map(move |i| a_off + i * k_step))
                .collect(),
        },
        _ => PhaseWindows::Gathered {
            segs: taps
                .iter()
                .enumerate()
                .map(|(i, &(_, a_off))| Segment {
                    a_off,
                    k0: i * o,
                    len: o,
                })
                .collect(),
            origins: (0..ch)
                .flat_map(|i| (0..cw).map(move |j| (i * wp + j) * o))
                .collect(),
        },
    }
}
