//! TF32 precision (`Precision::Tf32`): matrix products and the three implicit-GEMM convolutions
//! on the tensor-core variant of the GEMM core (`kernels/gemm_core.cuh`, `TP_TF32`), on the
//! emulated device (or the GPU: `TOWERPACK_TEST_CUDA=gpu`) against the CPU backend's f32.
//!
//! ## The bound
//!
//! An output is `c = Σₖ aₖ·bₖ` over K terms. TF32 keeps 10 explicit mantissa bits and
//! `cvt.rna.tf32.f32` rounds to nearest, so an operand's relative error is at most
//! `u = 2⁻¹¹`, and a product of two rounded operands is off by at most
//! `(2u + u²)·|aₖbₖ| ≤ 1.0005·2⁻¹⁰·|aₖbₖ|`. Summed over K: `(2u + u²)·S` with
//! `S = Σₖ |aₖ·bₖ|`. Then the accumulations: the tensor cores accumulate in f32 — the emulated
//! device rounds once per `mma` (every 8 products, exactly rounded; `ptx/src/exec/tensor.rs`),
//! a GPU at most `(K + 1)·2⁻²³·S` (a sequential f32 sum's bound) — split-K adds one rounding
//! per partial combined (fewer than K/16 + 2√K), and the CPU's own f32 sum is off by at most
//! `K·2⁻²⁴·S`. Every one of these is at most `4K·2⁻²⁴·S` together, so
//!
//! ```text
//! |tf32 on the device − f32 on the CPU|  ≤  β(K)·S,   β(K) = 1.0005·2⁻¹⁰ + (4K + 8)·2⁻²⁴
//! ```
//!
//! per output element. `S` is computed on the CPU as the same GEMM of `|a|` and `|b|` (in the
//! same graph), and scaled by 1.001 for its own f32 rounding. The worst case is far above what
//! random inputs give (errors of random sign cancel), so the tests print the measured
//! `max |err| / S` next to `β`.
//!
//! ## That the kernels really run in TF32
//!
//! A product of positive operands whose low 13 bits are exactly half a TF32 ulp (so
//! `cvt.rna` rounds every one of them up) must equal the f64 sum of the TF32-rounded products
//! within the device's accumulation error alone (`(K/4 + 4)·2⁻²⁴·S`), and must differ from the
//! exact f32 products' sum and from truncated (`rz`) operands' sum by more than that, in every
//! element: an f32 kernel, or one rounding differently, fails.
//!
//! ## Training
//!
//! Three Momentum steps of the small convnet (two 3×3 convolutions with batch norm, max
//! pooling, a dense layer) in TF32 on the emulated device against the same steps on the CPU
//! (f32): after each step every variable is within `2·10⁻²` of the CPU's (relative to the
//! variable's largest magnitude) and the losses within `10⁻²` relative. The bound is empirical
//! and loose: batch norm over a batch of 4 amplifies per-product errors of ~2⁻¹¹ in ways the
//! per-GEMM bound above does not follow through a step; the test guards against gross errors
//! (a wrong fragment, a missing rounding on one side), the GEMM tests against subtle ones.
//!
//! Through the trainer: `TrainConfig::precision(Tf32)` with the CUDA backend trains an MLP to
//! variables other than FP32's on the same device, and within `10⁻²` of the CPU's.
//!
//! Every emulated result is also compared bit for bit with a second run on a fresh device
//! (CTAs run on several host threads, so the combining block of a split changes between runs).
//!
//! And a guard of the H100's measurement: the PTX of ResNet-20's TF32 convolutions copies a
//! vector of 4 operand elements as one 16-byte `cp.async`, never as four 4-byte ones.

use crate::cuda_common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::Session;
use towerpack::backend::cuda::render::{self, KernelPlan, Target};
use towerpack::ir::*;
use towerpack::lower::{Precision, Program};

