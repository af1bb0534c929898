//! Trains an MLP on the embedded MNIST digits the tensorpack way: a logdir with `log.log`,
//! `stats.json`, a TensorBoard events file and checkpoints; validation every epoch; a learning
//! rate schedule. Run it again with the same logdir to resume where it stopped (exactly).
//!
//! ```text
//! cargo run --release --example train_mnist_mlp -- [--device cpu|cuda|cuda-emu] [logdir] [max_epoch]
//! ```
//!
//! `--device cuda` runs on the GPU (NVRTC-compiled kernels); `cuda-emu` runs the same kernels on
//! an emulated device. An unavailable device is one error line and exit status 1.

use std::error::Error;
use std::path::PathBuf;

use towerpack::data::{BatchData, mnist10k_split};
use towerpack::models::Mlp;
use towerpack::optim::Optimizer;
use towerpack::train::callbacks::{
    ClassificationError, InferenceRunner, Inferencer, MinSaver, ModelSaver, ScalarStats,
    ScheduledHyperParamSetter,
};
use towerpack::train::logdir::{LogDirAction, set_logger_dir};
use towerpack::train::{
    BackendChoice, ModelFn, SimpleTrainer, TrainConfig, launch_train_with_config,
};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut positional = Vec::new();
    let mut backend = BackendChoice::default();
    let mut argv = std::env::args().skip(1);
    while let Some(a) = argv.next() {
        if a == "--device" {
            let name = argv.next().ok_or("--device needs a value")?;
            backend = name.parse()?;
        } else {
            positional.push(a);
        }
    }
    let mut args = positional.into_iter();
    let logdir = args
        .next()
        .map_or_else(|| PathBuf::from("train_log/mnist_mlp"), PathBuf::from);
    let max_epoch: u64 = args.next().map_or(Ok(5), |s| s.parse())?;
    // Keep an existing logdir: that is what lets a second run resume.
    let logdir = set_logger_dir(&logdir, LogDirAction::Keep)?;

    let data = mnist10k_split()?;
    let train = data.train.to_f32(1.0 / 255.0);
    let validation = data.validation.to_f32(1.0 / 255.0);
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![256],
        ..Mlp::default()
    };
    let model = ModelFn::new(
        mlp.inputs(),
        move |x| mlp.build(x),
        Optimizer::momentum(0.1, 0.9),
    );
    let inferencers: Vec<Box<dyn Inferencer>> = vec![
        Box::new(ScalarStats::new(&["cross_entropy_loss"])),
        Box::new(ClassificationError::default()),
    ];
    let config = TrainConfig::new(model)
        .dataflow(BatchData::new(train.to_flow(Some(1))?, 64, false)?)
        .callback(ModelSaver::new())
        .callback(InferenceRunner::new(
            BatchData::new(validation.to_flow(None)?, 200, true)?,
            inferencers,
        ))
        .callback(MinSaver::new("validation_error"))
        .callback(ScheduledHyperParamSetter::new(
            "learning_rate",
            &[(0, 0.1), (3, 0.01)],
        ))
        .backend(backend)
        .logdir(&logdir)
        .max_epoch(max_epoch)
        .auto_resume(true);
    let report = launch_train_with_config(config, &mut SimpleTrainer::new())?;
    if let Some(&(_, error)) = report.history("validation_error").last() {
        println!(
            "validation error after epoch {}: {error:.4}",
            report.counters.epoch_num
        );
    }
    Ok(())
}
