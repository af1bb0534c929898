//! BF16 and FP16 precision (`Precision::Bf16`, `Precision::Fp16`): every GEMM kernel of such a
//! program rounds both operands to the 16-bit format (`round_operands`, `TP_ROUND` of
//! `kernels/gemm_core.cuh`) and accumulates in f32, on the emulated device (or the GPU:
//! `TOWERPACK_TEST_CUDA=gpu`), compared with the CPU backend running the same precision.
//!
//! ## The bound
//!
//! An output is `c = Σₖ ãₖ·b̃ₖ` over K terms, `ã`, `b̃` the operands rounded to bf16/f16 (round
//! to nearest even, on both backends). A product of two 16-bit values (at most 11 significant
//! bits each) has at most 22 significant bits, so it is exact in f32 — and so is every product
//! the tensor cores form (natively, in the 16-bit format). The two backends differ only
//! in how they sum the same exact products in f32 (the tensor-core tiles multiply natively:
//! operands rounded by `cvt.rn` into 16-bit shared stages, fragments read by `ldmatrix`,
//! `mma.sync` m16n8k16 `.bf16`/`.f16`). With `u = 2⁻²⁴` and `S = Σₖ |ãₖ·b̃ₖ|`:
//!
//! - the CPU's f32 sum (any order: blocked, FMA or not) is off the exact sum by at most `K·u·S`;
//! - the device accumulates K products in f32: the emulated device rounds once per `mma` (the
//!   native m16n8k16 bf16/f16 `mma` of the tensor-core tiles: 16 products and the accumulator,
//!   exactly rounded) or per FMA on the SIMT tiles, at most `K·u·S`; a GPU's tensor cores may
//!   truncate rather than round their accumulation, at most `2K·u·S`;
//! - split-K combines at most K/16 partial sums, each addition off by at most `u·S`.
//!
//! Together at most `(3K + K/16)·u·S`, so the tests check, per output element,
//!
//! ```text
//! |device − cpu|  ≤  β(K)·S,   β(K) = (4K + 8)·2⁻²⁴
//! ```
//!
//! with `S` computed on the CPU as the same GEMM of `|a|` and `|b|` in the same precision (the
//! rounding commutes with `|·|`), scaled by 1.001 for its own f32 rounding. Random signs make the
//! errors cancel, so the measured `max |err| / S` printed next to `β` is far below it.
//!
//! ## That the operands really are rounded, to nearest even
//!
//! Operands in [1, 2) whose dropped bits are exactly half a bf16 (f16) ulp: round-to-nearest-even
//! sends half of them down and half up; ties-away (`rna`, what TF32 does) sends all up,
//! truncation all down, no rounding keeps them. The device's result must lie within `β(K)·S` of
//! the f64 sum of the nearest-even rounded products and more than `4·β(K)·S` away from the sums
//! of each of the three other operand treatments, in every element. A kernel that does not
//! round, or rounds another way, fails.
//!
//! ## Every tile, SIMT ones included
//!
//! A device without tensor cores (`Target::tensor_cores = false`, compute capability below 8.0)
//! runs BF16/FP16 GEMMs on the SIMT tiles, which round their operands as they store them in
//! shared memory. Every tile of `render::launch::TILES` (forced), with and without split-K, runs
//! one matrix product on the emulator in both formats against the f64 sum of the rounded
//! products; the tensor-core tiles are also assembled by ptxas for sm_80 and sm_90 without spills.
//!
//! ## Training
//!
//! Three Momentum steps of the small convnet (two 3×3 convolutions with batch norm, max
//! pooling, a dense layer) in BF16 on the emulated device against the same steps in BF16 on the
//! CPU: the same roundings, so only the summation order differs — but an f32 difference of one
//! ulp can move an operand across a bf16 rounding boundary, a change of 2⁻⁸ relative in that
//! operand, and batch norm over 4 images amplifies it. The bound is empirical, as for TF32
//! (variables within `2·10⁻²` of the CPU's relative to the variable's largest magnitude, losses
//! within `10⁻²` relative); the measured errors are printed.

use crate::cuda_common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::Session;
use towerpack::backend::cuda::render::{self, KernelPlan, Target};
use towerpack::ir::*;
use towerpack::lower::{HalfFormat, KernelKind, Precision, Program};

/// The two 16-bit precisions, with their format and the `TP_ROUND` code their GEMMs render.
const HALVES: [(Precision, HalfFormat, &str); 2] = [
    (Precision::Bf16, HalfFormat::Bf16, "#define TP_ROUND 1"),
    (Precision::Fp16, HalfFormat::F16, "#define TP_ROUND 2"),
];

use crate::gemm_case::{
    Case, assert_bitwise, assert_windows_bitwise, convolution_cases, cpu_session, device_session,
    device_session_with, filter_window_cases, filter_window_launches, lowering, matmul,
    matrix_product_cases, quad_launches, split_window_convolution_cases, split_window_launches,
    tile_of, whole_image_window_cases, wide_convolution_cases, window_launches,
};
use crate::trainer_runs::{assert_like_the_cpu, trained_mlp, variables};
use towerpack::train::BackendChoice;

/// (4K + 8)·2⁻²⁴: see the module docs.
fn beta(k: usize) -> f64 {
    (4 * k + 8) as f64 * 2f64.powi(-24)
}

