//! The built-in callbacks.
//!
//! - Graph upkeep: [`MaintainStepCounter`] (internal), [`RunUpdateOps`], [`MovingAverageSummary`],
//!   [`MergeAllSummaries`]; [`LossScaleMonitor`] (internal) under FP16's loss scale.
//! - Checkpoints: [`ModelSaver`], [`MinSaver`], [`MaxSaver`].
//! - Validation: [`InferenceRunner`] with [`ScalarStats`] and [`ClassificationError`].
//! - Hyper-parameters: [`ScheduledHyperParamSetter`], [`HyperParamSetterWithFunc`],
//!   [`StatMonitorParamSetter`]; [`LogHyperParams`] puts the learning rate into the monitors
//!   every epoch.
//! - Progress: [`ProgressBar`], [`EstimatedTimeLeft`], [`ThroughputTracker`].
//! - Scheduling: [`PeriodicTrigger`], [`PeriodicCallback`], [`EnableCallbackIf`].
//! - Stopping: [`EarlyStopping`], [`NonFiniteGuard`].

mod inference;
mod loss_scale;
mod param;
mod periodic;
mod progress;
mod saver;
mod steps;
mod stopping;

pub use inference::{ClassificationError, InferenceRunner, Inferencer, ScalarStats};
pub use loss_scale::LossScaleMonitor;
pub use param::{
    HyperParamSetterWithFunc, Interpolation, LogHyperParams, ScheduledHyperParamSetter,
    StatMonitorParamSetter,
};
pub use periodic::{EnableCallbackIf, PeriodicCallback, PeriodicTrigger};
pub use progress::{EstimatedTimeLeft, ProgressBar, ThroughputTracker};
pub use saver::{MaxSaver, MinSaver, ModelSaver};
pub use steps::{MaintainStepCounter, MergeAllSummaries, MovingAverageSummary, RunUpdateOps};
pub use stopping::{EarlyStopping, Mode, NonFiniteGuard};

use super::callback::Callback;

/// tensorpack's `DEFAULT_CALLBACKS()`: `[MovingAverageSummary, ProgressBar, MergeAllSummaries,
/// RunUpdateOps]`, and [`LogHyperParams`] so the learning rate is in every epoch's statistics.
pub fn default_callbacks() -> Vec<Box<dyn Callback>> {
    vec![
        Box::new(MovingAverageSummary::new()),
        Box::new(ProgressBar::new()),
        Box::new(MergeAllSummaries::new()),
        Box::new(RunUpdateOps::new()),
        Box::new(LogHyperParams::new()),
    ]
}
