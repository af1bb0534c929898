//! Common-subexpression elimination: merges nodes computing the same pure op of the same inputs
//! on the same device. Inputs and side effects are never merged.

use super::StepGraph;
use crate::ir::{NodeId, Op, Value};
use crate::lower::LowerError;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

/// A cheap hash of the attributes that tell most ops of one kind apart (ops hold floats, so
/// `Op` itself is not `Hash`); equal ops have equal fingerprints.
fn fingerprint(op: &Op) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::mem::discriminant(op).hash(&mut h);
    match op {
        Op::Variable { var } => var.hash(&mut h),
        Op::Constant { value } => value.shape().hash(&mut h),
        _ => {}
    }
    h.finish()
}

/// Identical ops: equal attributes; constants must be bit-identical (`0.0` and `-0.0` stay
/// apart, equal NaNs merge).
fn same_op(a: &Op, b: &Op) -> bool {
    match (a, b) {
        (Op::Constant { value: x }, Op::Constant { value: y }) => {
            x.dtype() == y.dtype() && x.shape() == y.shape() && x.to_le_bytes() == y.to_le_bytes()
        }
        _ => a == b,
    }
}

/// Merges duplicate pure nodes; returns how many were removed.
pub fn cse(sg: &mut StepGraph) -> Result<usize, LowerError> {
    let mut seen: HashMap<(u64, Vec<Value>, Option<u16>), Vec<NodeId>> = HashMap::new();
    let mut removed = 0;
    for id in sg.graph.topo_order()? {
        let node = sg.graph.node(id);
        if matches!(node.op, Op::Input { .. } | Op::Assign { .. } | Op::Group) {
            continue;
        }
        let key = (
            fingerprint(&node.op),
            sg.graph.inputs(id).to_vec(),
            node.device,
        );
        let candidates = seen.entry(key).or_default();
        let first = candidates
            .iter()
            .copied()
            .find(|&c| same_op(&sg.graph.node(c).op, &node.op));
        match first {
            Some(first) => {
                let ports = node.outputs.len();
                for p in 0..ports as u16 {
                    sg.replace(Value::new(id, p), Value::new(first, p))?;
                }
                sg.graph.remove_node(id);
                removed += 1;
            }
            None => candidates.push(id),
        }
    }
    Ok(removed)
}
