//! Launches whose long reductions are split across blocks, on the emulated device against the
//! CPU backend, and bitwise reproducible run to run (CTAs run on several host threads, so the
//! block that arrives last — and combines — changes between runs):
//! - per-channel and full reductions split along the reduced axis (1 and 64 channels; lengths
//!   not multiples of the split; sums, means, maxima, integer sums), and the elementwise work
//!   they finish as they store their results;
//! - split-K filter gradients (3×3, 1×1, strided) and matrix products with a long K;
//! - batch-norm-like statistics and gradient sums taken in convolution epilogues
//!   (`LowerOptions::epilogue_reductions`), combined across the blocks of a channel tile.
//!
//! The emulated device reports a given multiprocessor count, so small problems take the launch
//! shapes (tiles, splits) large batches take on a large GPU; every test checks that the launch
//! it means to exercise really is split.

use crate::cuda_common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::cuda::render::{self, KernelPlan, Target};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::backend::{Feed, Session};
use towerpack::ir::*;
use towerpack::lower::{LowerOptions, Program};
use towerpack::tensor::{DType, HostTensor};

/// A graph under construction with random feeds.
struct Case {
    g: Graph,
    feeds: Vec<Feed>,
    fetches: Vec<Value>,
    rng: ChaCha8Rng,
    batch: usize,
    /// Sums of terms of both signs, whose yardstick is the sum of the terms' magnitudes:
    /// `(sum, of, factor)` says every term of fetch `sum` is at most `factor` times an element
    /// of fetch `of` in magnitude (see [`check`]).
    sum_bounds: Vec<(usize, usize, f64)>,
}

impl Case {
    fn new(seed: u64, batch: usize) -> Case {
        Case {
            g: Graph::new(),
            feeds: Vec::new(),
            fetches: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            batch,
            sum_bounds: Vec::new(),
        }
    }

    fn add(&mut self, name: &str, op: Op, ins: &[Value]) -> Value {
        let name = self.g.unique_name(name);
        Value::first(self.g.add_node(&name, op, ins).expect(&name))
    }

    /// A batched input of `dims` with random contents (f32 in [-2, 2), i32 in [-50, 50)).
    fn input(&mut self, dtype: DType, dims: &[usize]) -> Value {
        let name = self.g.unique_name("in");
        let ty = TensorType::new(dtype, Shape::batched(dims));
        let id = self
            .g
            .add_node(
                &name,
                Op::Input {
                    name: name.clone(),
                    ty,
                },
                &[],
            )
            .expect("input");
        let shape: Vec<usize> = std::iter::once(self.batch)
            .chain(dims.iter().copied())
            .collect();
        let n: usize = shape.iter().product();
        let values: Vec<f64> = (0..n)
            .map(|_| match dtype {
                DType::I32 => f64::from(self.rng.random_range(-50..50)),
                _ => self.rng.random_range(-2.0..2.0),
            })
            .collect();
        let t = HostTensor::from_f64_values(dtype, &shape, values).expect("sized");
        self.feeds.push((id, t));
        Value::first(id)
    }

    fn constant(&mut self, dims: &[usize]) -> Value {
        let n: usize = dims.iter().product();
        let data = (0..n).map(|_| self.rng.random_range(-1.0..1.0)).collect();
        let value = HostTensor::from_f32(dims, data).expect("sized");
        self.add("w", Op::Constant { value }, &[])
    }

    fn reduce(&mut self, op: ReduceOp, axes: Vec<usize>, x: Value) -> Value {
        let r = Op::Reduce {
            op,
            axes,
            keep_dims: false,
        };
        self.add("reduce", r, &[x])
    }

    fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        self.add("binary", Op::Binary(op), &[a, b])
    }

    fn fetch(&mut self, v: Value) {
        self.fetches.push(v);
    }

    fn step(&self) -> Step {
        Step::new(self.fetches.clone(), Vec::new())
    }
}

fn lowering(epilogue_reductions: bool) -> LowerOptions {
    LowerOptions {
        epilogue_reductions,
        ..towerpack::backend::cuda::CudaOptions::default().lowering()
    }
}

