//! The bf16 convolutions on AMX tiles (`kernels::conv::amx`) against f64 sums of the same
//! bf16-rounded operands, on seeded random geometries and ResNet's shapes, with an epilogue.
//!
//! Bound: products of bf16 values are exact in f32, so an output of `K` products carries only
//! f32 accumulation error, at most `(K + 2)·2⁻²⁴·Σ|x̃·w̃|` whatever the order the tile unit sums
//! in (`K` additions of unit roundoff 2⁻²⁴, plus the reference's own rounding to f32), plus
//! 1e-37 for the subnormals the instruction flushes. The tests say so and skip (passing) on a
//! machine without AMX-BF16; on one with it (Sapphire Rapids) they run.

use crate::cpu_kernels_common;

use cpu_kernels_common::*;
use rand::Rng;
use towerpack::backend::cpu::kernels::{
    ChannelEpilogue, Conv2dGeometry, ConvPass, NoEpilogue, Padding2d, SimdLevel,
    bf16_tiles_unsupported, conv2d_backward_filter_bf16, conv2d_backward_input_bf16,
    conv2d_forward_bf16,
};
use towerpack::lower::HalfFormat;

fn bf16(xs: &[f32]) -> Vec<f32> {
    xs.iter().map(|&x| HalfFormat::Bf16.round(x)).collect()
}

fn abs(xs: &[f32]) -> Vec<f32> {
    xs.iter().map(|x| x.abs()).collect()
}

/// Checks `got` against `want` within the accumulation bound of `k` products whose magnitudes
/// sum to `magnitude`.
fn assert_within_bound(what: &str, got: &[f32], want: &[f32], magnitude: &[f32], k: usize) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let beta = (k as f64 + 2.0) * 2f64.powi(-24);
    let mut worst = 0.0f64;
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(magnitude).enumerate() {
        let bound = beta * f64::from(m) + 1e-37;
        let err = (f64::from(g) - f64::from(w)).abs();
        assert!(
            err <= bound,
            "{what}: element {i} is {g}, the f64 sum of the rounded operands {w} \
             (error {err:e} > bound {bound:e})"
        );
        if bound > 0.0 {
            worst = worst.max(err / bound);
        }
    }
    eprintln!("{what}: worst error {:.3} of the bound", worst);
}

/// Whether the tile kernels run here; says why not when they do not.
fn tiles_here(g: &Conv2dGeometry) -> bool {
    match bf16_tiles_unsupported(g, ConvPass::Forward) {
        None => true,
        Some(why) => {
            eprintln!("skipped: {why}");
            false
        }
    }
}

fn check_forward(g: &Conv2dGeometry, seed: u64) {
    let mut r = rng(seed);
    let x = random_vec(&mut r, g.input_len());
    let w = random_vec(&mut r, g.filter_len());
    let (xr, wr) = (bf16(&x), bf16(&w));
    let mut y = vec![f32::NAN; g.output_len()];
    conv2d_forward_bf16(g, &x, &w, &mut y, &NoEpilogue).unwrap();
    let k = g.kernel_hw[0] * g.kernel_hw[1] * g.in_channels;
    assert_within_bound(
        &format!("forward {g:?}"),
        &y,
        &naive_conv_forward(g, &xr, &wr),
        &naive_conv_forward(g, &abs(&xr), &abs(&wr)),
        k,
    );
}

fn check_backward_input(g: &Conv2dGeometry, seed: u64) {
    let mut r = rng(seed);
    let dy = random_vec(&mut r, g.output_len());
    let w = random_vec(&mut r, g.filter_len());
    let (dyr, wr) = (bf16(&dy), bf16(&w));
    let mut dx = vec![f32::NAN; g.input_len()];
    conv2d_backward_input_bf16(g, &dy, &w, &mut dx, &NoEpilogue).unwrap();
    let k = g.kernel_hw[0] * g.kernel_hw[1] * g.out_channels;
    assert_within_bound(
        &format!("backward input {g:?}"),
        &dx,
        &naive_conv_backward_input(g, &dyr, &wr),
        &naive_conv_backward_input(g, &abs(&dyr), &abs(&wr)),
        k,
    );
}

