//! Per-channel reductions against the reference executor (`|a - b| <= 1e-4 + 1e-4·|b|`), on one
//! and two threads:
//! - computed in convolution epilogues (`LowerOptions::epilogue_reductions`): batch-norm-like
//!   statistics of a convolution's output and gradient-like sums over a backward-input
//!   convolution's masked output, on random shapes, strides and paddings, with the option on and
//!   off — and with it on, the reductions must really be in epilogues;
//! - over the middle axes of `[N, H, W, C]` (global average pooling), which the reduction
//!   engine folds block by block.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{Feed, Session};
use towerpack::ir::*;
use towerpack::lower::{KernelKind, LowerOptions};
use towerpack::tensor::HostTensor;

use crate::prologue_case::{BATCH, Case};
// Also `differential`'s.
pub(crate) use crate::prologue_case::random_conv;

impl Case {
    fn per_channel(&mut self, op: ReduceOp, x: Value) -> Value {
        let reduce = Op::Reduce {
            op,
            axes: vec![0, 1, 2],
            keep_dims: false,
        };
        self.add("reduce", reduce, &[x])
    }

    fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        self.add("binary", Op::Binary(op), &[a, b])
    }
}

/// A convolution with batch-norm statistics of its output (mean, then the variance around it),
/// and a backward-input convolution whose ReLU-masked output feeds four per-channel sums with
/// other operands (the shape of batch norm's backward pass).
fn case(seed: u64) -> (Graph, Vec<Feed>, Step) {
    let mut c = Case {
        g: Graph::new(),
        feeds: Vec::new(),
        fetches: Vec::new(),
        rng: ChaCha8Rng::seed_from_u64(seed),
    };
    let channels = [1, 3, 16, 17, 64][c.rng.random_range(0..5)];
    let outs = [2, 5, 16, 32, 64][c.rng.random_range(0..5)];
    let (k, attrs) = random_conv(&mut c.rng, 1);
    let x = c.input(&[7, 6, channels]);
    let w = c.constant(&[k, k, channels, outs]);
    let y = c.add("conv", Op::Conv2d(attrs), &[x, w]);
    let mean = c.per_channel(ReduceOp::Mean, y);
    let centred = c.binary(BinaryOp::Sub, y, mean);
    let square = c.add("square", Op::Unary(UnaryOp::Square), &[centred]);
    let variance = c.per_channel(ReduceOp::Mean, square);
    c.fetches.extend([y, mean, variance]);

    let y_dims = c.g.value_type(y).shape.resolve(BATCH);
    let dy = c.input(&y_dims[1..]);
    let backward = Op::Conv2dBackpropInput {
        attrs,
        input_hw: [7, 6],
    };
    let dx = c.add("backprop_input", backward, &[dy, w]);
    let zero = c.add(
        "zero",
        Op::Constant {
            value: HostTensor::scalar_f32(0.0),
        },
        &[],
    );
    let positive = c.binary(BinaryOp::Gt, x, zero);
    let masked = c.add("select", Op::Select, &[positive, dx, zero]);
    // Batch norm's statistics of `x` are forward values: constants here.
    let x_mean = c.constant(&[channels]);
    let gamma = c.constant(&[channels]);
    let x_centred = c.binary(BinaryOp::Sub, x, x_mean);
    let scaled = c.binary(BinaryOp::Mul, masked, gamma);
    let products = [
        c.binary(BinaryOp::Mul, masked, x_centred),
        c.binary(BinaryOp::Mul, scaled, x_centred),
        scaled,
    ];
    let mut sums = vec![c.per_channel(ReduceOp::Sum, masked)];
    sums.extend(products.map(|p| c.per_channel(ReduceOp::Sum, p)));
    c.fetches.push(masked);
    c.fetches.extend(sums);
    let step = Step::new(c.fetches.clone(), Vec::new());
    (c.g, c.feeds, step)
}

fn close(what: &str, got: &HostTensor, want: &HostTensor) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!(
            "{what}: shapes {:?} vs {:?}",
            got.shape(),
            want.shape()
        ));
    }
    for (i, (x, y)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        if (x - y).abs() > 1e-4 + 1e-4 * y.abs() {
            return Err(format!("{what}: element {i}: {x} vs reference {y}"));
        }
    }
    Ok(())
}

/// Runs case `seed` on the CPU backend and the reference; returns the number of epilogue
/// reductions in the compiled program, and the program.
fn check(seed: u64, epilogue_reductions: bool, threads: usize) -> Result<(usize, String), String> {
    let (g, feeds, step) = case(seed);
    let mut reference = ReferenceSession::new(g.clone()).expect("reference");
    let want = reference.run(&step, &feeds).map_err(|e| e.to_string())?;
    let lower = LowerOptions {
        epilogue_reductions,
        ..LowerOptions::default()
    };
    let options = CpuOptions {
        threads,
        lower,
        ..CpuOptions::default()
    };
    let mut cpu = CpuSession::new(g, options).expect("cpu");
    let got = cpu.run(&step, &feeds).map_err(|e| e.to_string())?;
    let program = cpu.program(&step, BATCH).expect("program");
    for (i, (c, w)) in got.iter().zip(&want).enumerate() {
        close(&format!("seed {seed}: fetch {i}"), c, w).map_err(|e| format!("{e}\n{program}"))?;
    }
    let reductions = program
        .kernels
        .iter()
        .filter_map(|k| k.kind.epilogue())
        .map(|e| e.reductions.len())
        .sum();
    Ok((reductions, program.to_string()))
}

