//! Elementwise fusion decisions: which elementwise nodes share a kernel.
//!
//! Nodes join greedily, in topological order, the group of one of their producers when the
//! group has the same iteration space and device and joining creates no cycle (no path from the
//! group through an outside node back to the joiner). A member's value leaves the group (is
//! materialised) when something outside needs it — unless every consumer is a reduction over
//! the group's space, which recomputes it in its prologue instead. A scaling by broadcast
//! scalars that only another group reads moves into that group (`sink_scalings`), so the
//! value before the scaling is the one written. A few cheap ops on small values (batch norm's
//! per-channel gradient terms) that only groups over much larger spaces read are recomputed
//! per element by those groups rather than launched for a handful of values.
//!
//! Across devices: a node reading a value computed on another device (a *gather*, such as the
//! average of every tower's gradient) starts a group of its own, so no kernel of one device
//! waits for another device because of fusion; and a gather group whose one output feeds one
//! kernel over the same space moves into that kernel (the average joins the optimizer update,
//! which then reads every tower's gradient directly).

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
    /// True when its first member reads a value computed on another device.
    pub gathers: bool,
}

/// The grouping of a step's elementwise nodes.
#[derive(Debug, Default)]
pub struct Grouping {
    pub groups: Vec<Group>,
    pub group_of: HashMap<NodeId, usize>,
    /// Member values recomputed by their consumers (other groups, reduction prologues)
    /// instead of being materialised.
    pub absorbed: HashSet<Value>,
    /// Member values the group must write out, per group, in topological order.
    pub outputs: Vec<Vec<Value>>,
}

impl Grouping {
    /// True when `v` is a member value no kernel writes out (internal to its group, or
    /// recomputed by its consumers): whoever needs it computes it from its cone.
    pub fn recomputed(&self, v: Value) -> bool {
        self.group_of
            .get(&v.node)
            .is_some_and(|&g| !self.outputs[g].contains(&v))
    }
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

/// True when some member of group `g` is an ancestor of `start` through data edges, with every
/// other group contracted to one kernel: a node of group `h` depends on whatever any member of
/// `h` reads (two groups reading each other's members would otherwise form a cycle of kernels,
/// as the averaging ops of two data-parallel towers do).
fn reaches(input: &GroupInput<'_>, gr: &Grouping, g: usize, min_pos: usize, start: NodeId) -> bool {
    let mut stack = vec![start];
    let mut seen = HashSet::new();
    let mut expanded = HashSet::new();
    while let Some(id) = stack.pop() {
        if !seen.insert(id) {
            continue;
        }
        match gr.group_of.get(&id) {
            Some(&h) if h == g => return true,
            Some(&h) if expanded.insert(h) => stack.extend(gr.groups[h].members.iter().copied()),
            _ => {}
        }
        if input.pos.get(&id).copied().unwrap_or(0) < min_pos {
            continue;
        }
        stack.extend(input.graph.inputs(id).iter().map(|v| v.node));
    }
    false
}

/// True when node `id` reads a computed value (not an input, constant or variable read) of
/// another device.
fn gathers(input: &GroupInput<'_>, id: NodeId) -> bool {
    let device = (input.device_of)(id);
    data_inputs(input.graph, id)
        .iter()
        .any(|u| !input.graph.node(u.node).op.is_source() && (input.device_of)(u.node) != device)
}

/// Elements a kernel reads to get `u`: a broadcast reads its source, not its shape.
fn elements_read(input: &GroupInput<'_>, mut u: Value) -> usize {
    while let Op::Broadcast { .. } = input.graph.node(u.node).op {
        match input.graph.inputs(u.node).first() {
            Some(&source) => u = source,
            None => break,
        }
    }
    (input.shape_of)(u).iter().product()
}

/// Largest cone (instructions of its own group) a consumer will recompute.
const MAX_RECOMPUTED_CONE: usize = 24;

/// Largest cone a consumer over a larger space recomputes per element ([`broadcast_cone`]).
const MAX_BROADCAST_CONE: usize = 6;

/// A consumer over a larger space recomputes a small group's member only when its space is at
/// least this many times the member's (per-channel values read by a whole activation).
const BROADCAST_RATIO: usize = 16;

/// Ops a consumer recomputes per element of a larger space: about one instruction each on
/// every backend (no division, no transcendental function).
fn cheap(op: &Op) -> bool {
    use crate::ir::{BinaryOp as B, UnaryOp as U};
    match op {
        Op::Unary(u) => matches!(u, U::Neg | U::Abs | U::Square | U::Relu),
        Op::Binary(b) => matches!(b, B::Add | B::Sub | B::Mul | B::Maximum | B::Minimum),
        _ => false,
    }
}

/// The recomputation plan being decided.
#[derive(Default)]
struct Recompute {
    /// Full-size tensors a recomputation of each absorbed value reads.
    full_leaves: HashMap<Value, Vec<Value>>,
    /// Members written out: recomputations read them instead of their cones.
    written: HashSet<Value>,
    /// Values some absorbed cone reads (a written member among them must stay written).
    relied: HashSet<Value>,
}

impl Recompute {
    /// The full-size tensors recomputing member `v` reads, if its cone is small enough and
    /// reads at most `max_leaves` of them.
    fn leaves(
        &self,
        input: &GroupInput<'_>,
        gr: &Grouping,
        v: Value,
        max_leaves: usize,
    ) -> Option<Vec<Value>> {
        let g = gr.group_of[&v.node];
        let space: usize = gr.groups[g].shape.iter().product();
        let (cone, leaves) = walk_cone(
            input,
            v.node,
            |_, _| true,
            |u, leaves| {
                if gr.group_of.get(&u.node) == Some(&g) && !self.written.contains(&u) {
                    return true;
                }
                if let Some(l) = self.full_leaves.get(&u) {
                    leaves.extend(l.iter().copied());
                } else if elements_read(input, u) * 4 > space {
                    leaves.push(u);
                }
                false
            },
        )?;
        (cone <= MAX_RECOMPUTED_CONE && leaves.len() <= max_leaves).then_some(leaves)
    }