/// An emulated session whose device reports `multiprocessors` SMs.
fn emulated(c: &Case, multiprocessors: u32, lower: &LowerOptions) -> CudaSession {
    cuda_common::require_nvrtc();
    let options = CudaOptions {
        cache_dir: None,
        lower: *lower,
        ..CudaOptions::default()
    };
    cuda_common::emulated_session(c.g.clone(), multiprocessors, options)
}

/// Largest |got - want| relative to the largest |want| (floored at 1).
fn normalized_error(got: &HostTensor, want: &HostTensor) -> f64 {
    error_within(got, want, 1.0)
}

/// Largest |got - want| relative to the largest |want|, floored at `floor`.
fn error_within(got: &HostTensor, want: &HostTensor, floor: f64) -> f64 {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    assert_eq!(g.len(), w.len());
    let scale = w.iter().fold(floor, |m, x| m.max(x.abs()));
    g.iter()
        .zip(&w)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs() / scale))
}

/// The launches of `program` as rendered for `multiprocessors` SMs: (kernel kind, grid, the
/// generated part).
fn launches(program: &Program, multiprocessors: u32) -> Vec<(String, [u32; 3], String)> {
    let target = Target::with_multiprocessors(multiprocessors);
    (0..program.kernels.len())
        .filter_map(|i| match render::render_kernel_for(program, i, &target) {
            Ok(KernelPlan::Launch(r)) => Some((
                program.kernels[i].kind.name().to_string(),
                r.launch.grid,
                r.generated,
            )),
            Ok(_) => None,
            Err(e) => panic!("render k{i}: {e}"),
        })
        .collect()
}

/// Runs `c` on the CPU backend and twice on fresh emulated devices reporting `multiprocessors`
/// SMs; checks the emulated results against the CPU's (error ≤ `tol` relative to the largest
/// value, floored at 1 — and for the sums of `Case::sum_bounds` at the sum of their terms'
/// magnitudes, the yardstick of floating-point summation: two f32 orders of a sum of `n`
/// terms differ by up to about `n·2⁻²⁴` of it however small the sum itself is) and the two
/// emulated runs against each other bit for bit. Returns the emulated program.
fn check(c: &Case, multiprocessors: u32, lower: &LowerOptions, tol: f64) -> Program {
    let step = c.step();
    let mut cpu = CpuSession::new(
        c.g.clone(),
        CpuOptions {
            threads: 2,
            lower: *lower,
            ..CpuOptions::default()
        },
    )
    .expect("cpu session");
    let want = cpu.run(&step, &c.feeds).expect("cpu step");
    let mut first = emulated(c, multiprocessors, lower);
    let got = first.run(&step, &c.feeds).expect("emulated step");
    let program = first.program(&step, c.batch).expect("program").clone();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let floor = c
            .sum_bounds
            .iter()
            .filter(|(sum, ..)| *sum == i)
            .map(|&(_, of, factor)| {
                factor * want[of].to_f64_vec().iter().map(|x| x.abs()).sum::<f64>()
            })
            .fold(1.0, f64::max);
        let err = error_within(g, w, floor);
        assert!(
            err <= tol,
            "fetch {i}: error {err:.3e} > {tol:e}\n{program}"
        );
    }
    for run in 0..2 {
        let mut again = emulated(c, multiprocessors, lower);
        let repeat = again.run(&step, &c.feeds).expect("emulated step");
        for (i, (a, b)) in got.iter().zip(&repeat).enumerate() {
            assert!(
                a.to_le_bytes() == b.to_le_bytes(),
                "fetch {i} differs between emulated runs (repeat {run})"
            );
        }
    }
    // The same session again (the workspace's counters were reset by the last run).
    let repeat = first.run(&step, &c.feeds).expect("second step");
    for (i, (a, b)) in got.iter().zip(&repeat).enumerate() {
        assert!(
            a.to_le_bytes() == b.to_le_bytes(),
            "fetch {i} differs on the session's second run"
        );
    }
    program
}

