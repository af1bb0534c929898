//! The names of the graph collections, in one place, and the variable collections as flags.
//!
//! Variable collections (TRAINABLE, MODEL, LOCAL) are [`VarFlags`] on variable declarations;
//! node collections live in [`Graph`] collections under the string keys below.

use crate::ir::{Graph, VarFlags, VarId};

/// BatchNorm EMA `Assign` nodes of the main training tower, run by a `RunUpdateOps` callback.
pub const UPDATE_OPS: &str = "update_ops";
/// Per-layer regularization terms, summed by `regularize_cost_from_collection`.
pub const REGULARIZATION_LOSSES: &str = "regularization_losses";
/// Tensors to summarize (histograms, images, scalars), main training tower only.
pub const SUMMARIES: &str = "summaries";
/// Scalars whose moving average is summarized, main training tower only.
pub const MOVING_SUMMARY: &str = "MOVING_SUMMARY_OPS";

/// Every node collection a tower may write.
pub const NODE_COLLECTIONS: [&str; 4] =
    [UPDATE_OPS, REGULARIZATION_LOSSES, SUMMARIES, MOVING_SUMMARY];

/// A variable collection of tensorpack, expressed through [`VarFlags`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VarCollection {
    /// TRAINABLE_VARIABLES: updated by gradient descent.
    Trainable,
    /// MODEL_VARIABLES: non-trainable state needed for inference (BatchNorm EMAs).
    Model,
    /// LOCAL_VARIABLES: per-replica copies, not saved.
    Local,
    /// GLOBAL_VARIABLES: every variable that is not local (what checkpoints save).
    Global,
}

impl VarCollection {
    /// True when a variable with `flags` belongs to this collection.
    pub fn contains(self, flags: VarFlags) -> bool {
        match self {
            VarCollection::Trainable => flags.trainable,
            VarCollection::Model => flags.model,
            VarCollection::Local => flags.local,
            VarCollection::Global => !flags.local,
        }
    }

    /// The variables of `graph` in this collection, in declaration order.
    pub fn variables(self, graph: &Graph) -> Vec<VarId> {
        graph
            .variable_ids()
            .filter(|(_, d)| self.contains(d.flags))
            .map(|(id, _)| id)
            .collect()
    }
}
