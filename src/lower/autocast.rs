//! Automatic mixed precision: the `autocast` and `absorb-casts` passes of
//! [`Precision::Bf16`](super::Precision::Bf16) and [`Precision::Fp16`](super::Precision::Fp16).
//!
//! [`insert_casts`] defines the semantics: both f32 operands of every GEMM (matmul and the
//! three convolutions: forward, input gradient, filter gradient) are read through a round trip
//! `cast(cast(x, bf16), f32)`, so the GEMM multiplies 16-bit values and accumulates in f32,
//! while everything else — variables and optimizer slots (the master weights), batch-norm
//! statistics, softmax, loss, elementwise ops and reductions — stays f32. The pass runs after
//! autodiff, on the step's graph: the gradients of the forward GEMMs are GEMMs of their own and
//! get their operands rounded the same way (the incoming gradient `dy` and the saved
//! activation or weight), which is what PyTorch's autocast does to them. The reference executor
//! runs the graph this function returns, so it is the definition every backend is checked
//! against.
//!
//! [`absorb_casts`] then folds each GEMM's pair of round trips into the GEMM kernel
//! ([`MatMulGeom::round_operands`](super::MatMulGeom::round_operands)): the kernel rounds its
//! operands as it loads them, so no cast is ever launched alone and a bf16 program has exactly
//! as many kernels as its fp32 twin. Casts it cannot absorb (an operand that is not a round
//! trip, e.g. one folded into a constant) stay in the graph and run as ordinary elementwise
//! ops, with the same values.

use super::LowerError;
use super::passes::{StepGraph, dce};
use super::precision::HalfFormat;
use crate::ir::{Graph, NodeId, Op, Value};
use crate::tensor::DType;
use std::collections::HashMap;

/// Whether `op` is a GEMM whose first two inputs are its multiplied operands.
pub fn is_gemm(op: &Op) -> bool {
    matches!(
        op,
        Op::MatMul { .. }
            | Op::Conv2d(..)
            | Op::Conv2dBackpropInput { .. }
            | Op::Conv2dBackpropFilter { .. }
    )
}

/// Reads both f32 operands of every GEMM of `graph` through `cast(cast(x, format), f32)`;
/// returns how many GEMMs were rewritten. GEMMs of other dtypes, and GEMMs already reading
/// round trips to `format`, are left alone. One round trip per value and device is shared by
/// all the GEMMs reading it (a weight read by its forward convolution and its input gradient
/// is rounded once). The casts are named after the value they round (`conv1/W/autocast` and
/// `conv1/W/autocast/f32`) and placed on the device of the GEMM reading them.
pub fn insert_casts(graph: &mut Graph, format: HalfFormat) -> Result<usize, LowerError> {
    let gemms: Vec<NodeId> = graph
        .node_ids()
        .filter(|&id| is_gemm(&graph.node(id).op))
        .collect();
    let mut rounded: HashMap<(Value, Option<u16>), Value> = HashMap::new();
    let mut count = 0;
    for id in gemms {
        let ins = graph.inputs(id);
        let operands = [ins[0], ins[1]];
        if operands
            .iter()
            .any(|&v| graph.value_type(v).dtype != DType::F32)
            || operands
                .iter()
                .all(|&v| round_trip(graph, v) == Some(format))
        {
            continue;
        }
        let device = graph.node(id).device;
        for (slot, v) in (0u16..).zip(operands) {
            let r = match rounded.get(&(v, device)) {
                Some(&r) => r,
                None => {
                    let r = add_round_trip(graph, v, format, device)?;
                    rounded.insert((v, device), r);
                    r
                }
            };
            graph.replace_input(id, slot, r)?;
        }
        count += 1;
    }
    Ok(count)
}

/// Adds `cast(cast(v, format), f32)` on `device`; returns its value.
pub(crate) fn add_round_trip(
    graph: &mut Graph,
    v: Value,
    format: HalfFormat,
    device: Option<u16>,
) -> Result<Value, LowerError> {
    let source = graph.node(v.node).name.clone();
    let base = if v.port == 0 {
        format!("{source}/autocast")
    } else {
        format!("{source}/{}/autocast", v.port)
    };
    let narrow_name = graph.unique_name(&base);
    let narrow = graph.add_node_on(&narrow_name, Op::Cast { to: format.dtype() }, &[v], device)?;
    let wide_name = graph.unique_name(&format!("{narrow_name}/f32"));
    let wide = graph.add_node_on(
        &wide_name,
        Op::Cast { to: DType::F32 },
        &[Value::first(narrow)],
        device,
    )?;
    Ok(Value::first(wide))
}

/// The format `v` was rounded to, when `v` is `cast(cast(x, bf16|f16), f32)` of an f32 `x`.
fn round_trip(graph: &Graph, v: Value) -> Option<HalfFormat> {
    round_trip_source(graph, v).map(|(_, f)| f)
}

