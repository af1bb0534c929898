//! One step of a graph, op by op: bind the feeds, compute the ancestors of the fetches and
//! targets in topological order, collect the assigns. Also [`evaluate`], the session-free entry.
//!
//! Every `Variable` node reads the store as it was when the step began; the assigns are returned
//! to the caller, which applies them when the step has succeeded (so a failed step changes nothing).

use super::Precision;
use super::array::Array;
use super::eval::eval_op;
use crate::backend::{BackendError, Feed, Step};
use crate::ir::{Graph, NodeId, Op, Shape, TensorType, Value, VarId, VariableDef, verify};
use crate::tensor::HostTensor;
use std::collections::{HashMap, HashSet};

/// What a step produced: the fetched values and the assigns to apply.
pub(crate) struct StepOutcome {
    pub fetched: Vec<HostTensor>,
    pub assigns: Vec<(VarId, Array)>,
}

/// `dtype[shape]` of a host tensor, as the IR prints types.
fn describe(t: &HostTensor) -> String {
    TensorType::of_host(t).to_string()
}

/// True when a host tensor of `got` may stand for a value of graph dtype `want` under `p`:
/// the same dtype, or (in `F64` mode) any float for any float.
fn dtype_accepted(want: crate::tensor::DType, got: crate::tensor::DType, p: Precision) -> bool {
    want == got || (p == Precision::F64 && want.is_float() && got.is_float())
}

/// Checks `value` against the declaration of a variable and converts it for the store.
pub(crate) fn accept_variable(
    def: &VariableDef,
    value: &HostTensor,
    p: Precision,
) -> Result<Array, BackendError> {
    let shape_ok = def.ty.shape.to_static().as_deref() == Some(value.shape());
    if !shape_ok || !dtype_accepted(def.ty.dtype, value.dtype(), p) {
        return Err(BackendError::VariableMismatch {
            variable: def.name.clone(),
            expected: def.ty.to_string(),
            got: describe(value),
        });
    }
    Ok(Array::from_host(value, def.ty.dtype, p))
}

/// Checks every feed, needed by the step or not (it targets an input, once; dtype and shape
/// fit), and binds the batch size `N`: every fed batched input must agree on it.
fn bind_feeds(
    graph: &Graph,
    feeds: &[Feed],
    p: Precision,
) -> Result<(HashMap<NodeId, Array>, Option<usize>), BackendError> {
    let mut bound = HashMap::new();
    let mut batch: Option<(usize, &str)> = None;
    for (id, t) in feeds {
        let node = graph
            .try_node(*id)
            .ok_or_else(|| BackendError::UnknownValue(format!("#{}", id.index())))?;
        let Op::Input { ty, .. } = &node.op else {
            return Err(BackendError::FeedNotInput {
                node: node.name.clone(),
            });
        };
        let mismatch = |got: String| BackendError::FeedMismatch {
            input: node.name.clone(),
            expected: ty.to_string(),
            got,
        };
        if bound.contains_key(id) {
            return Err(mismatch("a second feed in the same step".into()));
        }
        let dims_ok = ty.rank() == t.shape().len()
            && ty
                .shape
                .dims()
                .iter()
                .zip(t.shape())
                .all(|(d, &n)| d.fixed().is_none_or(|f| f == n));
        if !dims_ok || !dtype_accepted(ty.dtype, t.dtype(), p) {
            return Err(mismatch(describe(t)));
        }
        if ty.shape.has_batch() {
            let n = t.shape()[0];
            match batch {
                None => batch = Some((n, &node.name)),
                Some((expected, _)) if expected != n => {
                    return Err(BackendError::BatchMismatch {
                        input: node.name.clone(),
                        expected,
                        got: n,
                    });
                }
                Some(_) => {}
            }
        }
        bound.insert(*id, Array::from_host(t, ty.dtype, p));
    }
    Ok((bound, batch.map(|(n, _)| n)))
}

/// The concrete shape of `ty` once the batch size is known.
fn concrete(ty: &TensorType, batch: Option<usize>) -> Result<Vec<usize>, String> {
    match batch {
        Some(n) => Ok(ty.shape.resolve(n)),
        None => ty.shape.to_static().ok_or_else(|| {
            format!("internal: {ty} needs a batch size, but no batched input is fed")
        }),
    }
}

