//! Replication of one tower function: shared and replicated variable strategies, the single
//! tower, inference towers (reusing, creating no trainables), collection freezing, BatchNorm EMA
//! updates only in the main tower, and adding an inference tower to a finished graph.

use std::cell::Cell;
use towerpack::dsl::prelude::*;
use towerpack::ir::{Graph, Op, VarId};
use towerpack::tower::{MOVING_SUMMARY, SUMMARIES, TowerError, UPDATE_OPS, VarCollection};

fn sig() -> Vec<InputSpec> {
    vec![
        InputSpec::new("x", DType::F32, Shape::batched(&[6])),
        InputSpec::new("label", DType::I32, Shape::batched(&[])),
    ]
}

/// fc (+BN) -> linear, with a summary, a moving summary and regularization.
fn tower(inputs: &[Tensor]) -> Tensor {
    let h = FullyConnected("fc", &inputs[0]).units(5).build();
    let h = BNReLU("bn", h).build();
    let logits = FullyConnected("linear", h).units(3).build();
    add_tensor_summary(&logits);
    let loss = sparse_softmax_cross_entropy(&logits, &inputs[1]).named("loss");
    add_moving_summary(&loss);
    (loss + regularize_cost(".*/W", 1e-3)).named("cost")
}

fn var_names(g: &Graph, ids: &[VarId]) -> Vec<String> {
    ids.iter().map(|&id| g.variable(id).name.clone()).collect()
}

fn all_vars(g: &Graph) -> Vec<String> {
    g.variables().iter().map(|v| v.name.clone()).collect()
}

const SINGLE_VARS: [&str; 8] = [
    "fc/W",
    "fc/b",
    "bn/bn/beta",
    "bn/bn/gamma",
    "bn/bn/mean/EMA",
    "bn/bn/variance/EMA",
    "linear/W",
    "linear/b",
];

#[test]
fn single_tower_has_no_prefix_and_device_zero() {
    let r = replicate(&sig(), &Replication::single(), tower).expect("build");
    assert_eq!(all_vars(&r.graph), SINGLE_VARS);
    let h = &r.training[0];
    assert_eq!((h.ns_name.as_str(), h.vs_name.as_str()), ("", ""));
    let x = h.input("x").expect("input x");
    assert_eq!(r.graph.node(x).name, "x");
    assert_eq!(r.graph.node(x).device, Some(0));
    assert_eq!(h.get_tensor(&r.graph, "cost"), h.cost);
    assert_eq!(
        h.get_tensor(&r.graph, "fc/output"),
        r.graph.find_value("fc/output")
    );
}

#[test]
fn shared_towers_share_one_set_of_variables() {
    let calls = Cell::new(0);
    let plan = Replication::new(2, Strategy::Shared).with_inference(INFERENCE_TOWER);
    let r = replicate(&sig(), &plan, |x: &[Tensor]| {
        calls.set(calls.get() + 1);
        tower(x)
    })
    .expect("build");
    let g = &r.graph;
    assert_eq!(calls.get(), 3, "called once per tower");
    assert_eq!(all_vars(g), SINGLE_VARS);

    // Each tower has its own inputs and reads the same variable on its own device.
    let w = g.find_variable("fc/W").expect("fc/W");
    for (h, ns, device) in [
        (&r.training[0], "tower0", Some(0)),
        (&r.training[1], "tower1", Some(1)),
        (&r.inference[0], "InferenceTower", None),
    ] {
        let x = h.input("x").expect("x");
        assert_eq!(g.node(x).name, format!("{ns}/x"));
        let read = h.get_tensor(g, "fc/W").expect("read of fc/W");
        assert_eq!(g.node(read.node).op, Op::Variable { var: w });
        let conv = g.find(&format!("{ns}/fc/MatMul")).expect("matmul");
        assert_eq!(g.node(conv).device, device, "{ns}");
    }
    // tower0 owns the variables; tower1 and the inference tower own none.
    let trainables = VarCollection::Trainable.variables(g);
    assert_eq!(r.training[0].own_trainable_variables(g), trainables);
    assert!(r.training[1].created_variables.is_empty());
    assert!(r.inference[0].created_variables.is_empty());
    for h in &r.training {
        assert_eq!(h.gradient_variables(g), trainables);
    }
    assert!(r.inference[0].cost.is_none());
}

