//! `TrainError`: every way training can end other than by finishing, including the clean stop
//! ([`TrainError::Stop`], tensorpack's `StopTraining`) that any hook may return.

use std::path::PathBuf;

use crate::autodiff::AutodiffError;
use crate::backend::BackendError;
use crate::data::DataError;
use crate::dsl::DslError;
use crate::ir::IrError;
use crate::optim::OptimError;
use crate::tensor::{DType, TensorError};
use crate::train::checkpoint::{CheckpointError, RestoreError};
use crate::train::logdir::LogDirError;
use crate::train::summary::MonitorError;

/// Errors of the trainer system. Each names the callback, tensor, variable or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A clean stop (tensorpack's `StopTraining`): the loop ends, `after_train` runs, and
    /// `launch_train_with_config` returns `Ok` with the reason in the report.
    #[error("training stopped: {reason}")]
    Stop { reason: String },
    /// A configuration mistake of the run, a callback or a predictor, found before training
    /// starts (or when the misconfigured piece is first used).
    #[error("invalid training configuration: {0}")]
    Config(Box<ConfigError>),
    /// The trainer could not build its towers, gradients or train op as set up.
    #[error("trainer setup: {0}")]
    Setup(Box<SetupError>),
    /// The ranks of a distributed run disagree, or the build cannot run distributed.
    #[error("distributed training: {0}")]
    Distributed(Box<DistributedError>),
    /// A callback failed; `message` says why.
    #[error("callback {callback}: {message}")]
    Callback { callback: String, message: String },
    /// A loss or gradient was NaN or infinite (the non-finite guard).
    #[error("non-finite value (NaN or infinity) in {tensor} at global_step {global_step}")]
    NonFinite { tensor: String, global_step: u64 },
    /// The input source failed or was misused.
    #[error("input source {source_name}: {message}")]
    Input {
        source_name: String,
        message: String,
    },
    /// A value fed to an input does not have the input's dtype or shape.
    #[error("input `{input}` takes {expected}, but {who} fed {got}{hint}")]
    FeedMismatch {
        input: String,
        who: String,
        expected: String,
        got: String,
        /// What to do about it (e.g. how to cast), starting with "; " when not empty.
        hint: String,
    },
    /// A batched input was fed a batch of no examples.
    #[error(
        "input `{input}` got an empty batch ({got}) from {who}; a step needs at least one example"
    )]
    EmptyBatch {
        input: String,
        who: String,
        got: String,
    },
    /// SIGINT or SIGTERM stopped training at a step boundary (see [`crate::train::interrupt`]):
    /// `after_train` ran, and `checkpoint` holds the state after step `global_step` when a
    /// checkpoint directory was open (a `ModelSaver`).
    #[error(
        "interrupted by {} at global_step {global_step}; {}",
        crate::train::interrupt::signal_name(*.signal),
        interrupted_outcome(.checkpoint.as_deref())
    )]
    Interrupted {
        signal: i32,
        global_step: u64,
        checkpoint: Option<PathBuf>,
    },
    /// A hyper-parameter setter produced a value the variable must not take (a NaN or infinite
    /// value, a negative learning rate): training would go on silently with nonsense.
    #[error(
        "hyper-parameter `{name}` cannot be set to {value} (at global_step {global_step} by \
         {setter}): it must be {rule}"
    )]
    InvalidHyperParam {
        name: String,
        value: f64,
        global_step: u64,
        setter: String,
        rule: &'static str,
    },
    /// Resuming from a checkpoint or logdir is impossible as asked.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// An op was added to the graph after the session was created.
    #[error("{what}: the graph is finalized once the session exists; build ops in setup_graph")]
    GraphFinalized { what: String },
    /// The session was used before it exists.
    #[error("{what}: there is no session before before_train")]
    NoSession { what: String },
    /// A tensor name did not resolve (tensorpack's `get_tensors_maybe_in_tower`).
    #[error("tensor `{name}` not found in the graph{hint}")]
    TensorNotFound { name: String, hint: String },
    /// A variable name did not resolve.
    #[error("`{name}` is not a variable in the graph")]
    UnknownVariable { name: String },
    /// A file of the run could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Several `after_train` hooks failed after a successful run; the first is shown.
    #[error("{count} after_train hook(s) failed; first: {first}")]
    AfterTrain {
        count: usize,
        first: Box<TrainError>,
    },
    #[error(transparent)]
    Dsl(Box<DslError>),
    #[error(transparent)]
    Ir(Box<IrError>),
    #[error(transparent)]
    Autodiff(Box<AutodiffError>),
    #[error(transparent)]
    Optim(Box<OptimError>),
    #[error(transparent)]
    Backend(Box<BackendError>),
    #[error(transparent)]
    Data(Box<DataError>),
    #[error(transparent)]
    Checkpoint(Box<CheckpointError>),
    #[error(transparent)]
    Restore(Box<RestoreError>),
    #[error(transparent)]
    Monitor(Box<MonitorError>),
    #[error(transparent)]
    LogDir(Box<LogDirError>),
}

