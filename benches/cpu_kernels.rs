//! Benchmarks of the CPU kernels on the shapes that matter: the convolutions of a CIFAR ResNet-20
//! training step at batch 128, the MLP 784-512-512-10 GEMMs at batch 256 with their gradients,
//! the 8×10×10 product of a batch-8 `Linear(10, 10)`, and the GEMM crate comparison.
//!
//! `cargo bench --bench cpu_kernels [-- SECTION...]` with sections `gemm-crates`, `gemm`, `conv`,
//! `conv-algos`, `tiny`, `other`, `fused` (all by default). `--machine` prints one `kind name seconds gflops` line per
//! measurement (read by `bench/conv_shapes.py`). Threads: the rayon default (all cores), or
//! `RAYON_NUM_THREADS`. SIMD level: the detected one capped by `TOWERPACK_SIMD`; `conv-algos`
//! runs every vector level allowed. Timings are the best of several repetitions; the machine is shared, so
//! compare figures measured in one run only.

#[path = "cpu_kernels/fused.rs"]
mod fused;

use std::hint::black_box;
use std::time::Instant;

use towerpack::lower::HalfFormat;

use towerpack::backend::cpu::kernels::pool::{Pool2dGeometry, max_pool_backward, max_pool_forward};
use towerpack::backend::cpu::kernels::reduce::{column_moments, column_sums_dy_xhat};
use towerpack::backend::cpu::kernels::softmax::{
    sparse_softmax_cross_entropy, sparse_softmax_cross_entropy_backward,
    sparse_softmax_cross_entropy_with_grad,
};
use towerpack::backend::cpu::kernels::{
    ChannelEpilogue, Conv2dGeometry, ConvAlgorithm, ConvPass, MatRef, NoEpilogue, Padding2d,
    SimdLevel, bf16_tiles_unsupported, conv2d_backward_filter, conv2d_backward_filter_bf16,
    conv2d_backward_filter_with, conv2d_backward_input, conv2d_backward_input_bf16,
    conv2d_backward_input_with, conv2d_forward, conv2d_forward_bf16, conv2d_forward_with, sgemm,
};

/// Seconds of CPU time all threads of this process have run (from `/proc/self/task/*/schedstat`),
/// divided by the rayon thread count: on a busy machine it approximates the wall time the same
/// work takes on an idle one (`BENCH_CPU_TIME=1`; Linux only).
fn cpu_seconds() -> f64 {
    let mut total_ns = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            total_ns += stat
                .split(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
    }
    total_ns as f64 * 1e-9 / rayon::current_num_threads() as f64
}

/// Best seconds per call of `f` over `rounds` rounds of at least `min_secs` each. Calls run in
/// batches of at least ~20 µs between clock reads (reading the clock costs ~100 ns here).
fn time(min_secs: f64, rounds: usize, mut f: impl FnMut()) -> f64 {
    let cpu = std::env::var("BENCH_CPU_TIME").is_ok_and(|v| v == "1");
    let clock = || if cpu { cpu_seconds() } else { 0.0 };
    let warm = Instant::now();
    f();
    let once = warm.elapsed().as_secs_f64();
    let batch = ((20e-6 / once.max(1e-9)) as u32).clamp(1, 100_000);
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let start = Instant::now();
        let cpu_start = clock();
        let mut reps = 0u32;
        while reps == 0 || start.elapsed().as_secs_f64() < min_secs {
            for _ in 0..batch {
                f();
            }
            reps += batch;
        }
        let secs = if cpu {
            clock() - cpu_start
        } else {
            start.elapsed().as_secs_f64()
        };
        best = best.min(secs / f64::from(reps));
    }
    best
}

struct Report {
    machine: bool,
}

impl Report {
    fn line(&self, kind: &str, name: &str, secs: f64, flops: f64) {
        let gflops = flops / secs / 1e9;
        if self.machine {
            println!("{kind} {name} {secs:.9} {gflops:.2}");
        } else if secs < 1e-4 {
            println!(
                "{kind:<10} {name:<40} {:>10.3} µs {gflops:>8.1} GFLOP/s",
                secs * 1e6
            );
        } else {
            println!(
                "{kind:<10} {name:<40} {:>10.3} ms {gflops:>8.1} GFLOP/s",
                secs * 1e3
            );
        }
    }
}

