//! Reverse-mode automatic differentiation as a graph pass: the gradient of a float scalar cost
//! is built from NEW nodes of the same graph, named under a prefix (e.g. `tower0/gradients`) and
//! placed on the device of the forward node they differentiate.
//!
//! Semantics (TF's `tf.gradients`, as tensorpack's `SingleCostTrainer` uses it):
//! - Only values that carry floats carry gradients: integer and bool paths stop gradients
//!   silently (an `ArgMax` cast back to float contributes nothing). `Sign` and `Floor` have no
//!   gradient (zero almost everywhere), and neither does `RandomUniform` (w.r.t. either input).
//! - Ops without a rule on a path the gradient must take (only `MaxPoolGrad`: second-order max
//!   pooling) give [`AutodiffError::NotDifferentiable`], naming the node and its op.
//! - Ties at kinks follow TF: `relu'(0) = 0`; `maximum` routes to its left operand on ties
//!   (`a >= b`), `minimum` too (`a <= b`); `reduce_max`/`reduce_min` divide the gradient among
//!   tied elements; max pooling routes each window's gradient to its first maximum.
//! - Nodes are emitted only for paths from a `wrt` value to the cost (no gradient of the first
//!   convolution's input image, no gradient of integer branches).
//!
//! Gradient nodes are named `{prefix}/{forward}_grad/{part}`; when the prefix has a scope (the
//! part before its last `/`, e.g. `tower0`) that the forward name starts with, that scope is
//! stripped from the forward name once: `tower0/gradients/conv0/Conv2D_grad/backprop_input`.

mod emit;
mod pass;
mod rules;

use crate::ir::{IrError, Value, VarId};

pub use pass::{gradients, gradients_of_values};

/// The gradients of a cost with respect to a list of variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradientSet {
    /// `(variable, gradient)` for every variable the cost depends on, in the order asked for.
    /// The gradient has the variable's type; it sums the adjoints of every read of the variable
    /// that the cost depends on.
    pub grads: Vec<(VarId, Value)>,
    /// Variables the cost does not reach through float paths, in the order asked for. A trainer
    /// warns about them ("No gradient w.r.t N trainable variables: ...", as tensorpack's
    /// `FilterNoneGrad`) and drops them.
    pub unreached: Vec<VarId>,
}

/// Errors of the gradient pass. Each names the node (scoped name and op) at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AutodiffError {
    /// The cost is not a floating-point scalar.
    #[error("cost `{name}` must be a floating-point scalar, got {ty}")]
    CostNotScalar { name: String, ty: String },
    /// A value passed to the pass does not exist in the graph.
    #[error("value #{node}:{port} does not exist in the graph")]
    UnknownValue { node: usize, port: u16 },
    /// A variable passed to the pass was not declared in the graph.
    #[error("variable #{0} is not declared in the graph")]
    UnknownVariable(u32),
    /// A gradient must pass through an input of an op that has no gradient rule for it.
    #[error("node `{node}` ({op}) is not differentiable with respect to input {slot}: {reason}")]
    NotDifferentiable {
        node: String,
        op: String,
        slot: usize,
        reason: String,
    },
    /// A rule produced a gradient whose type differs from its input's (a bug of the rule).
    #[error(
        "gradient rule of node `{node}` ({op}) gave input {slot} a gradient of type {got}, expected {expected}"
    )]
    WrongGradientType {
        node: String,
        op: String,
        slot: usize,
        expected: String,
        got: String,
    },
    /// Building a gradient node failed (a bug of a rule; the source names the new node).
    #[error("building the gradient of node `{node}` ({op}): {source}")]
    Rule {
        node: String,
        op: String,
        #[source]
        source: Box<IrError>,
    },
    /// The graph itself is invalid (e.g. it has a cycle).
    #[error(transparent)]
    Ir(#[from] IrError),
}