/// The 16-bit format a GEMM kernel rounds its operands to (`None` for other kernels too).
fn round_operands(kind: &KernelKind) -> Option<HalfFormat> {
    match kind {
        KernelKind::MatMul(g, _) => g.round_operands,
        KernelKind::Conv2d(g, ..)
        | KernelKind::Conv2dBackpropInput(g, _)
        | KernelKind::Conv2dBackpropFilter(g, ..) => g.round_operands,
        _ => None,
    }
}

/// The GEMM launches of `program` as rendered for `multiprocessors` SMs: (kind, the format the
/// kernel rounds to, generated).
fn gemm_launches(
    program: &Program,
    multiprocessors: u32,
) -> Vec<(String, Option<HalfFormat>, String)> {
    gemm_launches_with(program, multiprocessors, true)
}

/// [`gemm_launches`] with convolution windows on or off (`Target::windows`).
fn gemm_launches_with(
    program: &Program,
    multiprocessors: u32,
    windows: bool,
) -> Vec<(String, Option<HalfFormat>, String)> {
    let target = Target {
        windows,
        ..Target::with_multiprocessors(multiprocessors)
    };
    (0..program.kernels.len())
        .filter_map(|i| match render::render_kernel_for(program, i, &target) {
            Ok(KernelPlan::Launch(r)) => Some((&program.kernels[i].kind, r)),
            Ok(_) => None,
            Err(e) => panic!("render k{i}: {e}"),
        })
        .filter(|(_, r)| r.generated.contains("#define TP_SPLIT_K"))
        .map(|(k, r)| (k.name().to_string(), round_operands(k), r.generated))
        .collect()
}

/// Runs `c` in `precision` on the device (twice, on fresh devices: bitwise equal) and on the
/// CPU; checks every GEMM element against `β(K)·S` and prints the worst `|err| / S` per GEMM.
/// Also checks that every GEMM launch rounds its operands. Returns the worst `|err| / (β·S)`.
fn check(c: &Case, multiprocessors: u32, precision: Precision, round_define: &str) -> f64 {
    check_with(c, multiprocessors, precision, round_define, true)
}

/// [`check`] with convolution windows on or off (`CudaOptions::conv_windows`).
fn check_with(
    c: &Case,
    multiprocessors: u32,
    precision: Precision,
    round_define: &str,
    windows: bool,
) -> f64 {
    let step = c.step();
    let want = cpu_session(&c.g, precision)
        .run(&step, &c.feeds)
        .expect("cpu step");
    let mut dev = device_session_with(&c.g, multiprocessors, precision, windows);
    let got = dev.run(&step, &c.feeds).expect("device step");
    let program = dev.program(&step, c.batch).expect("program").clone();
    assert_eq!(program.precision, precision);
    // Every GEMM kernel whose operands are round trips rounds them itself (an operand the
    // autocast pass could not absorb — a folded constant — was rounded by other kernels).
    let launches = gemm_launches_with(&program, multiprocessors, windows);
    let rounding = launches.iter().filter(|(_, f, _)| f.is_some()).count();
    assert!(rounding > 0, "no GEMM kernel rounds its operands");
    for (kind, format, generated) in &launches {
        assert_eq!(
            generated.contains(round_define),
            format.is_some(),
            "{kind} rounding to {format:?} renders:\n{generated}"
        );
    }
    let again = device_session_with(&c.g, multiprocessors, precision, windows)
        .run(&step, &c.feeds)
        .expect("device step");
    assert_bitwise(&got, &again, got.len(), "two runs");
    let mut worst_of_bound = 0.0f64;
    for (j, (_, _, k, what)) in c.gemms.iter().enumerate() {
        let (y, s, w) = (
            got[2 * j].to_f64_vec(),
            want[2 * j + 1].to_f64_vec(),
            want[2 * j].to_f64_vec(),
        );
        let b = beta(*k);
        let mut worst = 0.0f64;
        for (i, ((g, w), s)) in y.iter().zip(&w).zip(&s).enumerate() {
            let err = (g - w).abs();
            let bound = b * s * 1.001;
            assert!(
                err <= bound,
                "{what}[{i}] in {precision}: device {g} vs cpu {w}: error {err:e} > β(K={k})·S = \
                 {bound:e}"
            );
            if *s > 0.0 {
                worst = worst.max(err / s);
            }
        }
        eprintln!(
            "{precision} {what} on {multiprocessors} SMs: K = {k}, max |err|/S = {worst:.3e}, \
             β(K) = {b:.3e} ({:.2}% of the bound)",
            100.0 * worst / b
        );
        worst_of_bound = worst_of_bound.max(worst / b);
    }
    worst_of_bound
}

#[test]
fn matrix_products_in_bf16_and_fp16_match_the_cpu_within_the_derived_bound() {
    let (c, d) = matrix_product_cases();
    let mut worst = 0.0f64;
    for (precision, _, define) in HALVES {
        for sms in [132, 4] {
            worst = worst.max(check(&c, sms, precision, define));
            worst = worst.max(check(&d, sms, precision, define));
        }
    }
    eprintln!("matrix products: worst |err| / (β·S) = {worst:.3e}");
}