#[test]
fn replicated_towers_keep_local_copies() {
    let plan = Replication::new(2, Strategy::Replicated).with_inference(INFERENCE_TOWER);
    let r = replicate(&sig(), &plan, tower).expect("build");
    let g = &r.graph;
    let mut expected: Vec<String> = SINGLE_VARS.iter().map(|s| s.to_string()).collect();
    expected.extend(SINGLE_VARS.iter().map(|s| format!("tower1/{s}")));
    assert_eq!(all_vars(g), expected);
    for def in g.variables() {
        let replica = def.name.starts_with("tower1/");
        assert_eq!(def.flags.local, replica, "{}", def.name);
        if replica {
            assert!(!def.flags.model, "{} is a local copy", def.name);
        }
        if def.name.ends_with("/EMA") && !replica {
            assert!(def.flags.model && !def.flags.trainable, "{}", def.name);
        }
    }
    let own1 = var_names(g, &r.training[1].gradient_variables(g));
    assert_eq!(own1.len(), 6);
    assert!(own1.iter().all(|n| n.starts_with("tower1/")), "{own1:?}");
    // The inference tower reuses tower0's variables (vs "").
    let read = r.inference[0].get_tensor(g, "fc/W").expect("read");
    let Op::Variable { var } = g.node(read.node).op else {
        panic!("not a variable read");
    };
    assert_eq!(g.variable(var).name, "fc/W");
    // In replicated mode regularization covers only the tower's own weights.
    let internals: Vec<String> = g
        .node_ids()
        .map(|id| g.node(id).name.clone())
        .filter(|n| n.starts_with("tower1/regularize_cost_internals/") && n.contains("Square"))
        .collect();
    assert_eq!(internals.len(), 2, "{internals:?}");
}

#[test]
fn only_the_main_training_tower_keeps_summaries_and_update_ops() {
    let plan = Replication::new(2, Strategy::Shared).with_inference(INFERENCE_TOWER);
    let r = replicate(&sig(), &plan, tower).expect("build");
    let g = &r.graph;
    for key in [SUMMARIES, MOVING_SUMMARY, UPDATE_OPS] {
        let members = g.collection(key);
        assert!(!members.is_empty(), "{key}");
        for v in members {
            assert!(
                g.node(v.node).name.starts_with("tower0/"),
                "{key}: {}",
                g.node(v.node).name
            );
        }
        assert_eq!(r.training[0].collection(key), members, "{key}");
        assert!(r.training[1].collection(key).is_empty(), "{key}");
        assert!(r.inference[0].collection(key).is_empty(), "{key}");
    }
    // BN: two EMA assigns, in tower0 only; the inference tower normalizes with the EMAs.
    let assigns: Vec<&str> = g
        .node_ids()
        .filter(|&id| matches!(g.node(id).op, Op::Assign { .. }))
        .map(|id| g.node(id).name.as_str())
        .collect();
    assert_eq!(
        assigns,
        [
            "tower0/bn/bn/AssignMovingAvg",
            "tower0/bn/bn/AssignMovingAvg_1"
        ]
    );
    assert!(g.find("tower1/bn/bn/moments").is_some());
    assert!(g.find("InferenceTower/bn/bn/moments").is_none());
}

#[test]
fn an_inference_tower_can_be_added_to_a_finished_graph() {
    let b = Builder::with_seed(3);
    let trained = build_training_towers(&b, &sig(), 2, Strategy::Shared, &tower).expect("train");
    let graph = b.finish().expect("finish");
    let before = graph.variables().len();
    let nodes = graph.node_count();

    let b = Builder::from_graph(graph, 3);
    let h = build_inference_tower(&b, &sig(), "tower-pred-0", "", &tower).expect("predict");
    let g = b.finish().expect("finish again");
    assert_eq!(g.variables().len(), before, "no new variables");
    assert!(g.node_count() > nodes);
    assert!(h.get_tensor(&g, "cost").is_some());
    assert_eq!(trained[0].get_tensor(&g, "cost"), trained[0].cost);

    // A tower function that creates a trainable variable fails in the late tower.
    let b = Builder::from_graph(g, 3);
    let err = build_inference_tower(&b, &sig(), "tower-pred-1", "", &|x: &[Tensor]| {
        let w = x[0].builder().new_variable("W", &VarSpec::new(&[6, 1]));
        x[0].matmul(&w).sum()
    })
    .expect_err("trainable in an inference tower");
    assert!(matches!(
        err.tower_error(),
        Some(TowerError::NewTrainableInReuseTower { .. })
    ));
}

#[test]
fn costs_and_signatures_are_checked() {
    let err = replicate(&sig(), &Replication::single(), |x: &[Tensor]| x[0].clone())
        .expect_err("a batch is not a cost");
    assert_eq!(
        err,
        DslError::CostNotScalar {
            tower: "<root>".into(),
            ty: "f32[N,6]".into()
        }
    );
    for bad in [
        vec![
            InputSpec::new("x", DType::F32, Shape::batched(&[1])),
            InputSpec::new("x", DType::F32, Shape::batched(&[1])),
        ],
        vec![InputSpec::new("a:b", DType::F32, Shape::batched(&[1]))],
        vec![InputSpec::new("", DType::F32, Shape::batched(&[1]))],
    ] {
        let r = replicate(&bad, &Replication::single(), |x: &[Tensor]| x[0].sum());
        assert!(matches!(r, Err(DslError::Signature { .. })), "{bad:?}");
    }
    let r = replicate(&sig(), &Replication::new(2, Strategy::Single), tower);
    assert!(matches!(r, Err(DslError::Signature { .. })));
}
