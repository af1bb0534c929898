//! Backends: the CPU kernels (convolutions, GEMM, pooling, reductions, softmax) and feed errors of
//! the compiled backends. The SIMD-level tests are their own binary (`tests/backend_simd.rs`): they
//! read a process-wide record of the levels that ran, so nothing else may run kernels in their
//! process.
//!
//! One test binary per stage (linking the crate once per binary dominates the build); each
//! module is one former `tests/<stage>_<topic>.rs` file.

#[path = "../cpu_kernels_common/mod.rs"]
mod cpu_kernels_common;

mod cpu_conv;
mod cpu_conv_amx;
mod cpu_gemm;
mod cpu_pool;
mod cpu_reduce;
mod cpu_softmax;
#[cfg(feature = "cuda")]
mod feed_errors;