/// The 256-row tiles whose A stage the lanes of a warp fill with traded addresses (4 lanes per
/// line, `kernels/gemm_core.cuh` QUAD; on 4 and 8 SMs, where the 2,048-pixel convolutions
/// split K: on 132 they take smaller tiles) round and multiply what the CPU does, within the
/// bound. Windows off: with them, these tiles of whole image rows read a window instead.
#[test]
fn convolutions_on_256_row_tiles_load_a_through_traded_addresses_within_the_bound() {
    let c = wide_convolution_cases();
    for (precision, _, define) in HALVES {
        for sms in [4, 8] {
            check_with(&c, sms, precision, define, false);
            let launches = gemm_launches_with(&half_program(&c, sms, precision), sms, false);
            assert!(
                quad_launches(launches.iter().map(|(_, _, g)| g.as_str())) >= 2,
                "{precision:?} on {sms} SMs: the forward and input-gradient convolutions should \
                 take 256-row tiles with 128-bit loads: {:?}",
                launches.iter().map(|(k, ..)| k).collect::<Vec<_>>()
            );
        }
    }
}

/// Convolutions whose row tiles are whole rows of one image read A through a window loaded once
/// per block and rounded as it is stored (`kernels/gemm_core.cuh` tp_window; on 1-3 SMs, where
/// K is not split, and on 4 and 8, where each split multiplies its chunk of K from the whole
/// window): within the bound of the CPU in the same precision, and bitwise what the pipelined
/// core computes (`conv_windows` off). (The case's filter gradient takes windows too, whose
/// partial sums are not the pipelined core's: compared with the CPU only, here and in the next
/// test.)
#[test]
fn convolutions_through_a_window_match_the_cpu_and_the_pipelined_core_bitwise() {
    let c = wide_convolution_cases();
    let mut split = 0;
    for (precision, _, define) in HALVES {
        for sms in [1, 3, 4, 8] {
            check(&c, sms, precision, define);
            let launches = gemm_launches(&half_program(&c, sms, precision), sms);
            let generated = || launches.iter().map(|(_, _, g)| g.as_str());
            assert!(
                window_launches(generated()) >= 2,
                "{precision:?} on {sms} SMs: the forward and input-gradient convolutions should \
                 read a window"
            );
            split += split_window_launches(generated());
            // The filter gradient and its S.
            assert_eq!(
                filter_window_launches(generated()),
                2,
                "{precision:?} on {sms} SMs"
            );
            // The forward and input-gradient GEMMs and their S: the first four fetches.
            let what = format!("{precision:?} on {sms} SMs: the window and the pipelined core");
            assert_windows_bitwise(&c, sms, precision, Some(4), &what);
        }
    }
    assert!(
        split >= 4,
        "on 4 and 8 SMs some windows should split K: {split}"
    );
}

/// 32-channel convolutions (ResNet-20's second stage in small) read A through windows with K
/// split in chunks that start in the middle of a tap, rounded as they are stored: bitwise the
/// pipelined core's partial sums and combine, and within the bound of the CPU in the same
/// precision, on every device size that splits them.
#[test]
fn windows_with_k_split_mid_tap_match_the_pipelined_core_bitwise() {
    let c = split_window_convolution_cases();
    for (precision, _, define) in HALVES {
        let mut split = 0;
        for sms in [2, 4, 8, 132] {
            check(&c, sms, precision, define);
            let launches = gemm_launches(&half_program(&c, sms, precision), sms);
            split += split_window_launches(launches.iter().map(|(_, _, g)| g.as_str()));
            let what =
                format!("{precision:?} on {sms} SMs: the split window and the pipelined core");
            assert_windows_bitwise(&c, sms, precision, None, &what);
        }
        assert!(
            split >= 2,
            "{precision:?}: some 32-channel windows should split K: {split}"
        );
    }
}

/// 64-channel convolutions over 8×8 images (ResNet-20's third stage in small), whose
/// cost-chosen launches cannot read a window, take launches of one whole image by all the
/// channels that can (`render/fixed.rs window_launch`) where those fill the device: within the
/// bound of the CPU in the same precision, on device sizes where they do and where they do not.
#[test]
fn whole_image_tiles_read_a_window_within_the_bound() {
    let c = whole_image_window_cases();
    for (precision, _, define) in HALVES {
        let mut retiled = 0;
        for sms in [2, 4, 8, 32, 132] {
            check(&c, sms, precision, define);
            let program = half_program(&c, sms, precision);
            let with = gemm_launches(&program, sms);
            let without = gemm_launches_with(&program, sms, false);
            for ((kind, _, w), (_, _, wo)) in with.iter().zip(&without) {
                if w.contains("#define TP_WINDOW 1") && tile_of(w) != tile_of(wo) {
                    assert_eq!(tile_of(w), (64, 64), "{precision:?} {kind} on {sms} SMs");
                    retiled += 1;
                }
            }
        }
        eprintln!("{precision:?}: {retiled} launches retiled for a window");
        assert!(
            retiled >= 2,
            "{precision:?}: no launch retiled for a window"
        );
    }
}

/// Filter gradients with output channels in multiples of 16 read x and dy through windows of
/// whole output rows, rounded as they are stored, every tap from one load
/// (`kernels/conv2d_backprop_filter.cu` TP_FWIN): several channel tiles, an asymmetric padding,
/// one tap, a window that is the whole input, stride 2, 3 and 8 input channels, a 1×1
/// projection of stride 2; on 132 SMs (a block per window) and 2 (several windows per block,
/// split K). Within the bound of the CPU in the same precision.
#[test]
fn filter_gradients_through_windows_match_the_cpu_within_the_bound() {
    let c = filter_window_cases();
    for (precision, _, define) in HALVES {
        for sms in [132, 2] {
            check(&c, sms, precision, define);
            let launches = gemm_launches(&half_program(&c, sms, precision), sms);
            assert_eq!(
                filter_window_launches(launches.iter().map(|(_, _, g)| g.as_str())),
                16,
                "{precision:?} on {sms} SMs: every filter gradient (and its S) should read windows"
            );
        }
    }
}

