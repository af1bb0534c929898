//! Shared fixtures of the lowering tests of trainers' graphs: a small MLP (8 → 16 → 4), the
//! training graph a trainer builds for it at per-tower batch [`BATCH`], and random feeds for
//! every tower.
#![allow(dead_code)]

use std::sync::Arc;

use towerpack::backend::{Feed, Step};
use towerpack::dsl::{InputSpec, TowerHandle};
use towerpack::ir::{Graph, NodeId, rng::mix64};
use towerpack::models::Mlp;
use towerpack::tensor::{DType, HostTensor};
use towerpack::train::{DummyConstantInput, GraphSetup, InputSource, ModelDesc, ModelFn};

/// Per-tower batch of the graphs.
pub const BATCH: usize = 4;

/// A training graph: its step (tower 0's cost, the train op), towers and input signature.
pub struct Built {
    pub graph: Graph,
    pub step: Step,
    pub towers: Vec<TowerHandle>,
    pub signature: Vec<InputSpec>,
}

/// An MLP 8 → 16 → 4 with weight decay: fc0 holds 576 bytes of parameters, linear 272.
pub fn mlp() -> Mlp {
    Mlp {
        input_shape: vec![8],
        hidden: vec![16],
        classes: 4,
        weight_decay: 1e-4,
        dropout_rate: 0.0,
    }
}

/// The graph `setup_graph` builds for `model`; it returns the towers and the train op.
pub fn build(
    model: ModelFn,
    setup_graph: impl FnOnce(&mut GraphSetup<'_>) -> (Vec<TowerHandle>, NodeId),
) -> Built {
    let signature = model.inputs();
    let mut graph = Graph::new();
    let mut input = DummyConstantInput::new(vec![vec![BATCH, 8], vec![BATCH]]);
    input.setup(&signature).expect("input");
    let mut setup = GraphSetup {
        graph: &mut graph,
        seed: 1,
        input: &mut input,
        model: Some(Arc::new(model)),
        loss_scale: None,
    };
    let (towers, train_op) = setup_graph(&mut setup);
    let cost = towers[0].cost.expect("cost");
    Built {
        step: Step::new(vec![cost], vec![train_op]),
        towers,
        signature,
        graph,
    }
}

/// Random feeds for every tower's inputs.
pub fn feeds(b: &Built, seed: u64) -> Vec<Feed> {
    let mut state = seed;
    let mut next = move || {
        state = mix64(state.wrapping_add(1));
        state
    };
    let mut out = Vec::new();
    for tower in &b.towers {
        for spec in &b.signature {
            let id = tower.input(&spec.name).expect("input");
            let shape = spec.shape.resolve(BATCH);
            let n: usize = shape.iter().product();
            let values: Vec<f64> = (0..n)
                .map(|_| match spec.dtype {
                    DType::F32 => (next() >> 40) as f64 / 16_777_216.0 - 0.5,
                    _ => (next() % 4) as f64,
                })
                .collect();
            let t = HostTensor::from_f64_values(spec.dtype, &shape, values).expect("feed");
            out.push((id, t));
        }
    }
    out
}
