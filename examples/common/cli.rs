//! The command-line flags every example shares, with one meaning everywhere: `--logdir`,
//! `--fresh`, `--max-epoch`, `--steps-per-epoch`, `--seed`, `--load`, `--device`, `--threads`,
//! `--precision`.
//! An example flattens [`CommonArgs`] into its own flags and parses them with [`parse`], which
//! writes the example's own defaults into the help.

use std::path::PathBuf;

use clap::{Args, Parser};
use towerpack::train::logdir::LogDirAction;
use towerpack::train::{BackendChoice, Precision, SaverRestore, TrainConfig};

/// The flags every example shares.
#[derive(Args, Debug, Clone)]
pub struct CommonArgs {
    /// Where the log (log.log), stats.json, TensorBoard events and checkpoints go; an existing
    /// one is resumed.
    #[arg(long)]
    pub logdir: Option<PathBuf>,
    /// Start afresh: an existing logdir is backed up to `<logdir>.<timestamp>` instead of
    /// resumed.
    #[arg(long)]
    pub fresh: bool,
    /// Last epoch.
    #[arg(long)]
    pub max_epoch: Option<u64>,
    /// Steps per epoch (default: one pass over the training data).
    #[arg(long)]
    pub steps_per_epoch: Option<u64>,
    /// Seed of the initial weights, the data order and the random ops (dropout, augmentation,
    /// noise).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A checkpoint (a file, or a directory's latest). Training starts from its weights
    /// (tensorpack's `--load`), unless the logdir holds a checkpoint of its own: then the run
    /// resumes from that, and says so.
    #[arg(long)]
    pub load: Option<PathBuf>,
    /// Where to run: cpu, cuda (GPUs; `cuda:2` two of them), cuda-emu (the CUDA kernels on
    /// emulated devices, slow: for debugging) or reference (the op-by-op oracle, slower).
    #[arg(long, default_value = "cpu")]
    pub device: BackendChoice,
    /// CPU worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// How matrix products and convolutions multiply: fp32; tf32 (tensor cores on a CUDA
    /// device; the CPU has no TF32 units and computes in f32); bf16 or fp16 (mixed precision:
    /// their operands rounded to 16 bits, f32 accumulation; fp16 with a dynamic loss scale).
    /// Variables and checkpoints are f32 in every precision.
    #[arg(long, default_value = "fp32")]
    pub precision: Precision,
}

/// An example's defaults for the shared flags that have no common one.
pub struct Defaults {
    /// The logdir when `--logdir` is not given.
    pub logdir: &'static str,
    /// What `--max-epoch` defaults to, in words (shown in `--help`).
    pub max_epoch: &'static str,
}

/// Parses the flags `A` (which flattens [`CommonArgs`]), with the help of `--logdir` and
/// `--max-epoch` stating this example's defaults. Exits with clap's message on bad flags.
pub fn parse<A: Parser>(defaults: &Defaults) -> A {
    let command = A::command()
        .mut_arg("logdir", |a| {
            a.help(format!(
                "Where the log (log.log), stats.json, TensorBoard events and checkpoints go; \
                 an existing one is resumed [default: {}]",
                defaults.logdir
            ))
        })
        .mut_arg("max_epoch", |a| {
            a.help(format!("Last epoch [default: {}]", defaults.max_epoch))
        });
    let matches = command.get_matches();
    A::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

impl CommonArgs {
    /// `--logdir`, or the example's default.
    pub fn logdir(&self, defaults: &Defaults) -> PathBuf {
        self.logdir
            .clone()
            .unwrap_or_else(|| PathBuf::from(defaults.logdir))
    }

    /// `--device`, with `--threads` for the CPU.
    pub fn backend(&self) -> BackendChoice {
        match self.device {
            BackendChoice::Cpu { .. } => BackendChoice::Cpu {
                threads: self.threads,
            },
            other => other,
        }
    }

    /// Applies the shared flags to a training config: the logdir (backed up with `--fresh`,
    /// else resumed), the seed, the steps per epoch, the backend, and the weights of `--load`.
    /// `--max-epoch` is the example's to apply (its default is its own).
    pub fn apply(&self, config: TrainConfig, defaults: &Defaults) -> TrainConfig {
        let mut config = config
            .logdir(self.logdir(defaults))
            .logdir_action(if self.fresh {
                LogDirAction::Backup
            } else {
                LogDirAction::Keep
            })
            .seed(self.seed)
            .backend(self.backend())
            .precision(self.precision)
            .auto_resume(true);
        if let Some(steps) = self.steps_per_epoch {
            config = config.steps_per_epoch(steps);
        }
        // The run logs which: "Restored N variables from …" or that the logdir resumes.
        if let Some(load) = &self.load {
            config = config.session_init(SaverRestore::new(load));
        }
        config
    }
}
