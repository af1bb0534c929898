//! Checkpoints of the replicated trainer hold replica 0 only, so they load whatever the tower
//! count: into one tower (which then trains like two towers restored from it), back into two
//! towers (replica 1 takes the restored values through the broadcast), and into an offline
//! predictor that agrees with the trainer's own predictor.

use crate::train_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use towerpack::backend::Session;
use towerpack::data::DataFlow;
use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::ModelSaver;
use towerpack::train::checkpoint::{load_checkpoint, resolve_checkpoint_path};
use towerpack::train::*;
use train_common::*;

/// Runs the predictor of the inference tower (which reads replica 0) after training.
struct PredictAfterTraining {
    predictor: Option<OnlinePredictor>,
    out: Arc<Mutex<Vec<f32>>>,
}

impl Callback for PredictAfterTraining {
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.predictor = Some(ctx.get_predictor(&["input"], &["linear/output"])?);
        Ok(())
    }
    fn after_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let Some(p) = self.predictor.as_ref() else {
            return Err(TrainError::callback("PredictAfterTraining", "no predictor"));
        };
        let out = p.run(ctx.session("predict")?, &validation_images())?;
        *self.out.lock().expect("out") = out[0].to_f32_vec();
        Ok(())
    }
}

fn validation_images() -> Vec<HostTensor> {
    let mut flow = val_flow(16, 16);
    flow.reset_state().expect("reset");
    let batch = flow.next_datapoint().expect("batch").expect("one batch");
    batch[..1].to_vec()
}

/// Every variable of a session by name (replicas included) as f64 values.
fn all_variables(session: &dyn Session) -> BTreeMap<String, Vec<f64>> {
    session
        .graph()
        .variable_ids()
        .map(|(id, def)| {
            let v = session.read_variable(id).expect("read");
            (def.name.clone(), v.to_f64_vec())
        })
        .collect()
}

fn max_relative_difference(a: &[f64], b: &[f64]) -> f64 {
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f64, |m, (p, q)| m.max((p - q).abs())) / scale
}

/// One epoch from the checkpoint in `dir`: `trainer` at `batch` per tower.
fn continue_from(dir: &std::path::Path, trainer: &mut dyn Trainer, batch: usize) -> TrainReport {
    let c = bare(config(mlp_model(0.1), train_flow(256, batch, 5), None))
        .session_init(SaverRestore::new(dir.join("checkpoint")))
        .steps_per_epoch(4)
        .max_epoch(1);
    launch_train_with_config(c, trainer).expect("continue")
}

#[test]
fn a_two_tower_checkpoint_loads_into_one_tower_two_towers_and_a_predictor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let online = Arc::new(Mutex::new(Vec::new()));
    let c = bare(config(
        mlp_model(0.1),
        train_flow(256, 32, 4),
        Some(dir.path()),
    ))
    .callback(ModelSaver::new())
    .callback(PredictAfterTraining {
        predictor: None,
        out: Arc::clone(&online),
    })
    .steps_per_epoch(4)
    .max_epoch(2);
    let trained = launch_train_with_config(c, &mut ReplicatedTrainer::new(2)).expect("train");
    let trained = all_variables(trained.session.as_ref());

    // The file holds replica 0 (and the training state), nothing of replica 1.
    let file = resolve_checkpoint_path(&dir.path().join("checkpoint")).expect("latest");
    let saved = load_checkpoint(&file).expect("load");
    let names: Vec<&String> = saved.tensors.keys().collect();
    assert!(names.iter().any(|n| *n == "fc0/W/Momentum"), "{names:?}");
    assert!(!names.iter().any(|n| n.starts_with("tower")), "{names:?}");
    for (name, value) in &saved.tensors {
        assert!(value.to_f64_vec() == trained[name], "{name} as trained");
    }

    // One tower at batch 64 continues exactly like two towers at batch 32.
    let one = continue_from(dir.path(), &mut SimpleTrainer::new(), 64);
    let two = continue_from(dir.path(), &mut ReplicatedTrainer::new(2), 32);
    let (one, two) = (
        all_variables(one.session.as_ref()),
        all_variables(two.session.as_ref()),
    );
    for (name, value) in &one {
        let d = max_relative_difference(&two[name], value);
        assert!(d <= 1e-5, "{name}: relative difference {d:.3e}");
        // Replica 1 was restored through the broadcast and trained identically.
        if let Some(replica) = two.get(&format!("tower1/{name}")) {
            assert!(replica == &two[name], "tower1/{name}");
        }
    }
    assert!(
        max_relative_difference(&one["fc0/W"], &trained["fc0/W"]) > 1e-4,
        "the continued runs trained"
    );

    // An offline predictor restored from the checkpoint predicts what the trainer did.
    let config = PredictConfig::new(Arc::new(mlp_model(0.1)), &["linear/output"])
        .input_names(&["input"])
        .session_init(SaverRestore::new(dir.path().join("checkpoint")))
        .backend(cpu());
    let mut offline = OfflinePredictor::new(config).expect("predictor");
    let offline = offline.predict(&validation_images()).expect("predict")[0].to_f32_vec();
    let online = online.lock().expect("online").clone();
    assert_eq!(online.len(), 16 * 10);
    for (a, b) in online.iter().zip(&offline) {
        assert!(close(f64::from(*a), f64::from(*b), 1e-5), "{a} vs {b}");
    }
}