/// The program of `c` in `precision` as a device of `sms` SMs lowers it.
fn half_program(c: &Case, sms: u32, precision: Precision) -> Program {
    device_session(&c.g, sms, precision)
        .program(&c.step(), c.batch)
        .expect("program")
        .clone()
}

#[test]
fn the_three_convolutions_in_bf16_and_fp16_match_the_cpu_within_the_derived_bound() {
    let c = convolution_cases();
    let mut worst = 0.0f64;
    for (precision, _, define) in HALVES {
        for sms in [132, 2] {
            worst = worst.max(check(&c, sms, precision, define));
        }
    }
    eprintln!("convolutions: worst |err| / (β·S) = {worst:.3e}");
}

/// Bits of an f32 the format drops (16 for bf16, 13 for f16).
fn dropped_bits(format: HalfFormat) -> u32 {
    match format {
        HalfFormat::Bf16 => 16,
        HalfFormat::F16 => 13,
    }
}

/// f32 values in [1, 2) with a random kept mantissa whose dropped bits tell the roundings apart
/// (see the test): every 7th a tie with an even last kept bit (nearest-even rounds it down by
/// half an ulp, ties-away up by half), the others ¾ of an ulp above a kept value (nearest
/// rounds them up by ¼ ulp, truncation down by ¾).
fn telling(format: HalfFormat) -> impl FnMut(&mut ChaCha8Rng) -> f32 {
    let d = dropped_bits(format);
    let mut count = 0usize;
    move |r| {
        let kept = r.random_range(0u32..1 << (23 - d));
        count += 1;
        let bits = if count % 7 == 1 {
            ((kept & !1) << d) | (1 << (d - 1))
        } else {
            (kept << d) | (3 << (d - 2))
        };
        f32::from_bits(0x3f80_0000 | bits)
    }
}

/// `x` with its dropped bits rounded to nearest, ties away from zero (what `cvt.rna` does).
fn ties_away(format: HalfFormat, x: f32) -> f64 {
    let d = dropped_bits(format);
    let mask = !((1u32 << d) - 1);
    f64::from(f32::from_bits(
        x.to_bits().wrapping_add(1 << (d - 1)) & mask,
    ))
}

/// `x` with its dropped bits cut off (round toward zero).
fn truncated(format: HalfFormat, x: f32) -> f64 {
    let mask = !((1u32 << dropped_bits(format)) - 1);
    f64::from(f32::from_bits(x.to_bits() & mask))
}

#[test]
fn a_product_in_bf16_or_fp16_sums_nearest_even_rounded_operands_and_nothing_else() {
    // Per operand, in ulps of the format, nearest-even moves the average value by
    // -½·⅐ + ¼·⁶⁄₇ = +⅐, ties-away by +²⁄₇, truncation by -⁵⁄₇, no rounding by 0: every other
    // treatment differs from nearest-even by at least ⅐ ulp per operand, about 2⁻¹²·S for the
    // products of two f16 operands in [1, 2) — some 10× β(64)·S (2⁻¹⁶·S), 80× for bf16.
    let (m, n, k) = (20, 24, 64);
    for (precision, format, _) in HALVES {
        let mut c = Case::new(4, 1);
        let a = c.input_with(&[m, k], telling(format));
        let b = c.input_with(&[k, n], telling(format));
        c.gemm("matmul", matmul(false, false), &[a, b], k);
        let step = c.step();
        let (av, bv) = (c.feeds[0].1.to_f64_vec(), c.feeds[1].1.to_f64_vec());
        let bound_of = |s: f64| beta(k) * s;
        for sms in [132, 2] {
            let mut dev = device_session(&c.g, sms, precision);
            let got = dev.run(&step, &c.feeds).expect("device step")[0].to_f64_vec();
            let (mut worst, mut margin) = (0.0f64, f64::INFINITY);
            for i in 0..m {
                for j in 0..n {
                    let mut sums = [0.0f64; 4];
                    for kk in 0..k {
                        let (x, y) = (av[i * k + kk] as f32, bv[kk * n + j] as f32);
                        let even = f64::from(format.round(x)) * f64::from(format.round(y));
                        sums[0] += even;
                        sums[1] += ties_away(format, x) * ties_away(format, y);
                        sums[2] += truncated(format, x) * truncated(format, y);
                        sums[3] += f64::from(x) * f64::from(y);
                    }
                    // Positive operands: S is the nearest-even sum itself.
                    let (g, bound) = (got[i * n + j], bound_of(sums[0]));
                    let err = (g - sums[0]).abs();
                    assert!(
                        err <= bound,
                        "{precision} [{i},{j}] on {sms} SMs: {g} vs Σ of nearest-even rounded \
                         products {}: {err:e} > β·S = {bound:e}",
                        sums[0]
                    );
                    worst = worst.max(err / bound);
                    for (name, other) in [
                        ("ties-away (rna)", sums[1]),
                        ("truncated (rz)", sums[2]),
                        ("unrounded f32", sums[3]),
                    ] {
                        let off = (g - other).abs();
                        assert!(
                            off > 4.0 * bound,
                            "{precision} [{i},{j}] on {sms} SMs: {g} is within 4·β·S of the sum \
                             of {name} operands {other}: the kernel did not round to nearest even"
                        );
                        margin = margin.min(off / bound);
                    }
                }
            }
            eprintln!(
                "{precision} on {sms} SMs: |err| ≤ {worst:.3e}·β·S from the nearest-even sum; \
                 ≥ {margin:.0}·β·S from every other rounding"
            );
        }
    }
}