/// The `#define NAME value` of a generated part, if it has one.
fn define(generated: &str, name: &str) -> Option<usize> {
    let prefix = format!("#define {name} ");
    generated
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// The `#define NAME value` of a generated part that must have it.
fn defined(generated: &str, name: &str) -> usize {
    define(generated, name).unwrap_or_else(|| panic!("{name} not defined in\n{generated}"))
}

#[test]
fn split_reductions_over_one_and_64_channels_match_the_cpu_and_repeat_bitwise() {
    let mut c = Case::new(1, 3);
    // Per channel over [3, 3001, 1] and [3, 1001, 64]: 9003 and 3003 reduced points.
    let one = c.input(DType::F32, &[3001, 1]);
    let wide = c.input(DType::F32, &[1001, 64]);
    for x in [one, wide] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let r = c.reduce(op, vec![0, 1], x);
            c.fetch(r);
        }
        // With a prologue: the mean of squares.
        let sq = c.add("square", Op::Unary(UnaryOp::Square), &[x]);
        let r = c.reduce(ReduceOp::Mean, vec![0, 1], sq);
        c.fetch(r);
    }
    // Everything into one value, and integer sums (64-bit accumulators through the workspace).
    let flat = c.input(DType::F32, &[5000]);
    let all = c.reduce(ReduceOp::Sum, vec![0, 1], flat);
    c.fetch(all);
    let ints = c.input(DType::I32, &[3001]);
    let isum = c.reduce(ReduceOp::Sum, vec![0, 1], ints);
    c.fetch(isum);
    let program = check(&c, 132, &lowering(true), 1e-5);
    let split: Vec<usize> = launches(&program, 132)
        .iter()
        .filter(|(kind, ..)| kind == "reduce")
        .map(|(_, _, g)| defined(g, "TP_SPLIT"))
        .collect();
    assert!(
        split.len() >= 4 && split.iter().all(|&s| s > 1),
        "every reduction is split: {split:?}"
    );
}

/// Elementwise work on reduced values that the reductions finish as they store them
/// (`ReduceFinish`): batch norm's `rsqrt(variance + eps) * gamma` per channel, a function of a
/// whole-tensor sum, a comparison of a maximum stored as a boolean, and the squares of many
/// short sums — split across blocks, and not split.
#[test]
fn reduction_finishes_match_the_cpu_and_repeat_bitwise() {
    let mut c = Case::new(7, 3);
    let x = c.input(DType::F32, &[1001, 64]);
    // The variance's reduction reads x and the mean (its prologue), then finishes the scale.
    let mean = c.reduce(ReduceOp::Mean, vec![0, 1], x);
    let centred = c.binary(BinaryOp::Sub, x, mean);
    let sq = c.add("square", Op::Unary(UnaryOp::Square), &[centred]);
    let var = c.reduce(ReduceOp::Mean, vec![0, 1], sq);
    let eps = c.constant(&[]);
    let eps = c.add("abs", Op::Unary(UnaryOp::Abs), &[eps]);
    let shifted = c.binary(BinaryOp::Add, var, eps);
    let rstd = c.add("rsqrt", Op::Unary(UnaryOp::Rsqrt), &[shifted]);
    let gamma = c.constant(&[64]);
    let scale = c.binary(BinaryOp::Mul, rstd, gamma);
    c.fetch(scale);
    // One output: sqrt(|sum|) of everything.
    let flat = c.input(DType::F32, &[5000]);
    let all = c.reduce(ReduceOp::Sum, vec![0, 1], flat);
    let all = c.add("abs", Op::Unary(UnaryOp::Abs), &[all]);
    let root = c.add("sqrt", Op::Unary(UnaryOp::Sqrt), &[all]);
    c.fetch(root);
    // A maximum per channel compared with a bound: a boolean finish output.
    let y = c.input(DType::F32, &[700, 5]);
    let top = c.reduce(ReduceOp::Max, vec![0, 1], y);
    let bound = c.constant(&[5]);
    let above = c.binary(BinaryOp::Gt, top, bound);
    c.fetch(above);
    // Many outputs (3 × 600) of 40 points each: one block per tile of outputs, not split.
    let rows = c.input(DType::F32, &[40, 600]);
    let sums = c.reduce(ReduceOp::Sum, vec![1], rows);
    let squared = c.add("square", Op::Unary(UnaryOp::Square), &[sums]);
    c.fetch(squared);
    let mut splits = Vec::new();
    for sms in [132, 2] {
        let program = check(&c, sms, &lowering(true), 1e-5);
        let finishes = program
            .kernels
            .iter()
            .filter(|k| {
                matches!(
                    k.kind,
                    towerpack::lower::KernelKind::Reduce {
                        finish: Some(_),
                        ..
                    }
                )
            })
            .count();
        assert_eq!(finishes, 4, "{program}");
        assert_eq!(
            program.kernel_histogram(),
            vec![("reduce", 5)],
            "no elementwise launch is left:\n{program}"
        );
        splits.extend(
            launches(&program, sms)
                .iter()
                .map(|(_, _, g)| defined(g, "TP_SPLIT")),
        );
    }
    // Finishes ran in split launches (by the block that combines) and in whole ones.
    assert!(splits.contains(&1), "{splits:?}");
    assert!(splits.iter().any(|&s| s > 1), "{splits:?}");
}

