//! The graph walk of an export: which IR nodes the outputs need (refusing an op with no ONNX
//! form before anything is written), the graph's inputs and outputs, and each needed node, in
//! topological order, handed to [`super::ops`] through one [`Emitter`].

use std::collections::{BTreeMap, HashSet};

use super::emit::Emitter;
use super::error::{OnnxError, unsupported};
use super::layout::Layout;
use super::ops::{emit_node, refusal};
use super::proto::{self, pb};
use crate::ir::{Graph, NodeId, Op, Value};
use crate::tensor::HostTensor;

/// The nodes `outputs` depend on through data edges, and for each needed `Input` node the first
/// output that needs it.
fn data_ancestors(graph: &Graph, outputs: &[Value]) -> (HashSet<NodeId>, Vec<(NodeId, Value)>) {
    let mut needed = HashSet::new();
    let mut inputs = Vec::new();
    for &out in outputs {
        let mut stack = vec![out.node];
        while let Some(id) = stack.pop() {
            if !needed.insert(id) {
                continue;
            }
            if matches!(graph.node(id).op, Op::Input { .. }) {
                inputs.push((id, out));
            }
            stack.extend(graph.inputs(id).iter().map(|v| v.node));
        }
    }
    (needed, inputs)
}

/// Exports the part of `graph` that computes `outputs` from the `Input` nodes `inputs`, with
/// variables read from `variables` (by variable name), as an ONNX graph named `name`.
pub(super) fn export_graph(
    graph: &Graph,
    inputs: &[NodeId],
    outputs: &[Value],
    variables: &BTreeMap<String, HostTensor>,
    name: &str,
) -> Result<pb::GraphProto, OnnxError> {
    if outputs.is_empty() {
        return Err(OnnxError::NoOutputs);
    }
    for &out in outputs {
        if graph.node(out.node).op.is_source() {
            return Err(OnnxError::SourceOutput(graph.value_name(out)));
        }
    }
    let (needed, reached_inputs) = data_ancestors(graph, outputs);
    for (input, output) in reached_inputs {
        if !inputs.contains(&input) {
            return Err(OnnxError::MissingInput {
                output: graph.value_name(output),
                input: graph.node(input).name.clone(),
            });
        }
    }
    let order: Vec<NodeId> = graph
        .topo_order()?
        .into_iter()
        .filter(|id| needed.contains(id))
        .collect();
    // Refuse an unmappable op before anything else (e.g. before asking for variable values).
    for &id in &order {
        if let Some(reason) = refusal(graph, id) {
            return Err(unsupported(graph, id, reason));
        }
    }

    let mut e = Emitter::new(graph, variables);
    e.reserve_names(order.iter().chain(inputs))?;

    let mut graph_inputs = Vec::with_capacity(inputs.len());
    for &id in inputs {
        let node = graph.node(id);
        let Op::Input { ty, .. } = &node.op else {
            return Err(OnnxError::UnknownTensor {
                name: node.name.clone(),
                what: "an input",
            });
        };
        let v = Value::first(id);
        let name = e.define(v, Layout::plain(ty.rank()));
        graph_inputs.push(proto::value_info(&name, ty));
    }
    for &id in &order {
        match &graph.node(id).op {
            Op::Input { .. } => {}
            Op::Constant { value } => e.constant(id, value),
            Op::Variable { var } => e.variable(id, *var)?,
            _ => emit_node(&mut e, id)?,
        }
    }
    let mut graph_outputs = Vec::with_capacity(outputs.len());
    let mut seen = HashSet::new();
    for &out in outputs {
        let name = e.plain(out)?;
        if !seen.insert(name.clone()) {
            return Err(OnnxError::NameClash(name));
        }
        graph_outputs.push(proto::value_info(&name, graph.value_type(out)));
    }
    let (node, initializer) = e.finish();
    Ok(pb::GraphProto {
        name: Some(name.to_string()),
        node,
        initializer,
        input: graph_inputs,
        output: graph_outputs,
        ..Default::default()
    })
}
