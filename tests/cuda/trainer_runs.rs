//! Short trainer runs of the MLP on the device and on the CPU, and their comparison: how the
//! precision tests (`emu_tf32`, `emu_half`) check that `TrainConfig::precision` reaches the
//! device and trains there like the CPU in the same precision.

use crate::train_common;
use towerpack::lower::Precision;
use towerpack::train::{
    BackendChoice, SimpleTrainer, TrainConfig, TrainReport, launch_train_with_config,
};

/// One epoch of the trainer's MLP (3 steps of 32) on `backend` in `precision`.
pub fn trained_mlp(backend: BackendChoice, precision: Precision) -> TrainReport {
    let c: TrainConfig = train_common::bare(train_common::config(
        train_common::mlp_model(0.1),
        train_common::train_flow(96, 32, 3),
        None,
    ))
    .backend(backend)
    .precision(precision)
    .max_epoch(1);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train")
}

/// Every variable of a run, by name, in the graph's order.
pub fn variables(r: &TrainReport) -> Vec<(String, Vec<f64>)> {
    r.session
        .graph()
        .variable_ids()
        .map(|(id, def)| {
            let v = r.session.read_variable(id).expect("read").to_f64_vec();
            (def.name.clone(), v)
        })
        .collect()
}

/// Asserts that `device`'s variable `name` is within 1% of the CPU's largest value of it.
pub fn assert_like_the_cpu(what: &str, name: &str, device: &[f64], cpu: &[f64]) {
    let scale = cpu.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    for (i, (x, y)) in device.iter().zip(cpu).enumerate() {
        assert!(
            (x - y).abs() <= 1e-2 * scale,
            "{name}[{i}]: {what} on the device {x} vs on the cpu {y}"
        );
    }
}
