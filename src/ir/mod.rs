//! The op-graph IR: typed ops in a petgraph `StableGraph`, shapes with a symbolic batch, shape
//! and dtype inference, a verifier, and variable initializers.
//!
//! The IR knows nothing of towers, gradients, backends or trainers; every later stage builds on
//! it. Its textual form lives in [`text`].

mod error;
mod graph;
mod infer;
pub mod init;
mod op;
pub mod rng;
pub mod scalar;
mod shape;
mod step;
pub mod text;
mod variable;
mod verify;

pub use error::IrError;
pub use graph::{Edge, Graph, Node, NodeId, Value, is_valid_name};
pub use infer::{infer_types, window_output};
pub use op::{
    BinaryOp, Conv2dAttrs, Distribution, FanMode, Initializer, Op, Padding, PoolAttrs, PoolKind,
    ReduceOp, UnaryOp, VarId,
};
pub use shape::{Dim, Shape, TensorType};
pub use step::Step;
pub use variable::{VarFlags, VariableDef};
pub use verify::verify;