#[test]
fn every_gemm_of_a_half_program_rounds_and_nothing_else_changes() {
    let tg = cuda_common::convnet();
    let lower = |p| towerpack::lower::lower(&tg.graph, &tg.step, 4, &lowering(p)).expect("lower");
    let tf32 = lower(Precision::Tf32);
    for (precision, _, define) in HALVES {
        let half = lower(precision);
        assert_eq!(tf32.kernels.len(), half.kernels.len());
        let mut gemms = 0;
        for i in 0..tf32.kernels.len() {
            let (a, b) = (
                render::render_kernel(&tf32, i).expect("render"),
                render::render_kernel(&half, i).expect("render"),
            );
            let (KernelPlan::Launch(a), KernelPlan::Launch(b)) = (a, b) else {
                continue;
            };
            assert!(!a.generated.contains("TP_ROUND"));
            if a.generated.contains("#define TP_SPLIT_K") {
                gemms += 1;
                // The same tensor-core launch as TF32, rounding to the 16-bit format instead.
                assert!(b.generated.contains("#define TP_TF32 1"), "{}", b.generated);
                assert!(b.generated.contains(define), "{}", b.generated);
                assert_eq!(a.launch, b.launch, "kernel {i}");
            } else {
                assert_eq!(a, b, "kernel {i} is no GEMM and renders the same");
            }
        }
        assert!(gemms >= 6, "{gemms}");
        // Without tensor cores the GEMMs take the SIMT tiles and still round.
        let simt = Target {
            tensor_cores: false,
            ..Target::default()
        };
        for i in 0..half.kernels.len() {
            if let KernelPlan::Launch(r) = render::render_kernel_for(&half, i, &simt).expect("r")
                && r.generated.contains("#define TP_SPLIT_K")
            {
                assert!(!r.generated.contains("TP_TF32"), "{}", r.generated);
                assert!(r.generated.contains(define), "{}", r.generated);
            }
        }
    }
}

#[test]
fn a_small_convnet_with_batch_norm_trains_in_bf16_on_the_device_like_the_cpu() {
    let tg = cuda_common::convnet();
    let batch = 4;
    let precision = Precision::Bf16;
    let mut cpu = cpu_session(&tg.graph, precision);
    let mut dev = device_session(&tg.graph, 4, precision);
    cpu.initialize_variables(7).expect("init");
    dev.initialize_variables(7).expect("init");
    let vars: Vec<_> = tg
        .graph
        .variable_ids()
        .map(|(id, d)| (id, d.name.clone()))
        .collect();
    let (mut worst_var, mut worst_loss) = (0.0f64, 0.0f64);
    for step in 0..3 {
        // Each step starts from the CPU's variables (batch norm over 4 images makes a step
        // chaotic: compare one step at a time).
        for (id, _) in &vars {
            let v = cpu.read_variable(*id).expect("read");
            dev.write_variable(*id, &v).expect("write");
        }
        let feeds = cuda_common::feeds(&tg, batch, 100 + step);
        let want = cpu.run(&tg.step, &feeds).expect("cpu step");
        let got = dev.run(&tg.step, &feeds).expect("device step");
        let (lw, lg) = (want[0].to_f64_vec()[0], got[0].to_f64_vec()[0]);
        let loss_err = (lw - lg).abs() / lw.abs().max(1e-3);
        worst_loss = worst_loss.max(loss_err);
        assert!(loss_err <= 1e-2, "step {step}: loss {lg} vs cpu {lw}");
        for (id, name) in &vars {
            let (x, y) = (
                dev.read_variable(*id).expect("read").to_f64_vec(),
                cpu.read_variable(*id).expect("read").to_f64_vec(),
            );
            let scale = y.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                let e = (p - q).abs() / scale;
                worst_var = worst_var.max(e);
                assert!(e <= 2e-2, "step {step}: {name}[{i}]: bf16 {p} vs cpu {q}");
            }
        }
    }
    eprintln!(
        "3 bf16 steps: worst variable error {worst_var:.3e}, worst loss error {worst_loss:.3e}"
    );
}

#[test]
fn train_config_precision_bf16_reaches_the_device_through_the_trainer() {
    cuda_common::require_nvrtc();
    let bf16 = variables(&trained_mlp(cuda_common::backend(1), Precision::Bf16));
    let fp32 = variables(&trained_mlp(cuda_common::backend(1), Precision::Fp32));
    let cpu = variables(&trained_mlp(
        BackendChoice::Cpu { threads: 2 },
        Precision::Bf16,
    ));
    for ((name, b), (_, c)) in bf16.iter().zip(&cpu) {
        assert_like_the_cpu("bf16", name, b, c);
    }
    assert!(
        bf16 != fp32,
        "TrainConfig::precision(Bf16) changed nothing on the device"
    );
}