#[test]
fn split_k_filter_gradients_and_matrix_products_match_the_cpu_and_repeat_bitwise() {
    // K = 3·24·20 = 1440 output pixels at stride 1 (more than 8 splits: a two-level combine).
    let mut c = Case::new(2, 3);
    let x = c.input(DType::F32, &[24, 20, 8]);
    for (k, stride, o) in [(3, 1, 12), (1, 2, 16), (3, 2, 5)] {
        let attrs = Conv2dAttrs {
            strides: [stride, stride],
            padding: Padding::Same,
            dilations: [1, 1],
            groups: 1,
        };
        let oh = 24usize.div_ceil(stride);
        let ow = 20usize.div_ceil(stride);
        let dy = c.input(DType::F32, &[oh, ow, o]);
        let dw = c.add(
            "backprop_filter",
            Op::Conv2dBackpropFilter {
                attrs,
                filter_hw: [k, k],
            },
            &[x, dy],
        );
        c.fetch(dw);
    }
    // aᵀ·b over the batch: K = 1500, 6×10 (scalar loads) and 8×12 (128-bit loads).
    let mut m = Case::new(3, 1500);
    for (rows, cols) in [(6, 10), (8, 12)] {
        let a = m.input(DType::F32, &[rows]);
        let b = m.input(DType::F32, &[cols]);
        let p = m.add(
            "matmul",
            Op::MatMul {
                transpose_a: true,
                transpose_b: false,
            },
            &[a, b],
        );
        m.fetch(p);
    }
    for (case, kind) in [(&c, "conv2d_backprop_filter"), (&m, "matmul")] {
        for sms in [132, 8] {
            let program = check(case, sms, &lowering(true), 1e-5);
            let shapes = launches(&program, sms);
            let splits: Vec<usize> = shapes
                .iter()
                .filter(|(k, ..)| k == kind)
                .map(|(_, _, g)| defined(g, "TP_SPLIT_K"))
                .collect();
            assert!(
                !splits.is_empty() && splits.iter().all(|&s| s > 1),
                "{kind} on {sms} SMs is split along K: {splits:?}"
            );
            if sms == 132 {
                assert!(
                    splits.iter().any(|&s| s > 8),
                    "a two-level combine: {splits:?}"
                );
            }
        }
    }
}

/// The input gradient of the convolution `y` (of `filter`, over an `input_hw` image) for a
/// random `dy` shaped like `y`.
fn input_gradient(
    c: &mut Case,
    attrs: Conv2dAttrs,
    y: Value,
    filter: Value,
    input_hw: [usize; 2],
) -> Value {
    let y_dims = c.g.value_type(y).shape.resolve(c.batch);
    let dy = c.input(DType::F32, &y_dims[1..]);
    let backward = Op::Conv2dBackpropInput { attrs, input_hw };
    c.add("backprop_input", backward, &[dy, filter])
}

