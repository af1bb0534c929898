//! Distributed training: ranks as threads (`LocalGroup`) and, with the `mpi` feature, MPI ranks.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

#[path = "../distributed_common/mod.rs"]
mod distributed_common;

mod local;
mod mpi;
