//! Compute kernels of the CPU backend: pure functions over `f32` slices, knowing nothing of the
//! IR. GEMM ([`gemm`]), NHWC convolution with fused epilogues ([`conv`]), pooling ([`pool`]),
//! reductions ([`reduce`]) and softmax/cross-entropy ([`softmax`]).
//!
//! Every kernel checks its slice lengths against the shapes it is given and returns
//! [`KernelError`] instead of panicking. Threading uses the rayon pool the caller runs in; work is
//! split at boundaries that depend only on the shapes (and, for cross-row reductions, on
//! `rayon::current_num_threads()`), so results are bit-identical from run to run for a given
//! thread count. Small problems stay on the calling thread. Hand-written AVX-512 and AVX2 paths
//! (direct convolution; tiny GEMMs on AVX-512) sit next to portable ones; every kernel runs at the
//! [`SimdLevel`] in force on the calling thread ([`simd`]: detected, capped by `TOWERPACK_SIMD`,
//! lowered per call with [`SimdLevel::run`]), and carries it into its parallel tasks.
//!
//! ```
//! use towerpack::backend::cpu::kernels::{
//!     ChannelEpilogue, Conv2dGeometry, MatRef, Padding2d, conv2d_forward, sgemm_with_epilogue,
//! };
//! // A Linear layer with bias and ReLU: y = relu(x · w + b), x [2, 3], w [3, 2].
//! let (x, w, b) = ([1.0, 2.0, 3.0, -1.0, -2.0, -3.0], [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], [0.5, -9.0]);
//! let mut y = [0.0; 4];
//! let bias_relu = ChannelEpilogue { shift: Some(&b), relu: true, ..Default::default() };
//! let (xv, wv) = (MatRef::row_major(&x, 3), MatRef::row_major(&w, 2));
//! sgemm_with_epilogue(2, 2, 3, 1.0, xv, wv, 0.0, &mut y, &bias_relu)?;
//! assert_eq!(y, [4.5, 0.0, 0.0, 0.0]);
//!
//! // A 3×3 'same' convolution of one 4×4 single-channel image of ones with a filter of ones.
//! let mut g = Conv2dGeometry::new(1, [4, 4], 1, 1, [3, 3]);
//! g.padding = Padding2d::uniform(1);
//! let mut out = vec![0.0; g.output_len()];
//! conv2d_forward(&g, &[1.0; 16], &[1.0; 9], &mut out, &ChannelEpilogue::default())?;
//! assert_eq!(&out[..4], &[4.0, 6.0, 6.0, 4.0]); // corners see 4 cells, edges 6
//! # Ok::<(), towerpack::backend::cpu::kernels::KernelError>(())
//! ```

pub mod conv;
pub mod epilogue;
pub mod gemm;
mod parallel;
pub mod pool;
pub mod reduce;
pub mod round;
pub mod simd;
pub mod softmax;

pub use conv::{
    ComputeInput, Conv2dGeometry, ConvAlgorithm, ConvInput, ConvPass, Padding2d,
    bf16_tiles_preferred, bf16_tiles_unsupported, conv2d_backward_filter,
    conv2d_backward_filter_bf16, conv2d_backward_filter_with, conv2d_backward_input,
    conv2d_backward_input_bf16, conv2d_backward_input_with, conv2d_forward, conv2d_forward_bf16,
    conv2d_forward_with,
};
pub use epilogue::{ChannelEpilogue, Epilogue, MomentsEpilogue, NoEpilogue};
pub use gemm::{MatRef, sgemm, sgemm_with_epilogue};
pub use simd::{SimdLevel, SimdLevelError};

/// A kernel was called with buffers or shapes that do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A slice is shorter (or, for outputs, of a different length) than the shapes require.
    #[error("{kernel}: `{operand}` has {got} elements, expected {expected}")]
    BufferLength {
        kernel: &'static str,
        operand: &'static str,
        expected: usize,
        got: usize,
    },
    /// The shape parameters themselves are inconsistent.
    #[error("{kernel}: {message}")]
    Shape {
        kernel: &'static str,
        message: String,
    },
}

/// Checks that `operand` has exactly `expected` elements.
pub(crate) fn check_len(
    kernel: &'static str,
    operand: &'static str,
    got: usize,
    expected: usize,
) -> Result<(), KernelError> {
    if got == expected {
        Ok(())
    } else {
        Err(KernelError::BufferLength {
            kernel,
            operand,
            expected,
            got,
        })
    }
}

/// Whether the environment variable `var` switches a kernel path off for the process: `0`,
/// `off` or `false` (any case, surrounding spaces ignored).
pub(crate) fn switched_off_by_env(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| {
        let v = v.trim();
        v == "0" || v.eq_ignore_ascii_case("off") || v.eq_ignore_ascii_case("false")
    })
}

/// A [`KernelError::Shape`] with a formatted message.
pub(crate) fn shape_error(kernel: &'static str, message: impl Into<String>) -> KernelError {
    KernelError::Shape {
        kernel,
        message: message.into(),
    }
}