/// fp16 through the trainer adds the dynamic loss scale: every gradient checked by one join and
/// one count, the updates gated on the verdict. The device runs those kernels and trains like
/// the CPU in fp16, and keeps the same scale (no overflow here: the scale stays 2¹⁶).
#[test]
fn train_config_precision_fp16_with_its_loss_scale_trains_on_the_device_like_the_cpu() {
    use towerpack::optim::LOSS_SCALE;
    cuda_common::require_nvrtc();
    let dev = variables(&trained_mlp(cuda_common::backend(1), Precision::Fp16));
    let cpu = variables(&trained_mlp(
        BackendChoice::Cpu { threads: 2 },
        Precision::Fp16,
    ));
    let mut scale_seen = false;
    for ((name, d), (_, c)) in dev.iter().zip(&cpu) {
        if name == LOSS_SCALE {
            assert_eq!(d, c, "the loss scale");
            assert_eq!(c, &[65536.0], "no step was skipped");
            scale_seen = true;
        } else {
            assert_like_the_cpu("fp16", name, d, c);
        }
    }
    assert!(scale_seen, "an fp16 run has a loss scale variable");
}

#[test]
fn every_tile_simt_and_tensor_core_rounds_its_operands_and_multiplies_within_the_bound() {
    use towerpack::backend::Step;
    use towerpack::backend::cuda::nvrtc::{Arch, Compiler};
    use towerpack::backend::cuda::render::AddressOf;
    use towerpack::backend::cuda::render::launch::TILES;
    use towerpack::lower::BufferId;
    use towerpack_ptx::{Device, DevicePtr, KernelArgs, LaunchConfig};

    struct Addresses(std::collections::HashMap<BufferId, u64>, u64);
    impl AddressOf for Addresses {
        fn buffer(&self, b: BufferId) -> u64 {
            self.0[&b]
        }
        fn status(&self) -> u64 {
            0
        }
        fn workspace(&self) -> u64 {
            self.1
        }
    }
    cuda_common::require_nvrtc();
    let compiler = Compiler::new(None).expect("NVRTC");
    let dev = Device::new(0);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut failures = Vec::new();
    let mut table = String::from(
        "format | tile bm x bn | core | m x n x k (split) | sm_80 regs, sm_90 regs | max|err|/S\n",
    );
    let mut runs = (0, 0);
    // The second shape's long K splits on the default target (132 SMs), and its operands are
    // transposed: the first shape's tensor-core stages are A line-major (rows of A along k,
    // plain ldmatrix) and B k-major (ldmatrix .trans), the second's the other way round.
    for (shape, (m, n, k, transposed)) in
        [(100usize, 70usize, 40usize, false), (64, 36, 1000, true)]
            .into_iter()
            .enumerate()
    {
        let mut g = Graph::new();
        let input = |g: &mut Graph, name: &str, ty| {
            let op = Op::Input {
                name: name.into(),
                ty,
            };
            Value::first(g.add_node(name, op, &[]).expect("input"))
        };
        let (a_shape, b_shape) = if transposed {
            (Shape::fixed(&[k, m]), Shape::fixed(&[n, k]))
        } else {
            (Shape::batched(&[k]), Shape::fixed(&[k, n]))
        };
        let a = input(&mut g, "a", TensorType::f32(a_shape));
        let b = input(&mut g, "b", TensorType::f32(b_shape));
        let product = matmul(transposed, transposed);
        let c = Value::first(g.add_node("c", product, &[a, b]).expect("mm"));
        let step = Step::new(vec![c], Vec::new());
        let av: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let bv: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0..1.0)).collect();
        // A[r][j] and B[j][col] in either layout.
        let a_at = |r: usize, j: usize| {
            if transposed {
                av[j * m + r]
            } else {
                av[r * k + j]
            }
        };
        let b_at = |j: usize, col: usize| {
            if transposed {
                bv[col * k + j]
            } else {
                bv[j * n + col]
            }
        };
        for (precision, format, define) in HALVES {
            let p = towerpack::lower::lower(&g, &step, m, &lowering(precision)).expect("lower");
            let index = p
                .kernels
                .iter()
                .position(|k| matches!(k.kind, towerpack::lower::KernelKind::MatMul(..)))
                .expect("a matmul kernel");
            let kernel = &p.kernels[index];
            // The exact sums of the rounded products, and S.
            let (want, s): (Vec<f64>, Vec<f64>) = (0..m * n)
                .map(|i| {
                    let (r, col) = (i / n, i % n);
                    (0..k)
                        .map(|j| {
                            f64::from(format.round(a_at(r, j)))
                                * f64::from(format.round(b_at(j, col)))
                        })
                        .fold((0.0, 0.0), |(w, s), x| (w + x, s + x.abs()))
                })
                .unzip();
            for tile in TILES {
                for tensor_cores in [false, true] {
                    if tensor_cores && tile.tensor_warps().is_none() {
                        continue;
                    }
                    let target = Target {
                        tile: Some(tile),
                        tensor_cores,
                        ..Target::default()
                    };
                    let KernelPlan::Launch(r) =
                        render::render_kernel_for(&p, index, &target).expect("render")
                    else {
                        panic!("a launch")
                    };
                    assert!(r.generated.contains(define), "{}", r.generated);
                    assert_eq!(
                        r.generated.contains("#define TP_TF32 1"),
                        tensor_cores,
                        "{tile:?}"
                    );
                    assert!(
                        r.generated
                            .contains(&format!("#define TP_BM ((int){})", tile.bm))
                    );
                    let split = r
                        .generated
                        .lines()
                        .find_map(|l| l.strip_prefix("#define TP_SPLIT_K "))
                        .unwrap_or("?")
                        .to_string();
                    let source = r.source();
                    // ptxas on the tensor-core tiles, whose fragment loop now rounds (registers).
                    let mut cells = Vec::new();
                    if tensor_cores && shape == 0 {
                        for arch in [Arch(80), Arch(90)] {
                            let ptx = compiler
                                .compile("tile", &source, arch)
                                .unwrap_or_else(|e| panic!("{e}"));
                            let rep = cuda_common::assemble(&ptx, arch);
                            if rep.spilled() > 0 {
                                failures.push(format!(
                                    "{precision} {tile:?} on {}: {} B spilled",
                                    arch.sm(),
                                    rep.spilled()
                                ));
                            }
                            cells.push(rep.registers.to_string());
                        }
                    }
                    let ptx = compiler
                        .compile("tile", &source, Arch::EMULATED)
                        .unwrap_or_else(|e| panic!("{e}"));
                    // The tensor-core tiles multiply natively in the 16-bit format: operands
                    // rounded by cvt.rn into 16-bit stages, fragments read by ldmatrix (A's
                    // .trans where A is k-major, B's where B is), m16n8k16 mma; no TF32 and
                    // no cp.async on the way.
                    if tensor_cores {
                        let (mma, round) = match format {
                            HalfFormat::Bf16 => (
                                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                                "cvt.rn.bf16",
                            ),
                            HalfFormat::F16 => (
                                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                                "cvt.rn.f16",
                            ),
                        };
                        let ldmatrix = if transposed {
                            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
                        } else {
                            "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"
                        };
                        let plain = if transposed {
                            "ldmatrix.sync.aligned.m8n8.x2.shared.b16"
                        } else {
                            "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
                        };
                        let present = [mma, round, ldmatrix, plain]
                            .iter()
                            .all(|i| ptx.contains(i));
                        if !present || ptx.contains("tf32") || ptx.contains("cp.async") {
                            failures.push(format!(
                                "{precision} {tile:?}: the PTX lacks {mma}, {round}, \
                                 {ldmatrix} or {plain}, or has tf32 or cp.async"
                            ));
                        }
                    }
                    let module = dev.load_module(&ptx).expect("load");
                    let mut at = std::collections::HashMap::new();
                    let upload = |values: &[f32]| {
                        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                        let ptr = dev.alloc(bytes.len().max(4)).expect("alloc");
                        dev.copy_htod(ptr, &bytes).expect("upload");
                        ptr.0
                    };
                    at.insert(kernel.inputs[0].buffer, upload(&av));
                    at.insert(kernel.inputs[1].buffer, upload(&bv));
                    at.insert(kernel.outputs[0], upload(&vec![f32::NAN; m * n]));
                    let ws = dev.alloc(r.workspace_bytes.max(4)).expect("workspace").0;
                    let packed = r.params.pack(&Addresses(at.clone(), ws));
                    let cfg = LaunchConfig {
                        grid: r.launch.grid,
                        block: r.launch.block,
                        shared_bytes: 0,
                    };
                    dev.launch(&module, "tp_matmul", cfg, KernelArgs::Packed(&packed))
                        .expect("launch");
                    let mut bytes = vec![0u8; m * n * 4];
                    dev.copy_dtoh(&mut bytes, DevicePtr(at[&kernel.outputs[0]]))
                        .expect("read back");
                    let mut worst = 0.0f64;
                    for (i, ch) in bytes.chunks_exact(4).enumerate() {
                        let got = f64::from(f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]));
                        let err = (got - want[i]).abs();
                        if err.is_nan() || err > beta(k) * s[i] {
                            failures.push(format!(
                                "{precision} {tile:?} tensor cores {tensor_cores} {m}x{n}x{k} \
                                 [{i}]: {got} vs Σ rounded products {}",
                                want[i]
                            ));
                            break;
                        }
                        worst = worst.max(err / s[i]);
                    }
                    if tensor_cores {
                        runs.1 += 1;
                    } else {
                        runs.0 += 1;
                    }
                    table.push_str(&format!(
                        "{format} | {}x{} | {} | {m}x{n}x{k} ({split}) | {} | {worst:.2e} \
                         (β {:.2e})\n",
                        tile.bm,
                        tile.bn,
                        if tensor_cores { "tensor" } else { "simt" },
                        if cells.is_empty() {
                            "-".to_string()
                        } else {
                            cells.join(", ")
                        },
                        beta(k)
                    ));
                }
            }
        }
    }
    eprintln!("{table}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        runs.0,
        2 * 2 * TILES.len(),
        "every SIMT tile, both formats, both shapes"
    );
    assert!(runs.1 >= 2 * 2 * 3, "tensor-core tiles: {}", runs.1);
}