/// A convolution with batch-norm statistics of its output (mean, then the variance around it:
/// both join the convolution's epilogue, and `rsqrt(variance + ε)` its finish) and a
/// backward-input convolution whose ReLU-masked output feeds four per-channel sums (batch
/// norm's backward pass), as `tests/lower/channel_reductions.rs` builds them.
fn epilogue_case(seed: u64) -> Case {
    let mut c = Case::new(seed, 3);
    let channels = [1, 3, 16, 17, 64][c.rng.random_range(0..5)];
    let outs = [1, 5, 16, 32, 64][c.rng.random_range(0..5)];
    let k = c.rng.random_range(1..4);
    let s = c.rng.random_range(1..3);
    let attrs = Conv2dAttrs {
        strides: [s, s],
        padding: if c.rng.random_bool(0.5) {
            Padding::Same
        } else {
            Padding::Valid
        },
        dilations: [1, 1],
        groups: 1,
    };
    let (h, w) = (24, 20);
    let x = c.input(DType::F32, &[h, w, channels]);
    let filter = c.constant(&[k, k, channels, outs]);
    let y = c.add("conv", Op::Conv2d(attrs), &[x, filter]);
    let mean = c.reduce(ReduceOp::Mean, vec![0, 1, 2], y);
    let centred = c.binary(BinaryOp::Sub, y, mean);
    let square = c.add("square", Op::Unary(UnaryOp::Square), &[centred]);
    let variance = c.reduce(ReduceOp::Mean, vec![0, 1, 2], square);
    // Batch norm's scale of the variance: the epilogue's finish.
    let eps = c.add(
        "eps",
        Op::Constant {
            value: HostTensor::scalar_f32(1e-3),
        },
        &[],
    );
    let shifted = c.binary(BinaryOp::Add, variance, eps);
    let scale = c.add("rsqrt", Op::Unary(UnaryOp::Rsqrt), &[shifted]);
    c.fetches.extend([y, mean, variance, scale]);

    let dx = input_gradient(&mut c, attrs, y, filter, [h, w]);
    let zero = c.add(
        "zero",
        Op::Constant {
            value: HostTensor::scalar_f32(0.0),
        },
        &[],
    );
    let positive = c.binary(BinaryOp::Gt, x, zero);
    let masked = c.add("select", Op::Select, &[positive, dx, zero]);
    let x_mean = c.constant(&[channels]);
    let gamma = c.constant(&[channels]);
    let x_centred = c.binary(BinaryOp::Sub, x, x_mean);
    let scaled = c.binary(BinaryOp::Mul, masked, gamma);
    let products = [
        c.binary(BinaryOp::Mul, masked, x_centred),
        c.binary(BinaryOp::Mul, scaled, x_centred),
        scaled,
    ];
    let mut sums = vec![c.reduce(ReduceOp::Sum, vec![0, 1, 2], masked)];
    sums.extend(products.map(|p| c.reduce(ReduceOp::Sum, vec![0, 1, 2], p)));
    c.fetches.push(masked);
    // The four sums' terms are `masked` times factors below 3 in magnitude (`x` in [-2, 2),
    // `x_mean` and `gamma` in [-1, 1)): sums of hundreds of terms of both signs, whose result
    // can be far smaller than the terms (seen: -1.83 from terms of magnitude ~10, where the
    // CPU's im2col path at the `scalar` level and the device differ by 3.4e-5).
    let of = c.fetches.len() - 1;
    for i in 0..sums.len() {
        c.sum_bounds.push((of + 1 + i, of, 3.0));
    }
    c.fetches.extend(sums);
    c
}

