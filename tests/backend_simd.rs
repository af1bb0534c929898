//! The SIMD level (`TOWERPACK_SIMD`, `CpuOptions::simd`, `SimdLevel::run`): parsing, capping,
//! and that a forced level is the path that runs — in the kernels called directly on two
//! threads, and in whole training steps of a 2-thread `CpuSession` (conv, pooling, batch norm,
//! softmax, GEMM, fused elementwise and reduction engines, fused updates), whose results must
//! match the reference executor at every level this machine runs.
//!
//! The record of levels that ran (`simd::take_levels_run`) is process-wide, so the tests that
//! read it hold `RECORD` and no other test of this binary runs kernels meanwhile.

mod cpu_kernels_common;
mod model_steps;

use cpu_kernels_common::*;
use model_steps::{TrainGraph, feeds, training_graph};
use std::sync::Mutex;
use towerpack::backend::Session;
use towerpack::backend::cpu::kernels::{
    ChannelEpilogue, Conv2dGeometry, ConvAlgorithm, MatRef, NoEpilogue, Padding2d, conv2d_forward,
    conv2d_forward_with, sgemm, simd,
};
use towerpack::backend::cpu::{CpuOptions, CpuSession, SimdLevel};
use towerpack::backend::reference::ReferenceSession;
use towerpack::models::{CifarResNet, ConvNet};
use towerpack::tensor::HostTensor;

/// Held by the tests that read the process-wide record of levels that ran.
static RECORD: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    RECORD.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn levels_parse_order_and_cap() {
    for level in SimdLevel::ALL {
        assert_eq!(level.name().parse::<SimdLevel>(), Ok(level));
        assert_eq!(level.name().to_uppercase().parse::<SimdLevel>(), Ok(level));
        assert_eq!(level.to_string(), level.name());
    }
    let err = "sse4".parse::<SimdLevel>().unwrap_err().to_string();
    assert!(
        err.contains("\"sse4\"") && err.contains("scalar, avx2, avx512"),
        "{err}"
    );
    assert!(SimdLevel::Scalar < SimdLevel::Avx2 && SimdLevel::Avx2 < SimdLevel::Avx512);
    let available = SimdLevel::available();
    assert_eq!(available.first(), Some(&SimdLevel::Scalar));
    assert_eq!(available.last(), Some(&SimdLevel::max()));
    assert!(SimdLevel::max() <= SimdLevel::detected());
    assert_eq!(SimdLevel::Avx512.capped(), SimdLevel::max());
    // `run` sets the level for its closure only, capped, and restores the previous one.
    let outer = SimdLevel::current();
    SimdLevel::Scalar.run(|| {
        assert_eq!(SimdLevel::current(), SimdLevel::Scalar);
        SimdLevel::Avx512.run(|| assert_eq!(SimdLevel::current(), SimdLevel::max()));
        assert_eq!(SimdLevel::current(), SimdLevel::Scalar);
    });
    assert_eq!(SimdLevel::current(), outer);
}

