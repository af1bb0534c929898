//! Hyper-parameter setters, periodic wrappers and early stopping, each driving a real loop:
//! the learning rate seen at each epoch, which steps a wrapped callback runs at, and the epoch
//! training stops at.

use crate::train_common;

use towerpack::train::callbacks::*;
use towerpack::train::*;
use train_common::*;

/// Trains the MLP (4 steps per epoch) with `callbacks` for `epochs`.
fn run(callbacks: Vec<Box<dyn Callback>>, epochs: u64, lr: f64) -> TrainReport {
    let mut c = bare(config(mlp_model(lr), train_flow(128, 32, 1), None)).max_epoch(epochs);
    c.callbacks = callbacks;
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train")
}

fn lr_values(seen: &Seen) -> Vec<(u64, f32)> {
    seen.lock()
        .expect("seen")
        .iter()
        .map(|&(e, v)| (e, v as f32))
        .collect()
}

#[test]
fn scheduled_setter_applies_each_value_after_its_epoch() {
    let (probe, seen) = VariableProbe::new("learning_rate");
    let setter = ScheduledHyperParamSetter::new("learning_rate", &[(2, 0.05), (0, 0.2)]);
    let report = run(vec![Box::new(setter), Box::new(probe)], 3, 0.5);
    // (0, 0.2) before training; (2, 0.05) after epoch 2.
    assert_eq!(lr_values(&seen), [(1, 0.2), (2, 0.2), (3, 0.05), (3, 0.05)]);
    let history: Vec<(u64, f32)> = report
        .history("learning_rate")
        .iter()
        .map(|&(s, v)| (s, v as f32))
        .collect();
    assert_eq!(history, [(0, 0.2), (8, 0.05)]);
}

#[test]
fn scheduled_setter_interpolates_linearly_without_extrapolating() {
    let (probe, seen) = VariableProbe::new("learning_rate");
    let setter = ScheduledHyperParamSetter::new("learning_rate", &[(1, 0.1), (3, 0.3)]).linear();
    run(vec![Box::new(setter), Box::new(probe)], 4, 0.5);
    // Nothing before epoch 1 (no extrapolation): the optimizer's 0.5 holds.
    assert_eq!(
        lr_values(&seen),
        [(1, 0.5), (2, 0.1), (3, 0.2), (4, 0.3), (4, 0.3)]
    );
}

#[test]
fn step_based_schedule_fires_after_the_step() {
    let setter =
        ScheduledHyperParamSetter::new("learning_rate", &[(0, 0.3), (5, 0.03), (6, 0.003)])
            .step_based();
    let report = run(vec![Box::new(setter)], 2, 0.5);
    let history: Vec<(u64, f32)> = report
        .history("learning_rate")
        .iter()
        .map(|&(s, v)| (s, v as f32))
        .collect();
    assert_eq!(history, [(0, 0.3), (5, 0.03), (6, 0.003)]);
}

#[test]
fn setter_with_func_applies_before_training_and_after_each_epoch() {
    let (probe, seen) = VariableProbe::new("learning_rate");
    let setter =
        HyperParamSetterWithFunc::new("learning_rate", |epoch, old| old * 0.5 + epoch as f64);
    run(vec![Box::new(setter), Box::new(probe)], 2, 0.4);
    // before_train: f(0, 0.4) = 0.2; after epoch 1: f(1, 0.2) = 1.1; after 2: f(2, 1.1) = 2.55.
    assert_eq!(lr_values(&seen), [(1, 0.2), (2, 1.1), (2, 2.55)]);
}

#[test]
fn a_setter_of_a_missing_or_non_float_variable_fails_clearly() {
    let setter = ScheduledHyperParamSetter::new("no_such_var", &[(0, 0.1)]);
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 1), None))
        .max_epoch(1)
        .callback(setter);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("fails");
    assert!(
        err.to_string().contains("`no_such_var` is not a variable"),
        "{err}"
    );
    let setter = ScheduledHyperParamSetter::new("global_step", &[(0, 1.0)]);
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 1), None))
        .max_epoch(1)
        .callback(setter);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("fails");
    assert!(err.to_string().contains("must be a float scalar"), "{err}");
}

