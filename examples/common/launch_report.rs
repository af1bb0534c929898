//! `--launch-report FILE` of the examples: the training step a `SimpleTrainer` runs when no
//! callback adds to it (the examples' `--bench` step), lowered for the CUDA backend, and every
//! launch's predicted time on a GPU — one JSON line per launch, then a summary on stdout. No GPU
//! needed: block counts come from the emulated device, registers from ptxas when it is found.
//! And `--kernel-sources DIR`: the same step's kernels as CUDA C and PTX, for
//! `bench/sass_stats.py` to assemble and count.
//! (Also included by `tests/cuda/perf_model.rs`, which checks it against Nsight Compute's
//! launch order.)

#![allow(dead_code)]

use std::error::Error;
use std::path::Path;
use std::sync::Arc;

use towerpack::backend::Step;
use towerpack::backend::cuda::CudaOptions;
use towerpack::backend::cuda::nvrtc::{self, Arch, Compiler};
use towerpack::backend::cuda::perf::{self, GpuSpec, LaunchRow};
use towerpack::backend::cuda::render::{self, KernelPlan};
use towerpack::ir::Graph;
use towerpack::lower::{LowerOptions, Precision, Program, lower};
use towerpack::optim::{DynamicLossScale, add_step_counter};
use towerpack::train::{
    DummyConstantInput, GraphSetup, InputSource, ModelDesc, SimpleTrainer, Trainer,
};

/// The graph and step of one `SimpleTrainer` step of `model` at `batch` with no callbacks but
/// the trainer's step counter, as `launch_train_with_config` builds them: the training tower,
/// its gradients and optimizer update (`train_op`), then the `global_step` increment.
pub fn training_step(
    model: Arc<dyn ModelDesc>,
    batch: usize,
    seed: u64,
) -> Result<(Graph, Step), Box<dyn Error>> {
    training_step_in(model, batch, seed, Precision::Fp32)
}

/// [`training_step`] as a run in `precision` builds it (fp16 with its default loss scale).
pub fn training_step_in(
    model: Arc<dyn ModelDesc>,
    batch: usize,
    seed: u64,
    precision: Precision,
) -> Result<(Graph, Step), Box<dyn Error>> {
    let signature = model.inputs();
    let shapes = signature.iter().map(|s| s.shape.resolve(batch)).collect();
    let mut input = DummyConstantInput::new(shapes);
    input.setup(&signature)?;
    let mut graph = Graph::new();
    let mut trainer = SimpleTrainer::new();
    trainer.setup_graph(&mut GraphSetup {
        graph: &mut graph,
        seed,
        input: &mut input,
        model: Some(model),
        loss_scale: precision.loss_scaling().then(DynamicLossScale::default),
    })?;
    let train_op = trainer.train_op().ok_or("the trainer built no train op")?;
    let increment = add_step_counter(&mut graph)?;
    Ok((graph, Step::new(Vec::new(), vec![train_op, increment])))
}

/// The training step of `model` at `batch`, lowered as the CUDA backend lowers it.
pub fn training_program(
    model: Arc<dyn ModelDesc>,
    batch: usize,
    seed: u64,
) -> Result<Program, Box<dyn Error>> {
    training_program_in(model, batch, seed, Precision::Fp32)
}

/// [`training_program`] at `precision`.
pub fn training_program_in(
    model: Arc<dyn ModelDesc>,
    batch: usize,
    seed: u64,
    precision: Precision,
) -> Result<Program, Box<dyn Error>> {
    let (graph, step) = training_step_in(model, batch, seed, precision)?;
    let cuda = CudaOptions::default();
    let options = LowerOptions {
        precision,
        ..cuda.lowering()
    };
    Ok(lower(&graph, &step, batch, &options)?)
}

/// The launch report of `model`'s training step at `batch` on `gpu`.
pub fn report(
    model: Arc<dyn ModelDesc>,
    batch: usize,
    seed: u64,
    gpu: &GpuSpec,
) -> Result<Vec<LaunchRow>, Box<dyn Error>> {
    report_in(model, batch, seed, Precision::Fp32, gpu)
}

/// [`report`] at `precision`.
pub fn report_in(
    model: Arc<dyn ModelDesc>,
    batch: usize,
    seed: u64,
    precision: Precision,
    gpu: &GpuSpec,
) -> Result<Vec<LaunchRow>, Box<dyn Error>> {
    let program = training_program_in(model, batch, seed, precision)?;
    let compiler = Compiler::new(nvrtc::default_cache_dir())?;
    Ok(perf::launch_report(&program, &compiler, gpu, true)?)
}

/// Writes the report of `model` at `batch` and `precision` on the H100 model to `file` and
/// prints its summary.
pub fn write(
    model: Arc<dyn ModelDesc>,
    batch: usize,
    seed: u64,
    precision: Precision,
    file: &Path,
) -> Result<(), Box<dyn Error>> {
    let gpu = perf::H100_SXM;
    let rows = report_in(model, batch, seed, precision, &gpu)?;
    std::fs::write(file, perf::json_lines(&rows))?;
    print!("{}", perf::summary(&rows, &gpu));
    println!("wrote {} launches to {}", rows.len(), file.display());
    Ok(())
}

/// Writes every kernel that `model`'s training step at `batch` and `precision` launches (the
/// step of [`write`]) into `dir`: `NNN_<name>.cu`, the CUDA C NVRTC compiles (NNN: the kernel's
/// index in the program, `/` in its scoped name as `_`), and `NNN_<name>.ptx`, NVRTC's PTX for
/// compute_90 — an H100's, the input of `bench/sass_stats.py`. Returns how many it wrote.
pub fn write_sources(
    model: Arc<dyn ModelDesc>,
    batch: usize,
    seed: u64,
    precision: Precision,
    dir: &Path,
) -> Result<usize, Box<dyn Error>> {
    let program = training_program_in(model, batch, seed, precision)?;
    let compiler = Compiler::new(nvrtc::default_cache_dir())?;
    std::fs::create_dir_all(dir)?;
    let mut written = 0;
    for (i, k) in program.kernels.iter().enumerate() {
        let KernelPlan::Launch(r) = render::render_kernel(&program, i)? else {
            continue;
        };
        let source = r.source();
        let ptx = compiler.compile(r.body.entry(), &source, Arch(90))?;
        // Scoped names hold dots (`res1.0/add`): the extension is appended, not set.
        let stem = format!("{i:03}_{}", k.name.replace('/', "_"));
        std::fs::write(dir.join(format!("{stem}.cu")), &source)?;
        std::fs::write(dir.join(format!("{stem}.ptx")), ptx.as_bytes())?;
        written += 1;
    }
    println!(
        "wrote {written} kernels (CUDA C and compute_90 PTX) to {}",
        dir.display()
    );
    Ok(written)
}
