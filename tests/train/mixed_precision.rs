//! Training under FP16's dynamic loss scale: a forced overflow is skipped (no variable moves)
//! and halves the scale, good steps grow it again — PyTorch `GradScaler`'s semantics, checked
//! step by step on the variables — and the monitor reports the scale and every skipped step
//! from what it fetches with every 10th step of an epoch and its last.

use crate::train_common;

use std::sync::{Arc, Mutex};

use towerpack::optim::{DynamicLossScale, LOSS_SCALE, LOSS_SCALE_SKIPPED_STEPS};
use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::{
    ClassificationError, InferenceRunner, Inferencer, LossScaleMonitor, ModelSaver, ScalarStats,
};
use towerpack::train::*;
use train_common::*;

/// Every trainable variable after a step, with the loss-scale variable then.
type Observed = Arc<Mutex<Vec<(Vec<HostTensor>, f64)>>>;

/// Records every trainable variable before training, and after every step with the loss-scale
/// variable.
struct Watch {
    initial: Arc<Mutex<Vec<HostTensor>>>,
    seen: Observed,
}

/// The values of every trainable variable.
fn trainables(ctx: &mut TrainContext) -> Result<Vec<HostTensor>, TrainError> {
    let names: Vec<String> = ctx
        .graph()
        .variables()
        .iter()
        .filter(|v| v.flags.trainable)
        .map(|v| v.name.clone())
        .collect();
    names.iter().map(|n| ctx.read_variable(n)).collect()
}

impl Callback for Watch {
    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        *self.initial.lock().expect("initial") = trainables(ctx)?;
        Ok(())
    }

    fn after_run(&mut self, ctx: &mut TrainContext, _: &[HostTensor]) -> Result<(), TrainError> {
        let values = trainables(ctx)?;
        let scale = ctx
            .read_variable(LOSS_SCALE)?
            .scalar_value()
            .unwrap_or(f64::NAN);
        self.seen.lock().expect("seen").push((values, scale));
        Ok(())
    }
}

#[test]
fn an_fp16_overflow_skips_the_step_and_halves_the_loss_scale() {
    // 2^30 times the loss puts the gradient of the logits (~0.1/32 per element) near 2^21,
    // far past fp16's 65504 once it is rounded as an operand of the backward matrix products.
    let scaling = DynamicLossScale {
        initial_scale: 2f64.powi(30),
        growth_interval: 3,
        ..DynamicLossScale::default()
    };
    let (initial, seen) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let c = bare(config(mlp_model(0.1), train_flow(256, 32, 1), None))
        .precision(Precision::Fp16)
        .loss_scale(Some(scaling))
        .callback(Watch {
            initial: Arc::clone(&initial),
            seen: Arc::clone(&seen),
        })
        .max_epoch(3);
    let mut report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let (initial, seen) = (initial.lock().expect("initial"), seen.lock().expect("seen"));
    assert_eq!(seen.len(), 24);
    assert!(!initial.is_empty());

    // Replay GradScaler's rules on what happened: a step is applied iff a variable moved.
    let scale_var = {
        let id = report
            .session
            .graph()
            .find_variable(LOSS_SCALE)
            .expect("the scale is a variable");
        let def = report.session.graph().variable(id).clone();
        assert!(!def.flags.trainable);
        id
    };
    let (mut scale, mut good, mut skipped, mut grown) = (scaling.initial_scale, 0u32, 0, 0);
    let mut before: &Vec<HostTensor> = &initial;
    for (step, (values, monitored)) in seen.iter().enumerate() {
        let moved = before != values;
        if moved {
            good += 1;
            if good == scaling.growth_interval {
                scale *= 2.0;
                good = 0;
                grown += 1;
            }
        } else {
            scale *= 0.5;
            good = 0;
            skipped += 1;
        }
        assert_eq!(*monitored, scale, "step {}: the loss scale", step + 1);
        before = values;
    }
    assert!(skipped >= 1, "the forced overflow skipped no step");
    assert!(grown >= 1, "the scale never grew back");
    // The monitor fetched with local steps 0 and 7 (the last) of each 8-step epoch: the scale
    // then, and the skipped steps counted on the device in between, none missed.
    let scales: Vec<(u64, f64)> = report.history("loss_scale").to_vec();
    let fetched: Vec<u64> = scales.iter().map(|h| h.0).collect();
    assert_eq!(
        fetched,
        [1, 8, 9, 16, 17, 24],
        "the steps the monitor fetched with"
    );
    for &(step, monitored) in &scales {
        assert_eq!(
            monitored,
            seen[step as usize - 1].1,
            "step {step}: monitored scale"
        );
    }
    let skipped_history = report.history("loss_scale/skipped_steps").to_vec();
    assert_eq!(
        skipped_history.last().map(|h| h.1),
        Some(skipped as f64),
        "the monitored count of skipped steps: {skipped_history:?}"
    );
    let monitor = report
        .callback::<LossScaleMonitor>()
        .expect("the engine's loss-scale monitor");
    assert_eq!(monitor.skipped_steps(), skipped as u64);
    let skipped_var = report
        .session
        .graph()
        .find_variable(LOSS_SCALE_SKIPPED_STEPS)
        .expect("the count is a variable");
    let on_device = report
        .session
        .as_mut()
        .read_variable(skipped_var)
        .expect("read")
        .scalar_value()
        .expect("scalar");
    assert_eq!(on_device, skipped as f64, "the checkpointed count");

    // A monitor of the user's replaces the engine's: fetching every step, it sees every move.
    let c = bare(config(mlp_model(0.1), train_flow(256, 32, 1), None))
        .precision(Precision::Fp16)
        .loss_scale(Some(scaling))
        .callback(LossScaleMonitor::new().every(1))
        .max_epoch(3);
    let own = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert_eq!(
        own.callbacks_of::<LossScaleMonitor>().len(),
        1,
        "one monitor"
    );
    let every: Vec<f64> = own.history("loss_scale").iter().map(|h| h.1).collect();
    let per_step: Vec<f64> = seen.iter().map(|s| s.1).collect();
    assert_eq!(every, per_step, "the scale after every step");
    assert_eq!(
        own.history("loss_scale/skipped_steps").len(),
        skipped,
        "one count per skipped step"
    );
    assert!(
        seen[0].1 < scaling.initial_scale,
        "the first step overflowed"
    );
    let final_scale = report
        .session
        .as_mut()
        .read_variable(scale_var)
        .expect("read")
        .scalar_value()
        .expect("scalar");
    assert_eq!(
        final_scale, scale,
        "the variable holds the last monitored scale"
    );
}

