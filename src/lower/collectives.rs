//! Bucketed all-reduces: the per-tensor all-reduces of a distributed step become one in-place
//! all-reduce per bucket of contiguous memory.
//!
//! A distributed trainer all-reduces each tower's gradient of each variable (`Op::AllReduce`,
//! one kernel each after kernel formation). Here the memory planner is asked to place the
//! members' *inputs* (the gradients) back to back, one `AllReduce` kernel reduces the whole
//! range where it lies, and each member's result is its input's bytes — no copy in or out.
//! When the results feed a fused update kernel ([`super::arena`]) the range IS that kernel's
//! gradient arena, so its buckets are the update's buckets (same `bucket_bytes`); the other
//! all-reduces are cut into buckets of at most `bucket_bytes`, in program order. Emission
//! chains every collective into one order, the same on every participant.

use super::arena::{ArenaKernel, ArenaOperand};
use super::kernelize::Kernelized;
use super::program::KernelKind;
use crate::ir::{Graph, ReduceOp, Value};
use crate::tensor::DType;
use std::collections::{HashMap, HashSet};

/// One all-reduce over a contiguous range: member `i` is `inputs[i]`, reduced in place, and
/// `outputs[i]` (what its own all-reduce produced) denotes the same bytes afterwards.
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveBucket {
    pub name: String,
    pub device: u16,
    pub op: ReduceOp,
    /// The reduced values, in range order (the planner places them back to back).
    pub inputs: Vec<Value>,
    /// The values the members' all-reduces produced, in the same order.
    pub outputs: Vec<Value>,
    /// Elements per member.
    pub sizes: Vec<usize>,
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

/// An all-reduce draft that can be done in place inside a bucket.
struct Candidate {
    draft: usize,
    input: Value,
    op: ReduceOp,
    device: u16,
    len: usize,
    anchor: usize,
}

/// Replaces the all-reduce drafts of `k` that can run in place by bucket all-reduces (the
/// drafts die). An all-reduce qualifies when its input is a whole f32 value computed by a
/// kernel and read by nothing else (the bucket overwrites it), and no all-reduce depends on
/// another (a bucket must not wait for itself). `arenas` are the fused update kernels.
pub fn fuse_all_reduces(
    graph: &Graph,
    k: &mut Kernelized,
    arenas: &[ArenaKernel],
    batch: usize,
    bucket_bytes: usize,
) -> Vec<CollectiveBucket> {
    let mut candidates = candidates(graph, k, arenas, batch);
    let chained = chained_all_reduces(k);
    candidates.retain(|_, c| !chained.contains(&c.draft));
    let mut buckets = Vec::new();
    // Each gradient arena of a fused update is one bucket, when all its members qualify.
    let mut in_arenas: HashSet<Value> = HashSet::new();
    for a in arenas {
        for values in a.operands.iter().filter_map(|o| match o {
            ArenaOperand::Arena { values } => Some(values),
            _ => None,
        }) {
            let taken = values.iter().any(|v| in_arenas.contains(v));
            in_arenas.extend(values.iter().copied());
            let members: Option<Vec<&Candidate>> =
                values.iter().map(|v| candidates.get(v)).collect();
            let Some(members) = members.filter(|m| !taken && same_kind(m)) else {
                continue;
            };
            buckets.push(bucket(k, values, &members));
        }
    }
    // The others, in program order, cut into buckets of at most `bucket_bytes`.
    let mut rest: Vec<(&Value, &Candidate)> = candidates
        .iter()
        .filter(|(v, _)| !in_arenas.contains(v))
        .collect();
    rest.sort_by_key(|(_, c)| (c.device, c.op as u8, c.anchor));
    let mut runs: Vec<Vec<(&Value, &Candidate)>> = Vec::new();
    for m in rest {
        match runs.last_mut() {
            Some(run)
                if same_kind(&[run[0].1, m.1])
                    && 4 * (run.iter().map(|(_, c)| c.len).sum::<usize>() + m.1.len)
                        <= bucket_bytes.max(1) =>
            {
                run.push(m)
            }
            _ => runs.push(vec![m]),
        }
    }
    for run in runs {
        let values: Vec<Value> = run.iter().map(|(v, _)| **v).collect();
        let members: Vec<&Candidate> = run.iter().map(|(_, c)| *c).collect();
        buckets.push(bucket(k, &values, &members));
    }
    for b in &buckets {
        for v in &b.outputs {
            if let Some(c) = candidates.get(v) {
                k.drafts[c.draft].alive = false;
            }
        }
    }
    buckets.sort_by_key(|b| b.anchor);
    buckets
}

fn same_kind(members: &[&Candidate]) -> bool {
    members
        .iter()
        .all(|c| c.op == members[0].op && c.device == members[0].device)
}

fn bucket(k: &Kernelized, outputs: &[Value], members: &[&Candidate]) -> CollectiveBucket {
    let first = &k.drafts[members[0].draft].name;
    let last = &k.drafts[members[members.len() - 1].draft].name;
    let name = if members.len() == 1 {
        first.clone()
    } else {
        format!("{first}..{last}")
    };
    CollectiveBucket {
        name,
        device: members[0].device,
        op: members[0].op,
        inputs: members.iter().map(|c| c.input).collect(),
        outputs: outputs.to_vec(),
        sizes: members.iter().map(|c| c.len).collect(),
        anchor: members.iter().map(|c| c.anchor).max().unwrap_or(0),
    }
}

/// The all-reduce drafts that can run in place, by output value.
fn candidates(
    graph: &Graph,
    k: &Kernelized,
    arenas: &[ArenaKernel],
    batch: usize,
) -> HashMap<Value, Candidate> {
    // How many times each value is read: by kernels, fetches, assigns and fused updates.
    let mut reads: HashMap<Value, usize> = HashMap::new();
    let alive = k.drafts.iter().filter(|d| d.alive);
    let operands = alive
        .flat_map(|d| d.inputs.iter())
        .chain(&k.fetches)
        .chain(k.assigns.iter().map(|(o, _)| o));
    for o in operands {
        *reads.entry(o.base).or_default() += 1;
    }
    for a in arenas {
        for o in &a.operands {
            match o {
                ArenaOperand::Arena { values } => {
                    for v in values {
                        *reads.entry(*v).or_default() += 1;
                    }
                }
                ArenaOperand::Shared(op) => *reads.entry(op.base).or_default() += 1,
                ArenaOperand::State { .. } => {}
            }
        }
    }
    let mut out = HashMap::new();
    for (i, d) in k.drafts.iter().enumerate() {
        let KernelKind::AllReduce { op, len } = d.kind else {
            continue;
        };
        if !d.alive || d.inputs.len() != 1 || d.outputs.len() != 1 {
            continue;
        }
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
        if whole && computed && reads.get(&input.base) == Some(&1) {
            out.insert(
                d.outputs[0],
                Candidate {
                    draft: i,
                    input: input.base,
                    op,
                    device: d.device,
                    len,
                    anchor: d.anchor,
                },
            );
        }
    }
    out
}

/// The all-reduce drafts that depend on another all-reduce draft's result, and those others.
fn chained_all_reduces(k: &Kernelized) -> HashSet<usize> {
    let mut readers: HashMap<Value, Vec<usize>> = HashMap::new();
    for (i, d) in k.drafts.iter().enumerate().filter(|(_, d)| d.alive) {
        for o in &d.inputs {
            readers.entry(o.base).or_default().push(i);
        }
    }
    let is_all_reduce = |i: usize| matches!(k.drafts[i].kind, KernelKind::AllReduce { .. });
    let mut chained = HashSet::new();
    for start in (0..k.drafts.len()).filter(|&i| k.drafts[i].alive && is_all_reduce(i)) {
        let mut seen = HashSet::new();
        let mut stack = vec![start];
        while let Some(i) = stack.pop() {
            for v in &k.drafts[i].outputs {
                for &j in readers.get(v).map_or(&[][..], |r| r.as_slice()) {
                    if seen.insert(j) {
                        if is_all_reduce(j) {
                            chained.insert(start);
                            chained.insert(j);
                        }
                        stack.push(j);
                    }
                }
            }
        }
    }
    chained
}
