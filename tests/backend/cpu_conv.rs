//! The CPU convolution kernels against naive loops over every tap, on seeded random geometries
//! (strides, dilations, asymmetric padding, groups) and inputs, at every SIMD level this machine
//! runs. Tolerance: 1e-4 absolute plus 1e-4 relative on small problems (f32 sums of at most a
//! few hundred products of values in [-1, 1], against f64 references); 2e-3 absolute on the
//! large ones.

use crate::cpu_kernels_common;

use cpu_kernels_common::*;
use rand::Rng;
use towerpack::backend::cpu::kernels::{
    ChannelEpilogue, Conv2dGeometry, ConvAlgorithm, KernelError, MomentsEpilogue, NoEpilogue,
    Padding2d, SimdLevel, conv2d_backward_filter, conv2d_backward_filter_with,
    conv2d_backward_input, conv2d_backward_input_with, conv2d_forward, conv2d_forward_with,
};

/// A random small geometry with a valid output.
fn random_geometry(rng: &mut rand_chacha::ChaCha8Rng) -> Conv2dGeometry {
    loop {
        let groups = rng.random_range(1..=3);
        let g = Conv2dGeometry {
            batch: rng.random_range(1..=3),
            in_hw: [rng.random_range(1..=9), rng.random_range(1..=9)],
            in_channels: groups * rng.random_range(1..=4),
            out_channels: groups * rng.random_range(1..=4),
            kernel_hw: [rng.random_range(1..=3), rng.random_range(1..=3)],
            strides: [rng.random_range(1..=3), rng.random_range(1..=3)],
            dilations: random_dilations(rng),
            padding: random_padding(rng),
            groups,
        };
        if g.validate().is_ok() {
            return g;
        }
    }
}

/// Every algorithm that can run `g` at the SIMD level in force: the automatic choice and each
/// pinned one (the direct kernels need one group and a vector level).
fn algorithms_for(g: &Conv2dGeometry) -> Vec<ConvAlgorithm> {
    let mut algorithms = vec![ConvAlgorithm::Auto, ConvAlgorithm::Im2colGemm];
    if g.groups == 1 && direct_runs_at(SimdLevel::current()) {
        algorithms.push(ConvAlgorithm::Direct);
    }
    if winograd_runs(g, false) && winograd_runs(g, true) {
        algorithms.push(ConvAlgorithm::Winograd);
    }
    algorithms
}

/// Whether Winograd runs the forward pass (or, with `input_gradient`, the input gradient) of
/// `g` at the SIMD level in force, by its documented contract: 3×3, stride 1, no dilation, one
/// group, channels in whole vectors of 8, a vector level, and for the input gradient padding of
/// at most 2 on each side.
fn winograd_runs(g: &Conv2dGeometry, input_gradient: bool) -> bool {
    let p = g.padding;
    g.kernel_hw == [3, 3]
        && g.strides == [1, 1]
        && g.dilations == [1, 1]
        && g.groups == 1
        && g.in_channels > 0
        && g.out_channels > 0
        && g.in_channels.is_multiple_of(8)
        && g.out_channels.is_multiple_of(8)
        && direct_runs_at(SimdLevel::current())
        && (!input_gradient
            || [p.top, p.bottom, p.left, p.right]
                .iter()
                .all(|&side| side <= 2))
}

/// Whether the direct kernels run at `level`.
fn direct_runs_at(level: SimdLevel) -> bool {
    level >= SimdLevel::Avx2
}

