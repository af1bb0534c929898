//! Trains a digit classifier on the embedded MNIST digits the tensorpack way, in seconds: a
//! logdir with `log.log`, `stats.json`, a TensorBoard events file and checkpoints; validation on
//! the 2,000 held-out digits every epoch; a learning-rate schedule. Run it again with the same
//! logdir to resume exactly where it stopped.
//!
//! ```text
//! cargo run --release --example mnist                      # MLP 784-256-10
//! cargo run --release --example mnist -- --model convnet   # two conv stages
//! cargo run --release --example mnist -- --device cuda-emu  # CUDA kernels, emulated device
//! cargo run --release --example mnist -- --launch-report launches.jsonl  # predicted GPU times
//! cargo run --release --example mnist -- --export mnist.onnx --load train_log/mnist
//! ```
//!
//! `--device cuda` runs on the GPU (kernels compiled by NVRTC at run time); an unavailable
//! device is one error line and exit status 1.

use std::error::Error;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[path = "common/cli.rs"]
mod cli;

#[cfg(feature = "cuda")]
#[path = "common/launch_report.rs"]
mod launch_report;
use towerpack::data::{BatchData, mnist10k_split};
use towerpack::models::{ConvNet, Mlp};
use towerpack::optim::Optimizer;
use towerpack::train::callbacks::{
    ClassificationError, InferenceRunner, Inferencer, MinSaver, ModelSaver, NonFiniteGuard,
    ScalarStats, ScheduledHyperParamSetter,
};
use towerpack::train::{
    ModelFn, QueueInput, SimpleTrainer, TrainConfig, TrainError, launch_train_with_config,
};

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(about = "Train an MLP or a small convnet on the embedded MNIST digits")]
struct Args {
    /// Which network.
    #[arg(long, value_enum, default_value_t = ModelKind::Mlp)]
    model: ModelKind,
    #[command(flatten)]
    common: cli::CommonArgs,
    /// Validate on the first N held-out digits only (default: all 2,000).
    #[arg(long)]
    val_images: Option<usize>,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Write the CUDA launches of one training step at `--batch` with their predicted times
    /// on an H100 to FILE (one JSON line per launch) instead of training; no GPU needed.
    #[arg(long, value_name = "FILE")]
    launch_report: Option<PathBuf>,
    /// Write every kernel of that step to DIR as the CUDA C NVRTC compiles and its PTX for
    /// compute_90 (`bench/sass_stats.py DIR` counts their SASS) instead of training.
    #[arg(long, value_name = "DIR")]
    kernel_sources: Option<PathBuf>,
    /// Write the inference tower of `--model` with the checkpoint `--load` (default: the latest
    /// in the logdir) to this ONNX file (opset 17; input `input`, output `linear/output`)
    /// instead of training.
    #[arg(long)]
    export: Option<PathBuf>,
}

/// The defaults of the shared flags.
const DEFAULTS: cli::Defaults = cli::Defaults {
    logdir: "train_log/mnist",
    max_epoch: "5",
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ModelKind {
    /// 784-256-10 with ReLU.
    Mlp,
    /// (3×3 conv, BNReLU, 2×2 max-pool) × 2, FC 128 with dropout, FC 10.
    Convnet,
}

fn main() {
    let args: Args = cli::parse(&DEFAULTS);
    if let Err(e) = run(&args) {
        // Ctrl-C or SIGTERM: the run saved a checkpoint and its log line said where (no second
        // line here); exit as a shell reports a death by that signal (130 for SIGINT).
        if let Some(code) = e
            .downcast_ref::<TrainError>()
            .and_then(TrainError::interrupted_exit_code)
        {
            std::process::exit(code);
        }
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    if let Some(file) = &args.export {
        let load = args
            .common
            .load
            .clone()
            .unwrap_or_else(|| args.common.logdir(&DEFAULTS));
        let model = std::sync::Arc::new(mnist_model(args.model));
        let report = towerpack::export::onnx::OnnxExport::new(model, &["linear/output"])
            .input_names(&["input"])
            .require_all_variables()
            .write(&load, file)?;
        println!("{report}");
        return Ok(());
    }
    let data = mnist10k_split()?;
    let train = data.train.to_f32(1.0 / 255.0);
    let mut validation = data.validation.to_f32(1.0 / 255.0);
    if let Some(n) = args.val_images {
        validation = validation.slice(0, n.min(validation.len()))?;
    }
    let model = mnist_model(args.model);
    if let Some(dir) = &args.kernel_sources {
        #[cfg(feature = "cuda")]
        return launch_report::write_sources(
            std::sync::Arc::new(model),
            args.batch,
            args.common.seed,
            args.common.precision,
            dir,
        )
        .map(|_| ());
        #[cfg(not(feature = "cuda"))]
        return Err(format!(
            "--kernel-sources {} needs the `cuda` feature (on by default)",
            dir.display()
        )
        .into());
    }
    if let Some(file) = &args.launch_report {
        #[cfg(feature = "cuda")]
        return launch_report::write(
            std::sync::Arc::new(model),
            args.batch,
            args.common.seed,
            args.common.precision,
            file,
        );
        #[cfg(not(feature = "cuda"))]
        return Err(format!(
            "--launch-report {} needs the `cuda` feature (on by default)",
            file.display()
        )
        .into());
    }
    let inferencers: Vec<Box<dyn Inferencer>> = vec![
        Box::new(ScalarStats::new(&["cross_entropy_loss"])),
        Box::new(ClassificationError::default()),
    ];
    // A thread batches the digits ahead of the steps (as `examples/resnet.rs`).
    let config = TrainConfig::new(model)
        .data(QueueInput::new(BatchData::new(
            train.to_flow(Some(args.common.seed))?,
            args.batch,
            false,
        )?))
        .callback(ModelSaver::new())
        // A non-finite loss or gradient stops the run naming it and its step, before the epoch is saved.
        .callback(NonFiniteGuard::new())
        .callback(InferenceRunner::new(
            BatchData::new(validation.to_flow(None)?, 200, true)?,
            inferencers,
        ))
        .callback(MinSaver::new("validation_error"))
        .callback(ScheduledHyperParamSetter::new(
            "learning_rate",
            &[(3, 0.01)],
        ))
        .max_epoch(args.common.max_epoch.unwrap_or(5));
    let config = args.common.apply(config, &DEFAULTS);
    let report = launch_train_with_config(config, &mut SimpleTrainer::new())?;
    if let Some(&(_, error)) = report.history("validation_error").last() {
        println!(
            "epoch {}: validation accuracy {:.2}% on the 2,000 held-out digits",
            report.counters.epoch_num,
            (1.0 - error) * 100.0
        );
    }
    Ok(())
}

/// The network of `--model` with its optimizer.
fn mnist_model(kind: ModelKind) -> ModelFn {
    match kind {
        ModelKind::Mlp => {
            let mlp = Mlp {
                input_shape: vec![28, 28, 1],
                hidden: vec![256],
                ..Mlp::default()
            };
            ModelFn::new(
                mlp.inputs(),
                move |x| mlp.build(x),
                Optimizer::momentum(0.1, 0.9),
            )
        }
        ModelKind::Convnet => {
            let net = ConvNet {
                dropout_rate: 0.25,
                ..ConvNet::default()
            };
            ModelFn::new(
                net.inputs(),
                move |x| net.build(x),
                Optimizer::momentum(0.05, 0.9),
            )
        }
    }
}