use crate::gemm_case::{
    Case, assert_bitwise, assert_windows_bitwise, conv_attrs, convolution_cases, cpu_session,
    device_session, device_session_with, filter_window_cases, filter_window_launches, lowering,
    matmul, matrix_product_cases, quad_launches, split_window_convolution_cases,
    split_window_launches, wide_convolution_cases, window_launches,
};

/// 1.0005·2⁻¹⁰ + (4K + 8)·2⁻²⁴: see the module docs.
fn beta(k: usize) -> f64 {
    1.0005 * 2f64.powi(-10) + (4 * k + 8) as f64 * 2f64.powi(-24)
}

/// The GEMM launches of `program` as rendered for `multiprocessors` SMs: (kind, generated).
fn gemm_launches(program: &Program, multiprocessors: u32) -> Vec<(String, String)> {
    gemm_launches_with(program, multiprocessors, true)
}

/// [`gemm_launches`] with convolution windows on or off (`Target::windows`).
fn gemm_launches_with(
    program: &Program,
    multiprocessors: u32,
    windows: bool,
) -> Vec<(String, String)> {
    let target = Target {
        windows,
        ..Target::with_multiprocessors(multiprocessors)
    };
    (0..program.kernels.len())
        .filter_map(|i| match render::render_kernel_for(program, i, &target) {
            Ok(KernelPlan::Launch(r)) => Some((program.kernels[i].kind.name().to_string(), r)),
            Ok(_) => None,
            Err(e) => panic!("render k{i}: {e}"),
        })
        .filter(|(_, r)| r.generated.contains("#define TP_SPLIT_K"))
        .map(|(k, r)| (k, r.generated))
        .collect()
}

/// Runs `c` in TF32 on the device (twice, on fresh devices: bitwise equal) and in f32 on the
/// CPU; checks every GEMM element against `β(K)·S` and returns the worst `|err| / S` over
/// `β(K)` per GEMM. Also checks that every GEMM launch took the tensor-core core.
fn check(c: &Case, multiprocessors: u32) -> Vec<(String, usize, f64, f64)> {
    check_with(c, multiprocessors, true)
}

/// [`check`] with convolution windows on or off (`CudaOptions::conv_windows`).
fn check_with(c: &Case, multiprocessors: u32, windows: bool) -> Vec<(String, usize, f64, f64)> {
    let step = c.step();
    let want = cpu_session(&c.g, Precision::Fp32)
        .run(&step, &c.feeds)
        .expect("cpu step");
    let mut dev = device_session_with(&c.g, multiprocessors, Precision::Tf32, windows);
    let got = dev.run(&step, &c.feeds).expect("device step");
    let program = dev.program(&step, c.batch).expect("program").clone();
    assert_eq!(program.precision, Precision::Tf32);
    let launches = gemm_launches_with(&program, multiprocessors, windows);
    assert!(!launches.is_empty());
    for (kind, generated) in &launches {
        assert!(
            generated.contains("#define TP_TF32 1"),
            "{kind} without the tensor-core core:\n{generated}"
        );
    }
    let again = device_session_with(&c.g, multiprocessors, Precision::Tf32, windows)
        .run(&step, &c.feeds)
        .expect("device step");
    assert_bitwise(&got, &again, got.len(), "two runs");
    let mut report = Vec::new();
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
                "{what}[{i}]: tf32 {g} vs f32 {w}: error {err:e} > β(K={k})·S = {bound:e}"
            );
            if *s > 0.0 {
                worst = worst.max(err / s);
            }
        }
        eprintln!(
            "{what}: K = {k}, max |err|/S = {worst:.3e}, β(K) = {b:.3e} ({:.1}% of the bound)",
            100.0 * worst / b
        );
        report.push((what.clone(), *k, worst, b));
    }
    report
}

