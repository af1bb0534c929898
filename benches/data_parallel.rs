//! Benchmarks of data-parallel training on the CPU backend.
//!
//! - `averaging`: the fused gradient-averaging kernel of a 2-tower parameter-server program (one
//!   bucket over a 3.1M-parameter MLP: read both towers' gradient arenas and the state, write the
//!   state, in one pass) against a plain copy of the same number of bytes (read half, write
//!   half), both on the same number of threads. Target: the kernel moves bytes at ≥ 0.8× the
//!   copy's rate.
//! - `resnet`: ResNet-20 (CIFAR) training throughput, images per second (and CPU seconds per
//!   1000 images, which the machine's other load disturbs less), with 1 tower at batch 2B
//!   against 2 towers at batch B (parameter server and replicated), on all cores.
//!
//! `cargo bench --bench data_parallel [-- averaging|resnet]`. Timings are the best of several
//! repetitions; the machine is shared, so compare only figures of one run.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use towerpack::backend::Step;
use towerpack::backend::cpu::exec::Prepared;
use towerpack::backend::cpu::memory::Arena;
use towerpack::ir::Graph;
use towerpack::lower::{LowerOptions, Program, lower};
use towerpack::models::{CifarResNet, Mlp};
use towerpack::optim::Optimizer;
use towerpack::train::*;

/// Seconds of CPU time all threads of this process have run (`/proc/self/task/*/schedstat`):
/// on a machine shared with other work it approximates what the wall time would be alone.
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
    total_ns as f64 * 1e-9
}

/// Mean seconds per call of `f` over at least `min_secs` of wall time: CPU seconds of the
/// process divided by `threads` (the threads `f` keeps busy).
fn time(min_secs: f64, threads: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let cpu = cpu_seconds();
    let mut reps = 0u32;
    while reps == 0 || start.elapsed().as_secs_f64() < min_secs {
        f();
        reps += 1;
    }
    (cpu_seconds() - cpu) / threads as f64 / f64::from(reps)
}

/// Best seconds per call of `a` and of `b` on `threads` threads, timed in alternation over
/// `rounds` rounds (on a shared machine, the load then weighs on both alike).
fn time_pair(
    rounds: usize,
    threads: usize,
    mut a: impl FnMut(),
    mut b: impl FnMut(),
) -> (f64, f64) {
    a();
    b();
    let (mut ta, mut tb) = (f64::MAX, f64::MAX);
    for _ in 0..rounds {
        ta = ta.min(time(0.1, threads, &mut a));
        tb = tb.min(time(0.1, threads, &mut b));
    }
    (ta, tb)
}

/// The lowered training step of `strategy` over an MLP with `hidden` layers and `optimizer`.
fn training_program(strategy: &dyn TowerStrategy, optimizer: Optimizer) -> Program {
    let mlp = Mlp {
        input_shape: vec![1024],
        hidden: vec![1024, 1024, 1024],
        classes: 10,
        weight_decay: 0.0,
        dropout_rate: 0.0,
    };
    let signature = mlp.inputs();
    let model = ModelFn::new(signature.clone(), move |x| mlp.build(x), optimizer);
    let mut graph = Graph::new();
    let mut input = DummyConstantInput::new(vec![vec![8, 1024], vec![8]]);
    input.setup(&signature).expect("input");
    let mut setup = GraphSetup {
        graph: &mut graph,
        seed: 1,
        input: &mut input,
        model: Some(Arc::new(model)),
        loss_scale: None,
    };
    let built = strategy.build(&mut setup).expect("build");
    let step = Step::new(Vec::new(), vec![built.train_op]);
    let options = LowerOptions {
        bucket_bytes: 1 << 30,
        ..LowerOptions::default()
    };
    lower(&graph, &step, 8, &options).expect("lower")
}

/// The program's first fused update kernel alone, ready to run, with its state arenas, and
/// the bytes it reads and writes. `streaming`: on the engine of fused update kernels (listed
/// in the program's buckets), else on the general fused-expression engine.
fn bucket_kernel(program: &Program, streaming: bool) -> (Prepared, Vec<Arena>, usize) {
    let bucket = program.buckets.first().expect("a fused update kernel");
    let kernel = program.kernels[bucket.kernel as usize].clone();
    let bytes: usize = kernel
        .inputs
        .iter()
        .map(|v| program.buffer(v.buffer))
        .chain(kernel.outputs.iter().map(|b| program.buffer(*b)))
        .filter(|b| b.len() > 1)
        .map(|b| b.bytes())
        .sum();
    let buckets = if streaming {
        vec![towerpack::lower::Bucket {
            kernel: 0,
            ..bucket.clone()
        }]
    } else {
        Vec::new()
    };
    let alone = Program {
        kernels: vec![kernel],
        waits: Vec::new(),
        buckets,
        feeds: Vec::new(),
        fetches: Vec::new(),
        writebacks: Vec::new(),
        ..program.clone()
    };
    let state = alone
        .state
        .arena_bytes
        .iter()
        .map(|&b| Arena::new(b))
        .collect();
    (Prepared::new(alone).expect("prepare"), state, bytes)
}

