//! The gradient all-reduces of a distributed step, at graph level: one `AllReduce {op=mean}`
//! node per tower gradient of every variable, on the gradient's device. Nothing here
//! concatenates or slices: lowering ([`crate::lower::collectives`]) cuts these nodes, in
//! topological order, into buckets of at most `bucket_bytes` (the same on every rank whatever
//! its step), places the gradients of each bucket back to back and reduces the whole range in
//! place with ONE all-reduce, before the fused update kernels reading it (whose gradient
//! arenas are that range or parts of it) run.

use std::collections::HashSet;

use crate::ir::{Graph, Op, ReduceOp, Value, VarId};
use crate::tensor::DType;
use crate::train::error::{DistributedError, TrainError};

/// `(variable, all_reduce(gradient) {op=mean})` for every `(variable, gradient)` of one
/// tower, in the same order; each node is named `<prefix>/<variable>` and sits on its
/// gradient's device. Every gradient must be f32 with a static shape, once per variable.
pub fn all_reduce_gradients(
    graph: &mut Graph,
    grads: &[(VarId, Value)],
    prefix: &str,
) -> Result<Vec<(VarId, Value)>, TrainError> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(grads.len());
    for &(var, g) in grads {
        let name = graph.variable(var).name.clone();
        if !seen.insert(var) {
            return Err(DistributedError::DuplicateGradient {
                variable: name.to_string(),
            }
            .into());
        }
        let ty = graph.value_type(g);
        if ty.shape.to_static().is_none() {
            return Err(DistributedError::DynamicGradient {
                variable: name.to_string(),
                shape: ty.shape.to_string(),
            }
            .into());
        }
        if ty.dtype != DType::F32 {
            return Err(DistributedError::GradientDType {
                variable: name.to_string(),
                dtype: ty.dtype,
            }
            .into());
        }
        let device = graph.node(g.node).device;
        let node_name = graph.unique_name(&format!("{prefix}/{name}"));
        let reduced = graph.add_node_on(
            &node_name,
            Op::AllReduce { op: ReduceOp::Mean },
            &[g],
            device,
        )?;
        out.push((var, Value::first(reduced)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Initializer, Shape, TensorType, VarFlags, VariableDef};
    use crate::tensor::HostTensor;

    fn variable(g: &mut Graph, name: &str, dims: &[usize]) -> VarId {
        g.declare_variable(VariableDef {
            name: name.into(),
            ty: TensorType::f32(Shape::fixed(dims)),
            init: Initializer::Zeros,
            flags: VarFlags {
                trainable: true,
                ..VarFlags::default()
            },
        })
        .expect("variable")
    }

    fn constant(g: &mut Graph, name: &str, value: HostTensor) -> Value {
        Value::first(
            g.add_node(name, Op::Constant { value }, &[])
                .expect("constant"),
        )
    }

    #[test]
    fn each_gradient_gets_one_mean_all_reduce_on_its_device() {
        let mut g = Graph::new();
        let a = variable(&mut g, "a", &[2]);
        let b = variable(&mut g, "b", &[3]);
        let ga = constant(
            &mut g,
            "ga",
            HostTensor::from_f32(&[2], vec![1.0; 2]).expect("t"),
        );
        let gb = constant(
            &mut g,
            "gb",
            HostTensor::from_f32(&[3], vec![2.0; 3]).expect("t"),
        );
        g.set_device(gb.node, Some(1));
        let out = all_reduce_gradients(&mut g, &[(a, ga), (b, gb)], "allreduce").expect("ok");
        assert_eq!(out.iter().map(|(v, _)| *v).collect::<Vec<_>>(), vec![a, b]);
        for ((_, r), (device, input)) in out.iter().zip([(None, ga), (Some(1), gb)]) {
            let node = g.node(r.node);
            assert!(matches!(node.op, Op::AllReduce { op: ReduceOp::Mean }));
            assert_eq!(node.device, device);
            assert_eq!(g.inputs(r.node).to_vec(), vec![input]);
        }
        assert_eq!(g.value_name(out[1].1), "allreduce/b");
    }

    #[test]
    fn twice_the_same_variable_or_a_non_f32_gradient_is_refused() {
        let mut g = Graph::new();
        let a = variable(&mut g, "a", &[2]);
        let ga = constant(
            &mut g,
            "ga",
            HostTensor::from_f32(&[2], vec![1.0; 2]).expect("t"),
        );
        let e = all_reduce_gradients(&mut g, &[(a, ga), (a, ga)], "ar").expect_err("twice");
        assert!(e.to_string().contains("`a` has two gradients"), "{e}");
        let gi = constant(
            &mut g,
            "gi",
            HostTensor::from_i32(&[2], vec![1, 2]).expect("t"),
        );
        let e = all_reduce_gradients(&mut g, &[(a, gi)], "ar").expect_err("i32");
        assert!(
            e.to_string().contains("distributed all-reduces carry f32"),
            "{e}"
        );
    }
}
