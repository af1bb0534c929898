//! Data-parallel trainers: with 2 towers at batch B the parameter-server and replicated trainers
//! reach the weights of 1 tower at batch 2B (gradients are averaged, not summed); replicas stay
//! identical; the async trainer applies each tower's gradient as its own update; towers map onto
//! devices, and a device the backend cannot run is a clear error.

use crate::train_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use towerpack::autodiff::gradients;
use towerpack::backend::reference::ReferenceSession;
use towerpack::backend::{Session, Step};
use towerpack::data::DataFlow;
use towerpack::dsl::{Replication, replicate};
use towerpack::ir::init::initial_value;
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::train::*;
use train_common::*;

/// `max |a - b| / max |b|` of every variable is at most `tol`; the same variables on both sides.
fn assert_same_weights(
    what: &str,
    a: &BTreeMap<String, Vec<f64>>,
    b: &BTreeMap<String, Vec<f64>>,
    tol: f64,
) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{what}: the same variables are saved"
    );
    for (name, x) in a {
        let y = &b[name];
        let scale = y.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
        let worst = x.iter().zip(y).fold(0f64, |m, (p, q)| m.max((p - q).abs()));
        assert!(
            worst / scale <= tol,
            "{what}: {name}: relative difference {:.3e} (max |difference| {worst:.3e}, scale \
             {scale:.3e})",
            worst / scale
        );
    }
}

/// An MLP with momentum SGD and weight decay, no batch statistics, no dropout.
fn model() -> ModelFn {
    mlp_model(0.1)
}

/// One tower at batch 64 for 2 epochs of 4 steps.
fn one_tower_double_batch() -> BTreeMap<String, Vec<f64>> {
    let c = bare(config(model(), train_flow(256, 64, 4), None)).max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("one tower");
    assert_eq!(report.counters.global_step, 8);
    global_variable_values(report.session.as_ref())
}

/// `trainer` at batch 32 per tower for 2 epochs of 4 steps.
fn two_towers(trainer: &mut dyn Trainer) -> TrainReport {
    let c = bare(config(model(), train_flow(256, 32, 4), None))
        .steps_per_epoch(4)
        .max_epoch(2);
    let report = launch_train_with_config(c, trainer).expect("two towers");
    assert_eq!(report.counters.global_step, 8);
    report
}

#[test]
fn two_towers_at_batch_b_match_one_tower_at_batch_2b() {
    let reference = one_tower_double_batch();
    let trainers: Vec<(&str, Box<dyn Trainer>)> = vec![
        ("ps on tower 0", Box::new(ParameterServerTrainer::new(2))),
        (
            "ps on the host",
            Box::new(ParameterServerTrainer::new(2).parameter_device(ParameterDevice::Host)),
        ),
        ("replicated", Box::new(ReplicatedTrainer::new(2))),
        (
            "replicated on explicit devices, small buckets",
            Box::new(ReplicatedTrainer::on([Device::Cpu(1), Device::Cpu(0)]).bucket_bytes(4096)),
        ),
        (
            "replicated, both towers on one worker",
            Box::new(SyncMultiGPUTrainerReplicated::on([
                Device::Cpu(0),
                Device::Cpu(0),
            ])),
        ),
    ];
    for (what, mut trainer) in trainers {
        let report = two_towers(trainer.as_mut());
        let got = global_variable_values(report.session.as_ref());
        assert!(
            !got.keys().any(|k| k.starts_with("tower")),
            "{what}: replicas are not global variables"
        );
        assert_same_weights(what, &got, &reference, 1e-5);
    }
}

#[test]
fn the_equivalence_holds_with_adam_and_gradient_processors() {
    // Global-norm clipping needs every gradient before any update (no fused averaging kernel
    // then), and Adam's beta powers are state shared by all variables (and replicas).
    let adam = || {
        let m = model();
        ModelFn::new(m.inputs(), move |x| m.build_graph(x), Optimizer::adam(0.01)).with_processors(
            vec![towerpack::optim::GradientProcessor::global_norm_clip(0.5).expect("clip")],
        )
    };
    let c = bare(config(adam(), train_flow(256, 64, 4), None)).max_epoch(1);
    let one = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("one tower");
    let one = global_variable_values(one.session.as_ref());
    let trainers: Vec<(&str, Box<dyn Trainer>)> = vec![
        ("ps", Box::new(ParameterServerTrainer::new(2))),
        ("replicated", Box::new(ReplicatedTrainer::new(2))),
    ];
    for (what, mut trainer) in trainers {
        let c = bare(config(adam(), train_flow(256, 32, 4), None))
            .steps_per_epoch(4)
            .max_epoch(1);
        let two = launch_train_with_config(c, trainer.as_mut()).expect("two towers");
        assert_same_weights(
            what,
            &global_variable_values(two.session.as_ref()),
            &one,
            1e-5,
        );
    }
}

