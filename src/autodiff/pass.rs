//! The reverse sweep: finds the nodes on float paths from the `wrt` values to the cost, visits
//! them in reverse topological order, sums the adjoints of each output and applies the op's
//! gradient rule for the inputs that lead back to a `wrt` value.

use super::emit::Emitter;
use super::rules::{self, Forward};
use super::{AutodiffError, GradientSet};
use crate::ir::{Graph, NodeId, Op, Value, VarId, is_valid_name};
use std::collections::{HashMap, HashSet};

/// The gradients of the float scalar `cost` with respect to the variables `wrt`.
///
/// The gradient of a variable sums the adjoints of every `Variable` node reading it that the
/// cost depends on (with variables shared by towers, only the reads of the cost's own tower are
/// ancestors of the cost). Variables the cost does not reach through float paths (including
/// non-float variables) are listed in [`GradientSet::unreached`].
///
/// ```
/// use towerpack::autodiff::gradients;
/// use towerpack::ir::{
///     Graph, Initializer, Op, ReduceOp, Shape, TensorType, UnaryOp, Value, VarFlags, VariableDef,
/// };
///
/// let mut g = Graph::new();
/// let w = g.declare_variable(VariableDef {
///     name: "w".into(),
///     ty: TensorType::f32(Shape::fixed(&[3])),
///     init: Initializer::Zeros,
///     flags: VarFlags { trainable: true, ..VarFlags::default() },
/// })?;
/// let read = Value::first(g.add_node("w/read", Op::Variable { var: w }, &[])?);
/// let sq = Value::first(g.add_node("sq", Op::Unary(UnaryOp::Square), &[read])?);
/// let sum = Op::Reduce { op: ReduceOp::Sum, axes: vec![0], keep_dims: false };
/// let cost = Value::first(g.add_node("cost", sum, &[sq])?);
///
/// let set = gradients(&mut g, cost, &[w], "gradients")?;
/// let (var, grad) = set.grads[0];
/// assert_eq!(var, w);
/// assert_eq!(g.value_type(grad), &g.variable(w).ty);
/// // d sum(w^2) / dw = 2w, built by the rule of the `sq` node:
/// assert!(g.node(grad.node).name.starts_with("gradients/sq_grad/"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn gradients(
    graph: &mut Graph,
    cost: Value,
    wrt: &[VarId],
    name_prefix: &str,
) -> Result<GradientSet, AutodiffError> {
    let declared = graph.variables().len();
    if let Some(bad) = wrt.iter().find(|v| v.0 as usize >= declared) {
        return Err(AutodiffError::UnknownVariable(bad.0));
    }
    let wanted: HashSet<VarId> = wrt.iter().copied().collect();
    let reads: Vec<(VarId, Value)> = graph
        .node_ids()
        .filter_map(|id| match graph.node(id).op {
            Op::Variable { var } if wanted.contains(&var) => Some((var, Value::first(id))),
            _ => None,
        })
        .collect();
    let read_values: Vec<Value> = reads.iter().map(|(_, v)| *v).collect();
    let read_grads = gradients_of_values(graph, cost, &read_values, name_prefix)?;

    let mut per_var: HashMap<VarId, Vec<(Value, Value)>> = HashMap::new();
    for ((var, read), grad) in reads.iter().zip(read_grads) {
        if let Some(g) = grad {
            per_var.entry(*var).or_default().push((*read, g));
        }
    }
    let mut set = GradientSet {
        grads: Vec::new(),
        unreached: Vec::new(),
    };
    let mut done = HashSet::new();
    for &var in wrt {
        if !done.insert(var) {
            continue;
        }
        let Some(parts) = per_var.get(&var) else {
            set.unreached.push(var);
            continue;
        };
        let mut total = parts[0].1;
        if parts.len() > 1 {
            let base = grad_scope(name_prefix, &graph.variable(var).name);
            let mut e = Emitter::new(graph, base, parts[0].0.node);
            for &(_, g) in &parts[1..] {
                total = e.add(total, g)?;
            }
        }
        set.grads.push((var, total));
    }
    Ok(set)
}

