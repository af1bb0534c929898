//! Input sources: FeedInput and QueueInput train identically; QueueInput's reported position is
//! the CONSUMED one although its thread reads ahead; every tower of a multi-tower trainer takes
//! its own batch (a 2-tower strategy averaging gradients matches one tower on the double
//! batch); malformed data fails clearly.

use crate::train_common;

use std::collections::BTreeMap;

use towerpack::data::{BatchData, DataFlow, DataFromList, FlowState};
use towerpack::dsl::Strategy;
use towerpack::ir::{BinaryOp, Op, Value, VarId};
use towerpack::tensor::{DType, HostTensor};
use towerpack::train::*;
use train_common::*;

fn final_vars(c: TrainConfig) -> Vec<(String, Vec<u8>)> {
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    variable_bytes(report.session.as_ref())
}

#[test]
fn feed_and_queue_inputs_train_identically() {
    let feed = final_vars(bare(config(mlp_model(0.1), train_flow(128, 32, 4), None)).max_epoch(2));
    let queue = bare(TrainConfig::new(mlp_model(0.1)))
        .data(QueueInput::new(train_flow(128, 32, 4)).capacity(3))
        .backend(cpu())
        .seed(7)
        .max_epoch(2);
    assert_eq!(feed, final_vars(queue));
}

/// The position of `flow` after `n` datapoints read endlessly (pass after pass).
fn position_after(mut flow: impl DataFlow, n: usize) -> FlowState {
    flow.reset_state().expect("reset");
    let mut taken = 0;
    while taken < n {
        if flow.next_datapoint().expect("next").is_some() {
            taken += 1;
        }
    }
    flow.state()
}

#[test]
fn queue_input_reports_the_consumed_position_not_the_prefetched_one() {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let probe = {
        let seen = std::sync::Arc::clone(&seen);
        CallbackFactory::new("probe").on_trigger(move |ctx| {
            // Let the thread fill its queue, then look.
            std::thread::sleep(std::time::Duration::from_millis(20));
            seen.lock()
                .expect("seen")
                .push((ctx.global_step(), ctx.input_state()));
            Ok(())
        })
    };
    let c = bare(TrainConfig::new(mlp_model(0.1)))
        .data(QueueInput::new(train_flow(96, 32, 4)))
        .callback(probe)
        .backend(cpu())
        .max_epoch(3);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 3);
    for (step, state) in seen {
        assert_eq!(
            state,
            Some(position_after(train_flow(96, 32, 4), step as usize)),
            "at step {step}"
        );
    }
}

/// Two towers sharing variables, each on its own batch, gradients averaged: parameter-server
/// style, built from the trainer system's public pieces.
struct TwoTowerAverage;

impl TowerStrategy for TwoTowerAverage {
    fn name(&self) -> String {
        "TwoTowerAverage".into()
    }

    fn build(&self, setup: &mut GraphSetup<'_>) -> Result<TowerGraph, TrainError> {
        let model = setup.model()?;
        let towers = build_training_towers_on(setup, 2, Strategy::Shared)?;
        let mut per_var: BTreeMap<VarId, Vec<Value>> = BTreeMap::new();
        let mut order = Vec::new();
        let loss_scale = setup.loss_scale;
        for t in &towers {
            let prefix = format!("{}/gradients", t.ns_name);
            for (var, g) in tower_gradients(setup.graph, t, &prefix, loss_scale.as_ref())? {
                if !per_var.contains_key(&var) {
                    order.push(var);
                }
                per_var.entry(var).or_default().push(g);
            }
        }
        let graph = &mut *setup.graph;
        let mut averaged = Vec::new();
        for var in order {
            let grads = &per_var[&var];
            let name = graph.variable(var).name.clone();
            let sum = graph.add_node(
                &format!("average/{name}/add"),
                Op::Binary(BinaryOp::Add),
                &[grads[0], grads[1]],
            )?;
            let half = HostTensor::scalar(DType::F32, 0.5);
            let half = graph.add_node(
                &format!("average/{name}/half"),
                Op::Constant { value: half },
                &[],
            )?;
            let mean = graph.add_node(
                &format!("average/{name}/mean"),
                Op::Binary(BinaryOp::Mul),
                &[Value::first(sum), Value::first(half)],
            )?;
            averaged.push((var, Value::first(mean)));
        }
        let (train, processed) = apply_optimizer(
            setup.graph,
            model.as_ref(),
            &averaged,
            "train_op",
            loss_scale.as_ref(),
        )?;
        let cost = towers[0].cost.expect("cost");
        Ok(TowerGraph {
            train_op: train.train_op,
            built: BuiltGraph {
                losses: vec![("tower0/cost".into(), cost)],
                gradients: processed.grads,
                towers,
                ..BuiltGraph::default()
            },
        })
    }
}