#[test]
fn stat_monitor_setter_decays_on_plateaus() {
    let (probe, seen) = VariableProbe::new("learning_rate");
    let stat = ScriptedStat::new("val", &[1.0, 0.9, 0.9, 0.95, 0.92, 0.5, 0.6, 0.55]);
    let setter = StatMonitorParamSetter::new("learning_rate", "val", |v| v * 0.1, 0.01, 2);
    let report = run(
        vec![Box::new(stat), Box::new(setter), Box::new(probe)],
        8,
        0.5,
    );
    // History of 3: [1, .9, .9] dropped by more than 0.01; [.9, .9, .95] did not → decay after
    // epoch 4 and clear; [.92, .5, .6] dropped; [.5, .6, .55] did not → decay after epoch 8.
    let lrs = lr_values(&seen);
    assert_eq!(
        lrs[..5],
        [(1, 0.5), (2, 0.5), (3, 0.5), (4, 0.5), (5, 0.05)]
    );
    assert_eq!(lrs[5..], [(6, 0.05), (7, 0.05), (8, 0.05), (8, 0.005)]);
    let setter = report.callback::<StatMonitorParamSetter>().expect("setter");
    assert!(setter.history().is_empty());
}

#[test]
fn periodic_trigger_reschedules_trigger_only() {
    let log = log();
    let inner = Recorder::new("p", &log, &["trigger", "trigger_epoch", "trigger_step"]);
    let wrapped = PeriodicTrigger::new(inner)
        .every_k_steps(3)
        .every_k_epochs(2)
        .before_train(true);
    run(vec![Box::new(wrapped)], 2, 0.1);
    let triggers: Vec<String> = entries(&log)
        .into_iter()
        .filter(|e| e.starts_with("p trigger "))
        .collect();
    assert_eq!(
        triggers,
        [
            "p trigger e=0 l=-1 g=0",
            "p trigger e=1 l=2 g=3",
            "p trigger e=2 l=1 g=6",
            "p trigger e=2 l=3 g=8",
        ]
    );
    // The inner trigger_epoch is replaced; trigger_step passes through.
    let all = entries(&log);
    assert!(!all.iter().any(|e| e.contains("trigger_epoch")));
    assert_eq!(all.iter().filter(|e| e.contains("trigger_step")).count(), 8);
    // A schedule is required.
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 1), None))
        .max_epoch(1)
        .callback(PeriodicTrigger::new(Recorder::new("x", &log, &[])));
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("fails");
    assert!(err.to_string().contains("every_k_steps"), "{err}");
}

#[test]
fn periodic_callback_gates_hooks_and_keeps_the_last_step() {
    let log = log();
    let inner = Recorder::new("p", &log, &["before_run", "trigger_epoch"]);
    run(
        vec![Box::new(PeriodicCallback::new(inner, Some(3), Some(2)))],
        3,
        0.1,
    );
    assert_eq!(
        entries(&log),
        [
            "p before_run e=1 l=0 g=0",
            "p before_run e=1 l=3 g=3",
            // Every hook of an even epoch passes (epoch_num % 2 == 0).
            "p before_run e=2 l=0 g=4",
            "p before_run e=2 l=1 g=5",
            "p before_run e=2 l=2 g=6",
            "p before_run e=2 l=3 g=7",
            "p trigger_epoch e=2 l=3 g=8",
            "p before_run e=3 l=1 g=9",
            "p before_run e=3 l=3 g=11",
            // The very last step of training always passes.
            "p trigger_epoch e=3 l=3 g=12",
        ]
    );
}

#[test]
fn enable_callback_if_evaluates_its_predicate_per_hook() {
    let log = log();
    let inner = Recorder::new(
        "c",
        &log,
        &[
            "before_run",
            "after_run",
            "before_epoch",
            "trigger_epoch",
            "before_train",
        ],
    );
    let gated = EnableCallbackIf::new(inner, |ctx: &TrainContext| {
        ctx.epoch_num() == 2 && ctx.local_step() <= 0
    });
    // before_epoch of epoch 2 sees local_step 3 (the previous epoch's last), so it is gated off.
    run(vec![Box::new(gated)], 2, 0.1);
    assert_eq!(
        entries(&log),
        [
            "c before_train e=0 l=-1 g=0",
            "c before_run e=2 l=0 g=4",
            "c after_run e=2 l=0 g=5",
        ]
    );
}

