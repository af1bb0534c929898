//! The example training steps shared by the lowering and CUDA backend tests: one tower of an
//! MLP, ResNet-20 or a small convnet with its gradients and a Momentum update (and the model's
//! update ops), and random feeds for it.
#![allow(dead_code)]

use towerpack::autodiff::gradients;
use towerpack::backend::{Feed, Step};
use towerpack::dsl::{InputSpec, Replication, replicate};
use towerpack::ir::{Graph, NodeId};
use towerpack::models::{CifarResNet, ConvNet, Mlp};
use towerpack::optim::Optimizer;
use towerpack::tensor::{DType, HostTensor};

/// A training graph and its step.
pub struct TrainGraph {
    pub graph: Graph,
    pub step: Step,
    pub inputs: Vec<(String, NodeId)>,
    pub signature: Vec<InputSpec>,
}

/// One tower, its gradients and a Momentum update (and the model's update ops).
pub fn training_graph(
    signature: Vec<InputSpec>,
    tower: impl Fn(&[towerpack::dsl::Tensor]) -> towerpack::dsl::Tensor,
) -> TrainGraph {
    training_graph_with(Optimizer::momentum(0.05, 0.9), signature, tower)
}

/// One tower, its gradients and `optimizer`'s update (and the model's update ops).
pub fn training_graph_with(
    optimizer: Optimizer,
    signature: Vec<InputSpec>,
    tower: impl Fn(&[towerpack::dsl::Tensor]) -> towerpack::dsl::Tensor,
) -> TrainGraph {
    let r = replicate(&signature, &Replication::single(), tower).expect("replicate");
    let mut graph = r.graph;
    let t = &r.training[0];
    let cost = t.cost.expect("training tower has a cost");
    let vars = t.gradient_variables(&graph);
    let grads = gradients(&mut graph, cost, &vars, "gradients").expect("gradients");
    let op = optimizer
        .apply_gradients(&mut graph, &grads.grads, "train_op")
        .expect("optimizer");
    let mut targets = vec![op.train_op];
    targets.extend(
        t.collection(towerpack::tower::UPDATE_OPS)
            .iter()
            .map(|v| v.node),
    );
    TrainGraph {
        step: Step::new(vec![cost], targets),
        inputs: t.inputs.clone(),
        signature,
        graph,
    }
}

/// The MLP example: 8x8 inputs, hidden layers of 64 and 32, 10 classes.
pub fn mlp() -> TrainGraph {
    let m = Mlp {
        input_shape: vec![8, 8],
        hidden: vec![64, 32],
        classes: 10,
        weight_decay: 1e-4,
        dropout_rate: 0.0,
    };
    training_graph(m.inputs(), |x| m.build(x))
}

/// ResNet-20 (CIFAR, 3 blocks per stage).
pub fn resnet20() -> TrainGraph {
    let m = CifarResNet::new(3);
    training_graph(m.inputs(), |x| m.build(x))
}

/// A small convnet (max pooling, dropout) whose step also fetches `train_error` (in_top_k):
/// it covers the kernels the MLP and ResNet-20 do not use.
pub fn convnet() -> TrainGraph {
    let m = ConvNet {
        image_shape: [12, 12, 1],
        channels: [4, 8],
        hidden: 16,
        ..ConvNet::default()
    };
    let mut tg = training_graph(m.inputs(), |x| m.build(x));
    let error = tg.graph.find_value("train_error").expect("train_error");
    let mut fetches = tg.step.fetches.clone();
    fetches.push(error);
    tg.step = Step::new(fetches, tg.step.targets.clone());
    tg
}

/// Random feeds for `tg` at `batch` (f32 pixels in [0, 255), integer labels in [0, 10)).
pub fn feeds(tg: &TrainGraph, batch: usize, seed: u64) -> Vec<Feed> {
    let mut rng = seed;
    let mut next = move || {
        rng = towerpack::ir::rng::mix64(rng.wrapping_add(1));
        rng
    };
    tg.signature
        .iter()
        .map(|spec| {
            let id = tg
                .inputs
                .iter()
                .find(|(n, _)| *n == spec.name)
                .expect("input")
                .1;
            let shape = spec.shape.resolve(batch);
            let n: usize = shape.iter().product();
            let t = match spec.dtype {
                DType::F32 => HostTensor::from_f32(
                    &shape,
                    (0..n)
                        .map(|_| (next() >> 40) as f32 / 16_777_216.0 * 255.0)
                        .collect(),
                ),
                _ => HostTensor::from_f64_values(
                    spec.dtype,
                    &shape,
                    (0..n).map(|_| (next() % 10) as f64).collect(),
                ),
            };
            (id, t.expect("sized"))
        })
        .collect()
}
