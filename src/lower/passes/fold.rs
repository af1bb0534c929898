//! Constant folding and algebraic simplification.
//!
//! Folds small elementwise and layout ops whose inputs are all constants (evaluated with the
//! IR's scalar semantics), and removes no-ops: identities, casts and reshapes to the same type,
//! double negation, `x + 0`, `x - 0`, `x * 1` and `x / 1` (only when `x` already has the
//! result's type, so no broadcast is lost). `x * 0` is kept: it is NaN for a NaN `x`.
//!
//! A division by a constant power of two becomes a multiplication by its reciprocal, which is
//! exact: `x / 2ᵏ` and `x · 2⁻ᵏ` are the same real number, so both round to the same value — for
//! every `x`, NaN, infinities, zeros and subnormal results included — on every backend. Batch
//! norm's gradient divides whole activations by the element count of its statistics (a power
//! of two for power-of-two batches and images), and a multiplication costs a fraction of a
//! division.

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
        if let Some(x) = simplify(&sg.graph, id) {
            sg.replace(Value::first(id), x)?;
            rewrites += 1;
            continue;
        }
        // (A uniform reduction is never simplified: the order of the two checks is free.)
        let folded =
            fold_uniform_reduction(&sg.graph, id, batch).or_else(|| fold_constant(&sg.graph, id));
        if let Some(value) = folded {
            replace_node(sg, id, "folded", Op::Constant { value }, &[])?;
            rewrites += 1;
            continue;
        }
        if let Some((x, reciprocal)) = division_by_power_of_two(&sg.graph, id) {
            let name = format!("{}/reciprocal", sg.graph.node(id).name);
            let c_name = sg.graph.unique_name(&name);
            let c = sg
                .graph
                .add_node(&c_name, Op::Constant { value: reciprocal }, &[])?;
            sg.graph.set_device(c, sg.graph.node(id).device);
            replace_node(
                sg,
                id,
                "mul",
                Op::Binary(BinaryOp::Mul),
                &[x, Value::first(c)],
            )?;
            rewrites += 1;
        }
    }
    Ok(rewrites)
}

/// Replaces node `id` with a new node computing `op` of `inputs` on `id`'s device, which takes
/// over `id`'s name (built under a temporary `<name>/<suffix>` until `id` is gone).
fn replace_node(
    sg: &mut StepGraph,
    id: NodeId,
    suffix: &str,
    op: Op,
    inputs: &[Value],
) -> Result<(), LowerError> {
    let name = sg.graph.node(id).name.clone();
    let tmp = sg.graph.unique_name(&format!("{name}/{suffix}"));
    let new = sg.graph.add_node(&tmp, op, inputs)?;
    sg.graph.set_device(new, sg.graph.node(id).device);
    sg.replace(Value::first(id), Value::first(new))?;
    sg.graph.remove_node(id);
    sg.graph.rename_node(new, &name)?;
    Ok(())
}

