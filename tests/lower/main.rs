//! Lowering: passes, fusion, snapshots of lowered programs with their guards, verification, the
//! differential test against the reference executor, data-parallel and distributed programs.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

#[cfg(feature = "cuda")]
#[path = "../cuda_common/mod.rs"]
mod cuda_common;
// `cuda_common` loads `model_steps` itself and re-exports it: one copy of the module.
#[cfg(feature = "cuda")]
use cuda_common as model_steps;
#[cfg(not(feature = "cuda"))]
#[path = "../model_steps/mod.rs"]
mod model_steps;
#[path = "../prologue_case/mod.rs"]
mod prologue_case;
#[path = "../training_graphs/mod.rs"]
mod training_graphs;

#[cfg(feature = "cuda")]
mod adam_regression;
mod channel_reductions;
mod conv_prologues;
mod data_parallel;
mod differential;
#[cfg(feature = "cuda")]
mod distributed;
mod half_storage;
mod pipeline;
mod snapshots;
mod training;
mod verify;