/// Runs `step`: computes exactly the ancestors of its fetches and targets.
pub(crate) fn run_step(
    graph: &Graph,
    p: Precision,
    variables: &[Option<Array>],
    feeds: &[Feed],
    step: &Step,
) -> Result<StepOutcome, BackendError> {
    let exists = |v: &Value| {
        graph
            .try_node(v.node)
            .is_some_and(|n| usize::from(v.port) < n.outputs.len())
    };
    if let Some(v) = step.fetches.iter().find(|v| !exists(v)) {
        let name = graph.try_node(v.node).map_or_else(
            || format!("#{}:{}", v.node.index(), v.port),
            |n| format!("{}:{}", n.name, v.port),
        );
        return Err(BackendError::UnknownValue(name));
    }
    if let Some(t) = step.targets.iter().find(|t| !graph.contains(**t)) {
        return Err(BackendError::UnknownValue(format!("#{}", t.index())));
    }
    let (mut fed, batch) = bind_feeds(graph, feeds, p)?;
    let roots: Vec<NodeId> = step
        .fetches
        .iter()
        .map(|v| v.node)
        .chain(step.targets.iter().copied())
        .collect();
    let order = graph.ancestors_of(&roots)?;
    for &id in &order {
        let node = graph.node(id);
        if matches!(node.op, Op::Input { .. }) && !fed.contains_key(&id) {
            return Err(BackendError::MissingFeed {
                input: node.name.clone(),
            });
        }
    }

    let mut values: HashMap<NodeId, Vec<Array>> = HashMap::with_capacity(order.len());
    let mut assigns = Vec::new();
    let mut assigned = HashSet::new();
    for id in order {
        let node = graph.node(id);
        let inputs: Vec<&Array> = graph
            .inputs(id)
            .iter()
            .map(|v| {
                values
                    .get(&v.node)
                    .and_then(|outs| outs.get(usize::from(v.port)))
            })
            .collect::<Option<_>>()
            .ok_or_else(|| kernel_error(graph, id, &[], "internal: an input was not computed"))?;
        let outputs = match &node.op {
            Op::Input { .. } => fed.remove(&id).into_iter().collect(),
            Op::Constant { value } => vec![Array::from_host(value, value.dtype(), p)],
            // `graph.variable` cannot panic below: the verifier checked every variable id.
            Op::Variable { var } => {
                let value = variables.get(var.0 as usize).and_then(Option::as_ref);
                let value = value.cloned().ok_or_else(|| {
                    let name = &graph.variable(*var).name;
                    let msg = format!(
                        "variable `{name}` has no value: initialize or write it before the step"
                    );
                    kernel_error(graph, id, &[], &msg)
                })?;
                vec![value]
            }
            Op::Assign { var } => {
                if !assigned.insert(*var) {
                    return Err(BackendError::DoubleAssign {
                        variable: graph.variable(*var).name.clone(),
                    });
                }
                let value = inputs.first().ok_or_else(|| {
                    kernel_error(graph, id, &[], "internal: assign without input")
                })?;
                assigns.push((*var, (*value).clone()));
                Vec::new()
            }
            Op::Group => Vec::new(),
            op => compute(graph, id, op, &inputs, batch, p)?,
        };
        check_outputs(graph, id, &outputs, batch)
            .map_err(|m| kernel_error(graph, id, &inputs, &m))?;
        values.insert(id, outputs);
    }

    let fetched = step
        .fetches
        .iter()
        .map(|v| {
            values
                .get(&v.node)
                .and_then(|outs| outs.get(usize::from(v.port)))
                .map(|a| a.to_host(p))
                .ok_or_else(|| BackendError::UnknownValue(graph.value_name(*v)))
        })
        .collect::<Result<_, _>>()?;
    Ok(StepOutcome { fetched, assigns })
}

/// Evaluates a compute node from its inputs.
fn compute(
    graph: &Graph,
    id: NodeId,
    op: &Op,
    inputs: &[&Array],
    batch: Option<usize>,
    p: Precision,
) -> Result<Vec<Array>, BackendError> {
    let node = graph.node(id);
    let fail = |m: String| kernel_error(graph, id, inputs, &m);
    let shapes: Vec<Vec<usize>> = node
        .outputs
        .iter()
        .map(|t| concrete(t, batch))
        .collect::<Result<_, _>>()
        .map_err(fail)?;
    let outs = eval_op(op, inputs, &shapes, p).map_err(fail)?;
    outs.into_iter()
        .zip(&node.outputs)
        .map(|(o, ty)| Array::from_output(o, ty.dtype, p).map_err(fail))
        .collect()
}

/// Checks the computed outputs against the node's inferred types (catches executor bugs).
fn check_outputs(
    graph: &Graph,
    id: NodeId,
    outputs: &[Array],
    batch: Option<usize>,
) -> Result<(), String> {
    let node = graph.node(id);
    if outputs.len() != node.outputs.len() {
        return Err(format!(
            "internal: computed {} output(s), the node has {}",
            outputs.len(),
            node.outputs.len()
        ));
    }
    for (a, ty) in outputs.iter().zip(&node.outputs) {
        let want = concrete(ty, batch)?;
        if a.dtype != ty.dtype || a.shape != want {
            return Err(format!(
                "internal: computed {}{:?}, the node is {ty} = {want:?}",
                a.dtype, a.shape
            ));
        }
    }
    Ok(())
}

/// A kernel error naming the node, its op and the shapes of its inputs.
fn kernel_error(graph: &Graph, id: NodeId, inputs: &[&Array], message: &str) -> BackendError {
    let node = graph.node(id);
    let message = if inputs.is_empty() {
        message.to_string()
    } else {
        let types: Vec<String> = inputs
            .iter()
            .map(|a| TensorType::new(a.dtype, Shape::fixed(&a.shape)).to_string())
            .collect();
        format!("{message}; inputs: [{}]", types.join(", "))
    };
    BackendError::Kernel {
        node: node.name.clone(),
        op: node.op.kind_name().to_string(),
        message,
    }
}

/// Evaluates `values` of a verified `graph` without a session: the variables come from
/// `variables` (only those the values read must be present), the inputs from `feeds`. Nothing is
/// assigned. Results are as [`super::ReferenceSession`] returns them for precision `p`.
///
/// Verifies the graph first, so passes can check their output with one call.
pub fn evaluate(
    graph: &Graph,
    variables: &HashMap<VarId, HostTensor>,
    feeds: &[Feed],
    values: &[Value],
    p: Precision,
) -> Result<Vec<HostTensor>, BackendError> {
    verify(graph)?;
    let mut store: Vec<Option<Array>> = vec![None; graph.variables().len()];
    let mut ids: Vec<&VarId> = variables.keys().collect();
    ids.sort();
    for id in ids {
        let def = graph
            .variables()
            .get(id.0 as usize)
            .ok_or(BackendError::UnknownVariable(id.0))?;
        store[id.0 as usize] = Some(accept_variable(def, &variables[id], p)?);
    }
    let outcome = run_step(graph, p, &store, feeds, &Step::fetch(values.to_vec()))?;
    Ok(outcome.fetched)
}
