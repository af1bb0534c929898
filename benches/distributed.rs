//! Benchmarks of distributed training over MPI (feature `mpi`; needs `mpirun`):
//!
//! 1. `allreduce`: one bucket all-reduced across 2 ranks by the engine (f32 and bf16 wire,
//!    nonblocking with the heartbeat watchdog, through staging buffers) against a plain copy of
//!    the same bytes and against bare `MPI_Allreduce` / `MPI_Iallreduce` calls (rsmpi) on them;
//!    16 bytes is the size of the per-step agreement of 2 ranks;
//! 2. `train`: training throughput (images/s) of 1 rank and of 2 ranks on this machine, for the
//!    CIFAR ResNet-20 and the MLP 784-512-512-10, with 1 rank at the per-rank batch (1 thread),
//!    1 rank at the total batch using both cores, and 2 ranks (1 thread each).
//!
//! `cargo bench --features mpi --bench distributed [-- allreduce|train]`. The bench launches
//! `mpirun` on itself; every figure of one table is measured in one run (the machine is
//! shared: compare ratios, not absolute numbers).

use std::hint::black_box;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mpi::collective::{CommunicatorCollectives, SystemOperation};
use towerpack::backend::collective::mpi::MpiEngine;
use towerpack::backend::collective::{CollectiveEngine, CollectiveError, WireFormat};
use towerpack::backend::{BackendError, Collective};
use towerpack::ir::ReduceOp;
use towerpack::models::{CifarResNet, Mlp};
use towerpack::optim::Optimizer;
use towerpack::train::distributed::DistributedOptions;
use towerpack::train::*;

const ROLE: &str = "TOWERPACK_BENCH_RANK_ROLE";

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        rank_main(&role);
        return;
    }
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let run = |s: &str| wanted.is_empty() || wanted.iter().any(|w| w == s);
    if run("allreduce") {
        println!(
            "== one bucket all-reduced across 2 ranks vs a copy of the same bytes (best of interleaved rounds)"
        );
        print!("{}", mpirun(2, "allreduce"));
    }
    if run("train") {
        println!(
            "== training throughput, images/s (steps 3..13 of a run; median of 3 runs, the \
             three setups interleaved)"
        );
        println!(
            "{:<10} {:>22} {:>22} {:>24} {:>18}",
            "model",
            "1 rank, 1 thread, B",
            "1 rank, 2 threads, 2B",
            "2 ranks, 1 thread, B",
            "2 ranks/2 threads"
        );
        for model in ["resnet20", "mlp"] {
            let batch = if model == "mlp" { 128 } else { 32 };
            let setups = [
                (1, format!("train {model} {batch} 1")),
                (1, format!("train {model} {} 2", 2 * batch)),
                (2, format!("train {model} {batch} 1")),
            ];
            let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); setups.len()];
            for _ in 0..3 {
                for (i, (ranks, role)) in setups.iter().enumerate() {
                    let out = mpirun(*ranks, role);
                    let mut fields = out.split_whitespace().map(|f| f.parse::<f64>());
                    let images = fields.next().and_then(Result::ok).expect("images/s");
                    let reduce = fields.next().and_then(Result::ok).expect("all-reduce %");
                    runs[i].push((images, reduce));
                }
            }
            let median: Vec<(f64, f64)> = runs
                .iter_mut()
                .map(|r| {
                    r.sort_by(|a, b| a.0.total_cmp(&b.0));
                    r[r.len() / 2]
                })
                .collect();
            println!(
                "{model:<10} {:>22.1} {:>22.1} {:>24} {:>18.2}",
                median[0].0,
                median[1].0,
                format!("{:.1} ({:.0}% all-reduce)", median[2].0, median[2].1),
                median[2].0 / median[1].0
            );
        }
    }
}

/// Runs this bench as `ranks` MPI ranks in `role`; returns rank 0's output.
fn mpirun(ranks: usize, role: &str) -> String {
    let exe = std::env::current_exe().expect("bench binary");
    let out = Command::new("mpirun")
        .args(["--bind-to", "none", "-np", &ranks.to_string()])
        .arg(exe)
        .env(ROLE, role)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()
        .expect("mpirun (apt-get install openmpi-bin libopenmpi-dev)");
    assert!(
        out.status.success(),
        "mpirun {role} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn rank_main(role: &str) {
    let engine = MpiEngine::init_from_env().expect("MPI");
    let args: Vec<&str> = role.split(' ').collect();
    match args[0] {
        "allreduce" => allreduce(&engine),
        "train" => {
            let batch: usize = args[2].parse().expect("batch");
            let threads: usize = args[3].parse().expect("threads");
            train(engine.clone(), args[1], batch, threads);
        }
        other => panic!("unknown role {other}"),
    }
}

fn allreduce(engine: &Arc<MpiEngine>) {
    let world = mpi::topology::SimpleCommunicator::world();
    if engine.rank() == 0 {
        println!(
            "{:>9} {:>9} {:>13} {:>14} {:>14} {:>15} {:>9} {:>9}",
            "bytes",
            "copy µs",
            "f32 engine µs",
            "bf16 engine µs",
            "MPI_Allreduce",
            "MPI_Iallreduce",
            "f32/copy",
            "raw/copy"
        );
    }
    for bytes in [16usize, 256 << 10, 4 << 20, 64 << 20] {
        let n = bytes / 4;
        let src: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 1e-3).collect();
        let mut dst = vec![0f32; n];
        let mut data = src.clone();
        // Rounds interleave the variants, so that load from other processes of the shared
        // machine hits them alike; each keeps its best time.
        let mut t = [f64::MAX; 5];
        for _ in 0..if bytes > 16 << 20 { 8 } else { 30 } {
            let mut timed = |k: usize, f: &mut dyn FnMut()| {
                world.barrier();
                let start = Instant::now();
                f();
                t[k] = t[k].min(start.elapsed().as_secs_f64());
            };
            timed(0, &mut || {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            });
            timed(1, &mut || {
                engine
                    .all_reduce_as(&mut data, ReduceOp::Mean, WireFormat::F32)
                    .expect("all-reduce");
            });
            timed(2, &mut || {
                engine
                    .all_reduce_as(&mut data, ReduceOp::Mean, WireFormat::Bf16)
                    .expect("all-reduce");
            });
            timed(3, &mut || {
                world.all_reduce_into(&src[..], &mut dst[..], SystemOperation::sum());
            });
            timed(4, &mut || {
                mpi::request::scope(|scope| {
                    world
                        .immediate_all_reduce_into(
                            scope,
                            &src[..],
                            &mut dst[..],
                            SystemOperation::sum(),
                        )
                        .wait();
                });
            });
        }
        if engine.rank() == 0 {
            println!(
                "{bytes:>9} {:>9.1} {:>13.1} {:>14.1} {:>14.1} {:>15.1} {:>9.2} {:>9.2}",
                t[0] * 1e6,
                t[1] * 1e6,
                t[2] * 1e6,
                t[3] * 1e6,
                t[4] * 1e6,
                t[1] / t[0],
                t[3] / t[0]
            );
        }
    }
}

