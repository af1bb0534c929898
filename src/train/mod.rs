//! The trainer system: the epoch/step loop, callbacks, monitors, checkpoints, input sources and
//! predictors.

pub mod checkpoint;
pub mod logdir;
pub mod minimal;
pub mod monitor;
