//! Convolution prologues (`CudaOptions::conv_prologues` with `LowerOptions::conv_prologues`) on
//! the CUDA backend, on the emulated device (or the GPU: `TOWERPACK_TEST_CUDA=gpu`): a forward
//! convolution and a filter gradient that compute their input `x` as they read it (batch norm's
//! apply and ReLU) instead of an elementwise kernel writing it out, and an input gradient whose
//! epilogue recomputes it for a residual add. The cases are those of the CPU backend's test
//! (`tests/lower/conv_prologues.rs`, built by `tests/prologue_case`): random geometries (1 to 32
//! channels, 3 to 8 pixels a side, strides 1 and 2, `SAME` and `VALID`, 1 or 2 groups, 1×1 to
//! 3×3 filters) and fixed larger ones whose launches take the shared-memory windows
//! (`TP_WINDOW` forward windows of stride 1 and 16k channels, `TP_FWIN` filter-gradient windows
//! of 16k output channels and whole output rows of 64k pixels), each with a random apply. The
//! filter is fed rather than constant (`prologue_case::Filter::Fed`, the same values), as a
//! variable is: under BF16/FP16 a constant filter is folded with its rounding, the forward
//! convolution then cannot round its operands itself, and `x`'s rounding stays an elementwise
//! cast beside the apply, which keeps the apply written out (no prologue at all).
//!
//! Every case runs in FP32, BF16 and FP16 (`Precision`), once with prologues and once without
//! (all else equal), and checks:
//!
//! 1. **The program.** With prologues both convolutions have one
//!    (`KernelKind::prologue`) and read the fed `x` itself: no kernel writes the applied value.
//!    Without, none has one.
//! 2. **Bitwise the written-out program.** The two runs' fetches are bit for bit equal: NVRTC
//!    compiles with `--fmad=false`, so a prologue computes the same f32 values the elementwise
//!    kernel wrote, and the GEMM multiplies the same operands (rounded alike in BF16/FP16) in the
//!    same order; the epilogue's recomputation is the same f32 arithmetic too.
//! 3. **The CPU backend.** Each run against the CPU backend running the same lowering options
//!    (FP32 without Winograd, whose rounding error is ~10× the direct kernels'), per element:
//!
//!    ```text
//!    y, dw:     |device − cpu|  ≤  β(K)·S
//!    residual:  |device − cpu|  ≤  (β(K_y) + 2·u_h)·T·1.01 + (β(K_dx) + 2⁻²³)·S + K_dx·2⁻²⁴
//!    ```
//!
//!    with `β(K) = (4K + 8)·2⁻²⁴` (`emu_half.rs`' bound, which also covers FP32: each side's f32
//!    sum of K products, rounded or exact, is off the exact sum by at most `K·2⁻²⁴·S`, split-K
//!    adds at most `K/16` roundings) and `S` the same GEMM of the operands' absolute values,
//!    computed on the CPU in the same precision (rounding commutes with `|·|`) and scaled by
//!    1.001 for its own rounding. `y` (K = taps × input channels of a group) and `dw` (K = batch ×
//!    output pixels) multiply operands both backends compute alike (the applied value is the
//!    same f32 operations in the same order on both, without FMA contraction; the filter and
//!    `dy` are fed), so only the sums differ. The residual sum `dx + a` is the input gradient of
//!    `y` (K_dx = taps × output channels of a group) plus the applied value, and the two
//!    backends' `y` differ by up to `β(K_y)·S_y`: in BF16/FP16 rounding `y` to the 16-bit format
//!    can then land on neighbouring values, so each rounded operand differs by at most
//!    `β(K_y)·S_y + u_h·(|y_device| + |y_cpu|) ≤ (β(K_y) + 2·u_h)·S_y` (`u_h` the format's unit
//!    roundoff: 2⁻⁸ for BF16, 2⁻¹¹ for FP16, 0 for FP32), weighted by `|w|`: `T` is the input
//!    gradient of `S_y` by `|w|` on the CPU (1.01 for `S_y`'s rounding to 16 bits there), `S`
//!    that of `|y|` plus `|a|` (the add's rounding), and `K_dx·2⁻²⁴` covers FP16's subnormals.
//!    The 2·u_h term is a worst case (every operand on a rounding boundary); the measured
//!    `max |err| / S` and `max |err| / bound` are printed per precision and fetch.
//!
//! The paths: BF16 and FP16 on a device with tensor cores, with convolution windows
//! (`CudaOptions::conv_windows`) and without, and on a device without tensor cores (compute
//! capability 7.5, which the emulated driver reports when told to, `EmulatedDriver::set_arch`:
//! the SIMT tiles, which round their operands too; windows need tensor cores). FP32 multiplies on the SIMT tiles
//! everywhere (no tensor cores, no windows), so it runs once. The emulated devices report a few
//! SMs (4 to 132, per case), which changes the tiles and the splits of K. Which launches the
//! convolutions take (tensor core or SIMT, window or not) is re-rendered from the program with
//! the session's target and printed: every path must run both convolutions with prologues, and
//! the windowed cases must take both windows with them in BF16 and FP16. On a GPU the SIMT path
//! and the SM counts cannot be forced: it runs the tensor-core paths only, on the GPU's SMs.
//!
//! Failures are collected and reported together (case, precision, path, prologues, fetch).

