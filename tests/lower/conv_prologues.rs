//! Convolution prologues (`LowerOptions::conv_prologues`) on random geometries: a batch-norm-like
//! apply of per-channel values (a random chain of them, sometimes ending in a ReLU) that a
//! convolution, a filter gradient and a residual add in an input gradient's epilogue read.
//! The value must not be written out (both convolutions compute it in their prologues, the
//! epilogue recomputes it), the results must match the reference executor
//! (`|a - b| <= 1e-4 + 1e-4·|b|`) on one and two threads, and bitwise the same program lowered
//! without prologues — at every SIMD level the machine has (the direct kernels at `avx2` and
//! `avx512`, im2col at `scalar` and for grouped convolutions).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::cpu::kernels::SimdLevel;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{Feed, Session};
use towerpack::ir::*;
use towerpack::lower::{KernelKind, LowerOptions};
use towerpack::tensor::HostTensor;

use crate::channel_reductions::{BATCH, Case, random_conv};

/// Case `seed`: its graph, feeds and step (fetching the convolution, the filter gradient and the
/// residual sum; never the applied value itself, which would have to be written out).
fn case(seed: u64) -> (Graph, Vec<Feed>, Step) {
    let mut c = Case {
        g: Graph::new(),
        feeds: Vec::new(),
        fetches: Vec::new(),
        rng: ChaCha8Rng::seed_from_u64(seed),
    };
    let channels = [1, 3, 4, 16, 17, 32][c.rng.random_range(0..6)];
    let (h, w) = (c.rng.random_range(3..9), c.rng.random_range(3..9));
    let x = c.input(&[h, w, channels]);
    // The apply: a chain of per-channel operations (batch norm's is sub, mul, mul, add, relu).
    let mut a = x;
    for _ in 0..c.rng.random_range(1..5) {
        let op = [BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Add][c.rng.random_range(0..3)];
        let v = c.constant(&[channels]);
        a = c.add("apply", Op::Binary(op), &[a, v]);
    }
    if c.rng.random_bool(0.7) {
        a = c.add("relu", Op::Unary(UnaryOp::Relu), &[a]);
    }
    let groups = if channels % 2 == 0 && c.rng.random_bool(0.25) {
        2
    } else {
        1
    };
    let outs = groups * c.rng.random_range(1..9);
    let (k, attrs) = random_conv(&mut c.rng, groups);
    let filter = c.constant(&[k, k, channels / groups, outs]);
    let y = c.add("conv", Op::Conv2d(attrs), &[a, filter]);
    let y_dims = c.g.value_type(y).shape.resolve(BATCH);
    let dy = c.input(&y_dims[1..]);
    let dw = c.add(
        "filter_grad",
        Op::Conv2dBackpropFilter {
            attrs,
            filter_hw: [k, k],
        },
        &[a, dy],
    );
    // A residual add of `a` in the epilogue of the input gradient of `y` (which depends on
    // `a`, so the add cannot join the apply's group as it can a value computed beside it).
    let dx = c.add(
        "input_grad",
        Op::Conv2dBackpropInput {
            attrs,
            input_hw: [h, w],
        },
        &[y, filter],
    );
    let residual = c.add("residual", Op::Binary(BinaryOp::Add), &[dx, a]);
    let step = Step::new(vec![y, dw, residual], Vec::new());
    (c.g, c.feeds, step)
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