/// A child process of this test binary with `TOWERPACK_SIMD=value` runs `test` (ignored when
/// run normally, and a no-op without that value), which checks the process's reaction to it.
fn run_child(test: &str, value: &str) {
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--ignored", "--nocapture"])
        .env("TOWERPACK_SIMD", value)
        .output()
        .expect("child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} with TOWERPACK_SIMD={value}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this process runs with `TOWERPACK_SIMD=value` (set by `run_child`).
fn child_of(value: &str) -> bool {
    std::env::var("TOWERPACK_SIMD").as_deref() == Ok(value)
}

#[test]
fn the_environment_variable_caps_the_process_and_a_bad_value_is_an_error() {
    run_child("child_with_avx2_cap", "avx2");
    run_child("child_with_a_bad_value", "avx-512");
}

#[test]
#[ignore = "run by the_environment_variable_caps_the_process_and_a_bad_value_is_an_error"]
fn child_with_avx2_cap() {
    if !child_of("avx2") {
        return;
    }
    assert_eq!(SimdLevel::from_env(), Ok(Some(SimdLevel::Avx2)));
    assert_eq!(SimdLevel::max(), SimdLevel::detected().min(SimdLevel::Avx2));
    assert!(!SimdLevel::available().contains(&SimdLevel::Avx512));
    // A session asking for more runs at the cap.
    let tg = small_convnet();
    let options = CpuOptions {
        simd: Some(SimdLevel::Avx512),
        ..CpuOptions::default()
    };
    let cpu = CpuSession::new(tg.graph, options).expect("session");
    assert_eq!(cpu.simd_level(), SimdLevel::max());
}

#[test]
#[ignore = "run by the_environment_variable_caps_the_process_and_a_bad_value_is_an_error"]
fn child_with_a_bad_value() {
    if !child_of("avx-512") {
        return;
    }
    let err = SimdLevel::from_env().unwrap_err().to_string();
    assert!(
        err.contains("TOWERPACK_SIMD=\"avx-512\"") && err.contains("scalar, avx2, avx512"),
        "{err}"
    );
    let e = CpuSession::new(small_convnet().graph, CpuOptions::default())
        .err()
        .expect("a bad TOWERPACK_SIMD is an error");
    assert!(e.to_string().contains("TOWERPACK_SIMD"), "{e}");
    // Kernels called without a session warn and run at the detected level.
    assert_eq!(SimdLevel::max(), SimdLevel::detected());
}

#[test]
fn kernels_called_at_a_level_run_that_path_on_every_thread() {
    let _record = lock();
    let mut g = Conv2dGeometry::new(4, [16, 16], 16, 16, [3, 3]);
    g.padding = Padding2d::uniform(1);
    let mut r = rng(5);
    let x = random_vec(&mut r, g.input_len());
    let w = random_vec(&mut r, g.filter_len());
    let (m, n, k) = (256, 96, 130);
    let a = random_vec(&mut r, m * k);
    let b = random_vec(&mut r, k * n);
    let bias = random_vec(&mut r, 16);
    let mut outputs = Vec::new();
    for level in SimdLevel::available() {
        simd::take_levels_run();
        let (y, c, tiny) = level.run(|| {
            with_threads(2, || {
                let epilogue = ChannelEpilogue {
                    shift: Some(&bias),
                    relu: true,
                    ..Default::default()
                };
                let mut y = vec![0.0; g.output_len()];
                conv2d_forward(&g, &x, &w, &mut y, &epilogue).expect("conv");
                let mut c = vec![0.0; m * n];
                let (av, bv) = (MatRef::row_major(&a, k), MatRef::row_major(&b, n));
                sgemm(m, n, k, 1.0, av, bv, 0.0, &mut c, n).expect("gemm");
                let mut tiny = vec![0.0; 8 * 10];
                let (av, bv) = (
                    MatRef::row_major(&a[..80], 10),
                    MatRef::row_major(&b[..100], 10),
                );
                sgemm(8, 10, 10, 1.0, av, bv, 0.0, &mut tiny, 10).expect("tiny gemm");
                (y, c, tiny)
            })
        });
        assert_eq!(simd::take_levels_run(), vec![level], "forced {level}");
        let direct = level.run(|| {
            let mut y = vec![0.0; g.output_len()];
            conv2d_forward_with(ConvAlgorithm::Direct, &g, &x, &w, &mut y, &NoEpilogue, None)
                .is_ok()
        });
        assert_eq!(direct, level >= SimdLevel::Avx2, "direct conv at {level}");
        simd::take_levels_run();
        outputs.push((level, y, c, tiny));
    }
    // Every level computes the same products (within f32 rounding of a different order).
    let (_, y0, c0, t0) = &outputs[0];
    for (level, y, c, tiny) in &outputs[1..] {
        assert_close(&format!("conv at {level}"), y, y0, 1e-4, 1e-4);
        assert_close(&format!("gemm at {level}"), c, c0, 1e-4, 1e-4);
        assert_close(&format!("tiny gemm at {level}"), tiny, t0, 1e-5, 1e-5);
    }
}

fn small_convnet() -> TrainGraph {
    model_steps::convnet()
}

fn assert_close_tensor(what: &str, got: &HostTensor, want: &HostTensor, tol: f64) {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-3);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= tol * scale,
            "{what}[{i}]: {a} vs reference {b} (scale {scale})"
        );
    }
}

/// Trains `tg` for `steps` steps at `batch` on the reference executor and on 2-thread CPU
/// sessions at every available level (each checked to run only its level), interleaving the
/// sessions' steps, and compares the costs and the final variables.
fn every_level_matches_the_reference(tg: TrainGraph, batch: usize, steps: u64, tol: f64) {
    let mut reference = ReferenceSession::new(tg.graph.clone()).expect("reference");
    reference.initialize_variables(3).expect("init");
    let mut sessions: Vec<(SimdLevel, CpuSession)> = SimdLevel::available()
        .into_iter()
        .map(|level| {
            let options = CpuOptions {
                threads: 2,
                simd: Some(level),
                ..CpuOptions::default()
            };
            let mut cpu = CpuSession::new(tg.graph.clone(), options).expect("cpu");
            cpu.initialize_variables(3).expect("init");
            assert_eq!(cpu.simd_level(), level);
            (level, cpu)
        })
        .collect();
    for s in 0..steps {
        let f = feeds(&tg, batch, s);
        let want = reference.run(&tg.step, &f).expect("reference step");
        for (level, cpu) in &mut sessions {
            simd::take_levels_run();
            let got = cpu.run(&tg.step, &f).expect("cpu step");
            assert_eq!(simd::take_levels_run(), vec![*level], "step {s}");
            assert_close_tensor(&format!("{level}: step {s} cost"), &got[0], &want[0], tol);
        }
    }
    for (id, def) in tg.graph.variable_ids() {
        let w = reference.read_variable(id).expect("ref");
        for (level, cpu) in &sessions {
            let g = cpu.read_variable(id).expect("cpu");
            assert_close_tensor(&format!("{level}: {}", def.name), &g, &w, tol);
        }
    }
}

#[test]
fn convnet_training_steps_match_the_reference_at_every_level() {
    let _record = lock();
    let m = ConvNet {
        image_shape: [16, 16, 3],
        channels: [12, 20],
        hidden: 24,
        dropout_rate: 0.0,
        ..ConvNet::default()
    };
    every_level_matches_the_reference(training_graph(m.inputs(), |x| m.build(x)), 8, 2, 1e-4);
}

#[test]
fn resnet8_training_steps_match_the_reference_at_every_level() {
    let _record = lock();
    let m = CifarResNet::new(1);
    every_level_matches_the_reference(training_graph(m.inputs(), |x| m.build(x)), 4, 2, 2e-3);
}