use crate::cuda_common::{self, TestDevice};

#[path = "../prologue_case/mod.rs"]
mod prologue_case;

use prologue_case::{BATCH, Filter, Geometry, PrologueCase};
use std::collections::BTreeMap;
use std::sync::Arc;
use towerpack::backend::Session;
use towerpack::backend::cpu::{CpuOptions, CpuSession, WinogradUse};
use towerpack::backend::cuda::driver::emulated::EmulatedDriver;
use towerpack::backend::cuda::nvrtc::Arch;
use towerpack::backend::cuda::render::{self, KernelPlan, Target};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::ir::*;
use towerpack::lower::{KernelKind, LowerOptions, Precision, Program, lower};
use towerpack::tensor::HostTensor;

/// The precisions every case runs in.
const PRECISIONS: [Precision; 3] = [Precision::Fp32, Precision::Bf16, Precision::Fp16];

/// (4K + 8)·2⁻²⁴: see the module docs.
fn beta(k: usize) -> f64 {
    (4 * k + 8) as f64 * 2f64.powi(-24)
}

/// The unit roundoff of the format GEMM operands are rounded to in `precision` (0: none).
fn operand_roundoff(precision: Precision) -> f64 {
    match precision {
        Precision::Bf16 => 2f64.powi(-8),
        Precision::Fp16 => 2f64.powi(-11),
        Precision::Fp32 | Precision::Tf32 => 0.0,
    }
}

/// How a run's GEMMs multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Path {
    /// A device with tensor cores, convolution windows allowed.
    Windows,
    /// A device with tensor cores, convolution windows off (`CudaOptions::conv_windows`).
    NoWindows,
    /// A device without tensor cores (`EmulatedDriver::set_arch` 7.5): the SIMT tiles.
    Simt,
}

impl Path {
    /// The paths of `precision` on the test device: FP32 has no tensor cores nor windows.
    pub(crate) fn of(precision: Precision) -> Vec<Path> {
        if !precision.tensor_cores() {
            vec![Path::Windows]
        } else if cuda_common::test_device() == TestDevice::Gpu {
            vec![Path::Windows, Path::NoWindows]
        } else {
            vec![Path::Windows, Path::NoWindows, Path::Simt]
        }
    }

    fn name(self, precision: Precision) -> &'static str {
        match (precision.tensor_cores(), self) {
            (false, _) => "simt",
            (true, Path::Windows) => "tensor cores, windows",
            (true, Path::NoWindows) => "tensor cores, no windows",
            (true, Path::Simt) => "simt (no tensor cores)",
        }
    }

    pub(crate) fn windows(self) -> bool {
        self != Path::NoWindows
    }
}

/// The render target `dev` renders its kernels for (`prepared.rs`): its driver's SMs and
/// architecture (tensor cores from 8.0 on), and the session's windows.
pub(crate) fn session_target(dev: &CudaSession, windows: bool) -> Target {
    let driver = dev.driver();
    Target {
        tensor_cores: driver.arch(0).0 >= 80,
        windows,
        ..driver
            .multiprocessors(0)
            .map_or_else(Target::default, Target::with_multiprocessors)
    }
}

/// The CUDA options of a run: prologues on or off (both switches: the session's, off by
/// default, and the lowering's), `precision`, the path's windows, NVRTC's output cached in
/// `cache` (shared by the runs of a test: each source compiles once).
fn cuda_options(
    prologues: bool,
    precision: Precision,
    path: Path,
    cache: &std::path::Path,
) -> CudaOptions {
    CudaOptions {
        lower: LowerOptions {
            conv_prologues: prologues,
            precision,
            ..LowerOptions::default()
        },
        cache_dir: Some(cache.to_path_buf()),
        conv_windows: path.windows(),
        conv_prologues: prologues,
        ..CudaOptions::default()
    }
}

