//! Element types and host tensors: the data vocabulary shared by every stage.
//!
//! This module knows nothing of graphs, backends or trainers; it only holds dense arrays.

mod dtype;
mod half_round;
mod host;

pub use dtype::DType;
pub use half_round::bf16_from_f64;
pub use host::{HostTensor, Storage};

/// Errors of host-tensor construction and conversion.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TensorError {
    #[error("shape {shape:?} needs {expected} elements, got {got}")]
    ElementCount {
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    #[error("{dtype} tensor of shape {shape:?} needs {expected} bytes, got {got}")]
    ByteCount {
        dtype: DType,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    #[error("expected a {expected} tensor, got {got}")]
    WrongDType { expected: DType, got: DType },
    #[error("expected a tensor with one element, got shape {shape:?}")]
    NotScalar { shape: Vec<usize> },
}