fn check_backward_filter(g: &Conv2dGeometry, seed: u64) {
    let mut r = rng(seed);
    let x = random_vec(&mut r, g.input_len());
    let dy = random_vec(&mut r, g.output_len());
    let (xr, dyr) = (bf16(&x), bf16(&dy));
    let mut dw = vec![f32::NAN; g.filter_len()];
    conv2d_backward_filter_bf16(g, &x, &dy, &mut dw).unwrap();
    let [oh, ow] = g.out_hw();
    assert_within_bound(
        &format!("backward filter {g:?}"),
        &dw,
        &naive_conv_backward_filter(g, &xr, &dyr),
        &naive_conv_backward_filter(g, &abs(&xr), &abs(&dyr)),
        g.batch * oh * ow,
    );
    let mut again = vec![f32::NAN; g.filter_len()];
    conv2d_backward_filter_bf16(g, &x, &dy, &mut again).unwrap();
    assert!(
        dw.iter()
            .zip(&again)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "backward filter {g:?} differs run to run"
    );
}

/// A random one-group geometry: channel counts with partial 16-column blocks and 32-deep
/// steps, odd sizes, strides, dilations, asymmetric padding.
fn random_geometry(rng: &mut rand_chacha::ChaCha8Rng) -> Conv2dGeometry {
    let limits = GeometryLimits {
        hw: 11,
        in_channels: 40,
        out_channels: 70,
        stride: 2,
    };
    random_one_group_geometry(rng, &limits)
}

/// `g` at stride 1 with its padding cut to the window's reach: a geometry whose input gradient
/// the tiles run (`backward_input::transposed_geometry`).
fn stride_1_twin(g: &Conv2dGeometry) -> Conv2dGeometry {
    let reach = [
        g.dilations[0] * (g.kernel_hw[0] - 1),
        g.dilations[1] * (g.kernel_hw[1] - 1),
    ];
    Conv2dGeometry {
        strides: [1, 1],
        padding: Padding2d {
            top: g.padding.top.min(reach[0]),
            bottom: g.padding.bottom.min(reach[0]),
            left: g.padding.left.min(reach[1]),
            right: g.padding.right.min(reach[1]),
        },
        ..*g
    }
}

#[test]
fn bf16_tile_convolutions_sum_the_rounded_products_within_the_f32_bound() {
    // Every pass on every geometry (the input gradient of a strided one phase by phase), and
    // the input gradient on the geometry's stride-1 twin (the flipped-filter path).
    let probe = Conv2dGeometry::new(1, [3, 3], 1, 1, [1, 1]);
    if !tiles_here(&probe) {
        return;
    }
    let mut r = rng(71);
    for case in 0..80 {
        let g = random_geometry(&mut r);
        check_forward(&g, 500 + case);
        check_backward_filter(&g, 700 + case);
        assert_eq!(
            bf16_tiles_unsupported(&g, ConvPass::InputGradient),
            None,
            "{g:?}"
        );
        check_backward_input(&g, 800 + case);
        let s1 = stride_1_twin(&g);
        if s1.validate().is_ok() {
            check_backward_input(&s1, 900 + case);
        }
    }
}

#[test]
fn strided_input_gradients_phase_by_phase_sum_within_the_bound() {
    // Strides 2 and 3 with output-gradient channels of 16k, so the phases read their windows
    // in place where their rows are wide and gather them where narrow; odd sizes (phases of
    // unequal extent), dilations, asymmetric padding, windows smaller than the stride (phases
    // no tap reaches: zeros), one and two threads.
    let probe = Conv2dGeometry::new(1, [3, 3], 16, 16, [1, 1]);
    if !tiles_here(&probe) {
        return;
    }
    let mut r = rng(97);
    for case in 0..40 {
        let mut g = random_geometry(&mut r);
        let stride = r.random_range(2..=3);
        g.strides = [stride, r.random_range(1..=3)];
        g.in_channels = r.random_range(1..=40);
        g.out_channels = 16 * r.random_range(1..=4);
        g.in_hw = [r.random_range(1..=12), r.random_range(2..=70)];
        if g.validate().is_err() {
            continue;
        }
        with_threads(1 + case as usize % 2, || {
            check_backward_input(&g, 1300 + case);
        });
    }
}

#[test]
fn stride_1_windows_read_in_place_sum_within_the_bound() {
    // Stride 1 with channel counts of 16k: every window row (`KW·C`, or `C` per tap when
    // dilated) is whole 16- or 32-deep steps, so the tiles read the padded image in place —
    // pixels counted along the padded rows, those past each output row dropped — in the
    // forward pass and in the input gradient (channels `O`). Odd sizes, dilations, asymmetric
    // padding; wide images, where reading in place costs little more tile work than gathering
    // (narrow ones gather: `Windows::of`).
    let probe = Conv2dGeometry::new(1, [3, 3], 16, 16, [1, 1]);
    if !tiles_here(&probe) {
        return;
    }
    let mut r = rng(91);
    for case in 0..30 {
        let mut g = random_geometry(&mut r);
        g.in_channels = 16 * r.random_range(1..=4);
        g.out_channels = 16 * r.random_range(1..=3);
        g.in_hw = [r.random_range(1..=8), r.random_range(28..=40)];
        let g = stride_1_twin(&g);
        if g.validate().is_err() {
            continue;
        }
        with_threads(1 + case as usize % 2, || {
            check_forward(&g, 1100 + case);
            check_backward_input(&g, 1200 + case);
        });
    }
}