fn check_all_passes(g: &Conv2dGeometry, seed: u64, atol: f32) {
    let mut r = rng(seed);
    let x = random_vec(&mut r, g.input_len());
    let w = random_vec(&mut r, g.filter_len());
    let dy = random_vec(&mut r, g.output_len());
    let want_y = naive_conv_forward(g, &x, &w);
    let want_dx = naive_conv_backward_input(g, &dy, &w);
    let want_dw = naive_conv_backward_filter(g, &x, &dy);
    for algorithm in algorithms_for(g) {
        let what = format!("{algorithm:?} {g:?}");
        let mut y = vec![f32::NAN; g.output_len()];
        conv2d_forward_with(algorithm, g, &x, &w, &mut y, &NoEpilogue, None).unwrap();
        assert_close(&format!("forward {what}"), &y, &want_y, atol, 1e-4);

        let mut dx = vec![f32::NAN; g.input_len()];
        conv2d_backward_input_with(algorithm, g, &dy, &w, &mut dx, &NoEpilogue, None).unwrap();
        assert_close(&format!("backward input {what}"), &dx, &want_dx, atol, 1e-4);

        let mut dw = vec![f32::NAN; g.filter_len()];
        conv2d_backward_filter_with(algorithm, g, &x, &dy, &mut dw, None).unwrap();
        assert_close(
            &format!("backward filter {what}"),
            &dw,
            &want_dw,
            atol,
            1e-4,
        );
    }
}

#[test]
fn random_small_geometries_match_the_naive_convolution() {
    at_every_level(|| {
        let mut r = rng(7);
        for case in 0..300 {
            let g = random_geometry(&mut r);
            check_all_passes(&g, 1000 + case, 1e-4);
        }
    });
}

#[test]
fn pointwise_and_same_padded_shapes_match() {
    at_every_level(|| {
        // 1×1 stride 1 (the plain-GEMM path), TF 'same' 3×3 with stride 1 and 2, a 1×1 stride-2
        // projection shortcut and an asymmetric 'same' padding (extra cell at the end).
        let mut pointwise = Conv2dGeometry::new(2, [5, 7], 6, 5, [1, 1]);
        let mut same3 = Conv2dGeometry::new(2, [6, 6], 4, 8, [3, 3]);
        same3.padding = Padding2d::uniform(1);
        let mut strided3 = same3;
        strided3.strides = [2, 2];
        strided3.padding = Padding2d {
            top: 0,
            bottom: 1,
            left: 0,
            right: 1,
        };
        let mut projection = pointwise;
        projection.strides = [2, 2];
        for (i, g) in [pointwise, same3, strided3, projection].iter().enumerate() {
            check_all_passes(g, 50 + i as u64, 1e-4);
        }
        pointwise.batch = 0;
        check_all_passes(&pointwise, 60, 1e-4);
    });
}

#[test]
fn large_convolutions_match_and_are_deterministic_on_two_threads() {
    at_every_level(|| {
        // Big enough to split into parallel blocks (ResNet-like 3×3 stride 1 and 2, and a 1×1).
        let mut stride1 = Conv2dGeometry::new(4, [16, 16], 16, 16, [3, 3]);
        stride1.padding = Padding2d::uniform(1);
        let mut stride2 = Conv2dGeometry::new(4, [16, 16], 16, 32, [3, 3]);
        stride2.strides = [2, 2];
        stride2.padding = Padding2d {
            top: 0,
            bottom: 1,
            left: 0,
            right: 1,
        };
        let pointwise = Conv2dGeometry::new(4, [16, 16], 32, 16, [1, 1]);
        for (i, g) in [stride1, stride2, pointwise].iter().enumerate() {
            with_threads(2, || check_all_passes(g, 70 + i as u64, 2e-3));
            let mut r = rng(80 + i as u64);
            let x = random_vec(&mut r, g.input_len());
            let w = random_vec(&mut r, g.filter_len());
            let dy = random_vec(&mut r, g.output_len());
            let run = || {
                let mut y = vec![0.0; g.output_len()];
                let mut dx = vec![0.0; g.input_len()];
                let mut dw = vec![0.0; g.filter_len()];
                conv2d_forward(g, &x, &w, &mut y, &NoEpilogue).unwrap();
                conv2d_backward_input(g, &dy, &w, &mut dx, &NoEpilogue).unwrap();
                conv2d_backward_filter(g, &x, &dy, &mut dw).unwrap();
                (y, dx, dw)
            };
            let first = with_threads(2, run);
            let second = with_threads(2, run);
            assert!(
                first == second,
                "two-thread results differ between runs for {g:?}"
            );
        }
    });
}