/// The variance of a convolution's output computed in one pass in its epilogue
/// (`ChannelReduction::Variance`) stays accurate when the output's mean lies thousands of its
/// standard deviations from zero (an input offset by 1000): against the two-pass variance, in
/// f64, of the output as the kernel stored it — on the device with many blocks a channel tile
/// (two-level merge) and with few, and on the CPU running the same program. Blocks sum about a
/// value of their own data and merge re-centred: a one-pass sum of squares about zero in f32
/// would be off by ~ε·(mean/std)², 0.1–1 here. (Seen: within 3–8e-7 on the device, 5e-8 on
/// the CPU; the device's shift set to 0 instead, off by 0.49.)
#[test]
fn epilogue_variances_stay_accurate_far_from_zero() {
    let lower = lowering(true);
    for seed in 0..3 {
        let mut c = Case::new(seed, 4);
        let x = c.input(DType::F32, &[12, 10, 8]);
        let offset = c.add(
            "offset",
            Op::Constant {
                value: HostTensor::scalar_f32(1000.0),
            },
            &[],
        );
        let shifted = c.binary(BinaryOp::Add, x, offset);
        let filter = c.constant(&[3, 3, 8, 16]);
        let attrs = Conv2dAttrs {
            strides: [1, 1],
            padding: Padding::Valid,
            dilations: [1, 1],
            groups: 1,
        };
        let y = c.add("conv", Op::Conv2d(attrs), &[shifted, filter]);
        let op = Op::Moments {
            axes: vec![0, 1, 2],
            keep_dims: false,
        };
        let m = c.g.add_node("bn/moments", op, &[y]).expect("moments");
        c.fetches.extend([y, Value::new(m, 0), Value::new(m, 1)]);
        let step = c.step();
        let mut runs = Vec::new();
        for sms in [132, 2] {
            let mut device = emulated(&c, sms, &lower);
            runs.push((
                format!("device, {sms} SMs"),
                device.run(&step, &c.feeds).expect("step"),
            ));
            let program = device.program(&step, c.batch).expect("program");
            let variances = program
                .kernels
                .iter()
                .filter_map(|k| k.kind.epilogue())
                .flat_map(|e| &e.reductions)
                .filter(|&&r| r == towerpack::lower::ChannelReduction::Variance)
                .count();
            assert_eq!(
                variances, 1,
                "seed {seed}: the variance in the epilogue\n{program}"
            );
        }
        let mut cpu = CpuSession::new(
            c.g.clone(),
            CpuOptions {
                threads: 2,
                lower,
                ..CpuOptions::default()
            },
        )
        .expect("cpu session");
        runs.push(("cpu".into(), cpu.run(&step, &c.feeds).expect("cpu step")));
        for (what, out) in &runs {
            let y = out[0].to_f64_vec();
            let channels = 16;
            let rows = (y.len() / channels) as f64;
            let (mut far, mut worst) = (0.0f64, 0.0f64);
            for ch in 0..channels {
                let column = y.iter().skip(ch).step_by(channels);
                let mean = column.clone().sum::<f64>() / rows;
                let var = column.map(|v| (v - mean) * (v - mean)).sum::<f64>() / rows;
                far = far.max(mean.abs() / var.sqrt());
                let got = out[2].to_f64_vec()[ch];
                worst = worst.max((got - var).abs() / var);
            }
            assert!(
                far > 100.0,
                "seed {seed}: the mean is {far:.0} deviations from 0"
            );
            assert!(
                worst < 1e-5,
                "seed {seed}, {what}: variance off by {worst:.2e} (relative), mean {far:.0} \
                 deviations from 0"
            );
        }
    }
}

#[test]
fn epilogue_reductions_of_convolutions_match_the_cpu_and_repeat_bitwise() {
    // Blocks per channel tile of every convolution with epilogue reductions, and its splits
    // of K.
    let (mut members, mut splits) = (Vec::new(), Vec::new());
    for seed in 0..6 {
        let c = epilogue_case(seed);
        // A large GPU's shapes (small tiles at this size: many blocks per channel tile, a
        // two-level combine) and a small one's (tall tiles).
        for sms in [132, 2] {
            let program = check(&c, sms, &lowering(true), 1e-5);
            let reductions: usize = program
                .kernels
                .iter()
                .filter_map(|k| k.kind.epilogue())
                .map(|e| e.reductions.len())
                .sum();
            // The mean, the variance (one pass, `ChannelReduction::Variance`) and the four sums.
            assert_eq!(reductions, 6, "seed {seed}: in epilogues\n{program}");
            // rsqrt(variance + ε) stored with the variance (`Epilogue::finish`).
            let finishes = program
                .kernels
                .iter()
                .filter_map(|k| k.kind.epilogue())
                .filter(|e| e.finish.is_some())
                .count();
            assert_eq!(finishes, 1, "seed {seed}: the variance's finish\n{program}");
            let reducing: Vec<(u32, usize)> = launches(&program, sms)
                .iter()
                .filter(|(_, _, g)| define(g, "TP_EPI_RED").is_some_and(|r| r > 0))
                .map(|(_, grid, g)| (grid[0], defined(g, "TP_SPLIT_K")))
                .collect();
            assert_eq!(reducing.len(), 2, "seed {seed}");
            members.extend(reducing.iter().map(|r| r.0));
            splits.extend(reducing.iter().map(|r| r.1));
        }
    }
    // Split K and reduced in the epilogue at once (the row tiles' combining blocks are the
    // channel tile's members), and not split.
    assert!(splits.iter().any(|&s| s > 1), "{splits:?}");
    assert!(splits.contains(&1), "{splits:?}");
    // Single blocks, one-level and two-level combines (groups of about √members) all ran.
    assert!(
        members.contains(&1) || members.iter().any(|&b| b <= 8),
        "{members:?}"
    );
    assert!(members.iter().any(|&b| b > 8), "{members:?}");
}

