//! Gradient buckets at graph level: the gradients of a rank, in state-layout order, cut into
//! buckets of at most `bucket_bytes`; each bucket is ONE all-reduce.
//!
//! The contract lowering can later map onto the fused gradient arena: bucket `b` is
//! `flat_b = concat(reshape(g_i, [n_i]) for i in b)` (a single member skips the concat),
//! `avg_b = all_reduce(flat_b) {op=mean}`, and each member's averaged gradient is
//! `reshape(slice(avg_b, axis 0, [o_i, o_i + n_i)), shape_i)`. Members are whole variables in
//! the order of [`StateLayout`] (device, then offset), so a bucket covers a contiguous range of
//! the state arena and of a gradient arena laid out like it — the ranges
//! `lower::arena` fuses; a variable larger than `bucket_bytes` is a bucket of its own.

use std::collections::{HashMap, HashSet};

use crate::ir::{Graph, NodeId, Op, ReduceOp, Shape, Value, VarId};
use crate::lower::StateLayout;
use crate::tensor::DType;

use crate::train::error::TrainError;

/// One all-reduce of the distributed gradient average.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradientBucket {
    /// Its variables, in state-layout order.
    pub variables: Vec<VarId>,
    /// f32 elements reduced.
    pub elements: usize,
    /// The `AllReduce` node.
    pub all_reduce: NodeId,
}

/// The gradients averaged across ranks, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketedGradients {
    /// `(variable, averaged gradient)`, in the order of the input gradients.
    pub gradients: Vec<(VarId, Value)>,
    /// The buckets, in the order they are reduced.
    pub buckets: Vec<GradientBucket>,
}

/// Averages `grads` across the ranks of a job in buckets of at most `bucket_bytes` (see the
/// module docs). Every gradient must be f32 with a static shape.
pub fn all_reduce_in_buckets(
    graph: &mut Graph,
    grads: &[(VarId, Value)],
    bucket_bytes: usize,
    prefix: &str,
) -> Result<BucketedGradients, TrainError> {
    let mut seen = HashSet::new();
    if let Some((var, _)) = grads.iter().find(|(var, _)| !seen.insert(*var)) {
        return Err(TrainError::Config(format!(
            "`{}` has two gradients to all-reduce",
            graph.variable(*var).name
        )));
    }
    let layout = StateLayout::new(graph);
    let mut members: Vec<(VarId, Value, Vec<usize>)> = Vec::with_capacity(grads.len());
    for &(var, g) in grads {
        let ty = graph.value_type(g);
        let name = &graph.variable(var).name;
        let dims = ty.shape.to_static().ok_or_else(|| {
            TrainError::Config(format!(
                "the gradient of `{name}` has shape {}: a distributed all-reduce needs a static \
                 shape",
                ty.shape
            ))
        })?;
        if ty.dtype != DType::F32 {
            return Err(TrainError::Config(format!(
                "the gradient of `{name}` is {}: distributed all-reduces carry f32",
                ty.dtype
            )));
        }
        members.push((var, g, dims));
    }
    members.sort_by_key(|(var, _, _)| {
        let slot = layout.slot(*var);
        (slot.device, slot.offset)
    });
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut bytes = 0usize;
    for (i, (_, _, dims)) in members.iter().enumerate() {
        let size = 4 * dims.iter().product::<usize>();
        match groups.last_mut() {
            Some(g) if bytes + size <= bucket_bytes.max(1) => {
                g.push(i);
                bytes += size;
            }
            _ => {
                groups.push(vec![i]);
                bytes = size;
            }
        }
    }
    let mut averaged: Vec<Option<Value>> = vec![None; members.len()];
    let mut buckets = Vec::with_capacity(groups.len());
    for (b, group) in groups.iter().enumerate() {
        let scope = format!("{prefix}/bucket{b}");
        let mut node = |name: &str, op: Op, inputs: &[Value]| -> Result<Value, TrainError> {
            let unique = graph.unique_name(&format!("{scope}/{name}"));
            Ok(Value::first(graph.add_node(&unique, op, inputs)?))
        };
        let sizes: Vec<usize> = group
            .iter()
            .map(|&i| members[i].2.iter().product())
            .collect();
        let total: usize = sizes.iter().sum();
        let mut flats = Vec::with_capacity(group.len());
        for (j, &i) in group.iter().enumerate() {
            flats.push(node(
                &format!("flat{j}"),
                reshape(sizes[j]),
                &[members[i].1],
            )?);
        }
        let flat = if flats.len() == 1 {
            flats[0]
        } else {
            node("concat", Op::Concat { axis: 0 }, &flats)?
        };
        let reduced = node("all_reduce", Op::AllReduce { op: ReduceOp::Mean }, &[flat])?;
        let mut offset = 0;
        for (j, &i) in group.iter().enumerate() {
            let piece = if group.len() == 1 {
                reduced
            } else {
                node(
                    &format!("slice{j}"),
                    Op::Slice {
                        axis: 0,
                        start: offset,
                        end: offset + sizes[j],
                    },
                    &[reduced],
                )?
            };
            offset += sizes[j];
            let shape = Shape::fixed(&members[i].2);
            averaged[i] = Some(node(&format!("grad{j}"), Op::Reshape { shape }, &[piece])?);
        }
        buckets.push(GradientBucket {
            variables: group.iter().map(|&i| members[i].0).collect(),
            elements: total,
            all_reduce: reduced.node,
        });
    }
    let by_var: HashMap<VarId, Value> = members
        .iter()
        .zip(&averaged)
        .filter_map(|((var, _, _), v)| v.map(|v| (*var, v)))
        .collect();
    // Every member got its bucket above, and variables are distinct (checked first).
    let gradients = grads
        .iter()
        .filter_map(|(var, _)| by_var.get(var).map(|v| (*var, *v)))
        .collect();
    Ok(BucketedGradients { gradients, buckets })
}

fn reshape(n: usize) -> Op {
    Op::Reshape {
        shape: Shape::fixed(&[n]),
    }
}