#[test]
fn edge_values_round_on_the_device_exactly_as_on_the_cpu() {
    // K = 1: every output is one product of rounded operands, exact in f32 on both backends,
    // so the device must give the CPU's value exactly. The operands probe each format's edges:
    // ties (to even), f16 overflow (65520 is halfway to 65536: infinite; 65519 is 65504),
    // f16 subnormals (2⁻²⁵ is a tie to 0, 3·2⁻²⁶ rounds up to 2⁻²⁴, 10⁻⁶ keeps 4 bits), bf16
    // overflow (3.4·10³⁸ is past bf16's largest finite), signed zero, an f32 subnormal.
    let a_values: [f32; 12] = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        70_000.0,
        65_520.0,
        65_519.0,
        2f32.powi(-25),
        3.0 * 2f32.powi(-26),
        1e-6,
        3.4e38,
        -0.0,
    ];
    let b_values: [f32; 5] = [1.0, -1.0, 0.5, 1.0 + 2f32.powi(-9), f32::from_bits(1)];
    for (precision, format, _) in HALVES {
        let mut c = Case::new(7, 1);
        let mut next_a = a_values.iter().copied().cycle();
        let a = c.input_with(&[a_values.len(), 1], move |_| next_a.next().expect("cycle"));
        let mut next_b = b_values.iter().copied().cycle();
        let b = c.input_with(&[1, b_values.len()], move |_| next_b.next().expect("cycle"));
        c.gemm("outer", matmul(false, false), &[a, b], 1);
        let step = c.step();
        let want = cpu_session(&c.g, precision)
            .run(&step, &c.feeds)
            .expect("cpu step")[0]
            .to_f64_vec();
        let got = device_session(&c.g, 132, precision)
            .run(&step, &c.feeds)
            .expect("device step")[0]
            .to_f64_vec();
        let mut infinite = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (x, y) = (a_values[i / b_values.len()], b_values[i % b_values.len()]);
            let exact = f64::from(format.round(x)) * f64::from(format.round(y));
            assert!(
                g == w || (g.is_nan() && w.is_nan()),
                "{precision}: {x:e}·{y:e}: device {g:e}, cpu {w:e}"
            );
            assert!(
                g == &exact || (g.is_nan() && exact.is_nan()),
                "{precision}: {x:e}·{y:e}: device {g:e}, product of rounded operands {exact:e}"
            );
            infinite += usize::from(g.is_infinite());
        }
        // Rows that overflow, times the 4 nonzero b (the f32 subnormal rounds to 0, and
        // infinity times 0 is NaN): f16 70000, 65520 and 3.4e38; bf16 3.4e38.
        let overflowing = match format {
            HalfFormat::F16 => 3 * 4,
            HalfFormat::Bf16 => 4,
        };
        assert_eq!(infinite, overflowing, "{precision}: infinite products");
    }
}

