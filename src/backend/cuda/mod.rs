//! The CUDA backend: lowered [`Program`](crate::lower::Program)s rendered to CUDA C, compiled
//! by NVRTC and run through a narrow driver interface — on real GPUs (cudarc) or on emulated
//! devices (towerpack-ptx), so that everything but the silicon runs in CI.
//!
//! - [`render`]: each kernel of a program as a generated part plus a hand-written body of
//!   `kernels/` ([`bodies`]); one parameter descriptor per launch yields the C struct and the
//!   host packing;
//! - [`nvrtc`]: compilation to PTX, cached in memory and on disk.

pub mod bodies;
pub mod error;
pub mod nvrtc;
pub mod render;

pub use error::CudaError;
