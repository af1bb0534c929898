//! The CUDA backend: lowered [`Program`](crate::lower::Program)s rendered to CUDA C, compiled
//! by NVRTC and run through a narrow driver interface — on real GPUs (cudarc) or on emulated
//! devices (towerpack-ptx), so that everything but the silicon runs in CI.
//!
//! - [`render`]: each kernel of a program as a generated part plus a hand-written body of
//!   `kernels/` ([`bodies`]); one parameter descriptor per launch yields the C struct and the
//!   host packing;
//! - [`nvrtc`]: compilation to PTX, cached in memory and on disk;
//! - [`driver`]: the narrow device interface, on GPUs (cudarc) or emulated devices;
//! - [`prepared`]: a program placed, compiled and packed once; [`graph`]: its step captured
//!   once as a graph and replayed; [`session`]: the [`Session`](crate::backend::Session);
//! - [`perf`]: a performance model predicting each launch's time on a named GPU.

pub mod bodies;
pub mod driver;
pub mod error;
pub mod graph;
pub mod nvrtc;
pub mod perf;
pub mod prepared;
pub mod render;
pub mod session;

pub use error::CudaError;
pub use session::{
    CudaOptions, CudaSession, HOST_ONLY_ENV, PROLOGUES_ENV, PoisonScratch,
    prologues_from_environment,
};