fn data(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104729) % 2003) as f32 / 1001.5 - 1.0)
        .collect()
}

/// `(name, m, n, k, a transposed, b transposed)`: the MLP's forward GEMMs and their gradients.
const MLP_GEMMS: [(&str, usize, usize, usize, bool, bool); 9] = [
    ("fc1 fwd 256x512x784", 256, 512, 784, false, false),
    ("fc2 fwd 256x512x512", 256, 512, 512, false, false),
    ("fc3 fwd 256x10x512", 256, 10, 512, false, false),
    ("fc1 dW 784x512x256 (At)", 784, 512, 256, true, false),
    ("fc2 dX 256x512x512 (Bt)", 256, 512, 512, false, true),
    ("fc2 dW 512x512x256 (At)", 512, 512, 256, true, false),
    ("fc3 dX 256x512x10 (Bt)", 256, 512, 10, false, true),
    ("fc3 dW 512x10x256 (At)", 512, 10, 256, true, false),
    ("fc1 dX 256x784x512 (Bt)", 256, 784, 512, false, true),
];

fn views<'a>(
    a: &'a [f32],
    b: &'a [f32],
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
) -> (MatRef<'a>, MatRef<'a>) {
    let a = if ta {
        MatRef::transposed(a, m)
    } else {
        MatRef::row_major(a, k)
    };
    let b = if tb {
        MatRef::transposed(b, k)
    } else {
        MatRef::row_major(b, n)
    };
    (a, b)
}

fn bench_gemm(r: &Report) {
    for (name, m, n, k, ta, tb) in MLP_GEMMS {
        let (a, b) = (data(m * k, 1), data(k * n, 2));
        let mut c = vec![0.0; m * n];
        let (av, bv) = views(&a, &b, m, n, k, ta, tb);
        let secs = time(0.05, 5, || {
            sgemm(m, n, k, 1.0, av, bv, 0.0, &mut c, n).unwrap()
        });
        r.line("gemm", name, secs, 2.0 * (m * n * k) as f64);
    }
}

/// `gemm` (1 and all threads) against `matrixmultiply` (all threads) on raw pointers.
fn bench_gemm_crates(r: &Report) {
    let threads = rayon::current_num_threads();
    let conv_like = [
        ("conv 32x32x16 131072x16x144", 131072, 16, 144, false, false),
        ("conv 16x16x32 32768x32x288", 32768, 32, 288, false, false),
        ("conv 8x8x64 8192x64x576", 8192, 64, 576, false, false),
        ("tiny 8x10x10", 8, 10, 10, false, false),
    ];
    for (name, m, n, k, ta, tb) in MLP_GEMMS.into_iter().chain(conv_like) {
        let (a, b) = (data(m * k, 1), data(k * n, 2));
        let mut c = vec![0.0f32; m * n];
        let (ars, acs) = if ta { (1, m as isize) } else { (k as isize, 1) };
        let (brs, bcs) = if tb { (1, k as isize) } else { (n as isize, 1) };
        let flops = 2.0 * (m * n * k) as f64;
        for (label, par) in [
            ("gemm-1t", gemm::Parallelism::None),
            ("gemm-all", gemm::Parallelism::Rayon(threads)),
        ] {
            // SAFETY: the pointers and strides describe the vectors above exactly.
            let secs = time(0.05, 5, || unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    acs,
                    ars,
                    b.as_ptr(),
                    bcs,
                    brs,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    par,
                )
            });
            r.line(label, name, secs, flops);
        }
        // SAFETY: as above.
        let secs = time(0.05, 5, || unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                ars,
                acs,
                b.as_ptr(),
                brs,
                bcs,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        });
        r.line("mm-all", name, secs, flops);
    }
}