#[test]
fn each_tower_takes_its_own_batch() {
    let model = || {
        let mut m = mlp_model(0.0);
        m = ModelFn::new(
            m.inputs(),
            move |x| m.build_graph(x),
            towerpack::optim::Optimizer::sgd(0.2),
        );
        m
    };
    let one = bare(config(model(), train_flow(256, 64, 4), None)).max_epoch(2);
    let one = launch_train_with_config(one, &mut SimpleTrainer::new()).expect("one tower");
    let two = bare(config(model(), train_flow(256, 32, 4), None))
        .steps_per_epoch(4)
        .max_epoch(2);
    let mut trainer = TowerTrainer::with_strategy(TwoTowerAverage);
    let two = launch_train_with_config(two, &mut trainer).expect("two towers");
    // Tower i of step s took batch 2s + i of the 32-flow: the halves of batch s of the 64-flow.
    assert_eq!(two.counters.global_step, one.counters.global_step);
    assert_eq!(two.resumed, None);
    let (a, b) = (
        variable_bytes(one.session.as_ref()),
        variable_bytes(two.session.as_ref()),
    );
    assert_eq!(a.len(), b.len());
    let to_f32 = |bytes: &[u8]| -> Vec<f32> {
        bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        if name == "global_step" {
            assert_eq!(x, y);
            continue;
        }
        let (x, y) = (to_f32(x), to_f32(y));
        let scale = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let worst = x
            .iter()
            .zip(&y)
            .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        assert!(
            worst <= 1e-5 * scale.max(1.0),
            "{name}: max difference {worst}"
        );
    }
}

#[test]
fn malformed_data_fails_with_a_clear_error() {
    // Three components for a two-input signature.
    let items = (0..4)
        .map(|_| {
            vec![
                HostTensor::zeros(DType::F32, &[28, 28, 1]),
                HostTensor::scalar(DType::I32, 1.0),
                HostTensor::scalar(DType::I32, 2.0),
            ]
        })
        .collect();
    let flow = BatchData::new(DataFromList::new(items), 2, false).expect("batch");
    let err = launch_train_with_config(
        bare(config(mlp_model(0.1), flow, None)).max_epoch(1),
        &mut SimpleTrainer::new(),
    )
    .err()
    .expect("fails");
    assert!(
        err.to_string()
            .contains("3 components, the input signature has 2 (input, label)"),
        "{err}"
    );

    // An empty pass would loop forever; it is an error.
    let empty = BatchData::new(DataFromList::new(Vec::new()), 2, true).expect("batch");
    let c = bare(config(mlp_model(0.1), empty, None))
        .steps_per_epoch(1)
        .max_epoch(1);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("fails");
    assert!(err.to_string().contains("empty pass"), "{err}");
}

/// `n` training digits as the loader gives them: u8 pixels in [0, 255], i32 labels, batched.
fn u8_digits(n: usize, batch: usize) -> BatchData {
    let data = towerpack::data::mnist10k_split()
        .expect("mnist10k")
        .train
        .slice(0, n)
        .expect("slice");
    BatchData::new(data.to_flow(Some(3)).expect("flow"), batch, false).expect("batch")
}

