//! Common-subexpression elimination: merges nodes computing the same pure op of the same inputs
//! on the same device. Inputs and side effects are never merged.

use super::StepGraph;
use crate::ir::{Op, Value};
use crate::lower::LowerError;
use std::collections::HashMap;

/// Merges duplicate pure nodes; returns how many were removed.
pub fn cse(sg: &mut StepGraph) -> Result<usize, LowerError> {
    let mut seen: HashMap<(String, Vec<Value>, Option<u16>), crate::ir::NodeId> = HashMap::new();
    let mut removed = 0;
    for id in sg.graph.topo_order()? {
        let node = sg.graph.node(id);
        if matches!(node.op, Op::Input { .. } | Op::Assign { .. } | Op::Group) {
            continue;
        }
        // The Debug form of an op carries every attribute (constants included).
        let key = (
            format!("{:?}", node.op),
            sg.graph.inputs(id).to_vec(),
            node.device,
        );
        match seen.get(&key) {
            Some(&first) => {
                let ports = node.outputs.len();
                for p in 0..ports as u16 {
                    sg.replace(Value::new(id, p), Value::new(first, p))?;
                }
                sg.graph.remove_node(id);
                removed += 1;
            }
            None => {
                seen.insert(key, id);
            }
        }
    }
    Ok(removed)
}