#[test]
fn matrix_products_in_tf32_match_the_cpu_within_the_derived_bound() {
    let (c, d) = matrix_product_cases();
    for sms in [132, 4] {
        check(&c, sms);
        check(&d, sms);
    }
}

#[test]
fn the_three_convolutions_in_tf32_match_the_cpu_within_the_derived_bound() {
    let c = convolution_cases();
    for sms in [132, 2] {
        let report = check(&c, sms);
        assert_eq!(report.len(), 15);
    }
}

/// f32 values in [1, 2) whose low 13 bits are exactly half a TF32 ulp: `cvt.rna` rounds each up.
/// The 256-row tiles whose A stage the lanes of a warp fill with traded addresses (4 lanes per
/// line, `kernels/gemm_core.cuh` QUAD; on 4 and 8 SMs, where the 2,048-pixel convolutions
/// split K: on 132 they take smaller tiles) multiply what the CPU multiplies, within the bound.
/// Windows off: with them, these tiles of whole image rows read a window instead.
#[test]
fn convolutions_on_256_row_tiles_load_a_through_traded_addresses_within_the_bound() {
    let c = wide_convolution_cases();
    for sms in [4, 8] {
        assert_eq!(check_with(&c, sms, false).len(), 3);
        let launches = gemm_launches_with(&tf32_program(&c, sms, false), sms, false);
        let generated = || launches.iter().map(|(_, g)| g.as_str());
        assert!(
            quad_launches(generated()) >= 2,
            "on {sms} SMs the forward and input-gradient convolutions should take 256-row tiles \
             with 128-bit loads: {:?}",
            launches.iter().map(|(k, _)| k).collect::<Vec<_>>()
        );
    }
}

/// Convolutions whose row tiles are whole rows of one image read A through a window loaded once
/// per block (`kernels/gemm_core.cuh` tp_window; on 1-3 SMs, where K is not split, and on 4
/// and 8, where each split multiplies its chunk of K from the whole window): within the bound
/// of the CPU, and bitwise what the pipelined core computes (`conv_windows` off). (The case's
/// filter gradient takes windows too, whose partial sums are not the pipelined core's:
/// compared with the CPU only, here and in the next test.)
#[test]
fn convolutions_through_a_window_match_the_cpu_and_the_pipelined_core_bitwise() {
    let c = wide_convolution_cases();
    let mut split = 0;
    for sms in [1, 3, 4, 8] {
        assert_eq!(check(&c, sms).len(), 3);
        let with = gemm_launches(&tf32_program(&c, sms, true), sms);
        let generated = || with.iter().map(|(_, g)| g.as_str());
        assert!(
            window_launches(generated()) >= 2,
            "on {sms} SMs the forward and input-gradient convolutions should read a window"
        );
        split += split_window_launches(generated());
        // The filter gradient and its S.
        assert_eq!(filter_window_launches(generated()), 2, "on {sms} SMs");
        // The forward and input-gradient GEMMs and their S: the first four fetches.
        let what = format!("on {sms} SMs: the window and the pipelined core");
        assert_windows_bitwise(&c, sms, Precision::Tf32, Some(4), &what);
    }
    assert!(split >= 2, "on 4 and 8 SMs some windows should split K");
}

/// 32-channel convolutions (ResNet-20's second stage in small) read A through windows with K
/// split in chunks that start in the middle of a tap: bitwise the pipelined core's partial sums
/// and combine, and within the bound of the CPU, on every device size that splits them.
#[test]
fn windows_with_k_split_mid_tap_match_the_pipelined_core_bitwise() {
    let c = split_window_convolution_cases();
    let mut split = 0;
    for sms in [2, 4, 8, 132] {
        assert_eq!(check(&c, sms).len(), 2);
        let with = gemm_launches(&tf32_program(&c, sms, true), sms);
        split += split_window_launches(with.iter().map(|(_, g)| g.as_str()));
        let what = format!("on {sms} SMs: the split window and the pipelined core");
        assert_windows_bitwise(&c, sms, Precision::Tf32, None, &what);
    }
    assert!(
        split >= 2,
        "some 32-channel windows should split K: {split}"
    );
}

