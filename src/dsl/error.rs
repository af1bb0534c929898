//! The error of graph building: the first failure inside a tower function, with the scoped
//! name of the node or layer at fault and, for type errors, the op and the input shapes.

use crate::ir::IrError;
use crate::tower::TowerError;

/// An error while building a graph with the DSL.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DslError {
    /// The graph refused a node: the message names the node, the op and the input types.
    #[error(transparent)]
    Graph(#[from] IrError),
    /// A tower or scope rule was broken at `at` (the scoped name being created).
    #[error("at `{at}`: {source}")]
    Tower {
        at: String,
        #[source]
        source: Box<TowerError>,
    },
    /// A layer was called with arguments that do not fit its input.
    #[error("layer `{layer}` ({kind}): {message}")]
    Layer {
        layer: String,
        kind: &'static str,
        message: String,
    },
    /// An op was called with arguments that do not fit its input (before reaching the graph).
    #[error("node `{node}`: {message}")]
    Op { node: String, message: String },
    /// Tensors of two different builders were combined.
    #[error("node `{node}`: its inputs come from different graph builders")]
    MixedBuilders { node: String },
    /// A free function of the DSL ran with no default builder.
    #[error(
        "`{what}` needs a current graph: call it inside a tower function or under \
         Builder::as_default()"
    )]
    NoDefaultBuilder { what: &'static str },
    /// The cost returned by a training tower is not a float scalar.
    #[error("tower `{tower}`: the cost must be a float scalar, got {ty}")]
    CostNotScalar { tower: String, ty: String },
    /// An input signature that tensorpack would reject.
    #[error("input signature: {message}")]
    Signature { message: String },
    /// An op was built while the graph was being read (inside `Builder::with_graph`).
    #[error("the graph was modified while being read: build no ops inside Builder::with_graph")]
    Reentrant,
    /// `finish` was called twice.
    #[error("the builder was already finished")]
    Finished,
}

impl DslError {
    /// The tower rule behind this error, if it is one.
    pub fn tower_error(&self) -> Option<&TowerError> {
        match self {
            DslError::Tower { source, .. } => Some(source),
            _ => None,
        }
    }
}