/// The convolutions of a CIFAR ResNet-20 training step at batch 128 (TF 'same' padding), with
/// how many times each occurs in the network.
fn resnet20_convs() -> Vec<(&'static str, Conv2dGeometry, usize)> {
    let conv = |hw: usize, c: usize, o: usize, k: usize, stride: usize| {
        let mut g = Conv2dGeometry::new(128, [hw, hw], c, o, [k, k]);
        g.strides = [stride, stride];
        let out = hw.div_ceil(stride);
        let total = ((out - 1) * stride + k).saturating_sub(hw);
        g.padding = Padding2d {
            top: total / 2,
            bottom: total - total / 2,
            left: total / 2,
            right: total - total / 2,
        };
        g
    };
    vec![
        ("conv0 32x32x3->16", conv(32, 3, 16, 3, 1), 1),
        ("s1 32x32x16->16", conv(32, 16, 16, 3, 1), 6),
        ("t1 32x32x16->32 s2", conv(32, 16, 32, 3, 2), 1),
        ("s2 16x16x32->32", conv(16, 32, 32, 3, 1), 5),
        ("t2 16x16x32->64 s2", conv(16, 32, 64, 3, 2), 1),
        ("s3 8x8x64->64", conv(8, 64, 64, 3, 1), 5),
        ("p1 32x32x16->32 1x1 s2", conv(32, 16, 32, 1, 2), 0),
        ("p2 16x16x32->64 1x1 s2", conv(16, 32, 64, 1, 2), 0),
    ]
}

fn bench_conv(r: &Report) {
    let mut step_secs = 0.0;
    let mut step_flops = 0.0;
    for (name, g, count) in resnet20_convs() {
        let x = data(g.input_len(), 3);
        let w = data(g.filter_len(), 4);
        let dy = data(g.output_len(), 5);
        let mut y = vec![0.0; g.output_len()];
        let mut dx = vec![0.0; g.input_len()];
        let mut dw = vec![0.0; g.filter_len()];
        let flops = 2.0 * g.macs() as f64;
        let fwd = time(0.1, 3, || {
            conv2d_forward(&g, &x, &w, &mut y, &NoEpilogue).unwrap()
        });
        r.line("conv-fwd", name, fwd, flops);
        let bwd_in = time(0.1, 3, || {
            conv2d_backward_input(&g, &dy, &w, &mut dx, &NoEpilogue).unwrap()
        });
        r.line("conv-bwdin", name, bwd_in, flops);
        let bwd_w = time(0.1, 3, || {
            conv2d_backward_filter(&g, &x, &dy, &mut dw).unwrap()
        });
        r.line("conv-bwdw", name, bwd_w, flops);
        // conv0's input gradient is not needed in training.
        let passes = if name.starts_with("conv0") {
            fwd + bwd_w
        } else {
            fwd + bwd_in + bwd_w
        };
        step_secs += count as f64 * passes;
        step_flops += count as f64 * flops * if name.starts_with("conv0") { 2.0 } else { 3.0 };
        if name.starts_with("s1") {
            let (scale, shift) = (data(16, 6), data(16, 7));
            let residual = data(g.output_len(), 8);
            let epilogue = ChannelEpilogue {
                scale: Some(&scale),
                shift: Some(&shift),
                residual: Some(&residual),
                relu: true,
            };
            let fused = time(0.1, 3, || {
                conv2d_forward(&g, &x, &w, &mut y, &epilogue).unwrap()
            });
            r.line(
                "conv-fwd",
                "s1 + bn-apply+residual+relu epilogue",
                fused,
                flops,
            );
        }
    }
    r.line(
        "conv-step",
        "resnet20 all convs, one step",
        step_secs,
        step_flops,
    );
    if !r.machine {
        println!(
            "           => {:.0} img/s if the step were only its convolutions",
            128.0 / step_secs
        );
    }
}

