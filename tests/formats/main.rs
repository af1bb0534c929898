//! File formats: checkpoints, the logdir, restore matching, stats.json, TensorBoard events.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

mod checkpoint;
mod logdir;
mod restore;
mod stats;
mod tfevents;