/// Two ResNet-20 training steps (batch 2) as the CUDA trainer lowers them, on an emulated device
/// reporting 4 SMs (tall tiles, split reductions, split-K with two-level combines, epilogue
/// reductions combined across blocks): each step ends as the CPU backend's step from the same
/// variables ends, and two sessions end bit for bit equal. (Steps are compared one at a time:
/// batch norm over 2 images makes the step chaotic — variables 2e-6 apart before a step end
/// 1e-2 apart after it, on the CPU alone.)
///
/// A single step can be ill-conditioned too: a ReLU input within rounding of zero lands on
/// one side on the device and on the other on the CPU (seen: `res1.2/Relu`, 1.6e-7 on the
/// CPU, 0 on the device, for the second step's feeds once the stage-1 tiles changed), and the
/// gradient upstream of it then differs by 1e-3, as it would between any two summation orders
/// (the CPU's own AVX-512 and scalar steps differ by 5e-3 on another seed's feeds). So each
/// step also fetches every forward ReLU's input, and a step where the device and the CPU put
/// one on opposite sides of zero is not compared (its feeds are replaced by the next seed's);
/// two steps without such a flip must match.
#[test]
fn resnet20_training_steps_match_the_cpu_and_repeat_bitwise() {
    cuda_common::require_nvrtc();
    let tg = cuda_common::resnet20();
    let lower = lowering(true);
    let batch = 2;
    let session = || {
        let options = CudaOptions {
            cache_dir: None,
            lower,
            ..CudaOptions::default()
        };
        let mut s = cuda_common::emulated_session(tg.graph.clone(), 4, options);
        s.initialize_variables(3).expect("init");
        s
    };
    let (mut a, mut b) = (session(), session());
    let mut cpu = CpuSession::new(
        tg.graph.clone(),
        CpuOptions {
            threads: 2,
            lower,
            ..CpuOptions::default()
        },
    )
    .expect("cpu session");
    // The training step, also fetching every forward ReLU's input.
    let g = &tg.graph;
    let relu_inputs: Vec<Value> = g
        .node_ids()
        .filter(|&n| {
            matches!(g.node(n).op, Op::Unary(UnaryOp::Relu))
                && !g.node(n).name.starts_with("gradients/")
        })
        .map(|n| g.inputs(n)[0])
        .collect();
    assert!(
        relu_inputs.len() >= 19,
        "ResNet-20's ReLUs: {}",
        relu_inputs.len()
    );
    let fetched = tg.step.fetches.len();
    let step_with_relus = Step::new(
        tg.step
            .fetches
            .iter()
            .copied()
            .chain(relu_inputs.iter().copied())
            .collect(),
        tg.step.targets.clone(),
    );
    let mut steps_compared = 0;
    for seed in 0..8 {
        if steps_compared == 2 {
            break;
        }
        for (id, _) in tg.graph.variable_ids() {
            let v = a.read_variable(id).expect("read");
            cpu.write_variable(id, &v).expect("write");
        }
        let feeds = cuda_common::feeds(&tg, batch, seed);
        let on_cpu = cpu.run(&step_with_relus, &feeds).expect("cpu step");
        let on_device = a.run(&step_with_relus, &feeds).expect("emulated step");
        b.run(&step_with_relus, &feeds).expect("emulated step");
        let flips: usize = on_device[fetched..]
            .iter()
            .zip(&on_cpu[fetched..])
            .map(|(d, c)| {
                let (d, c) = (d.to_f32_vec(), c.to_f32_vec());
                d.iter()
                    .zip(&c)
                    .filter(|(x, y)| (**x > 0.0) != (**y > 0.0))
                    .count()
            })
            .sum();
        let mut compared = 0;
        for (id, def) in tg.graph.variable_ids() {
            let (x, y, want) = (
                a.read_variable(id).expect("read"),
                b.read_variable(id).expect("read"),
                cpu.read_variable(id).expect("read"),
            );
            assert!(
                x.to_le_bytes() == y.to_le_bytes(),
                "seed {seed}, {}: two emulated sessions differ",
                def.name
            );
            if flips > 0 {
                continue;
            }
            let err = normalized_error(&x, &want);
            assert!(
                err <= 2e-5,
                "seed {seed}, {}: error {err:.3e} against the CPU",
                def.name
            );
            compared += 1;
        }
        if flips > 0 {
            eprintln!("seed {seed}: {flips} ReLU input(s) on opposite sides of zero; not compared");
            continue;
        }
        assert!(compared > 60, "ResNet-20's variables: {compared}");
        steps_compared += 1;
    }
    assert_eq!(steps_compared, 2, "steps without a ReLU flip among 8 seeds");
}