/// Filter gradients with output channels in multiples of 16 read x and dy through windows of
/// whole output rows, every tap from one load (`kernels/conv2d_backprop_filter.cu` TP_FWIN):
/// several channel tiles, an asymmetric padding, one tap, a window that is the whole input,
/// stride 2, 3 and 8 input channels, a 1×1 projection of stride 2; on 132 SMs (a block per
/// window) and 2 (several windows per block, split K). Within the bound of the CPU.
#[test]
fn filter_gradients_through_windows_match_the_cpu_within_the_bound() {
    let c = filter_window_cases();
    for sms in [132, 2] {
        assert_eq!(check(&c, sms).len(), 8);
        let with = gemm_launches(&tf32_program(&c, sms, true), sms);
        assert_eq!(
            filter_window_launches(with.iter().map(|(_, g)| g.as_str())),
            16,
            "on {sms} SMs every filter gradient (and its S) should read windows"
        );
    }
}

/// The TF32 program of `c` as a device of `sms` SMs lowers it.
fn tf32_program(c: &Case, sms: u32, conv_windows: bool) -> Program {
    device_session_with(&c.g, sms, Precision::Tf32, conv_windows)
        .program(&c.step(), c.batch)
        .expect("program")
        .clone()
}

fn halfway(r: &mut ChaCha8Rng) -> f32 {
    f32::from_bits(0x3f80_0000 | (r.random_range(0u32..1024) << 13) | 0x1000)
}

fn tf32_rna(x: f32) -> f64 {
    // Ties away from zero: add half an ulp, then truncate.
    f64::from(f32::from_bits(
        x.to_bits().wrapping_add(0x1000) & 0xffff_e000,
    ))
}

fn tf32_rz(x: f32) -> f64 {
    f64::from(f32::from_bits(x.to_bits() & 0xffff_e000))
}

#[test]
fn a_product_in_tf32_equals_the_sum_of_tf32_rounded_products_and_not_the_f32_one() {
    let (m, n, k) = (20, 24, 256);
    let mut c = Case::new(4, 1);
    let a = c.input_with(&[m, k], halfway);
    let b = c.input_with(&[k, n], halfway);
    c.gemm("matmul", matmul(false, false), &[a, b], k);
    let step = c.step();
    for sms in [132, 2] {
        let mut dev = device_session(&c.g, sms, Precision::Tf32);
        let got = dev.run(&step, &c.feeds).expect("device step")[0].to_f64_vec();
        let (av, bv) = (c.feeds[0].1.to_f64_vec(), c.feeds[1].1.to_f64_vec());
        let mut margin = f64::INFINITY;
        for i in 0..m {
            for j in 0..n {
                let (mut exact, mut rna, mut rz) = (0.0f64, 0.0f64, 0.0f64);
                for kk in 0..k {
                    let (x, y) = (av[i * k + kk] as f32, bv[kk * n + j] as f32);
                    exact += f64::from(x) * f64::from(y);
                    rna += tf32_rna(x) * tf32_rna(y);
                    rz += tf32_rz(x) * tf32_rz(y);
                }
                let g = got[i * n + j];
                // The device's accumulation error alone (the f64 sums are exact: products of
                // 11- and 24-bit significands summed over 256 terms of one binade).
                let bound = (k as f64 / 4.0 + 4.0) * 2f64.powi(-24) * rna;
                assert!(
                    (g - rna).abs() <= bound,
                    "[{i},{j}] on {sms} SMs: {g} vs Σ rna-rounded products {rna}: {:e} > {bound:e}",
                    (g - rna).abs()
                );
                for (name, other) in [("exact f32", exact), ("truncated (rz)", rz)] {
                    assert!(
                        (g - other).abs() > 4.0 * bound,
                        "[{i},{j}] on {sms} SMs: {g} is within 4× the accumulation bound of the \
                         {name} sum {other}: the kernel did not round its operands with rna"
                    );
                }
                margin = margin.min((g - exact).abs() / bound);
            }
        }
        eprintln!("{sms} SMs: |tf32 − exact f32| ≥ {margin:.0}× the accumulation bound");
    }
}

