//! Trains the MNIST MLP data-parallel over MPI ranks (Horovod-style): every rank trains on its
//! own shard of the digits at batch 64 (the total batch is 64 × ranks), gradients are averaged
//! across ranks each step, and only the chief (rank 0) validates, logs and writes checkpoints.
//! Without a launcher it runs as a job of one process. Run it again with the same logdir to
//! resume from the chief's latest checkpoint, with any number of ranks.
//!
//! ```text
//! cargo build --release --features mpi --example train_mnist_distributed
//! mpirun -np 2 target/release/examples/train_mnist_distributed [logdir] [max_epoch]
//! mpirun -H host1,host2 -np 2 -x TOWERPACK_MPI_PEER_TIMEOUT_SECS=60 \
//!     target/release/examples/train_mnist_distributed /shared/train_log/mnist 5
//! ```

use std::error::Error;
use std::path::PathBuf;

use towerpack::data::{BatchData, mnist10k_split};
use towerpack::models::Mlp;
use towerpack::optim::Optimizer;
use towerpack::train::callbacks::{ClassificationError, InferenceRunner, Inferencer, ModelSaver};
use towerpack::train::logdir::{LogDirAction, set_logger_dir};
use towerpack::train::{
    DistributedOptions, DistributedTrainer, ModelFn, TrainConfig, TrainError, Trainer,
};

fn main() {
    if let Err(e) = run() {
        // Ctrl-C or SIGTERM: the chief saved a checkpoint and its log line said where (no
        // second line here); exit as a shell reports a death by that signal (130 for SIGINT).
        let code = e
            .downcast_ref::<TrainError>()
            .and_then(TrainError::interrupted_exit_code);
        if code.is_none() {
            eprintln!("error: {e}");
        }
        std::process::exit(code.unwrap_or(1));
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let logdir = args.next().map_or_else(
        || PathBuf::from("train_log/mnist_distributed"),
        PathBuf::from,
    );
    let max_epoch: u64 = args.next().map_or(Ok(3), |s| s.parse())?;
    // MPI starts here when launched by mpirun (feature `mpi`); otherwise a job of one process.
    let mut trainer = DistributedTrainer::from_environment(DistributedOptions::default())?;
    let (rank, ranks) = (trainer.rank(), trainer.size());
    // Only the chief logs to files; the others' logdir is dropped by `launch` (ChiefOnly).
    let logdir = if trainer.is_chief() {
        set_logger_dir(&logdir, LogDirAction::Keep)?
    } else {
        logdir
    };

    let data = mnist10k_split()?;
    let range = trainer.shard(data.train.len());
    let shard = data
        .train
        .slice(range.start, range.len())?
        .to_f32(1.0 / 255.0);
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
    let inferencers: Vec<Box<dyn Inferencer>> = vec![Box::new(ClassificationError::default())];
    let config = TrainConfig::new(model)
        .dataflow(BatchData::new(
            shard.to_flow(Some(1 + rank as u64))?,
            64,
            false,
        )?)
        .callback(ModelSaver::new())
        .callback(InferenceRunner::new(
            BatchData::new(validation.to_flow(None)?, 200, true)?,
            inferencers,
        ))
        .logdir(&logdir)
        .max_epoch(max_epoch)
        .auto_resume(true);
    let report = trainer.launch(config)?;
    if let Some(&(_, error)) = report.history("validation_error").last() {
        println!(
            "validation error after epoch {} ({ranks} ranks × batch 64): {error:.4}",
            report.counters.epoch_num
        );
    }
    Ok(())
}
