//! Optimizers: user-defined rules, gradient processors, slots, training and update formulas.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

#[path = "../train_common/mod.rs"]
mod train_common;

mod custom_rule;
mod finiteness;
mod processors;
mod slots;
mod training;
mod updates;