/// A session over `g` on the test device: emulated, one device reporting `sms` SMs, without
/// tensor cores on [`Path::Simt`].
pub(crate) fn device_session(g: &Graph, sms: u32, path: Path, options: CudaOptions) -> CudaSession {
    match cuda_common::test_device() {
        TestDevice::Emulated => {
            let driver = EmulatedDriver::new(1);
            driver.device(0).expect("device 0").set_multiprocessors(sms);
            if path == Path::Simt {
                // Compute capability 7.5: no tensor cores (`prepared.rs` renders for ≥ 8.0).
                driver.set_arch(Arch(75));
            }
            CudaSession::with_driver(g.clone(), Arc::new(driver), options)
                .expect("emulated session")
        }
        TestDevice::Gpu => cuda_common::session(g.clone(), 1, options),
    }
}

/// The CPU backend's fetches of `g`'s `step` lowered with `lower` (no Winograd), less
/// `half_gradients` (the CPU's convolutions read `dy` in f32 only).
fn cpu_run(
    g: &Graph,
    step: &Step,
    feeds: &[towerpack::backend::Feed],
    lower: LowerOptions,
) -> Vec<HostTensor> {
    let options = CpuOptions {
        threads: 2,
        lower: LowerOptions {
            half_gradients: false,
            ..lower
        },
        winograd: WinogradUse::Off,
        ..CpuOptions::default()
    };
    CpuSession::new(g.clone(), options)
        .expect("cpu session")
        .run(step, feeds)
        .expect("cpu step")
}

/// The magnitudes of the bounds of `c`'s fetches (module docs), on the CPU in `lower`'s
/// precision: `S` of `y`, of `dw` and of the residual sum, and `T`.
fn magnitudes(c: &PrologueCase, lower: LowerOptions) -> Vec<HostTensor> {
    let mut g = c.g.clone();
    let mut add = |name: &str, op: Op, ins: &[Value]| {
        let name = g.unique_name(name);
        Value::first(g.add_node(&name, op, ins).expect(&name))
    };
    let abs = Op::Unary(UnaryOp::Abs);
    let (a, w) = (
        add("abs_a", abs.clone(), &[c.applied]),
        add("abs_w", abs.clone(), &[c.filter]),
    );
    let dy = add("abs_dy", abs.clone(), &[c.dy]);
    let y = add("abs_y", abs, &[c.y]);
    let Geometry {
        h,
        w: width,
        k,
        attrs,
        ..
    } = c.geometry;
    let input_grad = Op::Conv2dBackpropInput {
        attrs,
        input_hw: [h, width],
    };
    let s_y = add("s_y", Op::Conv2d(attrs), &[a, w]);
    let filter_grad = Op::Conv2dBackpropFilter {
        attrs,
        filter_hw: [k, k],
    };
    let s_dw = add("s_dw", filter_grad, &[a, dy]);
    let s_dx = add("s_dx", input_grad.clone(), &[y, w]);
    let s_residual = add("s_residual", Op::Binary(BinaryOp::Add), &[s_dx, a]);
    let t = add("t", input_grad, &[s_y, w]);
    let step = Step::new(vec![s_y, s_dw, s_residual, t], Vec::new());
    cpu_run(&g, &step, &c.feeds, lower)
}

/// The worst errors of a (precision, fetch): `max |err| / S`, `max |err| / bound`.
#[derive(Clone, Copy, Default)]
struct Worst {
    of_s: f64,
    of_bound: f64,
}

