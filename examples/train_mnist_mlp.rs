//! Trains an MLP on the embedded MNIST digits the tensorpack way: a logdir with `log.log`,
//! `stats.json`, a TensorBoard events file and checkpoints; validation every epoch; a learning
//! rate schedule. Run it again with the same logdir to resume where it stopped (exactly).
//! With `towers` > 1 it trains data-parallel (`ReplicatedTrainer`), each tower on its own batch
//! of 64 (the gradients are averaged).
//!
//! ```text
//! cargo run --release --example train_mnist_mlp -- [logdir] [max_epoch] [towers]
//! ```

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
    ModelFn, ReplicatedTrainer, SimpleTrainer, TrainConfig, Trainer, launch_train_with_config,
};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let logdir = args
        .next()
        .map_or_else(|| PathBuf::from("train_log/mnist_mlp"), PathBuf::from);
    let max_epoch: u64 = args.next().map_or(Ok(5), |s| s.parse())?;
    let towers: usize = args.next().map_or(Ok(1), |s| s.parse())?;
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
        .logdir(&logdir)
        .max_epoch(max_epoch)
        .auto_resume(true);
    let mut trainer: Box<dyn Trainer> = match towers {
        1 => Box::new(SimpleTrainer::new()),
        n => Box::new(ReplicatedTrainer::new(n)),
    };
    let report = launch_train_with_config(config, trainer.as_mut())?;
    if let Some(&(_, error)) = report.history("validation_error").last() {
        println!(
            "validation error after epoch {}: {error:.4}",
            report.counters.epoch_num
        );
    }
    Ok(())
}
