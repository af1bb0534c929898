//! Training-step throughput of whole models on the CPU backend, through the path a user's
//! training loop takes (`SimpleTrainer`'s graph from `build_training_graph`, one iteration's
//! step run on the `CpuSession`: feeds copied in, the lowered step — forward, backward,
//! Momentum update, BatchNorm moving averages, step counter — run, the cost copied out), and
//! the lowering time of a ResNet-50 training graph.
//!
//! `cargo bench --bench train_step [-- SECTION...] [--threads N] [--rounds R] [--secs S]
//! [--machine] [--profile] [--cpu-time] [--precision P] [--f32-activations]` with sections `resnet20` (batch 128, 32×32×3), `mlp`
//! (784-512-512-10, batch 256), `linear` (Linear(10, 10), batch 8: framework overhead) and
//! `lower` (ResNet-50 at 224×224); all by default. Threads default to 2 (what
//! `bench/compare.py` gives PyTorch). Each round runs steps for at least `S` seconds after two
//! warm-up steps (the first compiles); the median over rounds is reported.
//!
//! `--machine` prints `train NAME SECONDS EXAMPLES/S` and `lower resnet50 WALL_SECONDS
//! CPU_SECONDS` lines for `bench/compare.py`; `--profile` runs the steps on a profiling
//! session instead and prints the time per kernel; `--cpu-time` measures the process's CPU
//! seconds per thread, which a busy machine disturbs less than wall time. `--f32-activations`
//! keeps bf16 programs' activations in f32 (`LowerOptions::half_activations` off). The machine is
//! shared: only ratios measured in one run mean much.

use std::time::Instant;

use towerpack::backend::Session;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::dsl::InputSpec;
use towerpack::dsl::prelude::*;
use towerpack::lower::{LowerOptions, Precision, lower};
use towerpack::models::{CifarResNet, ImagenetResNet, Mlp};
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::train::{ModelFn, TrainingGraph, build_training_graph};

struct Args {
    sections: Vec<String>,
    threads: usize,
    rounds: usize,
    secs: f64,
    machine: bool,
    profile: bool,
    /// Measure CPU seconds of the process divided by the thread count instead of wall time.
    cpu_time: bool,
    /// How the models' GEMMs multiply (`--precision fp32|tf32|bf16|fp16`).
    precision: Precision,
    /// Keep activations in f32 under bf16 (`--f32-activations`).
    f32_activations: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        sections: Vec::new(),
        threads: 2,
        rounds: 5,
        secs: 1.0,
        machine: false,
        profile: false,
        cpu_time: false,
        precision: Precision::Fp32,
        f32_activations: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .unwrap_or_else(|| panic!("{name} needs a value"))
                .parse::<f64>()
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        match arg.as_str() {
            "--threads" => a.threads = value("--threads") as usize,
            "--rounds" => a.rounds = value("--rounds") as usize,
            "--secs" => a.secs = value("--secs"),
            "--machine" => a.machine = true,
            "--profile" => a.profile = true,
            "--cpu-time" => a.cpu_time = true,
            "--precision" => {
                let name = it
                    .next()
                    .unwrap_or_else(|| panic!("--precision needs a value"));
                a.precision = name.parse().unwrap_or_else(|e| panic!("--precision: {e}"));
            }
            "--f32-activations" => a.f32_activations = true,
            "--bench" => {}
            s if s.starts_with("--") => panic!("unknown flag {s}"),
            s => a.sections.push(s.to_string()),
        }
    }
    if a.sections.is_empty() {
        a.sections = ["resnet20", "mlp", "linear", "lower"]
            .map(String::from)
            .to_vec();
    }
    a
}

