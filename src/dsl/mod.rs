//! The tower DSL: a graph [`Builder`], symbolic [`Tensor`]s with operator overloading, layers
//! called by name as tensorpack's (`Conv2D("conv0", x)`), [`argscope`] defaults, replication of
//! one tower function into many towers, and the [`graph!`](crate::graph) macro.
//!
//! Ops and layers never return `Result`: the first error is recorded by the builder with the
//! scoped node name, later ops are no-ops, and the error comes back from
//! [`Builder::build_tower`] or [`Builder::finish`].
//!
//! # A tower function in plain Rust
//!
//! ```
//! use towerpack::dsl::prelude::*;
//!
//! let sig = [
//!     InputSpec::new("x", DType::F32, Shape::batched(&[4])),
//!     InputSpec::new("label", DType::I64, Shape::batched(&[])),
//! ];
//! let tower = |inputs: &[Tensor]| {
//!     let h = FullyConnected("fc0", &inputs[0]).units(8).activation(relu).build();
//!     let logits = FullyConnected("linear", h).units(3).build();
//!     sparse_softmax_cross_entropy(&logits, &inputs[1]).named("cost")
//! };
//! let built = replicate(&sig, &Replication::single(), tower).unwrap();
//! assert!(built.graph.find_variable("fc0/W").is_some());
//! assert_eq!(built.training[0].get_tensor(&built.graph, "cost"), built.training[0].cost);
//! ```
//!
//! # The same with `graph!`
//!
//! Layer calls take keyword arguments; each keyword is a method of the layer, so rustc checks
//! it:
//!
//! ```
//! use towerpack::dsl::prelude::*;
//! use towerpack::graph;
//!
//! fn tower(inputs: &[Tensor]) -> Tensor {
//!     let (x, label) = (&inputs[0], &inputs[1]);
//!     graph! {
//!         let h = FullyConnected("fc0", x, units = 8, activation = relu);
//!         let logits = FullyConnected("linear", h, units = 3);
//!         sparse_softmax_cross_entropy(&logits, label).named("cost")
//!     }
//! }
//! # let sig = [
//! #     InputSpec::new("x", DType::F32, Shape::batched(&[4])),
//! #     InputSpec::new("label", DType::I64, Shape::batched(&[])),
//! # ];
//! # replicate(&sig, &Replication::single(), tower).unwrap();
//! ```
//!
//! A misspelled keyword is a compile error (E0599, no method `unitz`) pointing at it:
//!
//! ```compile_fail,E0599
//! use towerpack::dsl::prelude::*;
//! use towerpack::graph;
//!
//! fn tower(inputs: &[Tensor]) -> Tensor {
//!     graph! { FullyConnected("linear", &inputs[0], unitz = 3) }
//! }
//! ```

mod argscope;
mod builder;
mod error;
mod handle;
pub mod layers;
mod ops;
mod replicate;
mod scopes;
mod tensor;

pub use argscope::{ArgScopeGuard, LayerDefaults, argscope};
pub use builder::{Builder, DefaultGuard, Tensor, current_builder};
pub use error::DslError;
pub use handle::{InputSpec, TowerHandle, validate_signature};
pub use layers::*;
pub use ops::Operand;
pub use replicate::{
    INFERENCE_TOWER, Replicated, Replication, Strategy, build_inference_tower,
    build_training_towers, replicate,
};
pub use scopes::{ScopeGuard, TowerGuard};
pub use tensor::{concat, select};

use crate::tower::{TowerContext, VarSpec};
use tensor::orphan;

/// The tower context of the running tower function (tensorpack's
/// `get_current_tower_context()`), if any.
pub fn current_tower() -> Option<TowerContext> {
    current_builder().and_then(|b| b.tower_context())
}

/// The `global_step` variable of the current graph (`i64` scalar, non-trainable).
pub fn global_step() -> Tensor {
    current_builder().map_or_else(|| orphan("global_step"), |b| b.global_step())
}

/// `tf.get_variable` in the current graph and variable scope.
pub fn get_variable(name: &str, spec: &VarSpec) -> Tensor {
    current_builder().map_or_else(|| orphan("get_variable"), |b| b.get_variable(name, spec))
}

/// Opens a variable scope (and name scope) in the current graph until the guard drops.
/// Without a current graph the guard does nothing.
pub fn variable_scope(name: &str) -> ScopeGuard {
    current_builder().unwrap_or_default().variable_scope(name)
}

/// Opens a variable scope with reuse on (when `reuse`) in the current graph.
pub fn variable_scope_with_reuse(name: &str, reuse: bool) -> ScopeGuard {
    current_builder()
        .unwrap_or_default()
        .variable_scope_with_reuse(name, reuse)
}

/// Opens a name scope in the current graph until the guard drops.
pub fn name_scope(name: &str) -> ScopeGuard {
    current_builder().unwrap_or_default().name_scope(name)
}

/// Everything a tower function usually needs.
pub mod prelude {
    pub use super::layers::*;
    pub use super::{
        Builder, DslError, INFERENCE_TOWER, InputSpec, Replicated, Replication, Strategy, Tensor,
        TowerHandle, argscope, build_inference_tower, build_training_towers, concat, current_tower,
        get_variable, global_step, name_scope, replicate, select, variable_scope,
        variable_scope_with_reuse,
    };
    pub use crate::ir::{FanMode, Initializer, Padding, Shape};
    pub use crate::tensor::DType;
    pub use crate::tower::{TowerContext, VarSpec};
}
