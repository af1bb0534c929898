//! The loop: tensorpack's counters at every hook, registration order = call order, hooked runs
//! that merge callback fetches and targets into the trainer's step, clean stops, after_train
//! isolation, chief-only filtering and the default steps_per_epoch.

use crate::train_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use towerpack::data::DataFlow;
use towerpack::dsl::prelude::*;
use towerpack::ir::{NodeId, Value};
use towerpack::optim::GLOBAL_STEP;
use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::{ModelSaver, ProgressBar};
use towerpack::train::*;
use train_common::*;

#[test]
fn counters_follow_tensorpack_at_every_hook() {
    let log = log();
    let c = bare(config(mlp_model(0.1), train_flow(96, 32, 1), None))
        .callback(Recorder::new("r", &log, &[]))
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let mut want = vec![
        "r setup_graph e=0 l=-1 g=0".to_string(),
        "r before_train e=0 l=-1 g=0".into(),
    ];
    let mut g = 0;
    for e in 1..=2u64 {
        let l_before = if e == 1 { -1 } else { 2 };
        want.push(format!("r before_epoch e={e} l={l_before} g={g}"));
        for l in 0..3 {
            want.push(format!("r before_run e={e} l={l} g={g}"));
            g += 1;
            want.push(format!("r after_run e={e} l={l} g={g}"));
            want.push(format!("r trigger_step e={e} l={l} g={g}"));
        }
        want.push(format!("r after_epoch e={e} l=2 g={g}"));
        want.push(format!("r trigger_epoch e={e} l=2 g={g}"));
        want.push(format!("r trigger e={e} l=2 g={g}"));
    }
    want.push(format!("r after_train e=2 l=2 g={g}"));
    assert_eq!(entries(&log), want);
    assert_eq!(report.counters.global_step, 6);
    assert_eq!(report.stopped, None);
    let id = report
        .session
        .graph()
        .find_variable(GLOBAL_STEP)
        .expect("global_step");
    let value = report.session.read_variable(id).expect("read");
    assert_eq!(value.scalar_value().expect("scalar"), 6.0);
}

/// Records `trigger_epoch` into a shared log, as a monitor.
struct RecordingMonitor(Log);

impl TrainingMonitor for RecordingMonitor {
    fn trigger_epoch(&mut self, at: &monitors::StepStamp) -> Result<(), TrainError> {
        self.0
            .lock()
            .expect("log")
            .push(format!("monitor trigger_epoch e={}", at.epoch_num));
        Ok(())
    }
}

#[test]
fn registration_order_is_call_order_with_monitors_last() {
    let log = log();
    let c = config(mlp_model(0.1), train_flow(64, 32, 1), None)
        .callback(Recorder::new("a", &log, &["trigger_epoch"]))
        .callback(Recorder::new("b", &log, &["trigger_epoch"]))
        .monitors(vec![Box::new(RecordingMonitor(log.clone()))])
        .data(QueueInput::new(train_flow(64, 32, 1)))
        .max_epoch(2);
    let c = TrainConfig {
        dataflow: None,
        ..c
    };
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert_eq!(
        report.callback_keys,
        [
            "InputSource",
            "QueueInput/queue_size",
            "MaintainStepCounter",
            "a",
            "b",
            "MovingAverageSummary",
            "ProgressBar",
            "MergeAllSummaries",
            "RunUpdateOps",
            "LogHyperParams",
            "Monitors"
        ]
    );
    assert_eq!(
        entries(&log),
        [
            "a trigger_epoch e=1 l=1 g=2",
            "b trigger_epoch e=1 l=1 g=2",
            "monitor trigger_epoch e=1",
            "a trigger_epoch e=2 l=1 g=4",
            "b trigger_epoch e=2 l=1 g=4",
            "monitor trigger_epoch e=2",
        ]
    );
    // The queue statistic of the input source reached the monitors.
    assert_eq!(report.history("QueueInput/queue_size").len(), 2);
}

/// Adds a counter variable and an assign incrementing it to every hooked run, and fetches the
/// cost along with the step.
struct SameStep {
    counter: Option<(NodeId, Value)>,
    cost: Option<Value>,
    seen: Arc<std::sync::Mutex<Vec<(u64, f64)>>>,
}