/// One run of the 784-32-10 MLP on 2,048 digits for 6 epochs in `precision`: the held-out
/// error and loss on 1,000 validation digits, and whether the graph has a loss scale.
fn train_in(precision: Precision) -> (f64, f64, bool) {
    let infs: Vec<Box<dyn Inferencer>> = vec![
        Box::new(ScalarStats::new(&["cross_entropy_loss"])),
        Box::new(ClassificationError::default()),
    ];
    let c = bare(config(mlp_model(0.02), train_flow(2048, 32, 1), None))
        .precision(precision)
        .callback(InferenceRunner::new(val_flow(1000, 100), infs))
        .max_epoch(6);
    assert_eq!(
        c.loss_scale.is_some(),
        precision == Precision::Fp16,
        "only fp16 scales its loss by default"
    );
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let error = report.history("validation_error").last().expect("error").1;
    let loss = report
        .history("validation_cross_entropy_loss")
        .last()
        .expect("loss")
        .1;
    let scaled = report.session.graph().find_variable(LOSS_SCALE).is_some();
    (error, loss, scaled)
}

#[test]
fn bf16_and_fp16_training_learn_like_fp32() {
    let (e32, l32, s32) = train_in(Precision::Fp32);
    let (e_bf, l_bf, s_bf) = train_in(Precision::Bf16);
    let (e_h, l_h, s_h) = train_in(Precision::Fp16);
    eprintln!("held-out error fp32 {e32}, bf16 {e_bf}, fp16 {e_h}; loss {l32} {l_bf} {l_h}");
    assert_eq!(
        (s32, s_bf, s_h),
        (false, false, true),
        "only fp16 has a loss scale"
    );
    assert!(e32 < 0.2, "fp32 learns: {e32}");
    // Measured on every SIMD level (avx512, avx2, scalar; 1 and 2 threads): fp32 11.8%,
    // bf16 11.6%, fp16 11.7% held-out error — 0.2 points apart, against a bound of 1 point.
    for (name, e) in [("bf16", e_bf), ("fp16", e_h)] {
        assert!(
            (e - e32).abs() <= 0.01,
            "{name} held-out error {e} vs fp32 {e32}"
        );
    }
    // The 16-bit runs really rounded: their losses are not fp32's.
    assert_ne!(l_bf, l32);
    assert_ne!(l_h, l32);
}

/// Checkpoints hold f32 variables in every precision: an fp32 run resumes in fp16 (its loss
/// scale starts at the default) and that run's checkpoint, which also holds the scale,
/// resumes in fp32 again.
#[test]
fn checkpoints_resume_across_precisions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |precision: Precision, epochs: u64| {
        let c = bare(config(
            mlp_model(0.02),
            train_flow(128, 32, 1),
            Some(dir.path()),
        ))
        .precision(precision)
        .callback(ModelSaver::new())
        .auto_resume(true)
        .max_epoch(epochs);
        launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train")
    };
    let first = run(Precision::Fp32, 1);
    assert_eq!(first.counters.global_step, 4);
    let mut second = run(Precision::Fp16, 2);
    assert_eq!(second.resumed.as_ref().map(|r| r.global_step), Some(4));
    let id = second
        .session
        .graph()
        .find_variable(LOSS_SCALE)
        .expect("fp16 has a scale");
    let scale = second.session.as_mut().read_variable(id).expect("read");
    assert_eq!(
        scale.scalar_value().ok(),
        Some(65536.0),
        "no overflow: unchanged"
    );
    let third = run(Precision::Fp32, 3);
    assert_eq!(third.resumed.as_ref().map(|r| r.global_step), Some(8));
    assert_eq!(third.counters.global_step, 12);
}
