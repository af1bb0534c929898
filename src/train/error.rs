//! `TrainError`: every way training can end other than by finishing, including the clean stop
//! ([`TrainError::Stop`], tensorpack's `StopTraining`) that any hook may return.

use std::path::PathBuf;

use crate::autodiff::AutodiffError;
use crate::backend::BackendError;
use crate::data::DataError;
use crate::dsl::DslError;
use crate::ir::IrError;
use crate::optim::OptimError;
use crate::train::checkpoint::{CheckpointError, RestoreError};
use crate::train::logdir::LogDirError;
use crate::train::monitor::MonitorError;

/// Errors of the trainer system. Each names the callback, tensor, variable or file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A clean stop (tensorpack's `StopTraining`): the loop ends, `after_train` runs, and
    /// `launch_train_with_config` returns `Ok` with the reason in the report.
    #[error("training stopped: {reason}")]
    Stop { reason: String },
    /// A configuration mistake, found before training starts.
    #[error("invalid training configuration: {0}")]
    Config(String),
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