#[test]
fn tf32_means_f32_arithmetic_on_the_cpu_backend() {
    let mut c = Case::new(5, 2);
    let x = c.input(&[7, 6, 8]);
    let filter = c.constant(&[3, 3, 8, 4]);
    c.gemm(
        "conv",
        Op::Conv2d(conv_attrs(1, Padding::Same)),
        &[x, filter],
        72,
    );
    let a = c.input(&[9, 13]);
    let b = c.input(&[13, 5]);
    c.gemm("matmul", matmul(false, false), &[a, b], 13);
    let step = c.step();
    let f32_run = cpu_session(&c.g, Precision::Fp32)
        .run(&step, &c.feeds)
        .expect("cpu");
    let tf32_run = cpu_session(&c.g, Precision::Tf32)
        .run(&step, &c.feeds)
        .expect("cpu");
    for (a, b) in f32_run.iter().zip(&tf32_run) {
        assert!(a.to_le_bytes() == b.to_le_bytes());
    }
}

#[test]
fn fp32_programs_render_as_before_and_tf32_ones_only_change_the_gemms() {
    let tg = cuda_common::convnet();
    let lower = |p| towerpack::lower::lower(&tg.graph, &tg.step, 4, &lowering(p)).expect("lower");
    let (fp32, tf32) = (lower(Precision::Fp32), lower(Precision::Tf32));
    assert_eq!(fp32.kernels.len(), tf32.kernels.len());
    assert!(!fp32.to_string().contains("precision"));
    assert!(tf32.to_string().contains("precision: tf32"));
    let mut gemms = 0;
    for i in 0..fp32.kernels.len() {
        let (a, b) = (
            render::render_kernel(&fp32, i).expect("render"),
            render::render_kernel(&tf32, i).expect("render"),
        );
        let (KernelPlan::Launch(a), KernelPlan::Launch(b)) = (a, b) else {
            continue;
        };
        assert!(!a.generated.contains("TP_TF32"));
        if a.generated.contains("#define TP_SPLIT_K") {
            gemms += 1;
            assert!(b.generated.contains("#define TP_TF32 1"), "{}", b.generated);
        } else {
            assert_eq!(a, b, "kernel {i} is no GEMM and renders the same");
        }
    }
    assert!(gemms >= 6, "{gemms}");
}

#[test]
fn a_small_convnet_with_batch_norm_trains_in_tf32_on_the_device_like_the_cpu() {
    let tg = cuda_common::convnet();
    let batch = 4;
    let mut cpu = cpu_session(&tg.graph, Precision::Fp32);
    let mut dev = device_session(&tg.graph, 4, Precision::Tf32);
    cpu.initialize_variables(7).expect("init");
    dev.initialize_variables(7).expect("init");
    let vars: Vec<_> = tg
        .graph
        .variable_ids()
        .map(|(id, d)| (id, d.name.clone()))
        .collect();
    let mut worst_var = 0.0f64;
    let mut worst_loss = 0.0f64;
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
                assert!(e <= 2e-2, "step {step}: {name}[{i}]: tf32 {p} vs cpu {q}");
            }
        }
    }
    eprintln!("3 steps: worst variable error {worst_var:.3e}, worst loss error {worst_loss:.3e}");
}