/// The issue's check: the first 20 bf16 training steps of ResNet-20 at batch 2 on the emulated
/// device against the CPU backend's, each step from the CPU's variables.
///
/// A bf16 step of a batch-normalized net at batch 2 is chaotic under f32 rounding: an operand
/// one f32 ulp off can round to the other bf16 neighbour, and the CPU backend *itself*, with
/// every batch-norm γ nudged by one ulp, moves its whole update vector by 13% in norm (cosine
/// 0.991) in one step (measured with this model, seed and batch). So the step is compared as
/// such a perturbation would be: the loss (the forward pass, where a flip moves less) within
/// 5e-3 relative, and the update of all variables together within cosine 0.95 of the CPU's.
/// Measured over the 20 steps (2026-11-29): worst loss difference 1.6e-3, worst update cosine
/// 0.972, with activations stored in bf16 on both backends (more values rounded to bf16, so
/// more places where an f32 ulp of difference becomes a bf16 one) and the gradients read as
/// `dy` in bf16 on the device (0.972 without them too); 4.6e-4 and 0.986 with activations in
/// f32 on both (`TOWERPACK_CUDA_HALF_ACTIVATIONS=0`, which both sessions' lowering reads).
#[test]
fn resnet20_first_20_bf16_steps_match_the_cpu_step_by_step() {
    let tg = cuda_common::resnet20();
    let (batch, precision) = (2, Precision::Bf16);
    let mut cpu = cpu_session(&tg.graph, precision);
    let mut dev = device_session(&tg.graph, 4, precision);
    cpu.initialize_variables(11).expect("init");
    let ids: Vec<_> = tg.graph.variable_ids().map(|(id, _)| id).collect();
    let (mut worst_cosine, mut worst_loss) = (1.0f64, 0.0f64);
    for step in 0..20 {
        let mut before = Vec::new();
        for &id in &ids {
            let v = cpu.read_variable(id).expect("read");
            dev.write_variable(id, &v).expect("write");
            before.extend(v.to_f64_vec());
        }
        let feeds = cuda_common::feeds(&tg, batch, 500 + step);
        let want = cpu.run(&tg.step, &feeds).expect("cpu step");
        let got = dev.run(&tg.step, &feeds).expect("device step");
        let (lw, lg) = (want[0].to_f64_vec()[0], got[0].to_f64_vec()[0]);
        let loss_err = (lw - lg).abs() / lw.abs().max(1e-3);
        worst_loss = worst_loss.max(loss_err);
        assert!(loss_err <= 5e-3, "step {step}: loss {lg} vs cpu {lw}");
        let update = |s: &mut dyn Session| -> Vec<f64> {
            let after = ids
                .iter()
                .flat_map(|&id| s.read_variable(id).expect("read").to_f64_vec());
            after.zip(&before).map(|(a, b)| a - b).collect()
        };
        let (u_cpu, u_dev) = (update(&mut cpu), update(&mut dev));
        let dot: f64 = u_cpu.iter().zip(&u_dev).map(|(a, b)| a * b).sum();
        let norm = |u: &[f64]| u.iter().map(|x| x * x).sum::<f64>().sqrt();
        let cosine = dot / (norm(&u_cpu) * norm(&u_dev));
        worst_cosine = worst_cosine.min(cosine);
        assert!(cosine >= 0.95, "step {step}: update cosine {cosine}");
    }
    eprintln!(
        "ResNet-20, 20 bf16 steps: worst loss error {worst_loss:.3e}, worst update cosine \
         {worst_cosine:.6}"
    );
}