/// What a test gathers: failures, the worst errors, and the launches the prologue kernels took.
#[derive(Default)]
struct Report {
    failures: Vec<String>,
    worst: BTreeMap<(String, &'static str), Worst>,
    /// (precision, path, prologues, kernel kind, core, window) → launches.
    launches: BTreeMap<String, usize>,
    runs: usize,
    /// Whether a failure printed its program.
    dumped: bool,
}

/// The fetches of a case, in order.
const FETCHES: [&str; 3] = ["y", "dw", "residual"];

/// Checks the program of a case lowered with or without prologues (module docs, 1.).
fn check_program(c: &PrologueCase, program: &Program, prologues: bool) -> Result<(), String> {
    let with = program
        .kernels
        .iter()
        .filter(|k| k.kind.prologue().is_some())
        .count();
    if !prologues {
        return match with {
            0 => Ok(()),
            n => Err(format!("{n} prologues lowered without them")),
        };
    }
    if with != 2 {
        // The autocast pass of BF16/FP16 programs may round x for the convolution in the
        // apply's kernel (a second output, `…/autocast/…`), which then stays a kernel.
        let autocast = program.kernels.iter().any(|k| {
            matches!(k.kind, KernelKind::Elementwise { .. })
                && k.outputs.len() > 1
                && k.name.contains("/autocast/")
        });
        return Err(format!(
            "{with} kernels with a prologue, not 2 (the convolution and its filter gradient){}",
            if autocast {
                "; the apply's elementwise kernel also writes an autocast copy of it, which \
                 keeps it from becoming prologues"
            } else {
                ""
            }
        ));
    }
    let x = program
        .feeds
        .iter()
        .find(|(node, _)| *node == c.x.node)
        .map(|&(_, b)| b)
        .ok_or("x is not fed")?;
    for k in &program.kernels {
        if matches!(
            k.kind,
            KernelKind::Conv2d(..) | KernelKind::Conv2dBackpropFilter(..)
        ) && k.inputs[0].buffer != x
        {
            return Err(format!(
                "`{}` ({}) reads {} rather than the fed x ({x}): the applied value is written out",
                k.name,
                k.kind.name(),
                k.inputs[0].buffer
            ));
        }
    }
    let written = program
        .kernels
        .iter()
        .filter(|k| matches!(k.kind, KernelKind::Elementwise { .. }))
        .count();
    if written > 0 {
        return Err(format!("{written} elementwise kernels remain"));
    }
    Ok(())
}

/// The core (`tensor core` or `simt`) and window (`TP_WINDOW`, `TP_FWIN` or `no window`) kernel
/// `i` of `program` is rendered with on `target`; `None` when it launches nothing.
pub(crate) fn launch_path(
    program: &Program,
    i: usize,
    target: &Target,
) -> Result<Option<(&'static str, &'static str)>, String> {
    let r = match render::render_kernel_for(program, i, target) {
        Ok(KernelPlan::Launch(r)) => r,
        Ok(_) => return Ok(None),
        Err(e) => return Err(format!("render `{}`: {e}", program.kernels[i].name)),
    };
    let core = if r.generated.contains("#define TP_TF32 1") {
        "tensor core"
    } else {
        "simt"
    };
    let window = if r.generated.contains("#define TP_WINDOW 1") {
        "TP_WINDOW"
    } else if r.generated.contains("#define TP_FWIN 1") {
        "TP_FWIN"
    } else {
        "no window"
    };
    Ok(Some((core, window)))
}

/// Records the launches the convolutions of `program` take on `target` (core and window).
fn record_launches(
    program: &Program,
    target: &Target,
    what: &str,
    report: &mut Report,
) -> Result<(), String> {
    for (i, k) in program.kernels.iter().enumerate() {
        if !matches!(
            k.kind,
            KernelKind::Conv2d(..) | KernelKind::Conv2dBackpropFilter(..)
        ) {
            continue;
        }
        let Some((core, window)) = launch_path(program, i, target)? else {
            continue;
        };
        let prologue = if k.kind.prologue().is_some() {
            "prologue"
        } else {
            "no prologue"
        };
        *report
            .launches
            .entry(format!(
                "{what}: {} with {prologue}, {core}, {window}",
                k.kind.name()
            ))
            .or_default() += 1;
    }
    Ok(())
}

/// Runs case `c` (named `name`) on `sms` SMs in every precision and path, with prologues and
/// without, and checks it (module docs); failures go to `report`.
fn check_case(
    name: &str,
    c: &PrologueCase,
    sms: u32,
    cache: &std::path::Path,
    report: &mut Report,
) {
    for precision in PRECISIONS {
        let u_h = operand_roundoff(precision);
        let Geometry {
            h,
            w,
            channels,
            outs,
            k,
            attrs,
        } = c.geometry;
        let groups = attrs.groups.max(1);
        let y_dims = c.g.value_type(c.y).shape.resolve(BATCH);
        let k_y = k * k * channels / groups;
        let k_dw = BATCH * y_dims[1] * y_dims[2];
        let k_dx = k * k * outs / groups;
        let lowering = |prologues| {
            let o = cuda_options(prologues, precision, Path::Windows, cache);
            LowerOptions {
                conv_prologues: prologues,
                ..o.lowering()
            }
        };
        let m = magnitudes(c, lowering(false));
        let m: Vec<Vec<f64>> = m.iter().map(|t| t.to_f64_vec()).collect();
        let want = [true, false].map(|p| cpu_run(&c.g, &c.step, &c.feeds, lowering(p)));
        for path in Path::of(precision) {
            let what = format!(
                "{name} ({h}x{w}x{channels} -> {outs}, {k}x{k} stride {} {:?} {groups} groups, \
                 {sms} SMs) {precision} {}",
                attrs.strides[0],
                attrs.padding,
                path.name(precision)
            );
            let mut runs = Vec::new();
            for prologues in [true, false] {
                let what = format!(
                    "{what} {}",
                    if prologues {
                        "prologues"
                    } else {
                        "no prologues"
                    }
                );
                let options = cuda_options(prologues, precision, path, cache);
                let program = lower(&c.g, &c.step, BATCH, &options.lowering());
                match &program {
                    Ok(p) => {
                        if let Err(e) = check_program(c, p, prologues) {
                            // The program once per test: the failures' programs are alike.
                            let dump = if report.dumped {
                                String::new()
                            } else {
                                format!("\n{p}")
                            };
                            report.dumped = true;
                            report.failures.push(format!("{what}: {e}{dump}"));
                        }
                    }
                    Err(e) => report.failures.push(format!("{what}: lower: {e}")),
                }
                let mut dev = device_session(&c.g, sms, path, options);
                if let Ok(p) = &program {
                    let target = session_target(&dev, path.windows());
                    let label = format!("{precision} {}", path.name(precision));
                    if let Err(e) = record_launches(p, &target, &label, report) {
                        report.failures.push(format!("{what}: {e}"));
                    }
                }
                report.runs += 1;
                let got = match dev.run(&c.step, &c.feeds) {
                    Ok(got) => got,
                    Err(e) => {
                        report.failures.push(format!("{what}: run: {e}"));
                        runs.push(None);
                        continue;
                    }
                };
                let cpu = &want[usize::from(!prologues)];
                for (i, fetch) in FETCHES.iter().enumerate() {
                    let (d, w) = (got[i].to_f64_vec(), cpu[i].to_f64_vec());
                    let worst = report
                        .worst
                        .entry((precision.to_string(), *fetch))
                        .or_default();
                    for (j, (d, w)) in d.iter().zip(&w).enumerate() {
                        let (s, bound) = match i {
                            0 => (m[0][j], beta(k_y) * m[0][j] * 1.001),
                            1 => (m[1][j], beta(k_dw) * m[1][j] * 1.001),
                            _ => (
                                m[2][j],
                                ((beta(k_y) + 2.0 * u_h) * m[3][j] * 1.01
                                    + (beta(k_dx) + 2f64.powi(-23)) * m[2][j]
                                    + k_dx as f64 * 2f64.powi(-24))
                                    * 1.001,
                            ),
                        };
                        let err = (d - w).abs();
                        if err.is_nan() || bound.is_nan() || err > bound {
                            report.failures.push(format!(
                                "{what} fetch {i} ({fetch})[{j}]: device {d} vs cpu {w}: \
                                 |err| {err:e} > bound {bound:e} (S {s:e})"
                            ));
                            break;
                        }
                        if s > 0.0 {
                            worst.of_s = worst.of_s.max(err / s);
                        }
                        if bound > 0.0 {
                            worst.of_bound = worst.of_bound.max(err / bound);
                        }
                    }
                }
                runs.push(Some(got));
            }
            if let [Some(fused), Some(written)] = &runs[..] {
                for (i, fetch) in FETCHES.iter().enumerate() {
                    if fused[i].to_le_bytes() != written[i].to_le_bytes() {
                        let differ = fused[i]
                            .to_f64_vec()
                            .iter()
                            .zip(written[i].to_f64_vec())
                            .filter(|(a, b)| a.to_bits() != b.to_bits())
                            .count();
                        report.failures.push(format!(
                            "{what} fetch {i} ({fetch}): with prologues not bitwise the \
                             written-out program ({differ} of {} elements differ)",
                            fused[i].shape().iter().product::<usize>()
                        ));
                    }
                }
            }
        }
    }
}

/// The launches (as [`record_launches`] names them) every test must run: both convolutions with
/// prologues in every precision and path, on tensor cores where the path has them.
fn prologue_launches() -> Vec<String> {
    let mut launches = Vec::new();
    for precision in PRECISIONS {
        for path in Path::of(precision) {
            let core = if precision.tensor_cores() && path != Path::Simt {
                "tensor core"
            } else {
                "simt"
            };
            for kind in ["conv2d", "conv2d_backprop_filter"] {
                launches.push(format!(
                    "{precision} {}: {kind} with prologue, {core},",
                    path.name(precision)
                ));
            }
        }
    }
    launches
}

/// Prints what a test measured and ran; fails it with every failure, and with every expected
/// launch it did not run.
fn finish(test: &str, report: Report, expected_launches: &[String]) {
    let mut table = format!(
        "{test}: {} device runs\nprecision fetch | max |err|/S | max |err|/bound\n",
        report.runs
    );
    for ((precision, fetch), w) in &report.worst {
        table.push_str(&format!(
            "{precision} {fetch} | {:.3e} | {:.3e}\n",
            w.of_s, w.of_bound
        ));
    }
    table.push_str("convolution launches (re-rendered with the session's target):\n");
    for (launch, n) in &report.launches {
        table.push_str(&format!("  {launch}: {n}\n"));
    }
    eprintln!("{table}");
    let mut failures = report.failures;
    for want in expected_launches {
        if !report.launches.keys().any(|l| l.contains(want)) {
            failures.push(format!("no convolution launch like `{want}`"));
        }
    }
    assert!(
        failures.is_empty(),
        "{test}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Random geometries (`tests/prologue_case`'s [`prologue_case::case`], some of the CPU test's
/// seeds) on 4, 16 and 132 SMs in turn.
#[test]
fn random_prologue_cases_match_the_written_out_program_and_the_cpu() {
    cuda_common::require_nvrtc();
    let cache = tempfile::tempdir().expect("tempdir");
    let mut report = Report::default();
    // The CPU test's first seeds, then some of its 40 with 17 channels (14), two groups (20,
    // 25, 31), 32 channels at stride 2 (33) and 8×8×32 images under a 3×3 filter (39).
    let seeds = [0, 1, 2, 3, 4, 5, 14, 20, 25, 31, 33, 39];
    for (i, seed) in seeds.into_iter().enumerate() {
        let sms = [4, 16, 132][i % 3];
        let c = prologue_case::case_with(seed, None, Filter::Fed);
        check_case(&format!("seed {seed}"), &c, sms, cache.path(), &mut report);
    }
    finish("random cases", report, &prologue_launches());
}

/// Geometries whose launches take the windows on a few SMs: 16 and 32 channels, 8×8 and 16×16
/// images, 3×3 stride 1 `SAME` (both windows), 3×3 stride 2 (filter-gradient windows only),
/// output channels not multiples of 16 (no filter-gradient windows), each with a random apply.
#[test]
fn windowed_prologue_cases_match_the_written_out_program_and_the_cpu() {
    cuda_common::require_nvrtc();
    let cache = tempfile::tempdir().expect("tempdir");
    let attrs = |stride: usize, padding: Padding| Conv2dAttrs {
        strides: [stride, stride],
        padding,
        dilations: [1, 1],
        groups: 1,
    };
    let geometry = |hw: usize, channels: usize, outs: usize, stride: usize| Geometry {
        h: hw,
        w: hw,
        channels,
        outs,
        k: 3,
        attrs: attrs(stride, Padding::Same),
    };
    let mut report = Report::default();
    for (seed, g, sms) in [
        (100, geometry(8, 16, 16, 1), 4),
        (101, geometry(8, 32, 16, 1), 8),
        (102, geometry(16, 16, 32, 1), 4),
        (103, geometry(16, 16, 16, 2), 4),
        (104, geometry(8, 16, 12, 1), 4),
    ] {
        let c = prologue_case::case_with(seed, Some(g), Filter::Fed);
        check_case(&format!("seed {seed}"), &c, sms, cache.path(), &mut report);
    }
    let mut expected = prologue_launches();
    for precision in [Precision::Bf16, Precision::Fp16] {
        let path = Path::Windows.name(precision);
        expected.extend([
            format!("{precision} {path}: conv2d with prologue, tensor core, TP_WINDOW"),
            format!(
                "{precision} {path}: conv2d_backprop_filter with prologue, tensor core, TP_FWIN"
            ),
        ]);
    }
    finish("windowed cases", report, &expected);
}