#[test]
fn channel_epilogue_applies_scale_shift_residual_and_relu() {
    at_every_level(|| {
        let mut r = rng(90);
        for case in 0..40 {
            let g = random_geometry(&mut r);
            let x = random_vec(&mut r, g.input_len());
            let w = random_vec(&mut r, g.filter_len());
            let o = g.out_channels;
            let scale = random_vec(&mut r, o);
            let shift = random_vec(&mut r, o);
            let residual = random_vec(&mut r, g.output_len());
            let relu = case % 2 == 0;
            let epilogue = ChannelEpilogue {
                scale: Some(&scale),
                shift: Some(&shift),
                residual: Some(&residual),
                relu,
            };
            let mut want = naive_conv_forward(&g, &x, &w);
            for (i, v) in want.iter_mut().enumerate() {
                *v = *v * scale[i % o] + shift[i % o] + residual[i];
                if relu {
                    *v = v.max(0.0);
                }
            }
            for algorithm in algorithms_for(&g) {
                let mut y = vec![0.0; g.output_len()];
                conv2d_forward_with(algorithm, &g, &x, &w, &mut y, &epilogue, None).unwrap();
                assert_close(
                    &format!("fused forward {algorithm:?} {g:?}"),
                    &y,
                    &want,
                    2e-4,
                    1e-4,
                );
            }

            // The same epilogue on the input gradient (rows are input pixels, C wide).
            let c = g.in_channels;
            let dy = random_vec(&mut r, g.output_len());
            let res_in = random_vec(&mut r, g.input_len());
            let epilogue = ChannelEpilogue {
                residual: Some(&res_in),
                relu,
                ..Default::default()
            };
            let mut dx = vec![0.0; g.input_len()];
            conv2d_backward_input(&g, &dy, &w, &mut dx, &epilogue).unwrap();
            let mut want = naive_conv_backward_input(&g, &dy, &w);
            for (v, res) in want.iter_mut().zip(&res_in) {
                *v += res;
                if relu {
                    *v = v.max(0.0);
                }
            }
            assert_close(
                &format!("fused backward input {g:?} c={c}"),
                &dx,
                &want,
                2e-4,
                1e-4,
            );
        }
    });
}

#[test]
fn closure_epilogues_see_every_row_once_with_its_index() {
    at_every_level(|| {
        let mut g = Conv2dGeometry::new(3, [20, 20], 8, 12, [3, 3]);
        g.padding = Padding2d::uniform(1);
        let mut r = rng(95);
        let x = random_vec(&mut r, g.input_len());
        let w = random_vec(&mut r, g.filter_len());
        // Writes each row's global index into its first channel; every row must be visited once.
        let tag = |rows: &mut [f32], first_row: usize, cols: usize| {
            for (i, row) in rows.chunks_exact_mut(cols).enumerate() {
                row[0] = (first_row + i) as f32;
            }
        };
        for (threads, algorithm) in [1, 2]
            .into_iter()
            .flat_map(|t| algorithms_for(&g).into_iter().map(move |a| (t, a)))
        {
            let mut y = vec![0.0; g.output_len()];
            with_threads(threads, || {
                conv2d_forward_with(algorithm, &g, &x, &w, &mut y, &tag, None)
            })
            .unwrap();
            let plain = naive_conv_forward(&g, &x, &w);
            for (row, (got, want)) in y.chunks_exact(12).zip(plain.chunks_exact(12)).enumerate() {
                assert_eq!(got[0], row as f32, "row {row} tagged wrongly");
                assert_close("untouched channels", &got[1..], &want[1..], 1e-4, 1e-4);
            }
        }
    });
}