    /// What recomputing member `v` of a small group reads, when each of its consumers runs
    /// over a space at least [`BROADCAST_RATIO`] times larger (reading `v` broadcast) and the
    /// cone is a few [`cheap`] ops: those consumers compute it per element from the small
    /// values it reads (its cone stops at members written out anyway), so it costs no launch.
    fn broadcast_cone(
        &self,
        input: &GroupInput<'_>,
        gr: &Grouping,
        v: Value,
        consumers: &[NodeId],
    ) -> Option<Vec<Value>> {
        let g = gr.group_of[&v.node];
        let space: usize = gr.groups[g].shape.iter().product();
        let wide = consumers.iter().all(|c| {
            gr.group_of.get(c).is_some_and(|&h| {
                let to = &gr.groups[h];
                to.device == gr.groups[g].device
                    && !to.gathers
                    && to.shape.iter().product::<usize>() >= space * BROADCAST_RATIO
            })
        });
        if !wide || gr.groups[g].gathers {
            return None;
        }
        let (_, leaves) = walk_cone(
            input,
            v.node,
            |n, size| cheap(&input.graph.node(n).op) && size <= MAX_BROADCAST_CONE,
            |u, leaves| {
                // What the consumers would recompute too: unwritten members of the group, and
                // members of other groups their own consumers recompute.
                let recomputed = match gr.group_of.get(&u.node) {
                    Some(&h) if h == g => !self.written.contains(&u),
                    Some(_) => gr.absorbed.contains(&u),
                    None => false,
                };
                if !recomputed {
                    leaves.push(u);
                }
                recomputed
            },
        )?;
        Some(leaves)
    }