/// How a run, a callback, a session init or a predictor is configured wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `TrainConfig` has both a data flow and an input source.
    #[error("give either dataflow or data (an input source), not both")]
    DataflowAndInput,
    /// `TrainConfig` has neither a data flow nor an input source.
    #[error("no training data: give a dataflow or data (an input source)")]
    NoData,
    /// No `steps_per_epoch`, and the input cannot say how many batches an epoch has.
    #[error("steps_per_epoch is not set and the input ({input}) has no known size")]
    UnknownEpochSize { input: String },
    /// A periodic callback with no trigger.
    #[error("{callback}: give every_k_steps or every_k_epochs (at least 1), or before_train")]
    NoTrigger { callback: String },
    /// A hyper-parameter setter's variable is not a float scalar.
    #[error("hyper-parameter `{name}` must be a float scalar variable, it is {found}")]
    NotAHyperParam { name: String, found: String },
    /// A saver-like callback has nowhere to write.
    #[error("{callback} needs a logdir or an explicit checkpoint_dir")]
    NoCheckpointDir { callback: String },
    /// A checkpoint was requested in a directory no saver opened.
    #[error("checkpoint requested in {}, which no saver opened", .dir.display())]
    CheckpointDirNotOpen { dir: PathBuf },
    /// A regular expression of a callback or monitor does not compile.
    #[error("{who}: bad regex `{pattern}`: {source}")]
    BadRegex {
        who: String,
        pattern: String,
        #[source]
        source: regex::Error,
    },
    /// A value given to a session init does not match its graph variable.
    #[error(
        "{init}: variable `{variable}` is {}{:?} in the graph, the value is {}{:?} (set \
         ignore_mismatch to skip it)",
        .in_graph.0, .in_graph.1, .value.0, .value.1
    )]
    InitMismatch {
        init: String,
        variable: String,
        in_graph: (DType, Vec<usize>),
        value: (DType, Vec<usize>),
    },
    /// A session init was given a file format it cannot read.
    #[error("{init}: {path}: npz/npy files are not supported; convert them to safetensors")]
    UnsupportedInitFormat { init: String, path: String },
    /// A predictor with no outputs.
    #[error("a predictor needs at least one output")]
    PredictorWithoutOutputs,
    /// A predictor input that is not an input of its tower.
    #[error("predictor input `{input}` is not an input of tower `{tower}`")]
    PredictorInputNotInTower { input: String, tower: String },
    /// A predictor run with the wrong number of inputs.
    #[error("the predictor takes {} inputs ({}), got {got}", .inputs.len(), .inputs.join(", "))]
    PredictorArity { inputs: Vec<String>, got: usize },
}