#[test]
fn every_tensor_core_tile_assembles_without_spills_and_multiplies_within_the_bound() {
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
        "tile bm x bn (warps) | m x n x k | sm_80 regs, smem | sm_90 regs, smem | max|err|/S\n",
    );
    for (m, n, k) in [(100usize, 70usize, 40usize), (64, 36, 1000)] {
        let mut g = Graph::new();
        let input = |g: &mut Graph, name: &str, ty| {
            let op = Op::Input {
                name: name.into(),
                ty,
            };
            Value::first(g.add_node(name, op, &[]).expect("input"))
        };
        let a = input(&mut g, "a", TensorType::f32(Shape::batched(&[k])));
        let b = input(&mut g, "b", TensorType::f32(Shape::fixed(&[k, n])));
        let c = Value::first(g.add_node("c", matmul(false, false), &[a, b]).expect("mm"));
        let step = Step::new(vec![c], Vec::new());
        let p = towerpack::lower::lower(&g, &step, m, &lowering(Precision::Tf32)).expect("lower");
        let index = p
            .kernels
            .iter()
            .position(|k| matches!(k.kind, towerpack::lower::KernelKind::MatMul(..)))
            .expect("a matmul kernel");
        let kernel = &p.kernels[index];
        let av: Vec<f32> = (0..m * k).map(|_| rng.random_range(-1.0..1.0)).collect();
        let bv: Vec<f32> = (0..k * n).map(|_| rng.random_range(-1.0..1.0)).collect();
        let (want, s): (Vec<f64>, Vec<f64>) = (0..m * n)
            .map(|i| {
                let (r, col) = (i / n, i % n);
                (0..k)
                    .map(|j| f64::from(av[r * k + j]) * f64::from(bv[j * n + col]))
                    .fold((0.0, 0.0), |(w, s), x| (w + x, s + x.abs()))
            })
            .unzip();
        for tile in TILES.into_iter().filter(|t| t.tensor_warps().is_some()) {
            let target = Target {
                tile: Some(tile),
                ..Target::default()
            };
            let KernelPlan::Launch(r) =
                render::render_kernel_for(&p, index, &target).expect("render")
            else {
                panic!("a launch")
            };
            assert!(r.generated.contains("#define TP_TF32 1"));
            assert!(
                r.generated
                    .contains(&format!("#define TP_BM ((int){})", tile.bm))
            );
            let source = r.source();
            let mut cells = Vec::new();
            for arch in [Arch(80), Arch(90)] {
                let ptx = compiler
                    .compile("tile", &source, arch)
                    .unwrap_or_else(|e| panic!("{e}"));
                assert!(ptx.contains("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"));
                let rep = cuda_common::assemble(&ptx, arch);
                if rep.spilled() > 0 {
                    failures.push(format!(
                        "{tile:?} on {}: {} B spilled\n{}",
                        arch.sm(),
                        rep.spilled(),
                        rep.log
                    ));
                    if std::env::var_os("TOWERPACK_DUMP_PTX").is_some() {
                        std::fs::write("/tmp/spilled.ptx", ptx.as_bytes()).expect("dump");
                    }
                }
                cells.push(format!("{}, {} B", rep.registers, rep.shared));
            }
            let ptx = compiler
                .compile("tile", &source, Arch::EMULATED)
                .unwrap_or_else(|e| panic!("{e}"));
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
            let mut results = Vec::new();
            for _ in 0..2 {
                dev.launch(&module, "tp_matmul", cfg, KernelArgs::Packed(&packed))
                    .expect("launch");
                let mut bytes = vec![0u8; m * n * 4];
                dev.copy_dtoh(&mut bytes, DevicePtr(at[&kernel.outputs[0]]))
                    .expect("read back");
                results.push(bytes);
            }
            assert_eq!(results[0], results[1], "{tile:?}: bitwise repeatable");
            let mut worst = 0.0f64;
            for (i, ch) in results[0].chunks_exact(4).enumerate() {
                let got = f64::from(f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]));
                let err = (got - want[i]).abs();
                if err.is_nan() || err > beta(k) * s[i] {
                    failures.push(format!("{tile:?} {m}x{n}x{k} [{i}]: {got} vs {}", want[i]));
                    break;
                }
                worst = worst.max(err / s[i]);
            }
            let (wm, wn) = tile.tensor_warps().expect("a tensor-core tile");
            table.push_str(&format!(
                "{}x{} ({wm}x{wn}) | {m}x{n}x{k} | {} | {worst:.2e} (β {:.2e})\n",
                tile.bm,
                tile.bn,
                cells.join(" | "),
                beta(k)
            ));
        }
    }
    eprintln!("{table}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn train_config_precision_reaches_the_device_through_the_trainer() {
    use crate::trainer_runs::{assert_like_the_cpu, trained_mlp, variables};
    use towerpack::train::BackendChoice;
    cuda_common::require_nvrtc();
    let tf32 = variables(&trained_mlp(cuda_common::backend(1), Precision::Tf32));
    let fp32 = variables(&trained_mlp(cuda_common::backend(1), Precision::Fp32));
    let cpu = variables(&trained_mlp(
        BackendChoice::Cpu { threads: 2 },
        Precision::Tf32,
    ));
    for ((name, t), (_, c)) in tf32.iter().zip(&cpu) {
        assert_like_the_cpu("tf32", name, t, c);
    }
    assert!(
        tf32 != fp32,
        "TrainConfig::precision(Tf32) changed nothing on the device"
    );
}