fn bench_averaging() {
    let ps = ParameterServerTowers {
        towers: TowerPlacement {
            devices: TowerDevices::Count(2),
            bucket_bytes: None,
        },
        parameter_device: Some(ParameterDevice::Tower(0)),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("fused averaging kernel of 2 towers over 3.16M parameters vs a copy of its bytes");
    println!(
        "{:<20} {:>7} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "update", "threads", "MB", "kernel", "general", "copy", "ratio", "general"
    );
    println!(
        "{:<20} {:>7} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "", "", "moved", "GB/s", "GB/s", "GB/s", "k/copy", "g/copy"
    );
    for (name, optimizer) in [
        ("average + SGD", Optimizer::sgd(0.1)),
        ("average + momentum", Optimizer::momentum(0.1, 0.9)),
    ] {
        let program = training_program(&ps, optimizer);
        let (mut kernel, mut state, bytes) = bucket_kernel(&program, true);
        let (mut general, mut general_state, _) = bucket_kernel(&program, false);
        let mut threads_tried = vec![1, cores];
        threads_tried.dedup();
        for threads in threads_tried {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            // A plain copy reading and writing the same number of bytes in total.
            let half = bytes / 2 / 4;
            let src = vec![1.0f32; half];
            let mut dst = vec![0.0f32; half];
            let chunk = half.div_ceil(threads * 4);
            let mut copy = || {
                pool.install(|| {
                    use rayon::prelude::*;
                    dst.par_chunks_mut(chunk)
                        .zip(src.par_chunks(chunk))
                        .for_each(|(d, s)| d.copy_from_slice(s));
                });
                std::hint::black_box(&dst);
            };
            let (kernel_secs, copy_secs) = time_pair(
                15,
                threads,
                || {
                    pool.install(|| kernel.run_kernels(&mut state, threads, None))
                        .expect("run");
                },
                &mut copy,
            );
            let (general_secs, _) = time_pair(
                15,
                threads,
                || {
                    pool.install(|| general.run_kernels(&mut general_state, threads, None))
                        .expect("run");
                },
                || {},
            );
            let rate = |secs: f64| bytes as f64 / secs / 1e9;
            println!(
                "{name:<20} {threads:>7} {:>8.1} {:>9.2} {:>9.2} {:>9.2} {:>7.2} {:>7.2}",
                bytes as f64 / 1e6,
                rate(kernel_secs),
                rate(general_secs),
                rate(copy_secs),
                copy_secs / kernel_secs,
                copy_secs / general_secs
            );
        }
    }
}

/// `(wall, cpu)` seconds of every epoch, recorded by a callback.
struct EpochTimes {
    start: Option<(Instant, f64)>,
    seconds: Arc<Mutex<Vec<(f64, f64)>>>,
}

impl Callback for EpochTimes {
    fn chief_only(&self) -> bool {
        false
    }
    fn before_epoch(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        self.start = Some((Instant::now(), cpu_seconds()));
        Ok(())
    }
    fn after_epoch(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        if let Some((wall, cpu)) = self.start.take() {
            let times = (wall.elapsed().as_secs_f64(), cpu_seconds() - cpu);
            self.seconds.lock().expect("times").push(times);
        }
        Ok(())
    }
}

/// ResNet-20 training with `trainer`, `towers` towers at `batch` each, over 3 epochs of
/// `steps` steps after one warm-up epoch: images per second (best epoch) and CPU seconds per
/// 1000 images (all threads, spinning included; best epoch).
fn resnet_throughput(
    trainer: &mut dyn Trainer,
    towers: usize,
    batch: usize,
    steps: u64,
) -> (f64, f64) {
    let net = CifarResNet::new(3);
    let signature = net.inputs();
    let model = ModelFn::new(
        signature,
        move |x| net.build(x),
        Optimizer::momentum(0.1, 0.9),
    );
    let seconds = Arc::new(Mutex::new(Vec::new()));
    let config = TrainConfig::new(model)
        .data(DummyConstantInput::new(vec![
            vec![batch, 32, 32, 3],
            vec![batch],
        ]))
        .extra_callbacks(Vec::new())
        .monitors(Vec::new())
        .callback(EpochTimes {
            start: None,
            seconds: Arc::clone(&seconds),
        })
        .steps_per_epoch(steps)
        .max_epoch(4);
    launch_train_with_config(config, trainer).expect("train");
    let times = seconds.lock().expect("times").clone();
    let images = (towers * batch) as f64 * steps as f64;
    let wall = times[1..].iter().map(|t| t.0).fold(f64::MAX, f64::min);
    let cpu = times[1..].iter().map(|t| t.1).fold(f64::MAX, f64::min);
    (images / wall, cpu / images * 1000.0)
}

fn bench_resnet() {
    println!(
        "ResNet-20 training, all cores ({} threads)",
        rayon::current_num_threads()
    );
    println!(
        "{:<44} {:>12} {:>16}",
        "trainer", "images/s", "CPU s/1000 img"
    );
    for total in [64, 128] {
        let rows: Vec<(String, Box<dyn Trainer>, usize)> = vec![
            (
                format!("SimpleTrainer, 1 tower x {total}"),
                Box::new(SimpleTrainer::new()),
                1,
            ),
            (
                format!("ParameterServer, 2 towers x {}", total / 2),
                Box::new(ParameterServerTrainer::new(2)),
                2,
            ),
            (
                format!("Replicated, 2 towers x {}", total / 2),
                Box::new(ReplicatedTrainer::new(2)),
                2,
            ),
        ];
        for (name, mut trainer, towers) in rows {
            let (ips, cpu) = resnet_throughput(trainer.as_mut(), towers, total / towers, 5);
            println!("{name:<44} {ips:>12.1} {cpu:>16.2}");
        }
    }
}

fn main() {
    let sections: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |s: &str| sections.is_empty() || sections.iter().any(|a| a == s);
    if wanted("averaging") {
        bench_averaging();
    }
    if wanted("resnet") {
        bench_resnet();
    }
}