/// Records the wall time between global steps `from` and `to`, and flags that span.
struct StepClock {
    from: u64,
    to: u64,
    started: Option<Instant>,
    elapsed_ns: Arc<AtomicU64>,
    measuring: Arc<AtomicBool>,
}

/// The MPI engine, timing the gradient all-reduces made while `measuring`.
struct Timed {
    inner: Arc<MpiEngine>,
    measuring: Arc<AtomicBool>,
    reduce_ns: AtomicU64,
}

impl Collective for Timed {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn size(&self) -> usize {
        self.inner.size()
    }
    fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), BackendError> {
        let start = Instant::now();
        let out = self.inner.all_reduce(data, op);
        if self.measuring.load(Ordering::Relaxed) {
            self.reduce_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        out
    }
}

impl CollectiveEngine for Timed {
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn local_size(&self) -> usize {
        self.inner.local_size()
    }
    fn host(&self) -> String {
        self.inner.host()
    }
    fn all_reduce_as(
        &self,
        data: &mut [f32],
        op: ReduceOp,
        wire: WireFormat,
    ) -> Result<(), CollectiveError> {
        self.inner.all_reduce_as(data, op, wire)
    }
    fn broadcast(&self, data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        self.inner.broadcast(data, root)
    }
    fn gradient_wire(&self) -> WireFormat {
        self.inner.gradient_wire()
    }
    fn set_gradient_wire(&self, wire: WireFormat) {
        self.inner.set_gradient_wire(wire)
    }
}

impl Callback for StepClock {
    fn chief_only(&self) -> bool {
        false
    }
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if ctx.global_step() == self.from {
            self.started = Some(Instant::now());
            self.measuring.store(true, Ordering::Relaxed);
        }
        if ctx.global_step() == self.to
            && let Some(t) = self.started
        {
            self.elapsed_ns
                .store(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            self.measuring.store(false, Ordering::Relaxed);
        }
        Ok(())
    }
}

fn train(engine: Arc<MpiEngine>, model: &str, batch: usize, threads: usize) {
    let (from, to) = (3u64, 13u64);
    let elapsed = Arc::new(AtomicU64::new(0));
    let (model_fn, shapes) = match model {
        "resnet20" => {
            let net = CifarResNet::new(3);
            let m = ModelFn::new(
                net.inputs(),
                move |x| net.build(x),
                Optimizer::momentum(0.1, 0.9),
            );
            (m, vec![vec![batch, 32, 32, 3], vec![batch]])
        }
        "mlp" => {
            let net = Mlp::default();
            let m = ModelFn::new(
                net.inputs(),
                move |x| net.build(x),
                Optimizer::momentum(0.1, 0.9),
            );
            (m, vec![vec![batch, 28, 28], vec![batch]])
        }
        other => panic!("unknown model {other}"),
    };
    let size = engine.size();
    let measuring = Arc::new(AtomicBool::new(false));
    let timed = Arc::new(Timed {
        inner: engine,
        measuring: measuring.clone(),
        reduce_ns: AtomicU64::new(0),
    });
    let config = TrainConfig::new(model_fn)
        .data(DummyConstantInput::new(shapes))
        .backend(BackendChoice::Cpu { threads })
        .steps_per_epoch(to)
        .max_epoch(1)
        .extra_callbacks(Vec::new())
        .monitors(Vec::new())
        .callback(StepClock {
            from,
            to,
            started: None,
            elapsed_ns: elapsed.clone(),
            measuring,
        });
    let mut trainer = DistributedTrainer::new(timed.clone(), DistributedOptions::default());
    trainer.launch(config).expect("training");
    if trainer.rank() == 0 {
        let secs = Duration::from_nanos(elapsed.load(Ordering::Relaxed)).as_secs_f64();
        let images = (to - from) as usize * batch * size;
        let reduce = Duration::from_nanos(timed.reduce_ns.load(Ordering::Relaxed)).as_secs_f64();
        println!("{:.1} {:.1}", images as f64 / secs, 100.0 * reduce / secs);
    }
}