/// The values of replica 0's variable `name` and of its copy in tower 1.
fn replica_pair(session: &dyn Session, name: &str) -> (HostTensor, HostTensor) {
    let graph = session.graph();
    let read = |n: &str| {
        let id = graph.find_variable(n).unwrap_or_else(|| panic!("{n}"));
        session.read_variable(id).expect("read")
    };
    (read(name), read(&format!("tower1/{name}")))
}

/// Checks, when training starts, that replica 1 holds replica 0's values although each was
/// initialized from its own name.
struct BroadcastWitness {
    checked: Arc<Mutex<Vec<String>>>,
}

impl Callback for BroadcastWitness {
    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        for name in ["fc0/W", "linear/b"] {
            let (main, replica) = (
                ctx.read_variable(name)?,
                ctx.read_variable(&format!("tower1/{name}"))?,
            );
            let def = ctx
                .graph()
                .variable(ctx.find_variable(&format!("tower1/{name}"))?);
            let own_init = initial_value(def, ctx.seed());
            assert_eq!(
                main.to_le_bytes(),
                replica.to_le_bytes(),
                "{name} broadcast"
            );
            if name == "fc0/W" {
                assert_ne!(
                    own_init.to_le_bytes(),
                    replica.to_le_bytes(),
                    "{name} initial"
                );
            }
            self.checked.lock().expect("checked").push(name.to_string());
        }
        Ok(())
    }
}

#[test]
fn replicas_start_from_replica_0_and_stay_identical() {
    let checked = Arc::new(Mutex::new(Vec::new()));
    // No per-epoch broadcast: only the initial one, so identical replicas after 8 steps mean
    // every replica applied the same update.
    let mut trainer = ReplicatedTrainer::new(2).broadcast_every_epoch(false);
    let c = bare(config(model(), train_flow(256, 32, 4), None))
        .callback(BroadcastWitness {
            checked: Arc::clone(&checked),
        })
        .steps_per_epoch(4)
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut trainer).expect("train");
    assert_eq!(checked.lock().expect("checked").len(), 2);
    let session = report.session.as_ref();
    let graph = session.graph();
    let mut compared = 0;
    for (_, def) in graph.variable_ids() {
        let Some(main) = def.name.strip_prefix("tower1/") else {
            continue;
        };
        let (a, b) = replica_pair(session, main);
        assert!(a.to_le_bytes() == b.to_le_bytes(), "{main} after 8 steps");
        assert!(def.flags.local, "{} is a local variable", def.name);
        compared += 1;
    }
    assert_eq!(compared, 8, "4 weights and their 4 momentum slots");
    let (w0, _) = replica_pair(session, "fc0/W");
    let initial = initial_value(graph.variable(graph.find_variable("fc0/W").expect("W")), 7);
    assert_ne!(
        w0.to_le_bytes(),
        initial.to_le_bytes(),
        "training moved the weights"
    );
}

#[test]
fn only_the_main_tower_emits_summaries_and_moving_averages() {
    let report = two_towers(&mut ReplicatedTrainer::new(2));
    let graph = report.session.graph();
    for collection in [
        towerpack::tower::UPDATE_OPS,
        towerpack::tower::SUMMARIES,
        towerpack::tower::MOVING_SUMMARY,
    ] {
        let names: Vec<String> = graph
            .collection(collection)
            .iter()
            .map(|v| graph.node(v.node).name.clone())
            .collect();
        assert!(
            !names.iter().any(|n| n.starts_with("tower1/")),
            "{collection}: {names:?}"
        );
    }
    let c = bare(config(bn_dropout_model(0.1), train_flow(128, 32, 4), None))
        .steps_per_epoch(2)
        .max_epoch(1);
    let report = launch_train_with_config(c, &mut ParameterServerTrainer::new(2)).expect("bn");
    let graph = report.session.graph();
    let updates: Vec<String> = graph
        .collection(towerpack::tower::UPDATE_OPS)
        .iter()
        .map(|v| graph.node(v.node).name.clone())
        .collect();
    assert_eq!(updates.len(), 2, "mean and variance EMAs: {updates:?}");
    assert!(
        updates.iter().all(|n| n.starts_with("tower0/")),
        "{updates:?}"
    );
}

/// The gradient of every trainable variable of `model` at its initial values (seed 7) on
/// `batch`, computed by the reference executor.
fn reference_gradients(model: &ModelFn, batch: &[HostTensor]) -> BTreeMap<String, Vec<f64>> {
    let r = replicate(&model.inputs(), &Replication::single(), |x| {
        model.build_graph(x)
    })
    .expect("graph");
    let mut graph = r.graph;
    let tower = &r.training[0];
    let vars = tower.gradient_variables(&graph);
    let set = gradients(&mut graph, tower.cost.expect("cost"), &vars, "g").expect("grads");
    let mut session = ReferenceSession::new(graph.clone()).expect("session");
    session.initialize_variables(7).expect("init");
    let feeds = tower
        .inputs
        .iter()
        .zip(batch)
        .map(|((_, id), t)| (*id, t.clone()))
        .collect::<Vec<_>>();
    let fetched = session
        .run(
            &Step::fetch(set.grads.iter().map(|(_, g)| *g).collect()),
            &feeds,
        )
        .expect("run");
    set.grads
        .iter()
        .zip(fetched)
        .map(|((v, _), t)| (graph.variable(*v).name.clone(), t.to_f64_vec()))
        .collect()
}

