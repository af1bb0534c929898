//! Dead-code elimination: removes every node neither fetched nor assigned nor needed by one.

use super::StepGraph;
use crate::lower::LowerError;
use std::collections::HashSet;

/// Removes dead nodes; returns how many were removed.
pub fn dce(sg: &mut StepGraph) -> Result<usize, LowerError> {
    let live: HashSet<_> = sg.live_nodes()?.into_iter().collect();
    let dead: Vec<_> = sg
        .graph
        .node_ids()
        .filter(|id| !live.contains(id))
        .collect();
    for &id in &dead {
        sg.graph.remove_node(id);
    }
    Ok(dead.len())
}
