//! Extraction: the subgraph one step needs, with groups expanded into the assigns they gather.

use crate::ir::{Graph, NodeId, Op, Step, Value};
use crate::lower::LowerError;
use crate::lower::precision::HalfFormat;
use std::collections::{HashMap, HashSet};

/// The graph of one step, owned by lowering and rewritten by its passes.
#[derive(Clone, Debug)]
pub struct StepGraph {
    pub graph: Graph,
    /// The values the step returns, in order (kept up to date by rewrites).
    pub fetches: Vec<Value>,
    /// The `Assign` nodes the step applies, sorted by id.
    pub assigns: Vec<NodeId>,
    /// GEMM nodes whose operands their kernel rounds to a 16-bit format (set by
    /// [`absorb_casts`](crate::lower::autocast::absorb_casts)).
    pub round_operands: HashMap<NodeId, HalfFormat>,
}

impl StepGraph {
    /// Replaces every use of `old` by `new`, in the graph and in the fetch list.
    pub fn replace(&mut self, old: Value, new: Value) -> Result<(), LowerError> {
        self.graph.replace_all_uses(old, new)?;
        for f in &mut self.fetches {
            if *f == old {
                *f = new;
            }
        }
        Ok(())
    }

    /// The nodes the step needs, in topological order.
    pub fn live_nodes(&self) -> Result<Vec<NodeId>, LowerError> {
        let roots: Vec<NodeId> = self
            .fetches
            .iter()
            .map(|v| v.node)
            .chain(self.assigns.iter().copied())
            .collect();
        Ok(self.graph.ancestors_of(&roots)?)
    }
}

/// Copies the part of `graph` that `step` needs. Groups are replaced by the assigns they
/// (transitively) gather; a variable assigned twice is an error naming it.
pub fn extract(graph: &Graph, step: &Step) -> Result<StepGraph, LowerError> {
    let mut assigns = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<NodeId> = step.targets.clone();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        let node = graph.try_node(id).ok_or_else(|| LowerError::BadTarget {
            node: format!("#{}", id.index()),
        })?;
        match node.op {
            Op::Assign { .. } => assigns.push(id),
            Op::Group => stack.extend(graph.control_inputs(id)),
            _ => {
                return Err(LowerError::BadTarget {
                    node: node.name.clone(),
                });
            }
        }
    }
    assigns.sort();
    let mut by_var = HashMap::new();
    for &a in &assigns {
        if let Some(var) = graph.node(a).op.variable()
            && by_var.insert(var, a).is_some()
        {
            return Err(LowerError::DoubleAssign {
                variable: graph.variable(var).name.clone(),
            });
        }
    }
    for v in &step.fetches {
        let Some(node) = graph.try_node(v.node) else {
            return Err(LowerError::BadFetch {
                node: format!("#{}", v.node.index()),
                reason: "no such node".into(),
            });
        };
        if usize::from(v.port) >= node.outputs.len() {
            return Err(LowerError::BadFetch {
                node: node.name.clone(),
                reason: format!("it has {} output(s)", node.outputs.len()),
            });
        }
    }
    let roots: Vec<NodeId> = step
        .fetches
        .iter()
        .map(|v| v.node)
        .chain(assigns.iter().copied())
        .collect();
    let needed: HashSet<NodeId> = graph.ancestors_of(&roots)?.into_iter().collect();
    let mut sub = graph.clone();
    let all: Vec<NodeId> = sub.node_ids().collect();
    for id in all {
        if !needed.contains(&id) || matches!(sub.node(id).op, Op::Group) {
            sub.remove_node(id);
        }
    }
    Ok(StepGraph {
        graph: sub,
        fetches: step.fetches.clone(),
        assigns,
        round_operands: HashMap::new(),
    })
}
