//! Constant folding and algebraic simplification.
//!
//! Folds small elementwise and layout ops whose inputs are all constants (evaluated with the
//! IR's scalar semantics), and removes no-ops: identities, casts and reshapes to the same type,
//! double negation, `x + 0`, `x - 0`, `x * 1` and `x / 1` (only when `x` already has the
//! result's type, so no broadcast is lost). `x * 0` is kept: it is NaN for a NaN `x`.

use super::StepGraph;
use crate::ir::{BinaryOp, Graph, NodeId, Op, TensorType, UnaryOp, Value, scalar};
use crate::lower::LowerError;
use crate::tensor::HostTensor;

/// Folding never materialises constants larger than this many elements.
const MAX_FOLDED_ELEMENTS: usize = 1 << 16;

/// Runs folding and simplification in one topological sweep; returns the number of rewrites.
/// `batch` binds the symbolic batch size (lowering compiles one program per batch size), so
/// batch-dependent constants fold too — e.g. the element count of a mean's gradient.
pub fn fold(sg: &mut StepGraph, batch: usize) -> Result<usize, LowerError> {
    let mut rewrites = 0;
    for id in sg.graph.topo_order()? {
        if !sg.graph.contains(id) {
            continue;
        }
        if let Some(value) = fold_uniform_reduction(&sg.graph, id, batch) {
            let name = sg.graph.node(id).name.clone();
            let tmp = sg.graph.unique_name(&format!("{name}/folded"));
            let c = sg.graph.add_node(&tmp, Op::Constant { value }, &[])?;
            sg.graph.set_device(c, sg.graph.node(id).device);
            sg.replace(Value::first(id), Value::first(c))?;
            sg.graph.remove_node(id);
            sg.graph.rename_node(c, &name)?;
            rewrites += 1;
            continue;
        }
        if let Some(x) = simplify(&sg.graph, id) {
            sg.replace(Value::first(id), x)?;
            rewrites += 1;
            continue;
        }
        if let Some(value) = fold_constant(&sg.graph, id) {
            let name = sg.graph.node(id).name.clone();
            let tmp = sg.graph.unique_name(&format!("{name}/folded"));
            let c = sg.graph.add_node(&tmp, Op::Constant { value }, &[])?;
            sg.graph.set_device(c, sg.graph.node(id).device);
            sg.replace(Value::first(id), Value::first(c))?;
            sg.graph.remove_node(id);
            sg.graph.rename_node(c, &name)?;
            rewrites += 1;
        }
    }
    Ok(rewrites)
}

fn constant(graph: &Graph, v: Value) -> Option<&HostTensor> {
    match &graph.node(v.node).op {
        Op::Constant { value } => Some(value),
        _ => None,
    }
}

fn is_filled_with(graph: &Graph, v: Value, c: f64) -> bool {
    constant(graph, v).is_some_and(|t| t.to_f64_vec().iter().all(|&x| x == c))
}

/// A reduction of a constant broadcast to a (possibly batched) shape, when its result has a
/// static shape: every element of it is the same number (sum: `c·count`, mean/max/min: `c`).
fn fold_uniform_reduction(graph: &Graph, id: NodeId, batch: usize) -> Option<HostTensor> {
    let node = graph.node(id);
    let Op::Reduce { op, axes, .. } = &node.op else {
        return None;
    };
    let out = node.outputs.first()?;
    let out_shape = out.shape.to_static()?;
    let x = graph.inputs(id)[0];
    let Op::Broadcast { shape } = &graph.node(x.node).op else {
        return None;
    };
    let c = constant(graph, graph.inputs(x.node)[0])?;
    let vals = c.to_f64_vec();
    let first = *vals.first()?;
    if vals.iter().any(|&v| v != first) {
        return None;
    }
    let dims = shape.resolve(batch);
    let count: usize = axes.iter().map(|&a| dims[a]).product();
    let value = match op {
        crate::ir::ReduceOp::Sum => first * count as f64,
        _ => first,
    };
    let n: usize = out_shape.iter().product();
    HostTensor::from_f64_values(
        out.dtype,
        &out_shape,
        vec![scalar::round_to(value, out.dtype); n],
    )
    .ok()
}

