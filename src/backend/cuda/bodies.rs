//! The hand-written kernel bodies of `kernels/` (CUDA C), compiled into the library.
//!
//! A kernel's source is `common.cuh`, then its generated part (constants, `struct tp_params`,
//! hooks), then the headers its body needs, then the body. Bodies never change per launch: all
//! that varies is generated from the kernel's description.

/// The prelude every kernel starts with.
pub const COMMON: &str = include_str!("../../../kernels/common.cuh");
const GEMM_CORE: &str = include_str!("../../../kernels/gemm_core.cuh");
const SPLIT: &str = include_str!("../../../kernels/split.cuh");
const WARP: &str = include_str!("../../../kernels/warp.cuh");

/// A hand-written kernel body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Body {
    Elementwise,
    Reduce,
    MatMul,
    Conv2d,
    Conv2dBackpropInput,
    Conv2dBackpropFilter,
    Pool,
    PoolGrad,
    Softmax,
    SparseXent,
    ArgMax,
    InTopK,
    Gather,
}

impl Body {
    /// Every body, in a fixed order.
    pub const ALL: [Body; 13] = [
        Body::Elementwise,
        Body::Reduce,
        Body::MatMul,
        Body::Conv2d,
        Body::Conv2dBackpropInput,
        Body::Conv2dBackpropFilter,
        Body::Pool,
        Body::PoolGrad,
        Body::Softmax,
        Body::SparseXent,
        Body::ArgMax,
        Body::InTopK,
        Body::Gather,
    ];

    /// The file under `kernels/`.
    pub fn file(self) -> &'static str {
        match self {
            Body::Elementwise => "elementwise.cu",
            Body::Reduce => "reduce.cu",
            Body::MatMul => "matmul.cu",
            Body::Conv2d => "conv2d.cu",
            Body::Conv2dBackpropInput => "conv2d_backprop_input.cu",
            Body::Conv2dBackpropFilter => "conv2d_backprop_filter.cu",
            Body::Pool => "pool.cu",
            Body::PoolGrad => "pool_grad.cu",
            Body::Softmax => "softmax.cu",
            Body::SparseXent => "sparse_xent.cu",
            Body::ArgMax => "argmax.cu",
            Body::InTopK => "in_top_k.cu",
            Body::Gather => "gather.cu",
        }
    }

    /// The `extern "C" __global__` function the body defines.
    pub fn entry(self) -> &'static str {
        match self {
            Body::Elementwise => "tp_elementwise",
            Body::Reduce => "tp_reduce",
            Body::MatMul => "tp_matmul",
            Body::Conv2d => "tp_conv2d",
            Body::Conv2dBackpropInput => "tp_conv2d_backprop_input",
            Body::Conv2dBackpropFilter => "tp_conv2d_backprop_filter",
            Body::Pool => "tp_pool",
            Body::PoolGrad => "tp_pool_grad",
            Body::Softmax => "tp_softmax",
            Body::SparseXent => "tp_sparse_xent",
            Body::ArgMax => "tp_argmax",
            Body::InTopK => "tp_in_top_k",
            Body::Gather => "tp_gather_kernel",
        }
    }

    /// The headers the body needs (after the generated part).
    pub fn headers(self) -> &'static [&'static str] {
        match self {
            Body::MatMul
            | Body::Conv2d
            | Body::Conv2dBackpropInput
            | Body::Conv2dBackpropFilter => &[SPLIT, GEMM_CORE],
            Body::Softmax | Body::SparseXent => &[WARP],
            _ => &[],
        }
    }

    /// The body's text.
    pub fn text(self) -> &'static str {
        match self {
            Body::Elementwise => include_str!("../../../kernels/elementwise.cu"),
            Body::Reduce => include_str!("../../../kernels/reduce.cu"),
            Body::MatMul => include_str!("../../../kernels/matmul.cu"),
            Body::Conv2d => include_str!("../../../kernels/conv2d.cu"),
            Body::Conv2dBackpropInput => include_str!("../../../kernels/conv2d_backprop_input.cu"),
            Body::Conv2dBackpropFilter => {
                include_str!("../../../kernels/conv2d_backprop_filter.cu")
            }
            Body::Pool => include_str!("../../../kernels/pool.cu"),
            Body::PoolGrad => include_str!("../../../kernels/pool_grad.cu"),
            Body::Softmax => include_str!("../../../kernels/softmax.cu"),
            Body::SparseXent => include_str!("../../../kernels/sparse_xent.cu"),
            Body::ArgMax => include_str!("../../../kernels/argmax.cu"),
            Body::InTopK => include_str!("../../../kernels/in_top_k.cu"),
            Body::Gather => include_str!("../../../kernels/gather.cu"),
        }
    }
}