impl Callback for SameStep {
    fn chief_only(&self) -> bool {
        false
    }
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.cost = Some(ctx.get_tensor("cost")?);
        self.counter = ctx
            .with_builder("SameStep", |b| {
                let spec = VarSpec::new(&[]).dtype(DType::I64).trainable(false);
                let v = b.get_variable_by_full_name("runs", &spec);
                let next = &v + v.scalar_like(1.0);
                (
                    b.assign(&v, &next).expect("assign"),
                    v.value().expect("read"),
                )
            })
            .ok();
        Ok(())
    }
    fn before_run(&mut self, _: &TrainContext) -> Result<RunArgs, TrainError> {
        let (assign, read) = self.counter.expect("setup");
        Ok(RunArgs {
            fetches: vec![read, self.cost.expect("cost")],
            targets: vec![assign],
            feeds: Vec::new(),
        })
    }
    fn after_run(
        &mut self,
        ctx: &mut TrainContext,
        fetched: &[HostTensor],
    ) -> Result<(), TrainError> {
        // Reads see the start of the step: the counter equals the runs before this one.
        let runs = fetched[0].scalar_value().expect("scalar") as u64;
        assert_eq!(runs + 1, ctx.global_step());
        self.seen
            .lock()
            .expect("seen")
            .push((runs, fetched[1].scalar_value().expect("cost")));
        Ok(())
    }
}

/// Runs the train op and fetches the cost itself.
struct FetchingTrainer {
    inner: SimpleTrainer,
    cost: Option<Value>,
    costs: Vec<f64>,
}

impl Trainer for FetchingTrainer {
    fn setup_graph(&mut self, setup: &mut GraphSetup<'_>) -> Result<BuiltGraph, TrainError> {
        let built = self.inner.setup_graph(setup)?;
        self.cost = Some(built.losses[0].1);
        Ok(built)
    }
    fn run_step(&mut self, runner: &mut StepRunner<'_>) -> Result<(), TrainError> {
        let op = self.inner.train_op().expect("train op");
        let v = runner.hooked_run(&[self.cost.expect("cost")], &[op])?;
        self.costs.push(v[0].scalar_value().expect("cost"));
        Ok(())
    }
    fn default_input(&self, flow: Box<dyn DataFlow>) -> Box<dyn InputSource> {
        self.inner.default_input(flow)
    }
}

#[test]
fn callback_fetches_and_targets_run_in_the_same_step() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let c = bare(config(mlp_model(0.1), train_flow(128, 32, 3), None))
        .callback(SameStep {
            counter: None,
            cost: None,
            seen: Arc::clone(&seen),
        })
        .backend(BackendChoice::Reference)
        .max_epoch(2);
    let mut trainer = FetchingTrainer {
        inner: SimpleTrainer::new(),
        cost: None,
        costs: Vec::new(),
    };
    let mut report = launch_train_with_config(c, &mut trainer).expect("train");
    let seen = seen.lock().expect("seen").clone();
    assert_eq!(seen.len(), 8);
    for (i, ((runs, cost), trainer_cost)) in seen.iter().zip(&trainer.costs).enumerate() {
        assert_eq!(*runs, i as u64);
        // One step: the callback's cost is the trainer's cost of the same batch, bit for bit.
        assert_eq!(cost.to_bits(), trainer_cost.to_bits(), "step {i}");
    }
    let id = report.session.graph().find_variable("runs").expect("runs");
    let runs = report
        .session
        .read_variable(id)
        .expect("read")
        .scalar_value()
        .expect("scalar");
    assert_eq!(runs, 8.0);
    // Consecutive steps see different batches: the costs are not all equal.
    assert!(trainer.costs.windows(2).any(|w| w[0] != w[1]));
    let _ = report.session.as_mut();
}

/// Stops at a given global step from `trigger_step`; records after_train.
struct StopAt(u64, Arc<AtomicBool>);

