//! Convolution prologues (`LowerOptions::conv_prologues`) on random geometries: a batch-norm-like
//! apply of per-channel values (a random chain of them, sometimes ending in a ReLU) that a
//! convolution, a filter gradient and a residual add in an input gradient's epilogue read.
//! The value must not be written out (both convolutions compute it in their prologues, the
//! epilogue recomputes it), the results must match the reference executor
//! (`|a - b| <= 1e-4 + 1e-4·|b|`) on one and two threads, and bitwise the same program lowered
//! without prologues — at every SIMD level the machine has (the direct kernels at `avx2` and
//! `avx512`, im2col at `scalar` and for grouped convolutions).

use towerpack::backend::cpu::kernels::SimdLevel;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{Feed, Session};
use towerpack::ir::*;
use towerpack::lower::{KernelKind, LowerOptions};
use towerpack::tensor::HostTensor;

use crate::prologue_case::{self, BATCH};

/// Case `seed` (`tests/prologue_case`): its graph, feeds and step (fetching the convolution, the
/// filter gradient and the residual sum; never the applied value itself, which would have to be
/// written out).
fn case(seed: u64) -> (Graph, Vec<Feed>, Step) {
    let c = prologue_case::case(seed);
    (c.g, c.feeds, c.step)
}

fn close(what: &str, got: &HostTensor, want: &HostTensor) -> Result<(), String> {
    for (i, (x, y)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        if (x - y).abs() > 1e-4 + 1e-4 * y.abs() {
            return Err(format!("{what}: element {i}: {x} vs reference {y}"));
        }
    }
    Ok(())
}

/// The fetches of case `seed` on the CPU backend, and its program's number of prologues.
fn cpu_run(
    seed: u64,
    prologues: bool,
    threads: usize,
    simd: SimdLevel,
) -> (Vec<HostTensor>, usize) {
    let (g, feeds, step) = case(seed);
    let options = CpuOptions {
        threads,
        simd: Some(simd),
        lower: LowerOptions {
            conv_prologues: prologues,
            ..LowerOptions::default()
        },
        ..CpuOptions::default()
    };
    let mut cpu = CpuSession::new(g, options).expect("cpu");
    let got = cpu.run(&step, &feeds).expect("cpu step");
    let program = cpu.program(&step, BATCH).expect("program");
    let n = program
        .kernels
        .iter()
        .filter(|k| k.kind.prologue().is_some())
        .count();
    // The apply is written by no kernel of its own: no elementwise kernel is left (the residual
    // add is the input gradient's epilogue).
    if prologues {
        let lone = program
            .kernels
            .iter()
            .filter(|k| matches!(k.kind, KernelKind::Elementwise { .. }))
            .count();
        assert_eq!(lone, 0, "seed {seed}:\n{program}");
    }
    (got, n)
}

#[test]
fn prologues_match_the_reference_and_the_written_out_value() {
    let bits = |ts: &[HostTensor]| -> Vec<Vec<u64>> {
        ts.iter()
            .map(|t| t.to_f64_vec().iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|&l| l <= SimdLevel::max())
        .collect();
    let mut failures = Vec::new();
    for seed in 0..40 {
        let (g, feeds, step) = case(seed);
        let want = ReferenceSession::new(g)
            .expect("reference")
            .run(&step, &feeds)
            .expect("reference step");
        for threads in [1, 2] {
            let simd = levels[(seed as usize + threads) % levels.len()];
            let (fused, n) = cpu_run(seed, true, threads, simd);
            assert_eq!(n, 2, "seed {seed}: the convolution and its filter gradient");
            for (i, (got, want)) in fused.iter().zip(&want).enumerate() {
                if let Err(e) = close(&format!("seed {seed} {simd:?} fetch {i}"), got, want) {
                    failures.push(e);
                }
            }
            let (written, n) = cpu_run(seed, false, threads, simd);
            assert_eq!(n, 0);
            if bits(&fused) != bits(&written) {
                failures.push(format!(
                    "seed {seed} {simd:?} {threads} threads: not bitwise the written-out program"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
