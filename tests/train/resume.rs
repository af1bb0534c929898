//! Exact resume: a run that crashes (a callback aborts it) and is resumed from its latest
//! checkpoint — mid-epoch, at an epoch's end, and twice in a row — finishes with variables
//! bit-identical to an uninterrupted run, and the same stats.json. Also AutoResume's rules.

use crate::train_common;

use std::path::Path;

use towerpack::train::callbacks::{HyperParamSetterWithFunc, ModelSaver, PeriodicTrigger};

use towerpack::train::checkpoint::save_checkpoint;
use towerpack::train::*;
use train_common::*;

fn uninterrupted() -> (tempfile::TempDir, Vec<(String, Vec<u8>)>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = launch_train_with_config(full_config(dir.path()), &mut SimpleTrainer::new())
        .expect("train");
    assert_eq!(report.counters.global_step, 24);
    let vars = variable_bytes(report.session.as_ref());
    (dir, vars)
}

/// Runs `full_config` in `dir` resuming automatically, aborting at global step `abort_at`.
fn attempt(dir: &Path, abort_at: Option<u64>) -> Result<TrainReport, TrainError> {
    let mut c = full_config(dir).auto_resume(true);
    if let Some(at) = abort_at {
        c = c.callback(Abort { at });
    }
    launch_train_with_config(c, &mut SimpleTrainer::new())
}

fn assert_same_variables(a: &[(String, Vec<u8>)], b: &[(String, Vec<u8>)]) {
    assert_eq!(a.len(), b.len());
    for ((na, va), (nb, vb)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        assert!(va == vb, "variable {na} differs after resume");
    }
}

#[test]
fn a_crashed_run_resumes_to_bit_identical_weights() {
    let (reference_dir, reference) = uninterrupted();

    let dir = tempfile::tempdir().expect("tempdir");
    // Crash at step 17 (epoch 3, local step 4): the latest checkpoint is step 16, mid-epoch.
    let err = attempt(dir.path(), Some(17)).err().expect("crashes");
    assert!(err.to_string().contains("simulated crash at 17"), "{err}");
    // Resume, crash again at step 22 (latest checkpoint: step 20).
    let err = attempt(dir.path(), Some(22)).err().expect("crashes");
    assert!(err.to_string().contains("simulated crash at 22"), "{err}");
    // Resume to the end.
    let report = attempt(dir.path(), None).expect("finishes");
    let resumed = report.resumed.clone().expect("resumed");
    assert_eq!(resumed.global_step, 20);
    assert_eq!(
        resumed.point,
        ResumePoint {
            epoch: 4,
            next_local_step: 2
        }
    );
    assert_eq!(report.counters.global_step, 24);
    assert_same_variables(&reference, &variable_bytes(report.session.as_ref()));
    // The statistics continue exactly too (records of redone steps were dropped).
    assert_eq!(
        deterministic_stats(dir.path()),
        deterministic_stats(reference_dir.path())
    );
    let best = |d: &Path| {
        let c = towerpack::train::checkpoint::load_checkpoint(
            &d.join("min-validation_error.safetensors"),
        )
        .expect("min copy");
        c.global_step()
            .unwrap_or(0)
            .max(c.tensors["global_step"].scalar_value().expect("s") as u64)
    };
    assert_eq!(best(dir.path()), best(reference_dir.path()));
}

#[test]
fn a_checkpoint_at_an_epochs_last_step_resumes_into_the_epochs_triggers() {
    let (_reference_dir, reference) = uninterrupted();
    let dir = tempfile::tempdir().expect("tempdir");
    // Steps 7..12 are epoch 2; the checkpoint of step 12 is written after its last step but
    // before its trigger_epoch (InferenceRunner, setters...), which the resumed run then runs.
    attempt(dir.path(), Some(13)).err().expect("crashes");
    let report = attempt(dir.path(), None).expect("finishes");
    let resumed = report.resumed.clone().expect("resumed");
    assert_eq!(
        resumed.point,
        ResumePoint {
            epoch: 2,
            next_local_step: 6
        }
    );
    assert_same_variables(&reference, &variable_bytes(report.session.as_ref()));
}