impl Callback for StopAt {
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if ctx.global_step() == self.0 {
            return Err(TrainError::stop(format!("asked to stop at {}", self.0)));
        }
        Ok(())
    }
    fn after_train(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        self.1.store(true, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn stop_training_is_clean_and_after_train_runs() {
    let ran = Arc::new(AtomicBool::new(false));
    let c = bare(config(mlp_model(0.1), train_flow(128, 32, 3), None))
        .callback(StopAt(6, Arc::clone(&ran)))
        .max_epoch(5);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("a clean stop");
    assert_eq!(report.stopped.as_deref(), Some("asked to stop at 6"));
    assert_eq!(report.counters.global_step, 6);
    assert_eq!(report.counters.epoch_num, 2);
    assert_eq!(report.counters.local_step, 1);
    assert!(ran.load(Ordering::SeqCst));
}

/// Fails in after_train (and optionally in trigger_step at a step).
struct FailingAfterTrain {
    fail_step: Option<u64>,
}

impl Callback for FailingAfterTrain {
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if self.fail_step == Some(ctx.global_step()) {
            return Err(TrainError::callback("FailingAfterTrain", "step failure"));
        }
        Ok(())
    }
    fn after_train(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        Err(TrainError::callback(
            "FailingAfterTrain",
            "after_train failure",
        ))
    }
}

/// Counts after_train calls.
struct CountAfterTrain(Arc<AtomicU64>);

impl Callback for CountAfterTrain {
    fn after_train(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn an_after_train_error_does_not_skip_the_others() {
    let count = Arc::new(AtomicU64::new(0));
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 3), None))
        .callback(FailingAfterTrain { fail_step: None })
        .callback(CountAfterTrain(Arc::clone(&count)))
        .max_epoch(1);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("fails");
    match err {
        TrainError::AfterTrain { count: 1, first } => {
            assert!(first.to_string().contains("after_train failure"), "{first}")
        }
        other => panic!("unexpected {other}"),
    }
    assert_eq!(count.load(Ordering::SeqCst), 1);

    // A failing step: the step's error is returned, and every after_train still ran.
    let count = Arc::new(AtomicU64::new(0));
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 3), None))
        .callback(FailingAfterTrain { fail_step: Some(1) })
        .callback(CountAfterTrain(Arc::clone(&count)))
        .max_epoch(1);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("fails");
    assert!(err.to_string().contains("step failure"), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// A non-chief worker.
struct Worker(SimpleTrainer);

impl Trainer for Worker {
    fn setup_graph(&mut self, setup: &mut GraphSetup<'_>) -> Result<BuiltGraph, TrainError> {
        self.0.setup_graph(setup)
    }
    fn run_step(&mut self, runner: &mut StepRunner<'_>) -> Result<(), TrainError> {
        self.0.run_step(runner)
    }
    fn is_chief(&self) -> bool {
        false
    }
}

#[test]
fn chief_only_callbacks_are_skipped_on_other_workers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(64, 32, 3),
        Some(dir.path()),
    ))
    .callback(ModelSaver::new())
    .callback(ProgressBar::new().plain_to(std::io::sink()))
    .max_epoch(1);
    let report = launch_train_with_config(c, &mut Worker(SimpleTrainer::new())).expect("train");
    assert!(!report.callback_keys.iter().any(|k| k == "ModelSaver"));
    assert!(report.callback_keys.iter().any(|k| k == "ProgressBar"));
    assert!(!dir.path().join("checkpoint").exists());

    let c = bare(config(
        mlp_model(0.1),
        train_flow(64, 32, 3),
        Some(dir.path()),
    ))
    .callback(ModelSaver::new().set_chief_only(false))
    .max_epoch(1);
    let report = launch_train_with_config(c, &mut Worker(SimpleTrainer::new())).expect("train");
    assert!(report.callback_keys.iter().any(|k| k == "ModelSaver"));
    assert!(dir.path().join("model-2.safetensors").exists());
}

#[test]
fn steps_per_epoch_defaults_to_the_input_size() {
    let c = bare(config(mlp_model(0.1), train_flow(160, 32, 3), None)).max_epoch(1);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert_eq!(report.counters.steps_per_epoch, 5);
    assert_eq!(report.counters.global_step, 5);

    // Unknown size: an error naming the fix.
    let c = TrainConfig::new(mlp_model(0.1))
        .data(DummyConstantInput::new(vec![vec![8, 28, 28, 1], vec![8]]))
        .backend(cpu())
        .max_epoch(1);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("fails");
    assert!(err.to_string().contains("steps_per_epoch"), "{err}");

    // dataflow XOR data.
    let c = config(mlp_model(0.1), train_flow(64, 32, 3), None)
        .data(DummyConstantInput::new(vec![vec![8, 28, 28, 1], vec![8]]));
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("fails");
    assert!(err.to_string().contains("not both"), "{err}");

    // DummyConstantInput with an explicit size trains on zeros.
    let c = bare(
        TrainConfig::new(mlp_model(0.1))
            .data(DummyConstantInput::new(vec![vec![8, 28, 28, 1], vec![8]]))
            .backend(cpu())
            .steps_per_epoch(3)
            .max_epoch(2),
    );
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert_eq!(report.counters.global_step, 6);
}

#[test]
fn no_op_trainer_runs_hooks_and_counts_steps_without_data() {
    let log = log();
    let c = bare(config(mlp_model(0.1), train_flow(64, 32, 3), None))
        .callback(Recorder::new("r", &log, &["after_run"]))
        .steps_per_epoch(4)
        .max_epoch(2);
    let start = Arc::new(std::sync::Mutex::new(None));
    let (s1, s2) = (Arc::clone(&start), Arc::clone(&start));
    let c = c.callback(
        CallbackFactory::new("check")
            .on_before_train(move |ctx| {
                *s1.lock().expect("start") = ctx.input_state();
                Ok(())
            })
            .on_after_train(move |ctx| {
                // The empty steps read no input: nothing was consumed.
                assert_eq!(ctx.input_state(), *s2.lock().expect("start"));
                Ok(())
            }),
    );
    let report = launch_train_with_config(c, &mut NoOpTrainer).expect("train");
    assert_eq!(report.counters.global_step, 8);
    assert_eq!(entries(&log).len(), 8);
}
