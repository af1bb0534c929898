//! Bucketed all-reduces: the per-tensor all-reduces of a distributed step become one in-place
//! all-reduce per bucket of contiguous memory.
//!
//! A distributed trainer all-reduces each tower's gradient of each variable (`Op::AllReduce`).
//! Every participant of a job must issue the same collectives in the same order, even when
//! their steps differ (the chief fetches summaries, which can change what fuses), so the
//! buckets and their order are a property of the whole *graph* ([`CollectivePlan`]): its
//! all-reduce nodes in topological order, cut into buckets of at most `bucket_bytes` per device.
//! In a step, the memory planner places the members of each bucket back to back and one
//! `AllReduce` kernel reduces the whole range where it lies. A member is reduced in place — its
//! input (the gradient) is the range's bytes, no copy — when nothing else reads that input;
//! otherwise its all-reduce becomes a copy into the range. Fused update kernels
//! ([`super::arena`]) only merge consecutive members of one bucket, so their gradient arena is
//! the bucket's range or a part of it, reduced before they run.

use super::LowerError;
use super::arena::{ArenaKernel, ArenaOperand};
use super::expr::{ExprOp, FusedExpr};
use super::kernelize::Kernelized;
use super::program::KernelKind;
use crate::ir::{Graph, NodeId, Op, ReduceOp, Value};
use crate::tensor::DType;
use std::collections::HashMap;

/// Where an all-reduce node stands in its graph: its place in the order every participant
/// issues collectives, and its bucket and place in it, when bucketed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub order: usize,
    pub bucket: Option<(u32, u32)>,
}

/// The all-reduces of a graph, ordered and bucketed the same way whatever the step.
#[derive(Clone, Debug, Default)]
pub struct CollectivePlan {
    by_name: HashMap<String, Slot>,
}

impl CollectivePlan {
    /// The plan of `graph`'s all-reduce nodes: in topological order (among ready nodes, the
    /// one added first — stable when a participant adds nodes that only read existing ones);
    /// those of static f32 shape that depend on no other all-reduce go into buckets of at most
    /// `bucket_bytes` per device and reduction.
    pub fn new(graph: &Graph, bucket_bytes: usize) -> Result<CollectivePlan, LowerError> {
        let order = graph.topo_order()?;
        let mut after_all_reduce: HashMap<NodeId, bool> = HashMap::new();
        let mut open: HashMap<(u16, ReduceOp), (u32, u32, usize)> = HashMap::new();
        let mut buckets = 0u32;
        let mut by_name = HashMap::new();
        for id in order {
            let node = graph.node(id);
            let sources: Vec<NodeId> = graph
                .inputs(id)
                .iter()
                .map(|v| v.node)
                .chain(graph.control_inputs(id))
                .collect();
            let upstream = sources.iter().any(|s| {
                after_all_reduce.get(s).copied().unwrap_or(false)
                    || matches!(graph.node(*s).op, Op::AllReduce { .. })
            });
            after_all_reduce.insert(id, upstream);
            let Op::AllReduce { op } = node.op else {
                continue;
            };
            let ty = &node.outputs[0];
            let bytes = ty
                .shape
                .to_static()
                .filter(|_| ty.dtype == DType::F32 && !upstream)
                .map(|dims| 4 * dims.iter().product::<usize>());
            let bucket = bytes.map(|bytes| {
                let key = (node.device.unwrap_or(0), op);
                match open.get_mut(&key) {
                    Some((b, members, used)) if *used + bytes <= bucket_bytes.max(1) => {
                        *members += 1;
                        *used += bytes;
                        (*b, *members - 1)
                    }
                    _ => {
                        open.insert(key, (buckets, 1, bytes));
                        buckets += 1;
                        (buckets - 1, 0)
                    }
                }
            });
            let slot = Slot {
                order: by_name.len(),
                bucket,
            };
            by_name.insert(node.name.clone(), slot);
        }
        Ok(CollectivePlan { by_name })
    }

    /// The slot of the all-reduce node named `name`.
    pub fn slot(&self, name: &str) -> Option<Slot> {
        self.by_name.get(name).copied()
    }

    /// The bucket slot of every value a live all-reduce kernel of `k` produces.
    pub fn value_slots(&self, k: &Kernelized) -> HashMap<Value, (u32, u32)> {
        k.drafts
            .iter()
            .filter(|d| d.alive && matches!(d.kind, KernelKind::AllReduce { .. }))
            .filter_map(|d| {
                let bucket = self.slot(&d.name)?.bucket?;
                Some((*d.outputs.first()?, bucket))
            })
            .collect()
    }
}