/// The value `id` can be replaced with, if it is a no-op.
fn simplify(graph: &Graph, id: NodeId) -> Option<Value> {
    let node = graph.node(id);
    let ins = graph.inputs(id);
    let out: &TensorType = node.outputs.first()?;
    let same = |v: Value| graph.value_type(v) == out;
    match &node.op {
        Op::Identity => Some(ins[0]),
        Op::Cast { .. } | Op::Reshape { .. } | Op::Broadcast { .. } if same(ins[0]) => Some(ins[0]),
        Op::Unary(UnaryOp::Neg) => {
            let inner = graph.node(ins[0].node);
            match inner.op {
                Op::Unary(UnaryOp::Neg) => Some(graph.inputs(ins[0].node)[0]),
                _ => None,
            }
        }
        Op::Binary(b) => {
            let (l, r) = (ins[0], ins[1]);
            let pick = |keep: Value, other: Value, c: f64| {
                (same(keep) && is_filled_with(graph, other, c)).then_some(keep)
            };
            match b {
                BinaryOp::Add => pick(l, r, 0.0).or_else(|| pick(r, l, 0.0)),
                BinaryOp::Sub => pick(l, r, 0.0),
                BinaryOp::Mul => pick(l, r, 1.0).or_else(|| pick(r, l, 1.0)),
                BinaryOp::Div => pick(l, r, 1.0),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The folded value of `id`, if it is a small op of constants.
fn fold_constant(graph: &Graph, id: NodeId) -> Option<HostTensor> {
    let node = graph.node(id);
    let foldable = matches!(
        node.op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Broadcast { .. }
    );
    if !foldable || node.outputs.len() != 1 {
        return None;
    }
    let ins = graph.inputs(id);
    let consts: Vec<&HostTensor> = ins
        .iter()
        .map(|v| constant(graph, *v))
        .collect::<Option<_>>()?;
    let out = &node.outputs[0];
    let shape = out.shape.to_static()?;
    let n: usize = shape.iter().product();
    // Never grow a constant: a broadcast of a small constant stays a broadcast (a stride-0
    // view, read from the small constant) instead of becoming a large constant to load.
    let largest_input = consts.iter().map(|t| t.len()).max().unwrap_or(0);
    if n > MAX_FOLDED_ELEMENTS || n > largest_input.max(1) {
        return None;
    }
    if let Op::Reshape { .. } = node.op {
        return consts[0].reshape(&shape).ok();
    }
    let vals: Vec<Vec<f64>> = consts.iter().map(|t| t.to_f64_vec()).collect();
    let maps: Vec<Vec<usize>> = consts
        .iter()
        .map(|t| broadcast_strides(t.shape(), &shape))
        .collect();
    let operand_type = consts.first().map(|t| t.dtype())?;
    let mut result = Vec::with_capacity(n);
    let mut index = vec![0usize; shape.len()];
    for _ in 0..n {
        let at = |k: usize| -> f64 {
            let off: usize = index.iter().zip(&maps[k]).map(|(i, s)| i * s).sum();
            vals[k][off]
        };
        let x = match &node.op {
            Op::Unary(u) => scalar::unary(*u, at(0), out.dtype),
            Op::Binary(b) => scalar::binary(*b, at(0), at(1), operand_type),
            Op::Select => {
                if at(0) != 0.0 {
                    at(1)
                } else {
                    at(2)
                }
            }
            Op::Cast { to } => scalar::cast(at(0), *to),
            _ => at(0), // Broadcast
        };
        result.push(scalar::round_to(x, out.dtype));
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    HostTensor::from_f64_values(out.dtype, &shape, result).ok()
}

/// Strides reading a tensor of `shape` broadcast (NumPy rules) to `target`.
pub fn broadcast_strides(shape: &[usize], target: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; target.len()];
    let offset = target.len() - shape.len();
    let mut acc = 1;
    for d in (0..shape.len()).rev() {
        if shape[d] != 1 {
            strides[offset + d] = acc;
        }
        acc *= shape[d];
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Shape, Step};
    use crate::lower::passes::{dce, extract};
    use crate::tensor::DType;

    #[test]
    fn folds_constants_and_removes_no_ops() {
        let mut g = Graph::new();
        let x = g
            .add_node(
                "x",
                Op::Input {
                    name: "x".into(),
                    ty: TensorType::f32(Shape::batched(&[3])),
                },
                &[],
            )
            .expect("input");
        let two = g
            .add_node(
                "two",
                Op::Constant {
                    value: HostTensor::scalar_f32(2.0),
                },
                &[],
            )
            .expect("c");
        let half = g
            .add_node(
                "half",
                Op::Constant {
                    value: HostTensor::scalar_f32(0.5),
                },
                &[],
            )
            .expect("c");
        let one = g
            .add_node(
                "one",
                Op::Binary(BinaryOp::Mul),
                &[Value::first(two), Value::first(half)],
            )
            .expect("mul");
        let y = g
            .add_node(
                "y",
                Op::Binary(BinaryOp::Mul),
                &[Value::first(x), Value::first(one)],
            )
            .expect("mul");
        let id = g
            .add_node("id", Op::Identity, &[Value::first(y)])
            .expect("id");
        let c = g
            .add_node("c", Op::Cast { to: DType::F32 }, &[Value::first(id)])
            .expect("cast");
        let mut sg = extract(&g, &Step::fetch(vec![Value::first(c)])).expect("extract");
        assert!(fold(&mut sg, 1).expect("fold") >= 3);
        dce(&mut sg).expect("dce");
        assert_eq!(sg.fetches, vec![Value::first(x)], "x * (2 * 0.5) is x");
        assert_eq!(sg.graph.node_count(), 1);
    }

    #[test]
    fn keeps_a_multiplication_that_broadcasts() {
        let mut g = Graph::new();
        let x = g
            .add_node(
                "x",
                Op::Input {
                    name: "x".into(),
                    ty: TensorType::f32(Shape::fixed(&[3])),
                },
                &[],
            )
            .expect("input");
        let ones = g
            .add_node(
                "ones",
                Op::Constant {
                    value: HostTensor::from_f32(&[2, 3], vec![1.0; 6]).expect("6"),
                },
                &[],
            )
            .expect("c");
        let y = g
            .add_node(
                "y",
                Op::Binary(BinaryOp::Mul),
                &[Value::first(x), Value::first(ones)],
            )
            .expect("mul");
        let mut sg = extract(&g, &Step::fetch(vec![Value::first(y)])).expect("extract");
        fold(&mut sg, 1).expect("fold");
        assert_eq!(sg.fetches, vec![Value::first(y)]);
    }
}