/// A convolution's input gradient of random geometry — strides 1 to 3 and dilations 1 to 3 per
/// axis, kernels 1×1 to 4×3, explicit asymmetric padding, one or two groups, odd image sizes —
/// alone (long-K shapes may split along K) or feeding a per-channel sum (an epilogue reduction
/// combined over every block of the channel tile).
fn dgrad_case(seed: u64, with_sum: bool) -> Case {
    let mut c = Case::new(seed, 2);
    let groups = c.rng.random_range(1..3);
    let channels = groups * [1, 3, 4, 8][c.rng.random_range(0..4)];
    let outs = groups * [1, 4, 5, 16, 40, 96][c.rng.random_range(0..6)];
    let kernel = [c.rng.random_range(1..5), c.rng.random_range(1..4)];
    let strides = [c.rng.random_range(1..4), c.rng.random_range(1..4)];
    let dilations = [c.rng.random_range(1..4), c.rng.random_range(1..4)];
    let pad = |c: &mut Case| (c.rng.random_range(0..3), c.rng.random_range(0..3));
    let padding = Padding::Explicit([pad(&mut c), pad(&mut c)]);
    let (h, w) = (c.rng.random_range(9..16), c.rng.random_range(7..14));
    let attrs = Conv2dAttrs {
        strides,
        padding,
        dilations,
        groups,
    };
    let x = c.input(DType::F32, &[h, w, channels]);
    let filter = c.constant(&[kernel[0], kernel[1], channels / groups, outs]);
    // The forward convolution only gives dy its shape (nothing fetches it).
    let y = c.add("conv", Op::Conv2d(attrs), &[x, filter]);
    let dx = input_gradient(&mut c, attrs, y, filter, [h, w]);
    c.fetch(dx);
    if with_sum {
        let sum = c.reduce(ReduceOp::Sum, vec![0, 1, 2], dx);
        c.fetch(sum);
    }
    c
}

#[test]
fn strided_input_gradients_run_by_phase_match_the_cpu_and_repeat_bitwise() {
    let (mut phased, mut split_phased, mut reduced_phased) = (0, 0, 0);
    for seed in 0..24 {
        let with_sum = seed % 2 == 1;
        let c = dgrad_case(seed, with_sum);
        for sms in [132, 2] {
            let program = check(&c, sms, &lowering(true), 1e-5);
            for (kind, grid, generated) in launches(&program, sms) {
                if kind != "conv2d_backprop_input" {
                    continue;
                }
                let Some(phases_h) = define(&generated, "TP_PHASES_H") else {
                    continue;
                };
                let phases = phases_h * defined(&generated, "TP_PHASES_W");
                assert!(phases > 1, "{generated}");
                let tiles = generated
                    .lines()
                    .find_map(|l| l.strip_prefix("#define TP_PHASE_TILES ((int)"))
                    .and_then(|v| v.trim_end_matches(')').parse::<u32>().ok())
                    .unwrap_or_else(|| panic!("TP_PHASE_TILES in\n{generated}"));
                assert_eq!(grid[0], tiles * phases as u32, "one row of tiles per phase");
                phased += 1;
                split_phased += usize::from(defined(&generated, "TP_SPLIT_K") > 1);
                reduced_phased += usize::from(define(&generated, "TP_EPI_RED").unwrap_or(0) > 0);
            }
        }
    }
    // Phases ran alone, split along K and with epilogue reductions across their blocks.
    assert!(phased >= 20, "{phased} phased launches");
    assert!(split_phased > 0, "no phased launch was split along K");
    assert!(
        reduced_phased > 0,
        "no phased launch reduced in its epilogue"
    );
}