/// One all-reduce over a contiguous range: member `i` is `inputs[i]`, reduced in place, and
/// `outputs[i]` (what its own all-reduce produced) denotes the same bytes afterwards.
/// Members are the step's live all-reduces of one bucket of the [`CollectivePlan`], in the
/// bucket's order.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveBucket {
    pub name: String,
    pub device: u16,
    pub op: ReduceOp,
    /// The values placed in the range, in order: a member's input when it is reduced in
    /// place, else its own result (its all-reduce became a copy into the range).
    pub inputs: Vec<Value>,
    /// The values the members' all-reduces produce, in the same order.
    pub outputs: Vec<Value>,
    /// Elements per member.
    pub sizes: Vec<usize>,
    /// Place in the order of the job's collectives (that of its first member).
    pub order: usize,
    /// Scheduling position: the latest of its members'.
    pub anchor: usize,
}

impl CollectiveBucket {
    /// Total elements of the range.
    pub fn len(&self) -> usize {
        self.sizes.iter().sum()
    }

    /// True for a bucket without elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The bucket all-reduces of `k` according to `plan`: each bucketed all-reduce draft dies
/// (reduced in place) or becomes a copy of its input into the range. Unbucketed all-reduces
/// stay as they are.
pub fn fuse_all_reduces(
    graph: &Graph,
    k: &mut Kernelized,
    arenas: &[ArenaKernel],
    plan: &CollectivePlan,
    batch: usize,
) -> Vec<CollectiveBucket> {
    let reads = read_counts(k, arenas);
    let mut members: HashMap<u32, Vec<(u32, usize)>> = HashMap::new();
    for (i, d) in k.drafts.iter().enumerate() {
        if !d.alive || !matches!(d.kind, KernelKind::AllReduce { .. }) || d.outputs.len() != 1 {
            continue;
        }
        if let Some((bucket, index)) = plan.slot(&d.name).and_then(|s| s.bucket) {
            members.entry(bucket).or_default().push((index, i));
        }
    }
    let mut buckets: Vec<CollectiveBucket> = Vec::with_capacity(members.len());
    for (_, mut list) in members {
        list.sort_unstable();
        let mut b = CollectiveBucket {
            name: String::new(),
            device: k.drafts[list[0].1].device,
            op: ReduceOp::Mean,
            inputs: Vec::with_capacity(list.len()),
            outputs: Vec::with_capacity(list.len()),
            sizes: Vec::with_capacity(list.len()),
            order: usize::MAX,
            anchor: 0,
        };
        for &(_, i) in &list {
            let d = &k.drafts[i];
            let KernelKind::AllReduce { op, len } = d.kind else {
                continue;
            };
            let output = d.outputs[0];
            let input = &d.inputs[0];
            let ty = graph.value_type(input.base);
            let whole = input.view.is_identity()
                && input.view.shape.iter().product::<usize>() == len
                && ty.shape.resolve(batch).iter().product::<usize>() == len
                && ty.dtype == DType::F32;
            let computed = k
                .producer
                .get(&input.base)
                .is_some_and(|&p| k.drafts[p].alive && k.drafts[p].device == d.device);
            let in_place = whole && computed && reads.get(&input.base) == Some(&1);
            b.op = op;
            b.order = b
                .order
                .min(plan.slot(&d.name).map_or(usize::MAX, |s| s.order));
            b.anchor = b.anchor.max(d.anchor);
            b.inputs.push(if in_place { input.base } else { output });
            b.outputs.push(output);
            b.sizes.push(len);
        }
        let first = &k.drafts[list[0].1].name;
        let last = &k.drafts[list[list.len() - 1].1].name;
        b.name = if list.len() == 1 {
            first.clone()
        } else {
            format!("{first}..{last}")
        };
        for (&(_, i), (input, output)) in list.iter().zip(b.inputs.iter().zip(&b.outputs)) {
            let d = &mut k.drafts[i];
            if input == output {
                // Not reducible in place: the all-reduce copies its input into the range.
                let shape = graph.value_type(*output).shape.resolve(batch);
                let mut expr = FusedExpr::default();
                let loaded = expr.push(ExprOp::Load(0), DType::F32);
                expr.outputs.push(loaded);
                d.kind = KernelKind::Elementwise { shape, expr };
            } else {
                d.alive = false;
            }
        }
        buckets.push(b);
    }
    buckets.sort_by_key(|b| b.order);
    buckets
}

/// How many times each value is read by live kernels, fused updates, fetches and assigns.
fn read_counts(k: &Kernelized, arenas: &[ArenaKernel]) -> HashMap<Value, usize> {
    let mut reads: HashMap<Value, usize> = HashMap::new();
    let operands = k
        .drafts
        .iter()
        .filter(|d| d.alive)
        .flat_map(|d| d.inputs.iter())
        .chain(&k.fetches)
        .chain(k.assigns.iter().map(|(o, _)| o));
    for o in operands {
        *reads.entry(o.base).or_default() += 1;
    }
    for o in arenas.iter().flat_map(|a| &a.operands) {
        let values = match o {
            ArenaOperand::Arena { values } => values.clone(),
            ArenaOperand::Shared(op) => vec![op.base],
            ArenaOperand::State { .. } => Vec::new(),
        };
        for v in values {
            *reads.entry(v).or_default() += 1;
        }
    }
    reads
}