/// `(weights, momentum)` after momentum steps with `grads` in order from `w` and zero momentum.
fn momentum_chain(w: &[f64], grads: &[&[f64]], lr: f64, mu: f64) -> (Vec<f64>, Vec<f64>) {
    let mut w = w.to_vec();
    let mut m = vec![0.0; w.len()];
    for g in grads {
        for i in 0..w.len() {
            m[i] = mu * m[i] + g[i];
            w[i] -= lr * m[i];
        }
    }
    (w, m)
}

#[test]
fn async_towers_apply_their_gradients_one_after_another() {
    let model = model();
    let mut flow = train_flow(64, 32, 4);
    flow.reset_state().expect("reset");
    let b0 = flow.next_datapoint().expect("b0").expect("b0");
    let b1 = flow.next_datapoint().expect("b1").expect("b1");
    let (g0, g1) = (
        reference_gradients(&model, &b0),
        reference_gradients(&model, &b1),
    );
    for scale in [false, true] {
        let c = bare(config(mlp_model(0.1), train_flow(64, 32, 4), None))
            .steps_per_epoch(1)
            .max_epoch(1);
        let mut trainer = AsyncTrainer::new(2).scale_gradient(scale);
        let report = launch_train_with_config(c, &mut trainer).expect("async");
        let got = global_variable_values(report.session.as_ref());
        let k = if scale { 0.5 } else { 1.0 };
        for name in ["fc0/W", "fc0/b", "linear/W", "linear/b"] {
            let def = report
                .session
                .graph()
                .variable(report.session.graph().find_variable(name).expect(name));
            let w0 = initial_value(def, 7).to_f64_vec();
            let scaled = |g: &[f64]| g.iter().map(|x| x * k).collect::<Vec<_>>();
            let (s0, s1) = (scaled(&g0[name]), scaled(&g1[name]));
            let (w, m) = momentum_chain(&w0, &[&s0, &s1], 0.1, 0.9);
            let mut want = BTreeMap::new();
            want.insert(name.to_string(), w);
            want.insert(format!("{name}/Momentum"), m);
            let mut have = BTreeMap::new();
            for key in want.keys() {
                have.insert(key.clone(), got[key].clone());
            }
            assert_same_weights(&format!("scale {scale}"), &have, &want, 1e-5);
        }
    }
}

#[test]
fn async_sgd_with_scaled_gradients_is_the_synchronous_average() {
    let sgd = || {
        let m = model();
        ModelFn::new(m.inputs(), move |x| m.build_graph(x), Optimizer::sgd(0.2))
    };
    let run = |trainer: &mut dyn Trainer| {
        let c = bare(config(sgd(), train_flow(256, 32, 4), None))
            .steps_per_epoch(4)
            .max_epoch(2);
        global_variable_values(
            launch_train_with_config(c, trainer)
                .expect("train")
                .session
                .as_ref(),
        )
    };
    let asynchronous = run(&mut AsyncTrainer::new(2));
    let synchronous = run(&mut ParameterServerTrainer::new(2));
    assert_same_weights("async vs ps", &asynchronous, &synchronous, 1e-5);
    // Without scaling, each tower takes a full step.
    let unscaled = run(&mut AsyncTrainer::new(2).scale_gradient(false));
    let w = |m: &BTreeMap<String, Vec<f64>>| m["linear/b"].clone();
    assert!(
        w(&unscaled)
            .iter()
            .zip(w(&synchronous))
            .any(|(a, b)| (a - b).abs() > 1e-4),
        "unscaled async updates move further"
    );
}

#[test]
fn devices_the_backend_cannot_run_are_a_clear_error() {
    let c = bare(config(model(), train_flow(64, 32, 4), None)).max_epoch(1);
    let err = launch_train_with_config(
        c,
        &mut ReplicatedTrainer::on([Device::Cuda(0), Device::Cuda(1)]),
    )
    .err()
    .expect("no CUDA on the CPU backend");
    assert!(
        err.to_string()
            .contains("device cuda:0 is not a CPU device"),
        "{err}"
    );
    let c = bare(config(model(), train_flow(64, 32, 4), None)).max_epoch(1);
    let err = launch_train_with_config(c, &mut ReplicatedTrainer::new(0))
        .err()
        .expect("no towers");
    assert!(err.to_string().contains("at least one tower"), "{err}");
    let c = bare(config(model(), train_flow(64, 32, 4), None)).max_epoch(1);
    let mut ps = ParameterServerTrainer::new(2).parameter_device(ParameterDevice::Tower(2));
    let err = launch_train_with_config(c, &mut ps)
        .err()
        .expect("tower 2 of 2");
    assert!(
        err.to_string()
            .contains("variables on tower 2, but there are 2 towers"),
        "{err}"
    );
}
