//! The canonical printer: a header comment, the variables in declaration order, the nodes in
//! [`Graph::topo_order`], and the collections sorted by name. The output depends only on the
//! graph's content, so it is stable under a parse/print round trip.

use super::literal::{fmt_string, fmt_type};
use super::ops::{fmt_initializer, op_attrs};
use crate::ir::{Graph, NodeId, Op};
use std::collections::HashMap;
use std::fmt::Write as _;

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Prints `graph` in its canonical textual form.
pub(crate) fn print_graph(graph: &Graph) -> String {
    let collections: Vec<_> = graph
        .collections()
        .iter()
        .filter(|(_, members)| !members.is_empty())
        .collect();
    let mut out = format!(
        "# towerpack IR: {}, {}, {}\n",
        plural(graph.variables().len(), "variable", "variables"),
        plural(graph.node_count(), "node", "nodes"),
        plural(collections.len(), "collection", "collections"),
    );
    let (order, cycle) = match graph.topo_order() {
        Ok(order) => (order, None),
        Err(e) => (graph.node_ids().collect(), Some(e)),
    };
    if let Some(e) = cycle {
        // Not a valid graph: printed in insertion order, and it will not parse back.
        let _ = writeln!(out, "# error: {e}");
    }
    if !graph.variables().is_empty() {
        out.push('\n');
    }
    for def in graph.variables() {
        let _ = write!(out, "var @{} : {}", def.name, fmt_type(&def.ty));
        for (set, flag) in [
            (def.flags.trainable, "trainable"),
            (def.flags.model, "model"),
            (def.flags.local, "local"),
        ] {
            if set {
                let _ = write!(out, " {flag}");
            }
        }
        let _ = writeln!(out, " = {}", fmt_initializer(&def.init));
    }
    if !order.is_empty() {
        out.push('\n');
    }
    let position: HashMap<NodeId, usize> =
        order.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    for &id in &order {
        print_node(graph, id, &position, &mut out);
    }
    if !collections.is_empty() {
        out.push('\n');
    }
    for (name, members) in collections {
        let members: Vec<String> = members
            .iter()
            .map(|v| match graph.try_node(v.node) {
                Some(_) => format!("%{}", graph.value_name(*v)),
                // `add_to_collection` takes any value; a dangling one cannot parse back.
                None => format!("%<unknown node #{}>", v.node.index()),
            })
            .collect();
        let _ = writeln!(
            out,
            "collection {} = [{}]",
            fmt_string(name),
            members.join(", ")
        );
    }
    out
}

fn print_node(graph: &Graph, id: NodeId, position: &HashMap<NodeId, usize>, out: &mut String) {
    let node = graph.node(id);
    let mut operands: Vec<String> = Vec::new();
    if let Op::Variable { var } | Op::Assign { var } = node.op {
        let name = graph.variables().get(var.0 as usize).map_or_else(
            || format!("<unknown variable #{}>", var.0),
            |d| d.name.clone(),
        );
        operands.push(format!("@{name}"));
    }
    operands.extend(
        graph
            .inputs(id)
            .iter()
            .map(|v| format!("%{}", graph.value_name(*v))),
    );
    // Control inputs in printed order (not by id), so a reparsed graph prints the same.
    let mut controls = graph.control_inputs(id);
    controls.sort_by_key(|c| position.get(c).copied().unwrap_or(usize::MAX));
    operands.extend(
        controls
            .iter()
            .map(|c| format!("^%{}", graph.node(*c).name)),
    );
    let _ = write!(
        out,
        "%{} = {}({})",
        node.name,
        node.op.kind_name(),
        operands.join(", ")
    );
    let attrs = op_attrs(&node.op);
    if !attrs.is_empty() {
        let attrs: Vec<String> = attrs.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = write!(out, " {{{}}}", attrs.join(", "));
    }
    if let Some(d) = node.device {
        let _ = write!(out, " on dev{d}");
    }
    match node.outputs.as_slice() {
        [] => {}
        [t] => {
            let _ = write!(out, " : {}", fmt_type(t));
        }
        many => {
            let types: Vec<String> = many.iter().map(fmt_type).collect();
            let _ = write!(out, " : ({})", types.join(", "));
        }
    }
    out.push('\n');
}
