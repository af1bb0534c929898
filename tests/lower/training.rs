//! Lowering of real training steps: the MLP and CIFAR ResNet models with gradients and a
//! Momentum optimizer. Compiled steps must match the reference executor over several steps,
//! and fused updates must cover every trainable variable in one kernel per bucket.

use crate::model_steps;

use model_steps::{TrainGraph, feeds, mlp, training_graph};
use towerpack::backend::Session;
use towerpack::backend::cpu::{CpuOptions, CpuSession};
use towerpack::backend::reference::ReferenceSession;
use towerpack::lower::{KernelKind, LowerOptions, Storage, lower};
use towerpack::models::CifarResNet;
use towerpack::tensor::HostTensor;

fn assert_close(what: &str, got: &HostTensor, want: &HostTensor, tol: f64) {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = w.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-3);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= tol * scale,
            "{what}[{i}]: {a} vs reference {b} (scale {scale})"
        );
    }
}

fn compare_steps(tg: TrainGraph, batch: usize, steps: u64, tol: f64) {
    let mut reference = ReferenceSession::new(tg.graph.clone()).expect("reference");
    let mut cpu = CpuSession::new(tg.graph.clone(), CpuOptions::default()).expect("cpu");
    reference.initialize_variables(3).expect("init");
    cpu.initialize_variables(3).expect("init");
    for s in 0..steps {
        let f = feeds(&tg, batch, s);
        let want = reference.run(&tg.step, &f).expect("reference step");
        let got = cpu.run(&tg.step, &f).expect("cpu step");
        assert_close(&format!("step {s} cost"), &got[0], &want[0], tol);
    }
    for (id, def) in tg.graph.variable_ids() {
        let (g, w) = (
            cpu.read_variable(id).expect("cpu"),
            reference.read_variable(id).expect("ref"),
        );
        assert_close(&def.name, &g, &w, tol);
    }
}

#[test]
fn mlp_training_steps_match_the_reference() {
    compare_steps(mlp(), 16, 3, 1e-4);
}

#[test]
fn resnet8_training_steps_match_the_reference() {
    let m = CifarResNet::new(1);
    compare_steps(training_graph(m.inputs(), |x| m.build(x)), 4, 2, 2e-3);
}

#[test]
fn every_trainable_variable_is_updated_by_one_fused_kernel() {
    let tg = mlp();
    let p = lower(&tg.graph, &tg.step, 32, &LowerOptions::default()).expect("lower");
    let updates: Vec<_> = p
        .kernels
        .iter()
        .filter(|k| {
            k.outputs
                .iter()
                .any(|b| matches!(p.buffer(*b).storage, Storage::State { .. }))
        })
        .collect();
    let trainables = tg
        .graph
        .variables()
        .iter()
        .filter(|v| v.flags.trainable)
        .count();
    assert!(trainables >= 6);
    let fused = updates
        .iter()
        .find(|k| p.buffer(k.outputs[0]).name.starts_with("state["))
        .unwrap_or_else(|| panic!("no fused update kernel:\n{p}"));
    let KernelKind::Elementwise { shape, .. } = &fused.kind else {
        panic!("not elementwise")
    };
    let params: usize = tg
        .graph
        .variables()
        .iter()
        .filter(|v| v.flags.trainable)
        .map(|v| v.ty.shape.num_elements().unwrap_or(0))
        .sum();
    assert_eq!(
        shape,
        &vec![params],
        "one kernel over every trainable parameter:\n{p}"
    );
    assert!(
        fused
            .inputs
            .iter()
            .any(|v| p.buffer(v.buffer).name.starts_with("arena[")),
        "{p}"
    );
    // With 24 KiB buckets the same update is cut in two: fc0/W+fc0/b (16.25 KiB), then the rest.
    let small = LowerOptions {
        bucket_bytes: 24 << 10,
        ..LowerOptions::default()
    };
    let p2 = lower(&tg.graph, &tg.step, 32, &small).expect("lower");
    let buckets = p2
        .kernels
        .iter()
        .filter(|k| p2.buffer(k.outputs[0]).name.starts_with("state["))
        .count();
    assert_eq!(buckets, 2, "{p2}");
}

#[test]
fn adam_training_steps_match_the_reference() {
    use model_steps::training_graph_with;
    use towerpack::models::{ConvNet, Mlp};
    use towerpack::optim::Optimizer;
    let m = Mlp {
        input_shape: vec![8, 8],
        hidden: vec![64, 32],
        classes: 10,
        weight_decay: 1e-4,
        dropout_rate: 0.0,
    };
    compare_steps(
        training_graph_with(Optimizer::adam(1e-3), m.inputs(), |x| m.build(x)),
        16,
        4,
        1e-4,
    );
    let c = ConvNet {
        image_shape: [12, 12, 1],
        channels: [4, 8],
        hidden: 16,
        ..ConvNet::default()
    };
    compare_steps(
        training_graph_with(Optimizer::adam(1e-3), c.inputs(), |x| c.build(x)),
        8,
        4,
        1e-3,
    );
}
