//! The CUDA backend on the emulated device: one training step of the example programs (MLP,
//! ResNet-20) on `cuda-emu` and on the CPU backend side by side, with the emulator's
//! lane-instructions per second over the whole step (launch overhead, copies and compilation
//! excluded from nothing but the first step). Needs NVRTC. Run with
//! `cargo bench --bench cuda_emu`. Figures vary with machine load: compare them only within
//! one run.

#[path = "../tests/cuda_common/mod.rs"]
mod cuda_common;

use std::time::{Duration, Instant};
use towerpack::backend::Session;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::cuda::{CudaOptions, CudaSession};
use towerpack::models::{CifarResNet, Mlp};

fn best_of(reps: usize, mut f: impl FnMut()) -> Duration {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn main() {
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![256],
        ..Mlp::default()
    };
    let resnet = CifarResNet::new(3);
    let cases = vec![
        (
            "MLP 784-256-10, batch 64",
            cuda_common::training_graph(mlp.inputs(), |x| mlp.build(x)),
            64,
        ),
        (
            "ResNet-20, batch 8",
            cuda_common::training_graph(resnet.inputs(), |x| resnet.build(x)),
            8,
        ),
    ];
    for (name, tg, batch) in cases {
        let feeds = cuda_common::feeds(&tg, batch, 1);
        let (graph, step) = (tg.graph, tg.step);
        let options = CudaOptions {
            cache_dir: None,
            ..CudaOptions::default()
        };
        let mut emu =
            CudaSession::emulated(graph.clone(), 1, options).expect("cuda-emu (needs NVRTC)");
        let mut cpu = CpuSession::new(graph, CpuOptions::default()).expect("cpu");
        emu.initialize_variables(1).expect("init");
        cpu.initialize_variables(1).expect("init");
        let t = Instant::now();
        emu.run(&step, &feeds).expect("first step");
        let first = t.elapsed();
        let before = emu.driver().lane_instructions().unwrap_or(0);
        let e = best_of(2, || {
            emu.run(&step, &feeds).expect("step");
        });
        let lanes = (emu.driver().lane_instructions().unwrap_or(0) - before) / 2;
        cpu.run(&step, &feeds).expect("warm-up");
        let c = best_of(3, || {
            cpu.run(&step, &feeds).expect("step");
        });
        println!(
            "{name:<26} cuda-emu {:>9.1} ms/step (first, with compilation: {:>7.1} ms)  \
             {:>6.1} M lane-instr/step  {:>6.1} M lane-instr/s   cpu {:>7.2} ms/step  ratio {:>6.0}x",
            e.as_secs_f64() * 1e3,
            first.as_secs_f64() * 1e3,
            lanes as f64 / 1e6,
            lanes as f64 / e.as_secs_f64() / 1e6,
            c.as_secs_f64() * 1e3,
            e.as_secs_f64() / c.as_secs_f64()
        );
    }
}