/// Each convolution pass under each pinned algorithm, at each vector SIMD level this machine
/// (and `TOWERPACK_SIMD`) allows: `direct-avx2` against `direct-avx512` and `im2col-*`.
fn bench_conv_algorithms(r: &Report) {
    let levels: Vec<SimdLevel> = SimdLevel::available()
        .into_iter()
        .filter(|&l| l >= SimdLevel::Avx2)
        .collect();
    for (name, g, _) in resnet20_convs() {
        let x = data(g.input_len(), 3);
        let w = data(g.filter_len(), 4);
        let dy = data(g.output_len(), 5);
        let mut y = vec![0.0; g.output_len()];
        let mut dx = vec![0.0; g.input_len()];
        let mut dw = vec![0.0; g.filter_len()];
        let flops = 2.0 * g.macs() as f64;
        for &level in &levels {
            for (label, algo) in [
                ("im2col", ConvAlgorithm::Im2colGemm),
                ("direct", ConvAlgorithm::Direct),
                ("winograd", ConvAlgorithm::Winograd),
            ] {
                let label = format!("{label}-{level}");
                // Each pass the algorithm runs (Winograd: not the filter gradient, nor strided
                // or 3-channel layers).
                level.run(|| {
                    let mut fwd =
                        || conv2d_forward_with(algo, &g, &x, &w, &mut y, &NoEpilogue, None);
                    if fwd().is_ok() {
                        let secs = time(0.1, 3, || fwd().unwrap());
                        r.line(&format!("fwd-{label}"), name, secs, flops);
                    }
                    let mut bwdin = || {
                        conv2d_backward_input_with(algo, &g, &dy, &w, &mut dx, &NoEpilogue, None)
                    };
                    if bwdin().is_ok() {
                        let secs = time(0.1, 3, || bwdin().unwrap());
                        r.line(&format!("bwdin-{label}"), name, secs, flops);
                    }
                    let mut bwdw = || conv2d_backward_filter_with(algo, &g, &x, &dy, &mut dw, None);
                    if bwdw().is_ok() {
                        let secs = time(0.1, 3, || bwdw().unwrap());
                        r.line(&format!("bwdw-{label}"), name, secs, flops);
                    }
                });
            }
        }
        // bf16 on the vector kernels (operands rounded as they are copied: what a bf16 program
        // runs where the tiles do not pay off, or at avx2).
        let bf16 = Some(HalfFormat::Bf16);
        let direct = ConvAlgorithm::AutoDirect;
        let secs = time(0.1, 3, || {
            conv2d_forward_with(direct, &g, &x, &w, &mut y, &NoEpilogue, bf16).unwrap()
        });
        r.line("fwd-bf16-vector", name, secs, flops);
        let secs = time(0.1, 3, || {
            conv2d_backward_input_with(direct, &g, &dy, &w, &mut dx, &NoEpilogue, bf16).unwrap()
        });
        r.line("bwdin-bf16-vector", name, secs, flops);
        let secs = time(0.1, 3, || {
            conv2d_backward_filter_with(direct, &g, &x, &dy, &mut dw, bf16).unwrap()
        });
        r.line("bwdw-bf16-vector", name, secs, flops);
        // bf16 on AMX tiles (operands rounded as they are packed), where the machine has them.
        if bf16_tiles_unsupported(&g, ConvPass::Forward).is_none() {
            let secs = time(0.1, 3, || {
                conv2d_forward_bf16(&g, &x, &w, &mut y, &NoEpilogue).unwrap()
            });
            r.line("fwd-bf16-amx", name, secs, flops);
            let secs = time(0.1, 3, || {
                conv2d_backward_filter_bf16(&g, &x, &dy, &mut dw).unwrap()
            });
            r.line("bwdw-bf16-amx", name, secs, flops);
        }
        if bf16_tiles_unsupported(&g, ConvPass::InputGradient).is_none() {
            let secs = time(0.1, 3, || {
                conv2d_backward_input_bf16(&g, &dy, &w, &mut dx, &NoEpilogue).unwrap()
            });
            r.line("bwdin-bf16-amx", name, secs, flops);
        }
    }
}

