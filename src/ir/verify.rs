//! The verifier: checks the invariants every pass may rely on.
//!
//! A verified graph has unique valid names, no cycle, inputs that exist in every slot from 0 to
//! the op's arity, stored types equal to freshly inferred ones, control edges only where they
//! mean something, and collections that point at existing outputs.

use super::error::IrError;
use super::graph::{Edge, Graph, Value, is_valid_name};
use super::infer::infer_types;
use super::op::Op;
use petgraph::Direction;
use petgraph::visit::EdgeRef;
use std::collections::HashSet;

/// Checks every invariant of `graph`; the first violation is returned.
pub fn verify(graph: &Graph) -> Result<(), IrError> {
    graph.topo_order()?;
    let pg = graph.petgraph();
    let mut names = HashSet::new();
    for id in graph.node_ids() {
        let node = graph.node(id);
        let bad = |message: String| IrError::Invalid {
            node: node.name.clone(),
            message,
        };
        if !is_valid_name(&node.name) {
            return Err(IrError::InvalidName {
                name: node.name.clone(),
            });
        }
        if !names.insert(node.name.as_str()) {
            return Err(IrError::DuplicateNode {
                name: node.name.clone(),
            });
        }
        let mut slots: Vec<u16> = Vec::new();
        for e in pg.edges_directed(id, Direction::Incoming) {
            match *e.weight() {
                Edge::Data { port, slot } => {
                    let src = graph.node(e.source());
                    if usize::from(port) >= src.outputs.len() {
                        return Err(bad(format!(
                            "input {slot} reads output {port} of `{}`, which has {} output(s)",
                            src.name,
                            src.outputs.len()
                        )));
                    }
                    slots.push(slot);
                }
                Edge::Control => {
                    if !matches!(node.op, Op::Group) {
                        return Err(bad(format!(
                            "only group nodes take control inputs ({} does not)",
                            node.op.kind_name()
                        )));
                    }
                }
            }
        }
        slots.sort_unstable();
        if slots.iter().enumerate().any(|(i, &s)| usize::from(s) != i) {
            return Err(bad(format!(
                "input slots {slots:?} are not 0..{}",
                slots.len()
            )));
        }
        if let Some(var) = node.op.variable()
            && var.0 as usize >= graph.variables().len()
        {
            return Err(bad(format!("refers to unknown variable #{}", var.0)));
        }
        let inputs = graph.inputs(id);
        let types: Vec<_> = inputs.iter().map(|v| graph.value_type(*v)).collect();
        let inferred =
            infer_types(&node.op, &types, graph.variables()).map_err(|message| IrError::Type {
                node: node.name.clone(),
                op: node.op.kind_name().to_string(),
                inputs: types.iter().map(|t| t.to_string()).collect(),
                message,
            })?;
        if inferred != node.outputs {
            return Err(bad(format!(
                "stored output types {:?} differ from inferred {:?}",
                node.outputs
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>(),
                inferred.iter().map(|t| t.to_string()).collect::<Vec<_>>()
            )));
        }
    }
    for (name, members) in graph.collections() {
        for &Value { node, port } in members {
            let ok = graph
                .try_node(node)
                .is_some_and(|n| usize::from(port) < n.outputs.len().max(1));
            if !ok {
                return Err(IrError::Invalid {
                    node: format!("collection {name}"),
                    message: format!("member #{}:{port} does not exist", node.index()),
                });
            }
        }
    }
    Ok(())
}