/// How a trainer's graph setup failed: towers, their variables and gradients, the train op.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The trainer needs a model and the run has none.
    #[error("{what} needs the model's tower function, but the run has no model")]
    NoModel { what: String },
    /// `setup_graph` ran twice.
    #[error("{trainer}: setup_graph was already called")]
    AlreadyBuilt { trainer: String },
    /// `run_step` ran before `setup_graph`.
    #[error("{trainer}: run_step before setup_graph: the trainer has no train op")]
    NotBuilt { trainer: String },
    /// A trainer that cannot train under a dynamic loss scale was given one.
    #[error(
        "{trainer} applies each tower's gradients separately and cannot skip a step for \
         non-finite gradients: train fp16 with another trainer, or bf16 (no loss scale needed)"
    )]
    LossScaleUnsupported { trainer: String },
    /// A data-parallel trainer with zero towers.
    #[error("{trainer} needs at least one tower")]
    NoTowers { trainer: String },
    /// A strategy built no training tower.
    #[error("{trainer}: no training tower")]
    NoTrainingTower { trainer: String },
    /// A tower without a cost where a training tower is needed.
    #[error("tower {} is not a training tower: it has no cost", tower_label(.tower))]
    NoCost { tower: String },
    /// Parameter-server variables placed on a tower that does not exist.
    #[error("{trainer}: variables on tower {tower}, but there are {towers} towers")]
    TowerOutOfRange {
        trainer: String,
        tower: usize,
        towers: usize,
    },
    /// More logical devices than a graph can number.
    #[error("{index} is too many devices for one graph")]
    TooManyDevices { index: usize },
    /// A tower trains a different number of variables than tower 0.
    #[error("tower `{tower}` has gradients for {count} variables, tower 0 for {tower0}")]
    GradientCount {
        tower: String,
        count: usize,
        tower0: usize,
    },
    /// A tower trains a variable tower 0 does not.
    #[error("tower `{tower}` trains `{variable}`, which tower 0 does not")]
    ExtraVariable { tower: String, variable: String },
    /// A tower has no gradient for a variable the others train.
    #[error("tower {tower} has no gradient for `{variable}`")]
    MissingGradient { tower: usize, variable: String },
    /// A replica variable with no counterpart in tower 0.
    #[error("replica variable `{variable}` of tower `{tower}` has no counterpart in tower 0")]
    ReplicaWithoutCounterpart { variable: String, tower: String },
    /// A trainable replica variable with no source in replica 0.
    #[error("trainable replica variable `{replica}` has no source `{source_name}` in replica 0")]
    ReplicaWithoutSource {
        replica: String,
        source_name: String,
    },
    /// A replica whose type differs from its source's.
    #[error("replica `{replica}` is {replica_type}, its source `{source_name}` is {source_type}")]
    ReplicaType {
        replica: String,
        replica_type: String,
        source_name: String,
        source_type: String,
    },
    /// Averaging over no towers.
    #[error("{scope}: nothing to average")]
    NothingToAverage { scope: String },
    /// The towers' gradient processors kept different variables.
    #[error("{trainer}: the towers' gradient processors kept different variables")]
    ProcessorsDiffer { trainer: String },
    /// A node a per-tower update would repeat has control inputs.
    #[error("{trainer} cannot repeat `{node}`: it has control inputs")]
    NotRepeatable { trainer: String, node: String },
}