#[test]
fn early_stopping_stops_cleanly_after_patience() {
    let stat = ScriptedStat::new("val", &[1.0, 0.8, 0.85, 0.81, 0.5, 0.4]);
    let stop = EarlyStopping::new("val", 2, Mode::Min).min_delta(0.01);
    let report = run(vec![Box::new(stat), Box::new(stop)], 6, 0.1);
    // best 1.0, then 0.8; 0.85 and 0.81 do not beat 0.8 - 0.01: stop after epoch 4.
    assert_eq!(report.counters.epoch_num, 4);
    assert!(
        report
            .stopped
            .as_deref()
            .is_some_and(|r| r.contains("EarlyStopping")),
        "{:?}",
        report.stopped
    );
    let es = report.callback::<EarlyStopping>().expect("callback");
    assert_eq!((es.best(), es.wait()), (Some(0.8), 2));

    let stat = ScriptedStat::new("acc", &[0.1, 0.2, 0.3]);
    let stop = EarlyStopping::new("acc", 1, Mode::Max);
    let report = run(vec![Box::new(stat), Box::new(stop)], 3, 0.1);
    assert_eq!((report.counters.epoch_num, report.stopped), (3, None));
}

#[test]
fn a_tensorpack_style_resume_re_derives_the_scheduled_value() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(128, 32, 1),
        Some(dir.path()),
    ))
    .callback(ModelSaver::new())
    .max_epoch(2);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    // Weights (learning_rate 0.1 included) from the checkpoint, epochs from starting_epoch: the
    // schedule's value at the last finished epoch (2) replaces the restored 0.1.
    let (probe, seen) = VariableProbe::new("learning_rate");
    let setter = ScheduledHyperParamSetter::new("learning_rate", &[(0, 0.5), (2, 0.05), (3, 0.01)]);
    let c = bare(config(mlp_model(0.1), train_flow(128, 32, 1), None))
        .session_init(SaverRestore::new(dir.path()))
        .callback(setter)
        .callback(probe)
        .starting_epoch(3)
        .max_epoch(3);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert_eq!(lr_values(&seen), [(3, 0.05), (3, 0.01)]);
}

fn training_error(c: TrainConfig) -> TrainError {
    launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("training must fail")
}

#[test]
fn a_nan_infinite_or_negative_learning_rate_is_an_error_at_set_up() {
    for lr in [f64::NAN, f64::INFINITY, -0.1] {
        let seen = log();
        let c = bare(config(mlp_model(lr), train_flow(128, 32, 1), None))
            .callback(Recorder::new("r", &seen, &["before_train"]))
            .max_epoch(1);
        let err = training_error(c);
        let text = err.to_string();
        assert!(text.contains("learning_rate"), "lr {lr}: {text}");
        assert!(text.contains(&lr.to_string()), "lr {lr}: {text}");
        assert!(
            entries(&seen).is_empty(),
            "lr {lr}: training started: {:?}",
            entries(&seen)
        );
    }
    // Zero is a valid (frozen) learning rate.
    let report = run(Vec::new(), 1, 0.0);
    assert_eq!(report.counters.global_step, 4);
}

#[test]
fn a_schedule_producing_a_non_finite_or_negative_learning_rate_stops_with_an_error() {
    for bad in [f64::NAN, f64::NEG_INFINITY, -0.5] {
        let setter =
            HyperParamSetterWithFunc::new(
                "learning_rate",
                move |epoch, _| {
                    if epoch >= 2 { bad } else { 0.1 }
                },
            );
        let mut c = bare(config(mlp_model(0.1), train_flow(128, 32, 1), None)).max_epoch(3);
        c.callbacks = vec![Box::new(setter)];
        let err = training_error(c);
        assert!(
            matches!(
                &err,
                TrainError::InvalidHyperParam { name, global_step: 8, .. } if name == "learning_rate"
            ),
            "value {bad}: {err:?}"
        );
        assert!(
            err.to_string().contains("HyperParamSetterWithFunc"),
            "{err}"
        );
    }
}

#[test]
fn a_nan_learning_rate_inside_gradient_accumulation_is_an_error_at_set_up() {
    use towerpack::models::Mlp;
    use towerpack::optim::Optimizer;
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![8],
        classes: 10,
        ..Mlp::default()
    };
    let model = ModelFn::new(
        mlp.inputs(),
        move |x| mlp.build(x),
        Optimizer::sgd(f64::NAN).accumulate(2),
    );
    let err = training_error(bare(config(model, train_flow(64, 32, 1), None)).max_epoch(1));
    let text = err.to_string();
    assert!(
        text.contains("learning_rate") && text.contains("NaN"),
        "{text}"
    );
}
