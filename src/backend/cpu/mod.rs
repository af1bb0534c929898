//! The fast CPU backend. [`kernels`] holds its compute kernels: pure functions over `f32`
//! slices (GEMM, convolution, pooling, reductions, softmax), vectorised and threaded with rayon.
//! The `Program` executor that runs lowered kernels on them is built on top.

pub mod kernels;