/// How a distributed run cannot go on: the ranks disagree, or the build lacks a feature.
#[derive(Debug, thiserror::Error)]
pub enum DistributedError {
    /// A variable has two gradients to all-reduce.
    #[error("`{variable}` has two gradients to all-reduce")]
    DuplicateGradient { variable: String },
    /// A gradient without a static shape.
    #[error(
        "the gradient of `{variable}` has shape {shape}: a distributed all-reduce needs a \
         static shape"
    )]
    DynamicGradient { variable: String, shape: String },
    /// A gradient that is not f32.
    #[error("the gradient of `{variable}` is {dtype}: distributed all-reduces carry f32")]
    GradientDType { variable: String, dtype: DType },
    /// A variable without a static shape cannot be broadcast.
    #[error("variable `{variable}` has no static shape")]
    DynamicVariable { variable: String },
    /// The broadcast bytes of a variable do not make its tensor.
    #[error("broadcast variable `{variable}`: {source}")]
    Broadcast {
        variable: String,
        #[source]
        source: TensorError,
    },
    /// The ranks reached different points of the loop.
    #[error(
        "the ranks are out of step: {}; give every rank the same steps_per_epoch and callbacks \
         that run steps",
        .ranks.join(", ")
    )]
    OutOfStep {
        /// Where each rank is ("rank 0 at step 3").
        ranks: Vec<String>,
    },
    /// This rank's graph differs from the chief's.
    #[error("the ranks built different graphs: {difference}")]
    GraphDiffers { difference: String },
    /// Other ranks' graphs differ from the chief's.
    #[error(
        "the ranks built different graphs: ranks {ranks:?} differ from the chief (see their logs)"
    )]
    GraphsDiffer { ranks: Vec<usize> },
    /// `towers_per_rank` is zero.
    #[error("towers_per_rank must be at least 1")]
    NoTowersPerRank,
    /// Started by an MPI launcher without the `mpi` feature.
    #[error(
        "this process was started by an MPI launcher, but towerpack was built without the \
         `mpi` feature (cargo build --features mpi)"
    )]
    NoMpiFeature,
    /// NCCL asked for without the `nccl` feature.
    #[error(
        "DistributedOptions::gradient_engine is GradientEngine::Nccl, but towerpack was built \
         without the `nccl` feature (cargo build --features mpi,nccl)"
    )]
    NoNcclFeature,
}

/// A tower's name for messages: `name`, or "(no name scope)" for `SimpleTrainer`'s tower.
fn tower_label(tower: &str) -> String {
    if tower.is_empty() {
        "(no name scope)".to_string()
    } else {
        format!("`{tower}`")
    }
}

/// What an interrupted run left: where its checkpoint is, or that there is none.
fn interrupted_outcome(checkpoint: Option<&std::path::Path>) -> String {
    match checkpoint {
        Some(path) => format!(
            "checkpoint saved to {}; run again to resume",
            path.display()
        ),
        None => "no checkpoint saved (no ModelSaver opened a checkpoint directory); the \
                 steps since the last one are lost"
            .to_string(),
    }
}

macro_rules! boxed_from {
    ($($variant:ident($ty:ty)),* $(,)?) => {
        $(impl From<$ty> for TrainError {
            fn from(e: $ty) -> TrainError {
                TrainError::$variant(Box::new(e))
            }
        })*
    };
}

boxed_from!(
    Dsl(DslError),
    Ir(IrError),
    Autodiff(AutodiffError),
    Optim(OptimError),
    Backend(BackendError),
    Data(DataError),
    Checkpoint(CheckpointError),
    Restore(RestoreError),
    Monitor(MonitorError),
    LogDir(LogDirError),
    Config(ConfigError),
    Setup(SetupError),
    Distributed(DistributedError),
);

impl TrainError {
    /// A clean stop with `reason` (tensorpack's `raise StopTraining()`).
    pub fn stop(reason: impl Into<String>) -> TrainError {
        TrainError::Stop {
            reason: reason.into(),
        }
    }

    /// An error of callback `callback`.
    pub fn callback(callback: impl Into<String>, message: impl Into<String>) -> TrainError {
        TrainError::Callback {
            callback: callback.into(),
            message: message.into(),
        }
    }

    /// True for the clean stop.
    pub fn is_stop(&self) -> bool {
        matches!(self, TrainError::Stop { .. })
    }

    /// For [`TrainError::Interrupted`], the exit status a shell reports for a death by the
    /// signal (128 + its number: 130 for SIGINT, 143 for SIGTERM); `None` otherwise.
    pub fn interrupted_exit_code(&self) -> Option<i32> {
        match self {
            TrainError::Interrupted { signal, .. } => Some(128 + signal),
            _ => None,
        }
    }

    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
        move |source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
