//! Trains the MNIST MLP data-parallel over MPI ranks (Horovod-style): every rank trains on its
//! own shard of the digits at batch 64 (the total batch is 64 × ranks), gradients are averaged
//! across ranks each step, and only the chief (rank 0) validates, logs and writes checkpoints.
//! Without a launcher it runs as a job of one process. Run it again with the same logdir to
//! resume from the chief's latest checkpoint, with any number of ranks.
//!
//! ```text
//! cargo build --release --features mpi --example train_mnist_distributed
//! mpirun -np 2 target/release/examples/train_mnist_distributed --max-epoch 3
//! mpirun -H host1,host2 -np 2 -x TOWERPACK_MPI_PEER_TIMEOUT_SECS=60 \
//!     target/release/examples/train_mnist_distributed --logdir /shared/train_log/mnist
//! ```
//!
//! The flags are the other examples' (`--help`); `--device` and `--threads` apply to each rank
//! (with the CPU and several ranks on one machine, `--threads 0` shares the cores among them).

use std::error::Error;

use clap::Parser;

#[path = "common/cli.rs"]
mod cli;
use towerpack::data::{BatchData, mnist10k_split};
use towerpack::models::Mlp;
use towerpack::optim::Optimizer;
use towerpack::train::callbacks::{ClassificationError, InferenceRunner, Inferencer, ModelSaver};
use towerpack::train::{DistributedOptions, DistributedTrainer, ModelFn, TrainConfig, TrainError};

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(about = "Train the MNIST MLP data-parallel over MPI ranks (a job of one without mpirun)")]
struct Args {
    #[command(flatten)]
    common: cli::CommonArgs,
    /// Batch size of each rank (the total batch is this times the ranks).
    #[arg(long, default_value_t = 64)]
    batch: usize,
}

/// The defaults of the shared flags.
const DEFAULTS: cli::Defaults = cli::Defaults {
    logdir: "train_log/mnist_distributed",
    max_epoch: "3",
};

fn main() {
    let args: Args = cli::parse(&DEFAULTS);
    if let Err(e) = run(&args) {
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

fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    // MPI starts here when launched by mpirun (feature `mpi`); otherwise a job of one process.
    let mut trainer = DistributedTrainer::from_environment(DistributedOptions::default())?;
    let (rank, ranks) = (trainer.rank(), trainer.size());

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
            shard.to_flow(Some(args.common.seed + rank as u64))?,
            args.batch,
            false,
        )?)
        .callback(ModelSaver::new())
        .callback(InferenceRunner::new(
            BatchData::new(validation.to_flow(None)?, 200, true)?,
            inferencers,
        ))
        .max_epoch(args.common.max_epoch.unwrap_or(3));
    // Only the chief writes the logdir; `launch` drops the others' (ChiefOnly).
    let config = args.common.apply(config, &DEFAULTS);
    let report = trainer.launch(config)?;
    if let Some(&(_, error)) = report.history("validation_error").last() {
        println!(
            "validation error after epoch {} ({ranks} ranks × batch {}): {error:.4}",
            report.counters.epoch_num, args.batch
        );
    }
    Ok(())
}