/// `(x, format)` when `v` is `cast(cast(x, format), f32)` of an f32 `x`.
fn round_trip_source(graph: &Graph, v: Value) -> Option<(Value, HalfFormat)> {
    let Op::Cast { to: DType::F32 } = graph.node(v.node).op else {
        return None;
    };
    let narrow = graph.inputs(v.node)[0];
    let format = match graph.node(narrow.node).op {
        Op::Cast { to: DType::BF16 } => HalfFormat::Bf16,
        Op::Cast { to: DType::F16 } => HalfFormat::F16,
        _ => return None,
    };
    let x = graph.inputs(narrow.node)[0];
    (graph.value_type(x).dtype == DType::F32).then_some((x, format))
}

/// Makes every GEMM of `sg` whose two operands are round trips to one format read the
/// unrounded values instead, recording the format in [`StepGraph::round_operands`] for the
/// kernel to apply; then removes the casts nothing reads any more. Returns how many GEMMs
/// absorbed their casts.
pub fn absorb_casts(sg: &mut StepGraph) -> Result<usize, LowerError> {
    let gemms: Vec<NodeId> = sg
        .graph
        .node_ids()
        .filter(|&id| is_gemm(&sg.graph.node(id).op))
        .collect();
    let mut count = 0;
    for id in gemms {
        let ins = sg.graph.inputs(id);
        let (Some((a, fa)), Some((b, fb))) = (
            round_trip_source(&sg.graph, ins[0]),
            round_trip_source(&sg.graph, ins[1]),
        ) else {
            continue;
        };
        if fa != fb {
            continue;
        }
        sg.graph.replace_input(id, 0, a)?;
        sg.graph.replace_input(id, 1, b)?;
        sg.round_operands.insert(id, fa);
        count += 1;
    }
    dce(sg)?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, Conv2dAttrs, Shape, Step, TensorType};
    use crate::lower::passes::extract;
    use crate::lower::tests::structure::{node, var};

    /// `conv(x, W) + conv2(x, W)`: one input and one weight, each read by two GEMMs.
    fn graph() -> (Graph, Value) {
        let mut g = Graph::new();
        let x = node(
            &mut g,
            "x",
            Op::Input {
                name: "x".into(),
                ty: TensorType::f32(Shape::fixed(&[2, 4, 4, 3])),
            },
            &[],
        );
        let (_, wr) = var(&mut g, "W", &[3, 3, 3, 8]);
        let attrs = Conv2dAttrs::default();
        let y = node(&mut g, "conv", Op::Conv2d(attrs), &[x, wr]);
        let y2 = node(&mut g, "conv2", Op::Conv2d(attrs), &[x, wr]);
        let s = node(&mut g, "sum", Op::Binary(BinaryOp::Add), &[y, y2]);
        (g, s)
    }

    #[test]
    fn operands_are_rounded_once_per_value_and_absorbed_by_the_kernels() {
        let (mut g, s) = graph();
        assert_eq!(insert_casts(&mut g, HalfFormat::Bf16).expect("casts"), 2);
        // Idempotent: the GEMMs already read round trips.
        assert_eq!(insert_casts(&mut g, HalfFormat::Bf16).expect("again"), 0);
        let casts: Vec<String> = g
            .node_ids()
            .filter(|&id| matches!(g.node(id).op, Op::Cast { .. }))
            .map(|id| g.node(id).name.clone())
            .collect();
        assert_eq!(
            casts,
            [
                "x/autocast",
                "x/autocast/f32",
                "W/read/autocast",
                "W/read/autocast/f32"
            ]
        );
        crate::ir::verify(&g).expect("verifies");
        let step = Step {
            fetches: vec![s],
            targets: vec![],
        };
        let mut sg = extract(&g, &step).expect("extract");
        assert_eq!(absorb_casts(&mut sg).expect("absorb"), 2);
        assert!(
            sg.graph
                .node_ids()
                .all(|id| !matches!(sg.graph.node(id).op, Op::Cast { .. })),
            "every cast was absorbed and removed"
        );
        let conv = sg.graph.find("conv").expect("conv");
        assert_eq!(sg.round_operands.get(&conv), Some(&HalfFormat::Bf16));
        assert_eq!(
            sg.graph.inputs(conv).as_slice(),
            [
                sg.graph.find_value("x").expect("x"),
                sg.graph.find_value("W/read").expect("W")
            ]
        );
    }

    #[test]
    fn a_gemm_with_one_unrounded_operand_keeps_its_casts() {
        let (mut g, s) = graph();
        insert_casts(&mut g, HalfFormat::F16).expect("casts");
        let conv = g.find("conv").expect("conv");
        let x = g.find_value("x").expect("x");
        g.replace_input(conv, 0, x).expect("unround x");
        let step = Step {
            fetches: vec![s],
            targets: vec![],
        };
        let mut sg = extract(&g, &step).expect("extract");
        assert_eq!(absorb_casts(&mut sg).expect("absorb"), 1);
        let conv = sg.graph.find("conv").expect("conv");
        assert_eq!(sg.round_operands.get(&conv), None);
        assert!(
            sg.graph.find("W/read/autocast").is_some(),
            "still read by conv"
        );
    }
}