#[test]
fn auto_resume_starts_fresh_in_an_empty_logdir_and_explains_inconsistent_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(64, 32, 1),
        Some(dir.path()),
    ))
    .auto_resume(true)
    .max_epoch(1);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("fresh");
    assert!(report.resumed.is_none());

    // stats.json without a checkpoint.
    std::fs::write(
        dir.path().join("stats.json"),
        r#"[{"epoch_num": 3, "global_step": 6}]"#,
    )
    .expect("write");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(64, 32, 1),
        Some(dir.path()),
    ))
    .auto_resume(true);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("error");
    assert!(err.to_string().contains("holds no checkpoint"), "{err}");

    // A checkpoint without resume metadata: tensorpack's rule, the epoch after stats.json's.
    let trained = {
        let c = bare(config(mlp_model(0.1), train_flow(64, 32, 1), None)).max_epoch(1);
        let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
        let s = report.session;
        let graph = s.graph();
        towerpack::tower::VarCollection::Global
            .variables(graph)
            .into_iter()
            .map(|id| {
                (
                    graph.variable(id).name.clone(),
                    s.read_variable(id).expect("read"),
                )
            })
            .collect::<Vec<_>>()
    };
    save_checkpoint(dir.path(), 6, &trained, &Default::default()).expect("save");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(64, 32, 1),
        Some(dir.path()),
    ))
    .auto_resume(true)
    .max_epoch(4);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("resumes");
    assert_eq!(
        report.resumed.expect("resumed").point,
        ResumePoint::epoch_start(4)
    );
    // global_step was 2 in the checkpoint (one epoch of 2 steps); one more epoch ran.
    assert_eq!(report.counters.global_step, 4);

    // Without stats.json the epoch is unknown: an error.
    std::fs::remove_file(dir.path().join("stats.json")).expect("rm");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(64, 32, 1),
        Some(dir.path()),
    ))
    .auto_resume(true);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("error");
    assert!(err.to_string().contains("no resume metadata"), "{err}");

    // With always = false, a user's session_init wins.
    let c = bare(config(
        mlp_model(0.1),
        train_flow(64, 32, 1),
        Some(dir.path()),
    ))
    .auto_resume(false)
    .session_init(JustCurrentSession)
    .max_epoch(1);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("fresh");
    assert!(report.resumed.is_none());
}

#[test]
fn resume_from_an_explicit_checkpoint_continues_its_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(96, 32, 1),
        Some(dir.path()),
    ))
    .callback(PeriodicTrigger::new(ModelSaver::new()).every_k_steps(2))
    .max_epoch(2);
    let full = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let other = tempfile::tempdir().expect("tempdir");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(96, 32, 1),
        Some(other.path()),
    ))
    .resume_from(dir.path().join("model-4"))
    .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("resume");
    assert_eq!(
        report.resumed.clone().expect("resumed").point,
        ResumePoint {
            epoch: 2,
            next_local_step: 1
        }
    );
    assert_same_variables(
        &variable_bytes(full.session.as_ref()),
        &variable_bytes(report.session.as_ref()),
    );
}

#[test]
fn a_setter_with_a_function_is_not_applied_twice_on_resume() {
    // lr <- lr * 0.8 + 0.01 * epoch before training and after each epoch: a resumed run must not
    // apply it again in before_train.
    let cfg = |dir: &Path| {
        bare(config(mlp_model(0.2), train_flow(96, 32, 1), Some(dir)))
            .callback(PeriodicTrigger::new(ModelSaver::new()).every_k_steps(2))
            .callback(HyperParamSetterWithFunc::new("learning_rate", |e, lr| {
                lr * 0.8 + 0.01 * e as f64
            }))
            .max_epoch(3)
            .auto_resume(true)
    };
    let reference_dir = tempfile::tempdir().expect("tempdir");
    let reference = launch_train_with_config(cfg(reference_dir.path()), &mut SimpleTrainer::new())
        .expect("train");
    let dir = tempfile::tempdir().expect("tempdir");
    launch_train_with_config(
        cfg(dir.path()).callback(Abort { at: 5 }),
        &mut SimpleTrainer::new(),
    )
    .err()
    .expect("crashes");
    let resumed =
        launch_train_with_config(cfg(dir.path()), &mut SimpleTrainer::new()).expect("resume");
    assert_eq!(resumed.resumed.as_ref().expect("resumed").global_step, 4);
    assert_same_variables(
        &variable_bytes(reference.session.as_ref()),
        &variable_bytes(resumed.session.as_ref()),
    );
}
