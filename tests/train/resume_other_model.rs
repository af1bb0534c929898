//! Resuming is strict about the model: a logdir whose checkpoint was written by a different
//! model (a logdir reused by mistake) is one clear error, and the files already there are kept.

use crate::train_common;

use towerpack::data::{BatchData, mnist10k_split};
use towerpack::models::Mlp;
use towerpack::optim::Optimizer;
use towerpack::train::{ModelFn, SimpleTrainer, launch_train_with_config};
use train_common::config;

fn mlp(hidden: Vec<usize>) -> ModelFn {
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden,
        classes: 10,
        ..Mlp::default()
    };
    ModelFn::new(
        mlp.inputs(),
        move |x| mlp.build(x),
        Optimizer::momentum(0.1, 0.9),
    )
}

fn flow() -> BatchData {
    let digits = mnist10k_split().expect("mnist10k");
    let data = digits
        .train
        .slice(0, 64)
        .expect("slice")
        .to_f32(1.0 / 255.0);
    BatchData::new(data.to_flow(Some(1)).expect("flow"), 32, false).expect("batch")
}

#[test]
fn resuming_a_logdir_of_another_model_is_an_error_that_names_the_difference() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = config(mlp(vec![16]), flow(), Some(dir.path()))
        .callback(towerpack::train::callbacks::ModelSaver::new())
        .auto_resume(true)
        .max_epoch(1);
    launch_train_with_config(first, &mut SimpleTrainer::new()).expect("first run");
    let saved = std::fs::read(dir.path().join("model-2.safetensors")).expect("checkpoint");

    // One more hidden layer: `fc1/W`, `fc1/b` exist in the graph but not in the checkpoint.
    let second = config(mlp(vec![16, 16]), flow(), Some(dir.path()))
        .callback(towerpack::train::callbacks::ModelSaver::new())
        .auto_resume(true)
        .max_epoch(2);
    let err = launch_train_with_config(second, &mut SimpleTrainer::new())
        .err()
        .expect("a different model must not resume");
    let text = err.to_string();
    assert!(text.contains("written by a different model"), "{text}");
    assert!(text.contains("fc1/W"), "{text}");
    assert!(text.contains("model-2.safetensors"), "{text}");
    // Nothing already saved is lost or rewritten.
    assert_eq!(
        std::fs::read(dir.path().join("model-2.safetensors")).expect("still there"),
        saved
    );

    // The same model resumes.
    let same = config(mlp(vec![16]), flow(), Some(dir.path()))
        .auto_resume(true)
        .max_epoch(2);
    let report = launch_train_with_config(same, &mut SimpleTrainer::new()).expect("resume");
    assert!(report.resumed.is_some());
}
