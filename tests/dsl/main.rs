//! The tower DSL and the tower rules: `graph!`, layers, models, numerics, ops, the snapshotted
//! towers, validation, replication, scopes and the variable store.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

mod graph_macro;
mod layers;
mod models;
mod numerics;
mod ops;
mod snapshots;
mod tower_replicate;
mod tower_rules;
mod tower_store;
mod validation;