/// The gradients of the float scalar `cost` with respect to arbitrary values of the graph:
/// `None` for a value the cost does not depend on through float paths.
pub fn gradients_of_values(
    graph: &mut Graph,
    cost: Value,
    wrt: &[Value],
    name_prefix: &str,
) -> Result<Vec<Option<Value>>, AutodiffError> {
    let unknown = |v: &Value| AutodiffError::UnknownValue {
        node: v.node.index(),
        port: v.port,
    };
    let cost_ty = graph.try_value_type(cost).ok_or_else(|| unknown(&cost))?;
    if !cost_ty.dtype.is_float() || cost_ty.rank() != 0 {
        return Err(AutodiffError::CostNotScalar {
            name: graph.value_name(cost),
            ty: cost_ty.to_string(),
        });
    }
    if let Some(bad) = wrt.iter().find(|v| graph.try_value_type(**v).is_none()) {
        return Err(unknown(bad));
    }
    if !is_valid_name(name_prefix) {
        return Err(AutodiffError::Ir(crate::ir::IrError::InvalidName {
            name: name_prefix.to_string(),
        }));
    }

    let is_float = |g: &Graph, v: Value| g.value_type(v).dtype.is_float();
    let wrt_float: HashSet<Value> = wrt
        .iter()
        .copied()
        .filter(|v| is_float(graph, *v))
        .collect();
    let ancestors = data_ancestors(graph, cost.node);
    let relevant: HashSet<NodeId> = float_descendants(graph, &wrt_float)
        .into_iter()
        .filter(|id| ancestors.contains(id))
        .collect();
    let mut results: HashMap<Value, Value> = HashMap::new();
    if !relevant.contains(&cost.node) && !wrt_float.contains(&cost) {
        return Ok(vec![None; wrt.len()]);
    }

    let mut adjoints: HashMap<Value, Vec<Value>> = HashMap::new();
    {
        let base = grad_scope(name_prefix, &graph.node(cost.node).name);
        let mut e = Emitter::new(graph, base, cost.node);
        let dtype = e.ty(cost).dtype;
        let value = crate::tensor::HostTensor::scalar(dtype, 1.0);
        let one = e.node("ones", Op::Constant { value }, &[])?;
        adjoints.insert(cost, vec![one]);
    }
    let wrt_nodes: HashSet<NodeId> = wrt_float.iter().map(|v| v.node).collect();
    for id in graph.topo_order()?.into_iter().rev() {
        if !relevant.contains(&id) && !wrt_nodes.contains(&id) {
            continue;
        }
        let base = grad_scope(name_prefix, &graph.node(id).name);
        let outputs = graph.node(id).outputs.len();
        let mut e = Emitter::new(graph, base, id);
        let mut dys: Vec<Option<Value>> = Vec::with_capacity(outputs);
        for port in 0..outputs {
            let v = Value::new(id, port as u16);
            let total = match adjoints.remove(&v) {
                None => None,
                Some(parts) => {
                    let mut acc = parts[0];
                    for &p in &parts[1..] {
                        acc = e.node("accum", Op::Binary(crate::ir::BinaryOp::Add), &[acc, p])?;
                    }
                    Some(acc)
                }
            };
            if let (Some(t), true) = (total, wrt_float.contains(&v)) {
                results.insert(v, t);
            }
            dys.push(total);
        }
        if !relevant.contains(&id) || dys.iter().all(Option::is_none) {
            continue;
        }
        let fwd = Forward::of(e.graph, id);
        let needs: Vec<bool> = fwd
            .inputs
            .iter()
            .map(|&u| {
                is_float(e.graph, u) && (wrt_float.contains(&u) || relevant.contains(&u.node))
            })
            .collect();
        if !needs.iter().any(|&n| n) {
            continue;
        }
        let grads = rules::gradient(&mut e, &fwd, &dys, &needs)?;
        for (slot, (&u, g)) in fwd.inputs.iter().zip(grads).enumerate() {
            let Some(g) = g else { continue };
            if !needs[slot] {
                continue;
            }
            let (want, got) = (e.ty(u), e.ty(g));
            if want != got {
                return Err(AutodiffError::WrongGradientType {
                    node: e.graph.node(id).name.clone(),
                    op: fwd.op.kind_name().to_string(),
                    slot,
                    expected: want.to_string(),
                    got: got.to_string(),
                });
            }
            adjoints.entry(u).or_default().push(g);
        }
    }
    Ok(wrt.iter().map(|v| results.get(v).copied()).collect())
}

/// `{prefix}/{forward}_grad`, with the prefix's scope stripped once from the forward name.
pub(crate) fn grad_scope(prefix: &str, forward: &str) -> String {
    let stripped = prefix
        .rsplit_once('/')
        .and_then(|(scope, _)| forward.strip_prefix(scope))
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(forward);
    format!("{prefix}/{stripped}_grad")
}

/// Every node `root` depends on through data edges, `root` included.
fn data_ancestors(graph: &Graph, root: NodeId) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(id) = stack.pop() {
        if seen.insert(id) {
            stack.extend(graph.inputs(id).iter().map(|v| v.node));
        }
    }
    seen
}

/// Every node that consumes, through float values only, one of `starts` (the starts' own nodes
/// are not included unless they consume another start).
fn float_descendants(graph: &Graph, starts: &HashSet<Value>) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack: Vec<Value> = starts.iter().copied().collect();
    while let Some(v) = stack.pop() {
        for (consumer, _) in graph.uses(v) {
            if seen.insert(consumer) {
                let node = graph.node(consumer);
                for (port, ty) in node.outputs.iter().enumerate() {
                    if ty.dtype.is_float() {
                        stack.push(Value::new(consumer, port as u16));
                    }
                }
            }
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use super::grad_scope;

    #[test]
    fn gradient_scopes_strip_the_tower_once() {
        assert_eq!(
            grad_scope("tower0/gradients", "tower0/conv0/Conv2D"),
            "tower0/gradients/conv0/Conv2D_grad"
        );
        assert_eq!(
            grad_scope("tower0/gradients", "conv0/W"),
            "tower0/gradients/conv0/W_grad"
        );
        assert_eq!(
            grad_scope("tower0/gradients", "tower01/x"),
            "tower0/gradients/tower01/x_grad"
        );
        assert_eq!(
            grad_scope("gradients", "fc/MatMul"),
            "gradients/fc/MatMul_grad"
        );
    }
}
