//! `TrainConfig`: everything a run needs besides the trainer (tensorpack's `TrainConfig` and
//! `AutoResumeTrainConfig`); the backend is named by a [`BackendChoice`], which the backend
//! stage turns into a session.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::backend::BackendChoice;
use crate::data::DataFlow;
pub use crate::lower::Precision;
pub use crate::optim::DynamicLossScale;

use super::callback::Callback;
use super::input::InputSource;
use super::logdir::LogDirAction;
use super::model::ModelDesc;
use super::monitors::TrainingMonitor;
use super::session_init::SessionInit;

/// Whether and how a run continues an earlier one.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Resume {
    /// A fresh run (unless `session_init` and `starting_epoch` say otherwise, as in tensorpack).
    #[default]
    No,
    /// tensorpack's `AutoResumeTrainConfig`: continue from the latest checkpoint of the logdir,
    /// if there is one. With `always` false, a `session_init` given by the user wins.
    Auto { always: bool },
    /// Continue exactly from this checkpoint (file, prefix, directory or index).
    From(PathBuf),
}

/// The configuration of a run.
pub struct TrainConfig {
    pub model: Option<Arc<dyn ModelDesc>>,
    /// The training data; becomes the trainer's default input source. XOR `data`.
    pub dataflow: Option<Box<dyn DataFlow>>,
    /// The training input source. XOR `dataflow`.
    pub data: Option<Box<dyn InputSource>>,
    pub callbacks: Vec<Box<dyn Callback>>,
    /// `None`: tensorpack's defaults ([`default_callbacks`](super::callbacks::default_callbacks)).
    pub extra_callbacks: Option<Vec<Box<dyn Callback>>>,
    /// `None`: `[TFEventWriter, JSONWriter, ScalarPrinter]`.
    pub monitors: Option<Vec<Box<dyn TrainingMonitor>>>,
    /// How variables get their values after initialization (default: they keep them).
    pub session_init: Option<Box<dyn SessionInit>>,
    pub starting_epoch: u64,
    /// Default: the input's size (the data flow's length); an error if unknown.
    pub steps_per_epoch: Option<u64>,
    pub max_epoch: u64,
    /// Seeds graph randomness and variable initialization.
    pub seed: u64,
    pub backend: BackendChoice,
    /// How the model's matrix products and convolutions multiply (default f32): TF32 runs them
    /// on the tensor cores of the CUDA backend (the CPU backend has no TF32 units and computes
    /// in f32, as PyTorch's CPU does); bf16 and fp16 round their operands to 16 bits on every
    /// backend (automatic mixed precision, [`crate::lower::autocast`]). Variables (the master
    /// weights), optimizer slots, checkpoints and every other op stay f32.
    pub precision: Precision,
    /// The dynamic loss scale of FP16 training (set by [`TrainConfig::precision`]: the
    /// default [`DynamicLossScale`] for fp16, none otherwise; [`TrainConfig::loss_scale`]
    /// overrides it).
    pub loss_scale: Option<DynamicLossScale>,
    /// Where files go (checkpoints, `stats.json`, events, and `log.log`, which the run appends
    /// its log lines to). Default: the logger dir set by `logdir::set_logger_dir`, if any.
    pub logdir: Option<PathBuf>,
    /// What to do with `logdir` when it exists and is not empty (default
    /// [`LogDirAction::Keep`]: use it as it is, which resuming needs).
    pub logdir_action: LogDirAction,
    pub resume: Resume,
}

impl Default for TrainConfig {
    fn default() -> TrainConfig {
        TrainConfig {
            model: None,
            dataflow: None,
            data: None,
            callbacks: Vec::new(),
            extra_callbacks: None,
            monitors: None,
            session_init: None,
            starting_epoch: 1,
            steps_per_epoch: None,
            max_epoch: 99_999,
            seed: 0,
            backend: BackendChoice::default(),
            precision: Precision::default(),
            loss_scale: None,
            logdir: None,
            logdir_action: LogDirAction::Keep,
            resume: Resume::No,
        }
    }
}

impl TrainConfig {
    /// A configuration training `model` (everything else default).
    pub fn new(model: impl ModelDesc + 'static) -> TrainConfig {
        TrainConfig {
            model: Some(Arc::new(model)),
            ..TrainConfig::default()
        }
    }

    /// Trains on `flow` (the trainer picks the input source).
    pub fn dataflow(mut self, flow: impl DataFlow + 'static) -> TrainConfig {
        self.dataflow = Some(Box::new(flow));
        self
    }