    fn absorb(&mut self, gr: &mut Grouping, v: Value, leaves: Vec<Value>) {
        gr.absorbed.insert(v);
        self.relied.extend(leaves.iter().copied());
        self.full_leaves.insert(v, leaves);
    }
}

/// Walks the cone of `start` through its data inputs, depth first, each node once:
/// `enter(n, nodes so far)` accepts each node as it joins the cone (a refusal ends the walk
/// with `None`), and `follow(u, leaves)` says whether input `u` belongs to the cone (it is
/// walked into) or, when not, may record what it reads in `leaves`. Returns the cone's size
/// and its leaves, sorted and without repeats.
fn walk_cone(
    input: &GroupInput<'_>,
    start: NodeId,
    mut enter: impl FnMut(NodeId, usize) -> bool,
    mut follow: impl FnMut(Value, &mut Vec<Value>) -> bool,
) -> Option<(usize, Vec<Value>)> {
    let mut cone = HashSet::new();
    let mut leaves = Vec::new();
    let mut stack = vec![start];
    while let Some(n) = stack.pop() {
        if !cone.insert(n) {
            continue;
        }
        if !enter(n, cone.len()) {
            return None;
        }
        for u in data_inputs(input.graph, n) {
            if follow(u, &mut leaves) {
                stack.push(u.node);
            }
        }
    }
    leaves.sort();
    leaves.dedup();
    Some((cone.len(), leaves))
}

/// Decides which members are written out. A member is *recomputed* by its consumers instead
/// (it joins `absorbed`) when every consumer outside its group is a fused kernel over the same
/// space on the same device — another elementwise group or a reduction — and recomputing it
/// reads few full-size tensors (its cone stops at members written out anyway). This trades a
/// cheap recomputation for a write and a read of a whole activation: batch norm's forward would
/// otherwise store `x - mean`, `x̂` and a ReLU mask for the backward pass.
///
/// Two passes: in topological order, a member is absorbed when its recomputation reads at
/// most one full-size tensor; then, in reverse order, a member only reductions consume is
/// absorbed when it reads at most two (reductions over one space merge into one kernel that
/// reads each operand once: batch norm's backward then sums three products of the incoming
/// gradient without storing them). A member that absorbed cones read stays written.
fn decide_materialisation(
    input: &GroupInput<'_>,
    consumers: &HashMap<Value, Vec<NodeId>>,
    gr: &mut Grouping,
) {
    let graph = input.graph;
    let mut plan = Recompute::default();
    // Members with consumers outside their group that may be recomputed, in order, with
    // whether only reductions consume them.
    let mut candidates: Vec<(Value, bool)> = Vec::new();
    for &id in input.order {
        let Some(&g) = gr.group_of.get(&id) else {
            continue;
        };
        let v = Value::first(id);
        let grp = &gr.groups[g];
        let external: Vec<NodeId> = consumers
            .get(&v)
            .map_or(&[][..], |c| c.as_slice())
            .iter()
            .copied()
            .filter(|c| gr.group_of.get(c) != Some(&g))
            .collect();
        if external.is_empty() {
            continue;
        }
        if input.fuse
            && !input.pinned.contains(&v)
            && let Some(leaves) = plan.broadcast_cone(input, gr, v, &external)
        {
            plan.absorb(gr, v, leaves);
            continue;
        }
        let fusable_consumers = external.iter().all(|&c| {
            (input.device_of)(c) == grp.device
                && match gr.group_of.get(&c) {
                    Some(&g2) => gr.groups[g2].shape == grp.shape,
                    None => matches!(graph.node(c).op, Op::Reduce { .. }),
                }
        });
        if !input.fuse || input.pinned.contains(&v) || !fusable_consumers {
            plan.written.insert(v);
            continue;
        }
        // A gather group's only output, read by one other group: moving it there costs nothing
        // (the average of every tower's gradient joins the optimizer update that reads it).
        let consumer_groups: HashSet<Option<&usize>> =
            external.iter().map(|c| gr.group_of.get(c)).collect();
        let moves = grp.gathers
            && consumer_groups.len() == 1
            && !consumer_groups.contains(&None)
            && grp.members.iter().all(|&m| {
                let w = Value::first(m);
                w == v
                    || (!input.pinned.contains(&w)
                        && consumers
                            .get(&w)
                            .is_none_or(|c| c.iter().all(|n| gr.group_of.get(n) == Some(&g))))
            });
        // Two full-size inputs for elementwise consumers was measured (ResNet-20 training
        // step): it recomputes more than it saves. In a scalar space every input is "full
        // size" and recomputing costs nothing (the loss scale's bookkeeping: one check per
        // gradient and-ed together, which would otherwise be a launch each).
        let scalar = grp.shape.iter().product::<usize>() == 1;
        let max_leaves = if moves || scalar { usize::MAX } else { 1 };
        match plan.leaves(input, gr, v, max_leaves) {
            Some(leaves) => plan.absorb(gr, v, leaves),
            None => {
                plan.written.insert(v);
                let only_reductions = external.iter().all(|c| !gr.group_of.contains_key(c));
                candidates.push((v, only_reductions));
            }
        }
    }
    for &(v, only_reductions) in candidates.iter().rev() {
        if !only_reductions || plan.relied.contains(&v) {
            continue;
        }
        plan.written.remove(&v);
        match plan.leaves(input, gr, v, 2) {
            Some(leaves) => plan.absorb(gr, v, leaves),
            None => {
                plan.written.insert(v);
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
        let gather = gathers(input, id);
        if input.fuse && !gather {
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
                    gr.group_of.get(&w.node) != Some(&g) && reaches(input, &gr, g, min_pos, w.node)
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
                gathers: gather,
            });
            gr.groups.len() - 1
        });
        gr.groups[g].members.push(id);
        gr.group_of.insert(id, g);
    }
    sink_scalings(input, consumers, &mut gr);
    decide_materialisation(input, consumers, &mut gr);
    gr
}

