//! Elementwise fusion decisions: which elementwise nodes share a kernel.
//!
//! Nodes join greedily, in topological order, the group of one of their producers when the
//! group has the same iteration space and device and joining creates no cycle (no path from the
//! group through an outside node back to the joiner). A member's value leaves the group (is
//! materialised) when something outside needs it — unless every consumer is a reduction over
//! the group's space, which recomputes it in its prologue instead.

use crate::ir::{Graph, NodeId, Op, Value};
use std::collections::{HashMap, HashSet};

/// True for the ops fused into elementwise kernels.
pub fn is_fusable(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::RandomUniform { .. }
            | Op::OneHot { .. }
    )
}

/// True for layout ops, which become views.
pub fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
            | Op::Broadcast { .. }
            | Op::Identity
    )
}

/// The inputs a node really reads (`RandomUniform`'s first input only gives its shape).
pub fn data_inputs(graph: &Graph, id: NodeId) -> smallvec::SmallVec<[Value; 4]> {
    let ins = graph.inputs(id);
    match graph.node(id).op {
        Op::RandomUniform { .. } => ins.into_iter().skip(1).collect(),
        _ => ins,
    }
}

/// A set of fused elementwise nodes.
#[derive(Clone, Debug)]
pub struct Group {
    /// Members in topological order.
    pub members: Vec<NodeId>,
    pub shape: Vec<usize>,
    pub device: u16,
    /// Topological position of the first member (bounds cycle searches).
    pub min_pos: usize,
}

/// The grouping of a step's elementwise nodes.
#[derive(Debug, Default)]
pub struct Grouping {
    pub groups: Vec<Group>,
    pub group_of: HashMap<NodeId, usize>,
    /// Member values recomputed by reduction prologues instead of being materialised.
    pub absorbed: HashSet<Value>,
    /// Member values the group must write out, per group, in topological order.
    pub outputs: Vec<Vec<Value>>,
}

/// Context the grouping needs from the kernel former.
pub struct GroupInput<'a> {
    pub graph: &'a Graph,
    pub order: &'a [NodeId],
    pub pos: &'a HashMap<NodeId, usize>,
    pub shape_of: &'a dyn Fn(Value) -> Vec<usize>,
    pub device_of: &'a dyn Fn(NodeId) -> u16,
    /// Values that must be materialised whatever their consumers (fetches, assigned values).
    pub pinned: &'a HashSet<Value>,
    /// Whether fusion is enabled (off: every elementwise node is its own kernel).
    pub fuse: bool,
}

/// True when some member of `group` is an ancestor of `start` (through data edges).
fn reaches(
    input: &GroupInput<'_>,
    group_of: &HashMap<NodeId, usize>,
    g: usize,
    min_pos: usize,
    start: NodeId,
) -> bool {
    let mut stack = vec![start];
    let mut seen = HashSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) || input.pos.get(&id).copied().unwrap_or(0) < min_pos {
            continue;
        }
        if group_of.get(&id) == Some(&g) {
            return true;
        }
        stack.extend(input.graph.inputs(id).iter().map(|v| v.node));
    }
    false
}

/// Decides the groups, the absorbed values and each group's outputs.
pub fn group(input: &GroupInput<'_>, consumers: &HashMap<Value, Vec<NodeId>>) -> Grouping {
    let graph = input.graph;
    let mut gr = Grouping::default();
    for &id in input.order {
        let node = graph.node(id);
        if !is_fusable(&node.op) {
            continue;
        }
        let shape = (input.shape_of)(Value::first(id));
        let device = (input.device_of)(id);
        let ins = data_inputs(graph, id);
        let mut chosen = None;
        if input.fuse {
            for u in &ins {
                let Some(&g) = gr.group_of.get(&u.node) else {
                    continue;
                };
                let grp = &gr.groups[g];
                if grp.shape != shape || grp.device != device {
                    continue;
                }
                let min_pos = grp.min_pos;
                let cyclic = ins.iter().any(|w| {
                    gr.group_of.get(&w.node) != Some(&g)
                        && reaches(input, &gr.group_of, g, min_pos, w.node)
                });
                if !cyclic {
                    chosen = Some(g);
                    break;
                }
            }
        }
        let g = chosen.unwrap_or_else(|| {
            gr.groups.push(Group {
                members: Vec::new(),
                shape: shape.clone(),
                device,
                min_pos: input.pos.get(&id).copied().unwrap_or(0),
            });
            gr.groups.len() - 1
        });
        gr.groups[g].members.push(id);
        gr.group_of.insert(id, g);
    }
    for grp in &gr.groups {
        for &m in &grp.members {
            let v = Value::first(m);
            let cons = consumers.get(&v).map_or(&[][..], |c| c.as_slice());
            let all_reductions = !cons.is_empty()
                && cons.iter().all(|&c| {
                    matches!(graph.node(c).op, Op::Reduce { .. })
                        && (input.device_of)(c) == grp.device
                });
            if input.fuse && all_reductions && !input.pinned.contains(&v) {
                gr.absorbed.insert(v);
            }
        }
    }
    gr.outputs = gr
        .groups
        .iter()
        .enumerate()
        .map(|(g, grp)| {
            grp.members
                .iter()
                .map(|&m| Value::first(m))
                .filter(|v| {
                    if input.pinned.contains(v) {
                        return true;
                    }
                    if gr.absorbed.contains(v) {
                        return false;
                    }
                    consumers.get(v).is_some_and(|c| {
                        c.iter()
                            .any(|n| gr.group_of.get(n) != Some(&g) || !input.fuse)
                    })
                })
                .collect()
        })
        .collect();
    gr
}