fn training_error(c: TrainConfig) -> TrainError {
    launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("training must fail")
}

#[test]
fn u8_images_fed_to_an_f32_input_are_an_error_naming_the_input_and_the_cast() {
    let err = training_error(bare(config(mlp_model(0.1), u8_digits(64, 32), None)).max_epoch(1));
    assert!(
        matches!(&err, TrainError::FeedMismatch { input, .. } if input == "input"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("input `input` takes f32"), "{text}");
    assert!(text.contains("u8"), "{text}");
    assert!(text.contains("CastData"), "{text}");
}

#[test]
fn an_explicit_cast_data_trains_on_u8_images() {
    let flow = towerpack::data::CastData::new(u8_digits(64, 32), 0, DType::F32);
    let report = launch_train_with_config(
        bare(config(mlp_model(0.001), flow, None)).max_epoch(1),
        &mut SimpleTrainer::new(),
    )
    .expect("the cast data trains");
    assert_eq!(report.counters.global_step, 2);
}

#[test]
fn a_feed_of_the_wrong_shape_is_an_error_naming_the_input() {
    let items = (0..4)
        .map(|_| {
            vec![
                HostTensor::zeros(DType::F32, &[2, 27, 28, 1]),
                HostTensor::zeros(DType::I32, &[2]),
            ]
        })
        .collect();
    let err = training_error(
        bare(config(mlp_model(0.1), DataFromList::new(items), None))
            .steps_per_epoch(1)
            .max_epoch(1),
    );
    let text = err.to_string();
    assert!(
        matches!(&err, TrainError::FeedMismatch { input, .. } if input == "input"),
        "{err:?}"
    );
    assert!(text.contains("27"), "{text}");
}

#[test]
fn an_empty_batch_is_an_error_not_a_step_of_cost_zero() {
    let items = (0..4)
        .map(|_| {
            vec![
                HostTensor::zeros(DType::F32, &[0, 28, 28, 1]),
                HostTensor::zeros(DType::I32, &[0]),
            ]
        })
        .collect();
    let err = training_error(
        bare(config(mlp_model(0.1), DataFromList::new(items), None))
            .steps_per_epoch(1)
            .max_epoch(1),
    );
    assert!(
        matches!(&err, TrainError::EmptyBatch { input, .. } if input == "input"),
        "{err:?}"
    );
    assert!(err.to_string().contains("empty batch"), "{err}");
}

#[test]
fn u8_validation_data_is_an_error_naming_the_inference_runner() {
    use towerpack::train::callbacks::{ClassificationError, InferenceRunner, Inferencer};
    let infs: Vec<Box<dyn Inferencer>> = vec![Box::new(ClassificationError::default())];
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 1), None))
        .callback(InferenceRunner::new(u8_digits(40, 20), infs))
        .max_epoch(1);
    let err = training_error(c);
    let text = err.to_string();
    assert!(text.contains("input `input`"), "{text}");
    assert!(text.contains("validation data"), "{text}");
}

#[test]
fn a_predictor_refuses_a_feed_of_another_dtype() {
    let model: std::sync::Arc<dyn ModelDesc> = std::sync::Arc::new(mlp_model(0.1));
    let mut predictor = OfflinePredictor::new(
        PredictConfig::new(model, &["linear/output"]).input_names(&["input"]),
    )
    .expect("predictor");
    let good = HostTensor::zeros(DType::F32, &[3, 28, 28, 1]);
    assert_eq!(predictor.predict(&[good]).expect("f32 runs").len(), 1);
    let bad = HostTensor::zeros(DType::U8, &[3, 28, 28, 1]);
    let err = predictor.predict(&[bad]).expect_err("u8 is refused");
    assert!(
        matches!(&err, TrainError::FeedMismatch { input, .. } if input == "input"),
        "{err:?}"
    );
}
