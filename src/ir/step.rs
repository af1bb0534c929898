//! `Step`: what one run of a graph computes — values to fetch and side effects to apply.
//!
//! It is a property of the graph, not of a backend: lowering compiles one `Program` per distinct
//! step, and every backend's `Session::run` takes one.

use super::graph::{NodeId, Value};

/// Values to fetch and side-effect nodes (assigns, groups) to run in one step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Step {
    /// Values returned by a run, in this order.
    pub fetches: Vec<Value>,
    /// `Assign` or `Group` nodes whose effects the step applies.
    pub targets: Vec<NodeId>,
}

impl Step {
    /// A step fetching `fetches` and running `targets`.
    pub fn new(fetches: Vec<Value>, targets: Vec<NodeId>) -> Step {
        Step { fetches, targets }
    }

    /// A step that only fetches.
    pub fn fetch(fetches: Vec<Value>) -> Step {
        Step {
            fetches,
            targets: Vec::new(),
        }
    }

    /// Every node the step asks for: the fetched values' nodes, then the targets.
    pub fn roots(&self) -> Vec<NodeId> {
        self.fetches
            .iter()
            .map(|v| v.node)
            .chain(self.targets.iter().copied())
            .collect()
    }
}