    /// Trains on `input`.
    pub fn data(mut self, input: impl InputSource + 'static) -> TrainConfig {
        self.data = Some(Box::new(input));
        self
    }

    /// Adds a callback (after those added before).
    pub fn callback(mut self, callback: impl Callback + 'static) -> TrainConfig {
        self.callbacks.push(Box::new(callback));
        self
    }

    /// Replaces the default extra callbacks.
    pub fn extra_callbacks(mut self, callbacks: Vec<Box<dyn Callback>>) -> TrainConfig {
        self.extra_callbacks = Some(callbacks);
        self
    }

    /// Replaces the default monitors.
    pub fn monitors(mut self, monitors: Vec<Box<dyn TrainingMonitor>>) -> TrainConfig {
        self.monitors = Some(monitors);
        self
    }

    /// Initializes variables with `init`.
    pub fn session_init(mut self, init: impl SessionInit + 'static) -> TrainConfig {
        self.session_init = Some(Box::new(init));
        self
    }

    /// Sets `starting_epoch`.
    pub fn starting_epoch(mut self, epoch: u64) -> TrainConfig {
        self.starting_epoch = epoch;
        self
    }

    /// Sets `steps_per_epoch`.
    pub fn steps_per_epoch(mut self, steps: u64) -> TrainConfig {
        self.steps_per_epoch = Some(steps);
        self
    }

    /// Sets `max_epoch`.
    pub fn max_epoch(mut self, epoch: u64) -> TrainConfig {
        self.max_epoch = epoch;
        self
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> TrainConfig {
        self.seed = seed;
        self
    }

    /// Sets the backend.
    pub fn backend(mut self, backend: BackendChoice) -> TrainConfig {
        self.backend = backend;
        self
    }

    /// Sets the precision of matrix products and convolutions ([`Precision`]), with the loss
    /// scale it needs: PyTorch `GradScaler`'s defaults for fp16 ([`DynamicLossScale`]), none
    /// otherwise (call [`TrainConfig::loss_scale`] after this to change it).
    pub fn precision(mut self, precision: Precision) -> TrainConfig {
        self.precision = precision;
        self.loss_scale = precision.loss_scaling().then(DynamicLossScale::default);
        self
    }

    /// Trains under this dynamic loss scale (`None`: without one): the cost is multiplied by
    /// the scale before differentiation, gradients are divided by it before the gradient
    /// processors, a step whose gradients are not all finite is skipped and halves the scale,
    /// and the scale doubles after `growth_interval` good steps. The scale is the
    /// `LossScale/scale` variable (checkpointed) and the `loss_scale` monitor scalar, which a
    /// [`LossScaleMonitor`](crate::train::callbacks::LossScaleMonitor) fetches with every 10th
    /// step; one among [`callback`](Self::callback)s replaces the engine's (e.g.
    /// `LossScaleMonitor::new().every(1)` to fetch after every step).
    pub fn loss_scale(mut self, loss_scale: Option<DynamicLossScale>) -> TrainConfig {
        self.loss_scale = loss_scale;
        self
    }

    /// Writes files to `dir`, the log included (`<dir>/log.log`): the one way to say where a
    /// run's files go. An existing dir is used as it is (to resume) unless
    /// [`TrainConfig::logdir_action`] says otherwise.
    pub fn logdir(mut self, dir: impl AsRef<Path>) -> TrainConfig {
        self.logdir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// What the run does with an existing, non-empty logdir before it starts: keep it (the
    /// default), back it up to `<dir>.<MMDD-HHMMSS>`, delete it, use a new sibling, or ask on
    /// the terminal (tensorpack's `set_logger_dir` actions). [`TrainReport::logdir`] says which
    /// directory was used.
    ///
    /// [`TrainReport::logdir`]: super::TrainReport::logdir
    pub fn logdir_action(mut self, action: LogDirAction) -> TrainConfig {
        self.logdir_action = action;
        self
    }

    /// tensorpack's `AutoResumeTrainConfig(always_resume=always)`.
    pub fn auto_resume(mut self, always: bool) -> TrainConfig {
        self.resume = Resume::Auto { always };
        self
    }

    /// Continues exactly from `checkpoint`.
    pub fn resume_from(mut self, checkpoint: impl AsRef<Path>) -> TrainConfig {
        self.resume = Resume::From(checkpoint.as_ref().to_path_buf());
        self
    }
}