#[test]
fn epilogue_reductions_match_the_reference() {
    let mut failures = Vec::new();
    for seed in 0..40 {
        for threads in [1, 2] {
            match check(seed, true, threads) {
                // The mean of the forward output and the four backward sums.
                Ok((n, program)) => assert_eq!(
                    n, 5,
                    "seed {seed}: epilogue reductions
{program}"
                ),
                Err(e) => failures.push(e),
            }
        }
        match check(seed, false, 1) {
            Ok((n, program)) => assert_eq!(n, 0, "seed {seed}: the option is off\n{program}"),
            Err(e) => failures.push(e),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures; the first:\n{}",
        failures.len(),
        failures[0]
    );
}

/// Reductions a convolution's epilogue computes are, bit for bit, those of the reduction
/// kernel the program runs with the option off — also where the convolution chooses its own
/// blocks of rows (im2col + GEMM: here a grouped convolution, on every SIMD level; every
/// convolution at the `scalar` level), whose length is no multiple of the fused engine's
/// chunks unless the epilogue asks for one (`Epilogue::block_rows_multiple`). Each image's
/// output here is whole chunks. Exact rather than close: a batch-normalized network
/// amplifies a last-bit difference in its statistics by orders of magnitude (`training.rs`).
#[test]
fn epilogue_reductions_equal_the_reduction_kernels_bitwise() {
    use towerpack::backend::cpu::kernels::simd::SimdLevel;
    for (groups, channels, outs) in [(2, 16, 16), (4, 32, 64), (1, 16, 32)] {
        let mut c = Case {
            g: Graph::new(),
            feeds: Vec::new(),
            fetches: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(groups as u64),
        };
        let x = c.input(&[16, 16, channels]);
        let w = c.constant(&[3, 3, channels / groups, outs]);
        let attrs = Conv2dAttrs {
            strides: [1, 1],
            padding: Padding::Same,
            dilations: [1, 1],
            groups,
        };
        let y = c.add("conv", Op::Conv2d(attrs), &[x, w]);
        let mean = c.per_channel(ReduceOp::Mean, y);
        let square = c.add("square", Op::Unary(UnaryOp::Square), &[y]);
        let mean_square = c.per_channel(ReduceOp::Mean, square);
        let step = Step::new(vec![y, mean, mean_square], Vec::new());
        for simd in SimdLevel::available() {
            let run = |epilogue_reductions: bool| {
                let options = CpuOptions {
                    threads: 1,
                    simd: Some(simd),
                    lower: LowerOptions {
                        epilogue_reductions,
                        ..LowerOptions::default()
                    },
                    ..CpuOptions::default()
                };
                let mut cpu = CpuSession::new(c.g.clone(), options).expect("cpu");
                let out = cpu.run(&step, &c.feeds).expect("run");
                let program = cpu.program(&step, BATCH).expect("program");
                let in_epilogues: usize = program
                    .kernels
                    .iter()
                    .filter_map(|k| k.kind.epilogue())
                    .map(|e| e.reductions.len())
                    .sum();
                (out, in_epilogues)
            };
            let ((fused, n_fused), (separate, n_separate)) = (run(true), run(false));
            assert_eq!((n_fused, n_separate), (2, 0), "{groups} groups, {simd}");
            for (i, (a, b)) in fused.iter().zip(&separate).enumerate() {
                assert_eq!(
                    a.to_f64_vec(),
                    b.to_f64_vec(),
                    "{groups} groups, {channels} -> {outs} channels, {simd}: fetch {i}"
                );
            }
        }
    }
}

/// The variance reads the mean, which the convolution's own epilogue computes: it must stay a
/// separate kernel after the convolution.
#[test]
fn a_reduction_reading_the_epilogue_result_stays_a_kernel() {
    let (g, _, step) = case(7);
    let mut cpu = CpuSession::new(g, CpuOptions::default()).expect("cpu");
    let program = cpu.program(&step, BATCH).expect("program");
    let reduces = program
        .kernels
        .iter()
        .filter(|k| matches!(k.kind, KernelKind::Reduce { .. }))
        .count();
    assert_eq!(reduces, 1, "{program}");
}

/// Sums, means and maxima of a fused prologue over `H, W` of random `[N, H, W, C]` tensors.
#[test]
fn reductions_over_middle_axes_match_the_reference() {
    for seed in 0..24 {
        let mut c = Case {
            g: Graph::new(),
            feeds: Vec::new(),
            fetches: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
        };
        let h = c.rng.random_range(1..20);
        let width = c.rng.random_range(2..20);
        let channels = [1, 3, 16, 64, 100][c.rng.random_range(0..5)];
        let x = c.input(&[h, width, channels]);
        let relu = c.add("relu", Op::Unary(UnaryOp::Relu), &[x]);
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let reduce = Op::Reduce {
                op,
                axes: vec![1, 2],
                keep_dims: false,
            };
            let r = c.add("reduce", reduce, &[relu]);
            c.fetches.push(r);
        }
        let step = Step::new(c.fetches.clone(), Vec::new());
        let mut reference = ReferenceSession::new(c.g.clone()).expect("reference");
        let want = reference.run(&step, &c.feeds).expect("reference run");
        for threads in [1, 2] {
            let options = CpuOptions {
                threads,
                ..CpuOptions::default()
            };
            let mut cpu = CpuSession::new(c.g.clone(), options).expect("cpu");
            let got = cpu.run(&step, &c.feeds).expect("cpu run");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                if let Err(e) = close(&format!("seed {seed}: fetch {i}"), g, w) {
                    panic!("{e} ({h}x{width}x{channels}, {threads} threads)");
                }
            }
        }
    }
}