#[test]
fn resnet_shapes_on_two_threads_with_an_epilogue() {
    // ResNet-20's layers at batch 4: the 3-channel stem, 3×3 16/32/64 channels (stride 1 and
    // 2), a 1×1 projection; two threads split the images. The channel epilogue (scale, shift,
    // ReLU) runs on the tile kernels' rows as on the vector kernels'.
    let layer = |hw: usize, c: usize, o: usize, k: usize, stride: usize| {
        let mut g = Conv2dGeometry::new(4, [hw, hw], c, o, [k, k]);
        g.strides = [stride, stride];
        g.padding = Padding2d::uniform(k / 2);
        g
    };
    let shapes = [
        layer(32, 3, 16, 3, 1),
        layer(32, 16, 16, 3, 1),
        layer(32, 16, 32, 3, 2),
        layer(16, 32, 32, 3, 1),
        layer(8, 64, 64, 3, 1),
        layer(16, 32, 64, 1, 2),
    ];
    if !tiles_here(&shapes[0]) {
        return;
    }
    for (i, g) in shapes.iter().enumerate() {
        with_threads(2, || {
            check_forward(g, 40 + i as u64);
            check_backward_filter(g, 50 + i as u64);
            if bf16_tiles_unsupported(g, ConvPass::InputGradient).is_none() {
                check_backward_input(g, 60 + i as u64);
            }
            // The epilogue: relu(scale·y + shift) on the tile kernels equals the same epilogue
            // applied to their plain output.
            let mut r = rng(80 + i as u64);
            let x = random_vec(&mut r, g.input_len());
            let w = random_vec(&mut r, g.filter_len());
            let scale = random_vec(&mut r, g.out_channels);
            let shift = random_vec(&mut r, g.out_channels);
            let mut plain = vec![f32::NAN; g.output_len()];
            conv2d_forward_bf16(g, &x, &w, &mut plain, &NoEpilogue).unwrap();
            let mut fused = vec![f32::NAN; g.output_len()];
            let epilogue = ChannelEpilogue {
                scale: Some(&scale),
                shift: Some(&shift),
                residual: None,
                relu: true,
            };
            conv2d_forward_bf16(g, &x, &w, &mut fused, &epilogue).unwrap();
            for (j, (p, f)) in plain.iter().zip(&fused).enumerate() {
                let c = j % g.out_channels;
                let want = (p * scale[c] + shift[c]).max(0.0);
                assert_eq!(*f, want, "layer {i}, element {j}");
            }
        });
    }
}

#[test]
fn the_tile_kernels_refuse_what_they_cannot_run() {
    let mut grouped = Conv2dGeometry::new(1, [8, 8], 4, 4, [3, 3]);
    grouped.strides = [2, 2];
    grouped.groups = 2;
    let x = vec![0.0; grouped.input_len()];
    let w = vec![0.0; grouped.filter_len()];
    let mut dx = vec![0.0; grouped.input_len()];
    let dy = vec![0.0; grouped.output_len()];
    let err = conv2d_backward_input_bf16(&grouped, &dy, &w, &mut dx, &NoEpilogue).unwrap_err();
    // The reason in force: "grouped convolution" where the tiles run at all.
    let why = bf16_tiles_unsupported(&grouped, ConvPass::InputGradient).expect("refused");
    assert!(
        !tiles_here(&Conv2dGeometry::new(1, [8, 8], 4, 4, [3, 3])) || why == "grouped convolution",
        "{why}"
    );
    assert!(
        err.to_string().contains("conv2d_backward_input_bf16") && err.to_string().contains(why),
        "{err}"
    );
    // Below the avx512 level (or without AMX) the forward pass is refused too, naming why.
    let plain = Conv2dGeometry::new(1, [8, 8], 4, 4, [3, 3]);
    SimdLevel::Avx2.run(|| {
        let (w, mut y) = (vec![0.0; plain.filter_len()], vec![0.0; plain.output_len()]);
        let err = conv2d_forward_bf16(&plain, &x, &w, &mut y, &NoEpilogue).unwrap_err();
        assert!(
            err.to_string().contains("bf16 tile kernels cannot run"),
            "{err}"
        );
    });
}