/// Moves a *scaling* — a member that reads one member of its own group and otherwise only
/// values smaller than the space (broadcast scalars), and that only one other group of the
/// same space consumes — into that consumer group. Greedy joining put it with its producer;
/// there it would be written out for the consumer, and where it sits now its in-group operand
/// is written instead: the same bytes, or fewer when that operand is written anyway. The
/// consumer then computes the scaling itself, as it does for scaled values that were never
/// fused: the loss scale's unscaled gradients `g · (1/scale)` all reach the optimizer update
/// the same way, so the updates stay one expression and merge into one arena kernel
/// ([`super::arena`]) whether a gradient came out of a reduction or an elementwise
/// accumulation. Groups that gather across devices are left as they are.
fn sink_scalings(
    input: &GroupInput<'_>,
    consumers: &HashMap<Value, Vec<NodeId>>,
    gr: &mut Grouping,
) {
    if !input.fuse {
        return;
    }
    for &id in input.order {
        let Some(&g) = gr.group_of.get(&id) else {
            continue;
        };
        let v = Value::first(id);
        let Some(readers) = consumers.get(&v) else {
            continue;
        };
        let Some(&h) = readers.first().and_then(|c| gr.group_of.get(c)) else {
            continue;
        };
        let (from, to) = (&gr.groups[g], &gr.groups[h]);
        if h == g
            || input.pinned.contains(&v)
            || readers.iter().any(|c| gr.group_of.get(c) != Some(&h))
            || from.shape != to.shape
            || from.device != to.device
            || from.gathers
            || to.gathers
        {
            continue;
        }
        let space: usize = from.shape.iter().product();
        let ins = data_inputs(input.graph, id);
        let own = ins
            .iter()
            .filter(|u| gr.group_of.get(&u.node) == Some(&g))
            .count();
        let others: Vec<Value> = ins
            .iter()
            .copied()
            .filter(|u| gr.group_of.get(&u.node) != Some(&g))
            .collect();
        let small = others.iter().all(|&u| elements_read(input, u) < space);
        if own != 1 || !small {
            continue;
        }
        // The consumer must not be upstream of what the scaling reads from elsewhere.
        let min_pos = to.min_pos;
        if others
            .iter()
            .any(|u| reaches(input, gr, h, min_pos, u.node))
        {
            continue;
        }
        let pos = |n: &NodeId| input.pos.get(n).copied().unwrap_or(0);
        gr.groups[g].members.retain(|&m| m != id);
        let to = &mut gr.groups[h];
        let at = to.members.partition_point(|m| pos(m) < pos(&id));
        to.members.insert(at, id);
        to.min_pos = to.min_pos.min(pos(&id));
        gr.group_of.insert(id, h);
    }
}
