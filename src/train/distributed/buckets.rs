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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::{CpuOptions, CpuSession};
    use crate::backend::reference::ReferenceSession;
    use crate::backend::{BackendError, Collective, Session};
    use crate::ir::{Initializer, Step, TensorType, VarFlags, VariableDef};
    use crate::tensor::HostTensor;

    /// Variables `a [3,4]`, `b [5]`, `c [2,2,2]` with constant "gradients" 0, 1, 2, … per
    /// element, offset by 100 per variable.
    fn graph() -> (Graph, Vec<(VarId, Value)>) {
        let mut g = Graph::new();
        let mut grads = Vec::new();
        for (k, (name, dims)) in [("a", vec![3, 4]), ("b", vec![5]), ("c", vec![2, 2, 2])]
            .into_iter()
            .enumerate()
        {
            let var = g
                .declare_variable(VariableDef {
                    name: name.into(),
                    ty: TensorType::f32(Shape::fixed(&dims)),
                    init: Initializer::Zeros,
                    flags: VarFlags {
                        trainable: true,
                        ..VarFlags::default()
                    },
                })
                .expect("variable");
            let n: usize = dims.iter().product();
            let values = (0..n).map(|i| (100 * k + i) as f32).collect();
            let value = HostTensor::from_f32(&dims, values).expect("tensor");
            let c = g
                .add_node(&format!("grad_{name}"), Op::Constant { value }, &[])
                .expect("constant");
            grads.push((var, Value::first(c)));
        }
        (g, grads)
    }

    #[test]
    fn buckets_follow_the_state_layout_and_the_byte_limit() {
        let (mut g, grads) = graph();
        // a (48 bytes) fills a 60-byte bucket; b (20) and c (32) share the next.
        let out = all_reduce_in_buckets(&mut g, &grads, 60, "ar").expect("buckets");
        let vars: Vec<Vec<VarId>> = out.buckets.iter().map(|b| b.variables.clone()).collect();
        assert_eq!(vars, vec![vec![grads[0].0], vec![grads[1].0, grads[2].0]]);
        assert_eq!(
            out.buckets.iter().map(|b| b.elements).collect::<Vec<_>>(),
            vec![12, 13]
        );
        let text = crate::ir::text::print(&g);
        assert_eq!(text.matches("all_reduce(").count(), 2, "{text}");
        assert_eq!(text.matches("concat(").count(), 1, "{text}");
        // With one participant the averaged gradients are the gradients (reference oracle).
        let fetches: Vec<Value> = out.gradients.iter().map(|(_, v)| *v).collect();
        let mut session = ReferenceSession::new(g.clone()).expect("session");
        let got = session.run(&Step::fetch(fetches), &[]).expect("run");
        for ((_, original), value) in grads.iter().zip(&got) {
            let mut s = ReferenceSession::new(g.clone()).expect("session");
            let want = s.run(&Step::fetch(vec![*original]), &[]).expect("run");
            assert_eq!(value, &want[0]);
        }
    }

    /// A "reduction" that adds 1000 × the flat index within the bucket: shows which bucket
    /// position each variable's elements come back from.
    struct Positional;

    impl Collective for Positional {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            2
        }
        fn all_reduce(&self, data: &mut [f32], op: ReduceOp) -> Result<(), BackendError> {
            assert_eq!(op, ReduceOp::Mean);
            for (i, x) in data.iter_mut().enumerate() {
                *x += 1000.0 * i as f32;
            }
            Ok(())
        }
    }

    #[test]
    fn the_cpu_backend_slices_every_variable_back_from_its_bucket_offset() {
        let (mut g, grads) = graph();
        let out = all_reduce_in_buckets(&mut g, &grads, 60, "ar").expect("buckets");
        let fetches: Vec<Value> = out.gradients.iter().map(|(_, v)| *v).collect();
        let mut session = CpuSession::new(g, CpuOptions::default()).expect("session");
        session.set_collective(std::sync::Arc::new(Positional));
        let got = session.run(&Step::fetch(fetches), &[]).expect("run");
        // a: bucket 0 from 0; b: bucket 1 from 0; c: bucket 1 from 5.
        for (k, (value, start)) in got.iter().zip([0usize, 0, 5]).enumerate() {
            let v = value.to_f32_vec();
            for (i, x) in v.iter().enumerate() {
                let want = (100 * k + i) as f32 + 1000.0 * (start + i) as f32;
                assert_eq!(*x, want, "variable {k} element {i}");
            }
        }
    }

    #[test]
    fn every_step_issues_the_bucket_all_reduces_in_one_order() {
        let (mut g, grads) = graph();
        let out = all_reduce_in_buckets(&mut g, &grads, 60, "ar").expect("buckets");
        let mut orders = Vec::new();
        // Steps fetching the averaged gradients in opposite orders, one also a gradient: the
        // collectives must come in the same order (whichever it is) in both programs.
        let forward: Vec<Value> = out.gradients.iter().map(|(_, v)| *v).collect();
        let mut backward = forward.clone();
        backward.reverse();
        backward.push(grads[2].1);
        for fetches in [forward, backward] {
            let program = crate::lower::lower(
                &g,
                &Step::fetch(fetches),
                1,
                &crate::lower::LowerOptions::default(),
            )
            .expect("lower");
            let names: Vec<String> = program
                .kernels
                .iter()
                .filter(|k| matches!(k.kind, crate::lower::KernelKind::AllReduce { .. }))
                .map(|k| k.name.clone())
                .collect();
            orders.push(names);
        }
        assert_eq!(orders[0].len(), 2, "{:?}", orders[0]);
        assert_eq!(orders[0], orders[1]);
    }

    #[test]
    fn a_gradient_given_twice_is_refused() {
        let (mut g, grads) = graph();
        let twice = vec![grads[0], grads[0]];
        let e = all_reduce_in_buckets(&mut g, &twice, 60, "ar").expect_err("twice");
        assert!(e.to_string().contains("`a` has two gradients"), "{e}");
    }
}
