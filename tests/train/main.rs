//! The trainer: callbacks, custom trainers, data-parallel training and checkpoints, the example
//! script, input sources, interrupts and kills, the loop, learning on mnist10k, monitors,
//! predictors, resume, schedules.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

#[path = "../train_common/mod.rs"]
mod train_common;

mod callbacks;
mod custom_trainer;
mod data_parallel;
mod data_parallel_checkpoint;
mod example;
mod input;
mod interrupt;
mod kill;
mod minimal;
mod mixed_precision;
mod monitors;
mod predict;
mod resume;
mod resume_other_model;
mod schedules;
mod training_loop;