/// Deterministic pseudo-random batches: `f32` inputs uniform in `[-scale, scale)`, `i32`
/// labels in `0..classes`.
fn batches(
    signature: &[InputSpec],
    batch: usize,
    scale: f32,
    classes: i32,
) -> Vec<Vec<HostTensor>> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state = towerpack::ir::rng::mix64(state.wrapping_add(1));
        state
    };
    (0..4)
        .map(|_| {
            signature
                .iter()
                .map(|spec| {
                    let shape = spec.shape.resolve(batch);
                    let n: usize = shape.iter().product();
                    match spec.dtype {
                        DType::F32 => HostTensor::from_f32(
                            &shape,
                            (0..n)
                                .map(|_| ((next() >> 40) as f32 / 8_388_608.0 - 1.0) * scale)
                                .collect(),
                        ),
                        _ => HostTensor::from_f64_values(
                            spec.dtype,
                            &shape,
                            (0..n).map(|_| (next() % classes as u64) as f64).collect(),
                        ),
                    }
                    .expect("batch tensor")
                })
                .collect()
        })
        .collect()
}

/// Median and best of `rounds` measurements of seconds per step (wall time, or with
/// `--cpu-time` the process's CPU time divided by the thread count).
fn time_steps(args: &Args, mut step: impl FnMut(usize)) -> (f64, f64) {
    step(0);
    step(1);
    let clock = || {
        if args.cpu_time {
            process_cpu_seconds() / args.threads.max(1) as f64
        } else {
            0.0
        }
    };
    let mut rounds: Vec<f64> = (0..args.rounds)
        .map(|_| {
            let (start, cpu_start) = (Instant::now(), clock());
            let mut n = 0;
            while n == 0 || start.elapsed().as_secs_f64() < args.secs {
                step(n);
                n += 1;
            }
            let secs = if args.cpu_time {
                clock() - cpu_start
            } else {
                start.elapsed().as_secs_f64()
            };
            secs / n as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    (rounds[rounds.len() / 2], rounds[0])
}

/// CPU seconds all threads of this process have run (`/proc/self/task/*/schedstat`).
fn process_cpu_seconds() -> f64 {
    let tasks = std::fs::read_dir("/proc/self/task").into_iter().flatten();
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split(' ').next().and_then(|v| v.parse::<u64>().ok()))
        .sum::<u64>() as f64
        * 1e-9
}

fn report(args: &Args, name: &str, batch: usize, (median, best): (f64, f64)) {
    if args.machine {
        println!("train {name} {median:.9} {:.3}", batch as f64 / median);
    } else {
        println!(
            "{name:<10} batch {batch:<4} {:>10.1} µs/step {:>9.1} steps/s {:>9.1} examples/s \
             (best {:.1} µs)",
            median * 1e6,
            1.0 / median,
            batch as f64 / median,
            best * 1e6
        );
    }
}

fn bench_training(
    args: &Args,
    name: &str,
    batch: usize,
    signature: Vec<InputSpec>,
    tower: impl Fn(&[Tensor]) -> Tensor + Send + Sync + 'static,
    input_scale: f32,
) {
    let data = batches(&signature, batch, input_scale, 10);
    let tg = training_graph(signature, tower, 0.01);
    let mut session = CpuSession::new(
        tg.graph,
        CpuOptions {
            threads: args.threads,
            profile: args.profile,
            lower: LowerOptions {
                precision: args.precision,
                half_activations: !args.f32_activations,
                ..LowerOptions::default()
            },
            ..CpuOptions::default()
        },
    )
    .expect("session");
    session.initialize_variables(1).expect("init");
    let feeds = |i: usize| -> Vec<towerpack::backend::Feed> {
        tg.tower
            .inputs
            .iter()
            .zip(&data[i % data.len()])
            .map(|((_, id), t)| (*id, t.clone()))
            .collect()
    };
    if args.profile {
        // The same step on a profiling session: where the time goes.
        let start = Instant::now();
        let mut n = 0;
        while n < 3 || start.elapsed().as_secs_f64() < args.secs {
            session.run(&tg.step, &feeds(n)).expect("step");
            n += 1;
        }
        println!(
            "{name}: {n} steps in {:.3} s",
            start.elapsed().as_secs_f64()
        );
        println!("{}", session.profile_report());
        return;
    }
    let mut cost = 0.0;
    let times = time_steps(args, |i| {
        let out = session.run(&tg.step, &feeds(i)).expect("training step");
        cost = out[0].scalar_value().expect("scalar cost");
    });
    assert!(cost.is_finite(), "{name}: the cost diverged ({cost})");
    report(args, name, batch, times);
}

/// `SimpleTrainer`'s training graph of `tower` over `signature` with Momentum (graph seed 1).
fn training_graph(
    signature: Vec<InputSpec>,
    tower: impl Fn(&[Tensor]) -> Tensor + Send + Sync + 'static,
    learning_rate: f64,
) -> TrainingGraph {
    let model = ModelFn::new(signature, tower, Optimizer::momentum(learning_rate, 0.9));
    build_training_graph(&model, 1).expect("build the training graph")
}

/// `Linear(10, 10)` and the mean sparse softmax cross-entropy: nothing but framework overhead.
fn linear_tower(inputs: &[Tensor]) -> Tensor {
    let x = &inputs[0];
    let logits = towerpack::graph! { FullyConnected("fc", x, units = 10) };
    sparse_softmax_cross_entropy(&logits, &inputs[1]).mean()
}

/// Builds ResNet-50's training graph (untimed), then times `lower` of its step.
fn bench_lowering(args: &Args) {
    let model = ImagenetResNet::resnet50();
    let tg = training_graph(model.inputs(), move |x| model.build(x), 0.1);
    let (graph, step) = (&tg.graph, &tg.step);
    let batch = 32;
    let mut kernels = 0;
    // The verifier runs inside `lower`; it is also timed alone.
    let mut verify_wall = Vec::new();
    let mut times: Vec<(f64, f64)> = (0..args.rounds.max(3))
        .map(|_| {
            let (start, cpu_start) = (Instant::now(), thread_cpu_seconds());
            let p = lower(graph, step, batch, &LowerOptions::default()).expect("lower");
            let secs = (
                start.elapsed().as_secs_f64(),
                thread_cpu_seconds() - cpu_start,
            );
            kernels = p.kernels.len();
            let verify_start = Instant::now();
            towerpack::lower::verify(&p).expect("the program verifies");
            verify_wall.push(verify_start.elapsed().as_secs_f64());
            secs
        })
        .collect();
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    verify_wall.sort_by(f64::total_cmp);
    let (median, best) = (times[times.len() / 2], times[0]);
    if args.machine {
        println!("lower resnet50 {:.9} {:.9}", median.0, median.1);
    } else {
        println!(
            "lower      resnet50 training step ({} graph nodes, {kernels} kernels): {:.1} ms \
             wall, {:.1} ms CPU (best {:.1} ms wall), of which verification {:.1} ms wall",
            graph.node_count(),
            median.0 * 1e3,
            median.1 * 1e3,
            best.0 * 1e3,
            verify_wall[verify_wall.len() / 2] * 1e3
        );
    }
}

/// CPU seconds this thread has run (`/proc/thread-self/schedstat`; 0 where unavailable): on
/// a busy machine, the time the work takes on an idle one.
fn thread_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split(' ').next().and_then(|v| v.parse::<u64>().ok()))
        .map_or(0.0, |ns| ns as f64 * 1e-9)
}

fn main() {
    let args = parse_args();
    for section in args.sections.clone() {
        match section.as_str() {
            "resnet20" => {
                let m = CifarResNet::new(3);
                bench_training(
                    &args,
                    "resnet20",
                    128,
                    m.inputs(),
                    move |x| m.build(x),
                    128.0,
                );
            }
            "mlp" => {
                let m = Mlp::default();
                bench_training(&args, "mlp", 256, m.inputs(), move |x| m.build(x), 1.0);
            }
            "linear" => {
                let signature = vec![
                    InputSpec::new("input", DType::F32, Shape::batched(&[10])),
                    InputSpec::new("label", DType::I32, Shape::batched(&[])),
                ];
                bench_training(&args, "linear", 8, signature, linear_tower, 1.0);
            }
            "lower" => bench_lowering(&args),
            other => panic!("unknown section {other} (resnet20, mlp, linear, lower)"),
        }
    }
}