fn bench_tiny(r: &Report) {
    let (m, n, k) = (8, 10, 10);
    let (x, w, dy) = (data(m * k, 1), data(k * n, 2), data(m * n, 3));
    let mut y = vec![0.0; m * n];
    let mut dw = vec![0.0; k * n];
    let mut dx = vec![0.0; m * k];
    let flops = 2.0 * (m * n * k) as f64;
    let fwd = time(0.05, 5, || {
        sgemm(
            m,
            n,
            k,
            1.0,
            MatRef::row_major(&x, k),
            MatRef::row_major(&w, n),
            0.0,
            &mut y,
            n,
        )
        .unwrap()
    });
    r.line("tiny", "8x10x10 forward", fwd, flops);
    let step = time(0.05, 5, || {
        let (x, w, dy) = (black_box(&x), black_box(&w), black_box(&dy));
        sgemm(
            m,
            n,
            k,
            1.0,
            MatRef::row_major(x, k),
            MatRef::row_major(w, n),
            0.0,
            &mut y,
            n,
        )
        .unwrap();
        sgemm(
            k,
            n,
            m,
            1.0,
            MatRef::transposed(x, k),
            MatRef::row_major(dy, n),
            0.0,
            &mut dw,
            n,
        )
        .unwrap();
        sgemm(
            m,
            k,
            n,
            1.0,
            MatRef::row_major(dy, n),
            MatRef::transposed(w, n),
            0.0,
            &mut dx,
            k,
        )
        .unwrap();
    });
    r.line("tiny", "8x10x10 fwd + dW + dX", step, 3.0 * flops);
    let labels: Vec<i32> = (0..8).map(|i| i % 10).collect();
    let (mut loss, mut dlogits, dloss) = (vec![0.0; 8], vec![0.0; 80], vec![0.125; 8]);
    let xent = time(0.05, 5, || {
        sparse_softmax_cross_entropy(&y, &labels, 10, &mut loss).unwrap();
        sparse_softmax_cross_entropy_backward(&y, &labels, 10, &dloss, &mut dlogits).unwrap();
    });
    r.line("tiny", "8x10 cross-entropy fwd + bwd", xent, 0.0);
    let one_pass = time(0.05, 5, || {
        sparse_softmax_cross_entropy_with_grad(&y, &labels, 10, Some(&mut loss), &mut dlogits)
            .unwrap()
    });
    r.line(
        "tiny",
        "8x10 cross-entropy loss+grad, one pass",
        one_pass,
        0.0,
    );
}

fn bench_other(r: &Report) {
    let (rows, c) = (128 * 32 * 32, 16);
    let x = data(rows * c, 1);
    let dy = data(rows * c, 2);
    let (mut mean, mut var) = (vec![0.0; c], vec![0.0; c]);
    let secs = time(0.05, 5, || {
        column_moments(&x, c, &mut mean, &mut var).unwrap()
    });
    r.line(
        "reduce",
        "bn moments [131072, 16]",
        secs,
        3.0 * (rows * c) as f64,
    );
    let (mut s1, mut s2) = (vec![0.0; c], vec![0.0; c]);
    let secs = time(0.05, 5, || {
        column_sums_dy_xhat(&dy, &x, &mean, &var, &mut s1, &mut s2).unwrap()
    });
    r.line(
        "reduce",
        "bn backward sums [131072, 16]",
        secs,
        5.0 * (rows * c) as f64,
    );
    let g = Pool2dGeometry {
        batch: 128,
        in_hw: [32, 32],
        channels: 16,
        window: [2, 2],
        strides: [2, 2],
        padding: Padding2d::default(),
    };
    let mut y = vec![0.0; g.output_len()];
    let mut dx = vec![0.0; g.input_len()];
    let secs = time(0.05, 5, || max_pool_forward(&g, &x, &mut y).unwrap());
    r.line("pool", "max 2x2 s2 [128, 32, 32, 16]", secs, 0.0);
    let dy = data(g.output_len(), 3);
    let secs = time(0.05, 5, || max_pool_backward(&g, &x, &dy, &mut dx).unwrap());
    r.line("pool", "max 2x2 s2 backward", secs, 0.0);
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let report = Report {
        machine: args.iter().any(|a| a == "--machine"),
    };
    let sections: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(String::as_str)
        .collect();
    let wanted = |s: &str| sections.is_empty() || sections.contains(&s);
    if !report.machine {
        println!("threads: {}", rayon::current_num_threads());
    }
    if wanted("tiny") {
        bench_tiny(&report);
    }
    if wanted("gemm") {
        bench_gemm(&report);
    }
    if wanted("conv") {
        bench_conv(&report);
    }
    if wanted("conv-algos") {
        bench_conv_algorithms(&report);
    }
    if wanted("other") {
        bench_other(&report);
    }
    if wanted("fused") {
        // One thread: the engine's cost per point, as each worker pays it.
        let time = |f: &mut dyn FnMut()| time(0.05, 5, f);
        let line = |name: &str, secs: f64, points: usize| {
            report.line("fused", name, secs, 0.0);
            if !report.machine {
                println!(
                    "{:<10} {:<40} {:>10.3} ns/point",
                    "",
                    "",
                    secs * 1e9 / points as f64
                );
            }
        };
        fused::bench(data, time, line);
    }
    if wanted("gemm-crates") {
        bench_gemm_crates(&report);
    }
}