/// `(x, 1 / c)` when `id` is `x / c` for a floating-point constant `c` (at most
/// [`MAX_FOLDED_ELEMENTS`]) whose every element is a power of two with a reciprocal the type
/// represents exactly (so `x · (1 / c)` is `x / c`, bit for bit).
fn division_by_power_of_two(graph: &Graph, id: NodeId) -> Option<(Value, HostTensor)> {
    let node = graph.node(id);
    if node.op != Op::Binary(BinaryOp::Div) {
        return None;
    }
    let ins = graph.inputs(id);
    let c = constant(graph, ins[1])?;
    let dtype = c.dtype();
    let out = node.outputs.first()?;
    if !dtype.is_float() || out.dtype != dtype || c.len() > MAX_FOLDED_ELEMENTS {
        return None;
    }
    let reciprocals = c
        .to_f64_vec()
        .into_iter()
        .map(|v| {
            let r = 1.0 / v;
            // `v` is an element of a `dtype` tensor, so only its reciprocal can fall outside it.
            let power_of_two = v.is_normal() && v.abs().to_bits() & ((1 << 52) - 1) == 0;
            (power_of_two && scalar::round_to(r, dtype) == r).then_some(r)
        })
        .collect::<Option<Vec<f64>>>()?;
    let value = HostTensor::from_f64_values(dtype, c.shape(), reciprocals).ok()?;
    Some((ins[0], value))
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

    /// Adds input `x` of f32 values of `shape`.
    fn add_input(g: &mut Graph, shape: Shape) -> Value {
        let ty = TensorType::f32(shape);
        let op = Op::Input {
            name: "x".into(),
            ty,
        };
        Value::first(g.add_node("x", op, &[]).expect("input"))
    }

    fn add_constant(g: &mut Graph, name: &str, value: HostTensor) -> Value {
        Value::first(
            g.add_node(name, Op::Constant { value }, &[])
                .expect("constant"),
        )
    }

    fn add_binary(g: &mut Graph, name: &str, op: BinaryOp, a: Value, b: Value) -> Value {
        Value::first(g.add_node(name, Op::Binary(op), &[a, b]).expect(name))
    }

    #[test]
    fn folds_constants_and_removes_no_ops() {
        let mut g = Graph::new();
        let x = add_input(&mut g, Shape::batched(&[3]));
        let two = add_constant(&mut g, "two", HostTensor::scalar_f32(2.0));
        let half = add_constant(&mut g, "half", HostTensor::scalar_f32(0.5));
        let one = add_binary(&mut g, "one", BinaryOp::Mul, two, half);
        let y = add_binary(&mut g, "y", BinaryOp::Mul, x, one);
        let id = g.add_node("id", Op::Identity, &[y]).expect("id");
        let c = g
            .add_node("c", Op::Cast { to: DType::F32 }, &[Value::first(id)])
            .expect("cast");
        let mut sg = extract(&g, &Step::fetch(vec![Value::first(c)])).expect("extract");
        assert!(fold(&mut sg, 1).expect("fold") >= 3);
        dce(&mut sg).expect("dce");
        assert_eq!(sg.fetches, vec![x], "x * (2 * 0.5) is x");
        assert_eq!(sg.graph.node_count(), 1);
    }

    /// `x / c` for each divisor, folded: the divisions by powers of two with exact reciprocals
    /// become multiplications (keeping the node's name), the others stay; and the two agree bit
    /// for bit on f32 values of every kind (NaN, infinities, signed zeros, subnormals, and
    /// quotients that underflow or overflow), by the IR's scalar semantics.
    #[test]
    fn divides_by_powers_of_two_as_multiplications_by_their_exact_reciprocals() {
        let two = |k: i32| 2f64.powi(k) as f32;
        for (divisor, rewritten) in [
            (2048.0, true),
            (0.25, true),
            (-8.0, true),
            (two(127), true), // 2⁻¹²⁷: a subnormal reciprocal, still exact
            (3.0, false),
            (0.1, false),
            (two(-140), false), // a subnormal divisor: 2¹⁴⁰ is no f32
            (0.0, false),
        ] {
            let mut g = Graph::new();
            let x = add_input(&mut g, Shape::batched(&[4]));
            let c = add_constant(&mut g, "c", HostTensor::scalar_f32(divisor));
            let y = add_binary(&mut g, "y", BinaryOp::Div, x, c);
            let mut sg = extract(&g, &Step::fetch(vec![y])).expect("extract");
            fold(&mut sg, 1).expect("fold");
            let fetched = sg.fetches[0].node;
            assert_eq!(sg.graph.node(fetched).name, "y", "{divisor}");
            let op = &sg.graph.node(fetched).op;
            let want = if rewritten {
                BinaryOp::Mul
            } else {
                BinaryOp::Div
            };
            assert_eq!(op, &Op::Binary(want), "x / {divisor:e}");
            if !rewritten {
                continue;
            }
            let r = constant(&sg.graph, sg.graph.inputs(fetched)[1]).expect("reciprocal");
            let r = r.to_f64_vec()[0];
            assert_eq!(r * f64::from(divisor), 1.0);
            let mut bits = 0x9E37_79B9u32;
            for i in 0..20_000 {
                bits ^= bits << 13;
                bits ^= bits >> 17;
                bits ^= bits << 5;
                let special = [f32::NAN, f32::INFINITY, -0.0, 0.0, f32::MIN_POSITIVE, 1e-45];
                let x = f64::from(special.get(i).copied().unwrap_or(f32::from_bits(bits)));
                // Native f32 arithmetic (the CPU kernels') and the IR's scalar semantics (the
                // reference executor's).
                let (x32, r32) = (x as f32, r as f32);
                let (q32, p32) = (x32 / divisor, x32 * r32);
                assert!(q32.to_bits() == p32.to_bits() || q32.is_nan() && p32.is_nan());
                let q = scalar::binary(BinaryOp::Div, x, f64::from(divisor), DType::F32);
                let p = scalar::binary(BinaryOp::Mul, x, r, DType::F32);
                assert!(
                    (q as f32).to_bits() == (p as f32).to_bits() || q.is_nan() && p.is_nan(),
                    "{x:e} / {divisor:e} = {q:e}, · its reciprocal = {p:e}"
                );
            }
        }
    }

    #[test]
    fn keeps_a_multiplication_that_broadcasts() {
        let mut g = Graph::new();
        let x = add_input(&mut g, Shape::fixed(&[3]));
        let ones = HostTensor::from_f32(&[2, 3], vec![1.0; 6]).expect("6");
        let ones = add_constant(&mut g, "ones", ones);
        let y = add_binary(&mut g, "y", BinaryOp::Mul, x, ones);
        let mut sg = extract(&g, &Step::fetch(vec![y])).expect("extract");
        fold(&mut sg, 1).expect("fold");
        assert_eq!(sg.fetches, vec![y]);
    }
}
