//! The fast CPU backend: runs lowered [`Program`](crate::lower::Program)s.
//!
//! - [`kernels`]: compute kernels over `f32` slices (GEMM, convolution, pooling, reductions,
//!   softmax), vectorised and threaded with rayon;
//! - [`fused`] and [`fused_reduce`]: the engines for fused elementwise expressions and
//!   reductions with fused prologues, over [`access`] patterns and raw [`memory`]; [`bucket`]:
//!   the streaming engine of fused update kernels over gradient arenas;
//! - [`exec`]: a program prepared to run; [`session`]: the [`Session`](crate::backend::Session).

pub mod access;
pub mod bucket;
mod devices;
pub mod exec;
pub mod fused;
pub mod fused_reduce;
mod half_io;
pub mod kernels;
pub mod memory;
pub mod session;
mod small;

pub use kernels::{SimdLevel, SimdLevelError};
pub use session::{
    AmxUse, CpuOptions, CpuSession, WinogradUse, oversubscription_warning, precision_warning,
};