/// TF32's operand stages take a thread's vector of 4 elements as ONE 16-byte `cp.async`,
/// whichever way it lies (`tp_operand::at`: line-major stages for the operands whose lines run
/// along K, k-major for the others). On an H100 the convolutions' channels-fast operands went
/// into k-major stages as four 4-byte copies each: the L1 was 92% busy and a TF32 step took
/// 1.4x an f32 one (`tests/perf/gpu-h100-tensor-core-layouts-2026-11-27.md`). Checked on the
/// PTX of every distinct tensor-core kernel of ResNet-20's TF32 training step (batch 128) that
/// loads vectors of 4 on both operands: 16-byte copies, and not one 4-byte copy.
#[test]
fn tf32_stages_copy_a_vector_of_four_as_one_16_byte_cp_async() {
    use std::collections::BTreeSet;
    use towerpack::backend::cuda::nvrtc::{Arch, Compiler};
    cuda_common::require_nvrtc();
    let compiler = Compiler::new(None).expect("NVRTC");
    let tg = cuda_common::resnet20();
    let options = towerpack::lower::LowerOptions {
        epilogue_reductions: true,
        ..lowering(Precision::Tf32)
    };
    let p = towerpack::lower::lower(&tg.graph, &tg.step, 128, &options).expect("lower");
    let mut seen = BTreeSet::new();
    let mut kinds = BTreeSet::new();
    for i in 0..p.kernels.len() {
        let KernelPlan::Launch(r) = render::render_kernel(&p, i).expect("render") else {
            continue;
        };
        let vectors = r.generated.contains("#define TP_VEC_A ((int)4)")
            && r.generated.contains("#define TP_VEC_B ((int)4)");
        if !r.generated.contains("#define TP_TF32 1") || !vectors || !seen.insert(r.source()) {
            continue;
        }
        let name = &p.kernels[i].name;
        let ptx = compiler
            .compile(name, &r.source(), Arch::EMULATED)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            ptx.contains("cp.async.cg.shared.global"),
            "k{i} {name}: no 16-byte cp.async"
        );
        assert!(
            !ptx.contains("cp.async.ca.shared.global"),
            "k{i} {name}: a 4-byte cp.async in a kernel whose loads are vectors of 4"
        );
        kinds.insert(p.kernels[i].kind.name());
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["conv2d", "conv2d_backprop_filter", "conv2d_backprop_input"],
        "the three convolutions were checked ({} distinct kernels)",
        seen.len()
    );
}
