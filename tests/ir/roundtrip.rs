//! Round trips of random graphs: `print(parse(print(g))) == print(g)`, and the parsed graph
//! equals the original node by node (so the printer cannot drop information silently).

use super::random_graph::{KINDS, build};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeSet;
use towerpack::ir::text::{parse, print};
use towerpack::ir::{BinaryOp, Graph, Op, Padding, ReduceOp, UnaryOp, verify};

/// Everything about `g` that the text must carry, node by node in topological order, with
/// nodes named instead of numbered. Floats compare through `{:?}`, so NaNs compare equal; the
/// printed text compares their bits.
fn structure(g: &Graph) -> Vec<String> {
    let mut out: Vec<String> = g.variables().iter().map(|v| format!("{v:?}")).collect();
    for id in g.topo_order().expect("acyclic") {
        let n = g.node(id);
        let inputs: Vec<String> = g.inputs(id).iter().map(|v| g.value_name(*v)).collect();
        let controls: BTreeSet<String> = g
            .control_inputs(id)
            .iter()
            .map(|c| g.node(*c).name.clone())
            .collect();
        out.push(format!(
            "{} {:?} {:?} {:?} {inputs:?} {controls:?}",
            n.name, n.op, n.outputs, n.device
        ));
    }
    for (name, members) in g.collections() {
        let members: Vec<String> = members.iter().map(|v| g.value_name(*v)).collect();
        out.push(format!("{name:?} {members:?}"));
    }
    out
}

fn check_round_trip(g: &Graph) -> Result<(), TestCaseError> {
    verify(g).map_err(|e| TestCaseError::fail(format!("generator made an invalid graph: {e}")))?;
    let text = print(g);
    let parsed = parse(&text, "random.tp")
        .map_err(|e| TestCaseError::fail(format!("{e}\n--- text ---\n{text}")))?;
    prop_assert_eq!(print(&parsed), text.clone());
    prop_assert_eq!(structure(&parsed), structure(g), "text:\n{}", text);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn print_parse_print_is_a_fixed_point(
        steps in prop::collection::vec((0..KINDS, any::<u64>()), 1..40)
    ) {
        check_round_trip(&build(&steps))?;
    }
}

/// Every op kind name the IR has.
fn all_kind_names() -> BTreeSet<&'static str> {
    let mut names: BTreeSet<&'static str> = [
        "input",
        "constant",
        "variable",
        "assign",
        "group",
        "identity",
        "select",
        "cast",
        "reshape",
        "transpose",
        "broadcast",
        "slice",
        "concat",
        "pad",
        "argmax",
        "moments",
        "matmul",
        "conv2d",
        "conv2d_backprop_input",
        "conv2d_backprop_filter",
        "max_pool",
        "avg_pool",
        "max_pool_grad",
        "avg_pool_grad",
        "softmax",
        "log_softmax",
        "sparse_softmax_cross_entropy",
        "one_hot",
        "in_top_k",
        "random_uniform",
        "all_reduce",
    ]
    .into();
    names.extend(UnaryOp::ALL.map(UnaryOp::name));
    names.extend(BinaryOp::ALL.map(BinaryOp::name));
    names.extend(ReduceOp::ALL.map(ReduceOp::name));
    names
}

#[test]
fn the_generator_reaches_every_op_kind_and_feature() {
    let mut rng = ChaCha8Rng::seed_from_u64(20);
    let mut seen = BTreeSet::new();
    let (mut devices, mut controls, mut port1, mut explicit, mut shared) = (0, 0, 0, 0, 0);
    let mut collections = BTreeSet::new();
    for _ in 0..300 {
        let steps: Vec<(u8, u64)> = (0..30)
            .map(|_| (rng.random_range(0..KINDS), rng.random()))
            .collect();
        let g = build(&steps);
        for id in g.node_ids() {
            let n = g.node(id);
            seen.insert(n.op.kind_name());
            devices += usize::from(n.device.is_some());
            controls += g.control_inputs(id).len();
            port1 += g.inputs(id).iter().filter(|v| v.port == 1).count();
            let pad = match &n.op {
                Op::Conv2d(a) => a.padding,
                Op::Pool(a) => a.padding,
                _ => Padding::Same,
            };
            explicit += usize::from(matches!(pad, Padding::Explicit(_)));
        }
        let reads: Vec<_> = g
            .node_ids()
            .filter_map(|id| g.node(id).op.variable())
            .collect();
        shared += reads.len() - reads.iter().collect::<BTreeSet<_>>().len();
        collections.extend(g.collections().keys().cloned());
    }
    let missing: Vec<_> = all_kind_names().difference(&seen).copied().collect();
    assert!(missing.is_empty(), "never generated: {missing:?}");
    for (what, count) in [
        ("devices", devices),
        ("control edges", controls),
        ("port-1 inputs", port1),
        ("explicit paddings", explicit),
        ("shared variables", shared),
    ] {
        assert!(count > 10, "only {count} {what}");
    }
    assert!(collections.len() >= 5, "{collections:?}");
}

#[test]
fn parsing_rebuilds_an_equal_graph_for_many_seeds() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for _ in 0..100 {
        let steps: Vec<(u8, u64)> = (0..60)
            .map(|_| (rng.random_range(0..KINDS), rng.random()))
            .collect();
        check_round_trip(&build(&steps)).expect("round trip");
    }
}
