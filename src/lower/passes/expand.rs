//! Expansion of composite ops into simpler ones the kernel former handles generically.
//!
//! `Moments` becomes the two-pass form `mean = reduce_mean(x)`,
//! `var = reduce_mean((x - mean)²)`: numerically safe, and the squared deviations are never
//! materialised because reductions absorb their elementwise producers.

use super::StepGraph;
use crate::ir::{BinaryOp, NodeId, Op, ReduceOp, Shape, UnaryOp, Value};
use crate::lower::LowerError;

/// Expands every `Moments` node; returns how many were expanded.
pub fn expand(sg: &mut StepGraph) -> Result<usize, LowerError> {
    let targets: Vec<NodeId> = sg
        .graph
        .node_ids()
        .filter(|&id| matches!(sg.graph.node(id).op, Op::Moments { .. }))
        .collect();
    for &id in &targets {
        expand_moments(sg, id)?;
    }
    Ok(targets.len())
}

fn expand_moments(sg: &mut StepGraph, id: NodeId) -> Result<(), LowerError> {
    let node = sg.graph.node(id).clone();
    let Op::Moments { axes, keep_dims } = &node.op else {
        return Ok(());
    };
    let x = sg.graph.inputs(id)[0];
    let g = &mut sg.graph;
    let dev = node.device;
    let base = node.name.clone();
    let add = |g: &mut crate::ir::Graph, suffix: &str, op: Op, ins: &[Value]| {
        let name = g.unique_name(&format!("{base}/{suffix}"));
        g.add_node_on(&name, op, ins, dev).map(Value::first)
    };
    let mean_kept = add(
        g,
        "mean",
        Op::Reduce {
            op: ReduceOp::Mean,
            axes: axes.clone(),
            keep_dims: true,
        },
        &[x],
    )?;
    let dev_x = add(g, "centered", Op::Binary(BinaryOp::Sub), &[x, mean_kept])?;
    let sq = add(g, "squared", Op::Unary(UnaryOp::Square), &[dev_x])?;
    let var = add(
        g,
        "variance",
        Op::Reduce {
            op: ReduceOp::Mean,
            axes: axes.clone(),
            keep_dims: *keep_dims,
        },
        &[sq],
    )?;
    let mean = if *keep_dims {
        mean_kept
    } else {
        let shape = Shape::from_dims(
            g.value_type(mean_kept)
                .shape
                .dims()
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, d)| *d),
        );
        add(g, "mean_squeezed", Op::Reshape { shape }, &[mean_kept])?
    };
    sg.replace(Value::new(id, 0), mean)?;
    sg.replace(Value::new(id, 1), var)?;
    sg.graph.remove_node(id);
    Ok(())
}