#[test]
fn mismatched_buffers_and_bad_geometries_are_errors() {
    let g = Conv2dGeometry::new(1, [4, 4], 2, 3, [3, 3]);
    let x = vec![0.0; g.input_len()];
    let w = vec![0.0; g.filter_len()];
    let mut y = vec![0.0; g.output_len() + 1];
    let err = conv2d_forward(&g, &x, &w, &mut y, &NoEpilogue).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::BufferLength {
                operand: "output",
                expected: 12,
                got: 13,
                ..
            }
        ),
        "{err}"
    );
    let mut bad = g;
    bad.groups = 2;
    bad.out_channels = 3;
    let err = conv2d_forward(&bad, &x, &w, &mut y, &NoEpilogue).unwrap_err();
    assert!(
        err.to_string().contains("not divisible into 2 groups"),
        "{err}"
    );
    let mut too_big = g;
    too_big.kernel_hw = [5, 5];
    assert!(too_big.validate().is_err());
    let mut dy = vec![0.0; g.output_len()];
    let residual = vec![0.0; 3];
    let epilogue = ChannelEpilogue {
        residual: Some(&residual),
        ..Default::default()
    };
    let err = conv2d_forward(&g, &x, &w, &mut dy, &epilogue).unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::BufferLength {
                operand: "residual",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn moments_epilogue_gathers_the_batch_statistics_of_the_fused_output() {
    at_every_level(|| {
        let mut g = Conv2dGeometry::new(6, [12, 12], 8, 16, [3, 3]);
        g.padding = Padding2d::uniform(1);
        let mut r = rng(97);
        let x = random_vec(&mut r, g.input_len());
        let w = random_vec(&mut r, g.filter_len());
        let shift = random_vec(&mut r, 16);
        let want_y: Vec<f32> = naive_conv_forward(&g, &x, &w)
            .iter()
            .enumerate()
            .map(|(i, v)| (v + shift[i % 16]).max(0.0))
            .collect();
        let (mut want_mean, mut want_var) = (vec![0.0; 16], vec![0.0; 16]);
        for ch in 0..16 {
            let col: Vec<f64> = want_y
                .iter()
                .skip(ch)
                .step_by(16)
                .map(|&v| f64::from(v))
                .collect();
            let mean = col.iter().sum::<f64>() / col.len() as f64;
            want_mean[ch] = mean as f32;
            want_var[ch] =
                (col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / col.len() as f64) as f32;
        }
        for algorithm in algorithms_for(&g) {
            let mut results = Vec::new();
            for threads in [1, 2, 2] {
                let inner = ChannelEpilogue {
                    shift: Some(&shift),
                    relu: true,
                    ..Default::default()
                };
                let epilogue = MomentsEpilogue::new(inner, 16);
                let mut y = vec![0.0; g.output_len()];
                with_threads(threads, || {
                    conv2d_forward_with(algorithm, &g, &x, &w, &mut y, &epilogue, None)
                })
                .unwrap();
                assert_close(
                    &format!("{algorithm:?} fused output"),
                    &y,
                    &want_y,
                    2e-4,
                    1e-4,
                );
                let moments = epilogue.finish();
                assert_eq!(moments.rows(), g.batch * 144);
                let (mut mean, mut var) = (vec![0.0; 16], vec![0.0; 16]);
                moments.mean_variance(&mut mean, &mut var).unwrap();
                assert_close(
                    &format!("{algorithm:?} means"),
                    &mean,
                    &want_mean,
                    1e-5,
                    1e-4,
                );
                assert_close(
                    &format!("{algorithm:?} variances"),
                    &var,
                    &want_var,
                    1e-5,
                    1e-4,
                );
                results.push((mean, var));
            }
            // Merged in row order: identical whatever the thread count.
            assert!(
                results.windows(2).all(|p| p[0] == p[1]),
                "{algorithm:?}: statistics vary"
            );
        }
        let wrong = MomentsEpilogue::new(NoEpilogue, 15);
        let mut y = vec![0.0; g.output_len()];
        assert!(conv2d_forward(&g, &x, &w, &mut y, &wrong).is_err());
    });
}

/// Winograd F(4×4, 3×3) against the naive loops on random eligible geometries (outputs that are
/// not whole 4×4 tiles, asymmetric padding, 8–32 channels, one to three images, one and two
/// threads), all three passes, bitwise the same at every vector level; and on every geometry of
/// the random sample it runs exactly where its contract says, with an error elsewhere. Tolerance: 1e-4 absolute plus 1e-4 relative, as the other algorithms' (measured:
/// Winograd's errors are ~2e-6 of the outputs' scale here, the transforms' coefficients cost
/// about one decimal digit against the direct kernels).
#[test]
fn winograd_runs_where_its_contract_says_and_matches_the_naive_convolution() {
    let levels: Vec<SimdLevel> = SimdLevel::available()
        .into_iter()
        .filter(|&l| direct_runs_at(l))
        .collect();
    let mut r = rng(41);
    let mut both_ran = 0;
    for case in 0..60u64 {
        let side = |r: &mut rand_chacha::ChaCha8Rng| r.random_range(0..=3);
        let g = Conv2dGeometry {
            padding: Padding2d {
                top: side(&mut r),
                bottom: side(&mut r),
                left: side(&mut r),
                right: side(&mut r),
            },
            ..Conv2dGeometry::new(
                r.random_range(1..=3),
                [r.random_range(1..=11), r.random_range(1..=11)],
                8 * r.random_range(1..=4),
                8 * r.random_range(1..=4),
                [3, 3],
            )
        };
        if g.validate().is_err() {
            continue;
        }
        let mut r = rng(3000 + case);
        let x = random_vec(&mut r, g.input_len());
        let w = random_vec(&mut r, g.filter_len());
        let dy = random_vec(&mut r, g.output_len());
        let threads = 1 + (case % 2) as usize;
        let mut first: Option<(SimdLevel, Passes)> = None;
        for &level in &levels {
            let wino = ConvAlgorithm::Winograd;
            let (y, dx, dw) = level.run(|| {
                with_threads(threads, || {
                    let mut y = vec![f32::NAN; g.output_len()];
                    let y = conv2d_forward_with(wino, &g, &x, &w, &mut y, &NoEpilogue, None)
                        .map(|()| y);
                    let mut dx = vec![f32::NAN; g.input_len()];
                    let dx =
                        conv2d_backward_input_with(wino, &g, &dy, &w, &mut dx, &NoEpilogue, None)
                            .map(|()| dx);
                    let mut dw = vec![f32::NAN; g.filter_len()];
                    let dw =
                        conv2d_backward_filter_with(wino, &g, &x, &dy, &mut dw, None).map(|()| dw);
                    (y, dx, dw)
                })
            });
            let what = format!("case {case} {level} {g:?}");
            assert_eq!(y.is_ok(), winograd_runs(&g, false), "forward {what}");
            assert_eq!(dx.is_ok(), winograd_runs(&g, true), "input gradient {what}");
            assert_eq!(
                dw.is_ok(),
                winograd_runs(&g, false),
                "filter gradient {what}"
            );
            both_ran += usize::from(y.is_ok() && dx.is_ok() && level == levels[0]);
            let y = y.unwrap_or_default();
            let dx = dx.unwrap_or_default();
            let dw = dw.unwrap_or_default();
            if !y.is_empty() {
                let want = naive_conv_forward(&g, &x, &w);
                assert_close(&format!("forward {what}"), &y, &want, 1e-4, 1e-4);
            }
            if !dx.is_empty() {
                let want = naive_conv_backward_input(&g, &dy, &w);
                assert_close(&format!("input gradient {what}"), &dx, &want, 1e-4, 1e-4);
            }
            if !dw.is_empty() {
                let want = naive_conv_backward_filter(&g, &x, &dy);
                assert_close(&format!("filter gradient {what}"), &dw, &want, 1e-4, 1e-4);
            }
            match &first {
                None => first = Some((level, (y, dx, dw))),
                Some((l0, (y0, dx0, dw0))) => assert!(
                    &y == y0 && &dx == dx0 && &dw == dw0,
                    "case {case}: Winograd at {level} and {l0} differs on {g:?}"
                ),
            }
        }
    }
    assert!(
        levels.is_empty() || both_ran >= 20,
        "only {both_ran} geometries ran both passes"
    );
}

/// A random one-group geometry with channel counts that leave partial vectors at both widths
/// (up to 40: several 16- and 8-channel chunks plus a tail), odd sizes, strides, dilations and
/// asymmetric padding.
fn random_direct_geometry(rng: &mut rand_chacha::ChaCha8Rng) -> Conv2dGeometry {
    let limits = GeometryLimits {
        hw: 13,
        in_channels: 40,
        out_channels: 40,
        stride: 3,
    };
    random_one_group_geometry(rng, &limits)
}

/// `y`, `dx` and `dw` of one convolution.
type Passes = (Vec<f32>, Vec<f32>, Vec<f32>);

/// The three passes of `g` on the direct kernels at `level`, on `threads` threads.
fn direct_passes(
    level: SimdLevel,
    threads: usize,
    g: &Conv2dGeometry,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
) -> Passes {
    level.run(|| {
        with_threads(threads, || {
            let direct = ConvAlgorithm::Direct;
            let mut y = vec![f32::NAN; g.output_len()];
            conv2d_forward_with(direct, g, x, w, &mut y, &NoEpilogue, None).unwrap();
            let mut dx = vec![f32::NAN; g.input_len()];
            conv2d_backward_input_with(direct, g, dy, w, &mut dx, &NoEpilogue, None).unwrap();
            let mut dw = vec![f32::NAN; g.filter_len()];
            conv2d_backward_filter_with(direct, g, x, dy, &mut dw, None).unwrap();
            (y, dx, dw)
        })
    })
}

#[test]
fn direct_kernels_match_the_naive_convolution_and_agree_bitwise_across_levels() {
    // Every direct level (AVX2 and, where the CPU has it, AVX-512) against the naive loops, and
    // the levels against each other bit for bit: both sum each output's products in the same
    // order (one FMA chain per output), whatever the vector width and tile shapes.
    let levels: Vec<SimdLevel> = SimdLevel::available()
        .into_iter()
        .filter(|&l| direct_runs_at(l))
        .collect();
    let mut r = rng(31);
    let mut cases: Vec<Conv2dGeometry> = (0..120).map(|_| random_direct_geometry(&mut r)).collect();
    // Large enough to split over two threads: a ResNet-like 3×3 layer with 19 → 37 channels,
    // and a strided one with 24 → 40.
    let mut wide = Conv2dGeometry::new(4, [15, 13], 19, 37, [3, 3]);
    wide.padding = Padding2d::uniform(1);
    let mut strided = Conv2dGeometry::new(3, [17, 17], 24, 40, [3, 3]);
    strided.strides = [2, 2];
    strided.padding = Padding2d {
        top: 1,
        bottom: 0,
        left: 1,
        right: 0,
    };
    cases.extend([wide, strided]);
    for (case, g) in cases.iter().enumerate() {
        let mut r = rng(2000 + case as u64);
        let x = random_vec(&mut r, g.input_len());
        let w = random_vec(&mut r, g.filter_len());
        let dy = random_vec(&mut r, g.output_len());
        let large = case >= 120;
        let atol = if large { 2e-3 } else { 1e-4 };
        let threads = if large { 2 } else { 1 };
        let mut first: Option<(SimdLevel, Passes)> = None;
        for &level in &levels {
            let got = direct_passes(level, threads, g, &x, &w, &dy);
            let what = format!("case {case} {level} {g:?}");
            assert_close(
                &format!("forward {what}"),
                &got.0,
                &naive_conv_forward(g, &x, &w),
                atol,
                1e-4,
            );
            assert_close(
                &format!("backward input {what}"),
                &got.1,
                &naive_conv_backward_input(g, &dy, &w),
                atol,
                1e-4,
            );
            assert_close(
                &format!("backward filter {what}"),
                &got.2,
                &naive_conv_backward_filter(g, &x, &dy),
                atol,
                1e-4,
            );
            match &first {
                None => first = Some((level, got)),
                Some((l0, want)) => assert!(
                    got == *want,
                    "case {case}: the direct kernels at {level} and {l0} differ on {g:?}"
                ),
            }
        }
    }
}

/// The passes given a 16-bit format (operands rounded to bf16 / f16 as the kernels copy them) give
/// bitwise what the plain passes give on operands rounded beforehand — the f32 products and sums
/// of the same 16-bit values — at every SIMD level, on random geometries (the direct kernels
/// and the im2col fallback, which groups > 1 take) and ResNet-20's shapes.
#[test]
fn rounded_passes_multiply_exactly_the_rounded_operands() {
    use towerpack::lower::HalfFormat;
    let auto = ConvAlgorithm::Auto;
    let round = |format: HalfFormat, xs: &[f32]| -> Vec<f32> {
        xs.iter().map(|&x| format.round(x)).collect()
    };
    let mut stage = Conv2dGeometry::new(2, [8, 8], 16, 32, [3, 3]);
    stage.padding = Padding2d::uniform(1);
    stage.strides = [2, 2];
    let mut first = Conv2dGeometry::new(2, [8, 8], 3, 16, [3, 3]);
    first.padding = Padding2d::uniform(1);
    let mut r = rng(11);
    let mut geometries: Vec<Conv2dGeometry> = (0..40).map(|_| random_geometry(&mut r)).collect();
    geometries.extend([stage, first]);
    at_every_level(|| {
        for (case, g) in geometries.iter().enumerate() {
            let mut r = rng(500 + case as u64);
            // Values past f16's range and below its normals, to round in every regime.
            let mut x = random_vec(&mut r, g.input_len());
            x.iter_mut().step_by(7).for_each(|v| *v *= 1e5);
            x.iter_mut().skip(3).step_by(11).for_each(|v| *v *= 1e-6);
            let w = random_vec(&mut r, g.filter_len());
            let dy = random_vec(&mut r, g.output_len());
            for format in [HalfFormat::Bf16, HalfFormat::F16] {
                let what = format!("{format} {:?} {g:?}", SimdLevel::current());
                let (xr, wr, dyr) = (round(format, &x), round(format, &w), round(format, &dy));
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();

                let (mut want, mut got) = (vec![0.0; g.output_len()], vec![1.0; g.output_len()]);
                conv2d_forward(g, &xr, &wr, &mut want, &NoEpilogue).unwrap();
                conv2d_forward_with(auto, g, &x, &w, &mut got, &NoEpilogue, Some(format)).unwrap();
                assert_eq!(bits(&got), bits(&want), "forward {what}");

                let (mut want, mut got) = (vec![0.0; g.input_len()], vec![1.0; g.input_len()]);
                conv2d_backward_input(g, &dyr, &wr, &mut want, &NoEpilogue).unwrap();
                conv2d_backward_input_with(auto, g, &dy, &w, &mut got, &NoEpilogue, Some(format))
                    .unwrap();
                assert_eq!(bits(&got), bits(&want), "backward input {what}");

                let (mut want, mut got) = (vec![0.0; g.filter_len()], vec![1.0; g.filter_len()]);
                conv2d_backward_filter(g, &xr, &dyr, &mut want).unwrap();
                conv2d_backward_filter_with(auto, g, &x, &dy, &mut got, Some(format)).unwrap();
                assert_eq!(bits(&got), bits(&want), "backward filter {what}");
            }
        }
    });
}
