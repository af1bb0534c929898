//! Data flows: augmentation, flows, loaders, prefetching, speed.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

#[path = "../data_common/mod.rs"]
mod data_common;

mod augment;
mod flows;
mod loaders;
mod prefetch;
mod speed;
