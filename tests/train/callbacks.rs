//! Built-in callbacks on a real loop: savers and their files, validation numbers checked
//! against an offline predictor, BatchNorm EMA updates, moving averages recomputed by hand,
//! summaries, progress reporting and the non-finite guard.

use crate::train_common;

use std::sync::{Arc, Mutex};

use towerpack::data::{BatchData, DataFlow, DataFromList};
use towerpack::dsl::prelude::*;
use towerpack::ir::Value;
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::train::callbacks::*;
use towerpack::train::checkpoint::{CheckpointIndex, list_checkpoints, load_checkpoint};
use towerpack::train::*;
use train_common::*;

fn steps_of(dir: &std::path::Path) -> Vec<u64> {
    list_checkpoints(dir)
        .expect("list")
        .into_iter()
        .map(|(_, s)| s)
        .collect()
}

#[test]
fn model_saver_keeps_the_newest_and_saves_every_variable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let saver = PeriodicTrigger::new(
        ModelSaver::new()
            .max_to_keep(2)
            .keep_checkpoint_every_n_hours(0.0),
    )
    .every_k_steps(2);
    let c = config(mlp_model(0.1), train_flow(128, 32, 1), Some(dir.path()))
        .callback(saver)
        .max_epoch(2);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert_eq!(steps_of(dir.path()), [6, 8]);
    let index = CheckpointIndex::read(dir.path())
        .expect("index")
        .expect("exists");
    assert_eq!(index.latest.as_deref(), Some("model-8.safetensors"));
    let ckpt = load_checkpoint(dir.path()).expect("load");
    for name in [
        "fc0/W",
        "fc0/b",
        "linear/W",
        "fc0/W/Momentum",
        "global_step",
        "learning_rate",
        "EMA/cross_entropy_loss",
    ] {
        assert!(
            ckpt.tensors.contains_key(name),
            "{name} missing: {:?}",
            ckpt.tensors.keys()
        );
    }
    assert_eq!(
        ckpt.tensors["global_step"].scalar_value().expect("scalar"),
        8.0
    );
    assert_eq!(ckpt.metadata["global_step"], "8");
    assert_eq!(ckpt.metadata["epoch_num"], "2");
    assert!(ckpt.metadata.contains_key("towerpack.resume"));

    // With an hourly rule shorter than a step, every checkpoint is preserved for good.
    let dir = tempfile::tempdir().expect("tempdir");
    let saver = PeriodicTrigger::new(
        ModelSaver::new()
            .max_to_keep(1)
            .keep_checkpoint_every_n_hours(1e-9),
    )
    .every_k_steps(2);
    let c = bare(config(
        mlp_model(0.1),
        train_flow(128, 32, 1),
        Some(dir.path()),
    ))
    .callback(saver)
    .max_epoch(1);
    launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    assert_eq!(steps_of(dir.path()), [2, 4]);
}

#[test]
fn min_and_max_savers_copy_the_best_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = bare(config(
        mlp_model(0.1),
        train_flow(64, 32, 1),
        Some(dir.path()),
    ))
    .callback(ScriptedStat::new("val", &[3.0, 1.0, 2.0, 0.5, 4.0]))
    .callback(ModelSaver::new())
    .callback(MinSaver::new("val"))
    .callback(MaxSaver::new("val"))
    .max_epoch(5);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let read = |name: &str| std::fs::read(dir.path().join(name)).expect(name);
    // Two steps per epoch: the minimum 0.5 was after epoch 4 (step 8), the maximum 4.0 after 5.
    assert_eq!(read("min-val.safetensors"), read("model-8.safetensors"));
    assert_eq!(read("max-val.safetensors"), read("model-10.safetensors"));
    let min: Vec<_> = report
        .callbacks_of::<MinSaver>()
        .iter()
        .map(|m| m.best())
        .collect();
    assert_eq!(min, [Some((8, 0.5)), Some((10, 4.0))]);
    // The best value is part of the resume state.
    let ckpt = load_checkpoint(&dir.path().join("model-10.safetensors")).expect("load");
    assert!(ckpt.metadata["towerpack.resume"].contains("\"MinSaver(val)\":{\"best\":[8,0.5]}"));
}

#[test]
fn inference_runner_matches_an_offline_predictor() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 100 validation digits in batches of 32: the last batch has 4.
    let infs: Vec<Box<dyn Inferencer>> = vec![
        Box::new(ScalarStats::new(&["cross_entropy_loss"])),
        Box::new(ClassificationError::default()),
    ];
    let c = bare(config(
        mlp_model(0.1),
        train_flow(256, 32, 1),
        Some(dir.path()),
    ))
    .callback(InferenceRunner::new(val_flow(100, 32), infs))
    .callback(ModelSaver::new())
    .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let error = report.history("validation_error");
    let loss = report.history("validation_cross_entropy_loss");
    assert_eq!(error.len(), 2);
    assert_eq!(loss.len(), 2);

    let config = PredictConfig::new(
        Arc::new(mlp_model(0.1)),
        &["wrong_vector", "cross_entropy_loss"],
    )
    .session_init(SaverRestore::new(dir.path()))
    .backend(cpu());
    let mut predictor = OfflinePredictor::new(config).expect("predictor");
    let mut flow = val_flow(100, 32);
    flow.reset_state().expect("reset");
    let (mut wrong, mut count, mut losses) = (0.0, 0usize, Vec::new());
    while let Some(batch) = flow.next_datapoint().expect("batch") {
        let out = predictor.predict(&batch).expect("predict");
        wrong += out[0].to_f64_vec().iter().sum::<f64>();
        count += out[0].len();
        losses.push(out[1].scalar_value().expect("scalar"));
    }
    assert_eq!(count, 100);
    // Σ wrong / Σ examples, not the mean of per-batch rates (the last batch is smaller).
    assert_eq!(error[1].1, wrong / 100.0);
    let mean_loss = losses.iter().sum::<f64>() / losses.len() as f64;
    assert!(
        close(loss[1].1, mean_loss, 1e-5),
        "{} vs {mean_loss}",
        loss[1].1
    );
    assert!(
        error[1].1 < 0.5,
        "the model should learn something: {}",
        error[1].1
    );
}

#[test]
fn run_update_ops_updates_batchnorm_statistics() {
    let ema = |with: bool| {
        let mut c = bare(config(bn_dropout_model(0.05), train_flow(64, 32, 1), None)).max_epoch(1);
        if with {
            c = c.callback(RunUpdateOps::new());
        }
        let mut report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
        let id = report
            .session
            .graph()
            .find_variable("bn0/bn/mean/EMA")
            .expect("ema");
        report
            .session
            .as_mut()
            .read_variable(id)
            .expect("read")
            .to_f64_vec()
    };
    assert!(
        ema(false).iter().all(|&x| x == 0.0),
        "no updates without RunUpdateOps"
    );
    assert!(
        ema(true).iter().any(|&x| x != 0.0),
        "RunUpdateOps applies the EMA assigns"
    );
}

/// Fetches a tensor by name with every step.
struct Fetch {
    name: &'static str,
    value: Option<Value>,
    seen: Arc<Mutex<Vec<f32>>>,
}

impl Callback for Fetch {
    fn chief_only(&self) -> bool {
        false
    }
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.value = Some(ctx.get_tensor(self.name)?);
        Ok(())
    }
    fn before_run(&mut self, _: &TrainContext) -> Result<RunArgs, TrainError> {
        Ok(RunArgs::fetch(self.value.into_iter().collect()))
    }
    fn after_run(
        &mut self,
        _: &mut TrainContext,
        fetched: &[HostTensor],
    ) -> Result<(), TrainError> {
        self.seen
            .lock()
            .expect("seen")
            .push(fetched[0].to_f32_vec()[0]);
        Ok(())
    }
}

#[test]
fn moving_average_summary_keeps_tensorpacks_ema() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let c = bare(config(mlp_model(0.1), train_flow(128, 32, 1), None))
        .callback(Fetch {
            name: "cross_entropy_loss",
            value: None,
            seen: Arc::clone(&seen),
        })
        .callback(MovingAverageSummary::new())
        .max_epoch(2);
    let mut report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    // ema = 0.95 ema + 0.05 x from 0, in f32, after every step; put with each epoch's last step.
    let mut ema = 0f32;
    let mut at_epoch_end = Vec::new();
    for (i, x) in seen.lock().expect("seen").iter().enumerate() {
        ema = ema * 0.95f32 + x * (1.0f32 - 0.95f64 as f32);
        if i % 4 == 3 {
            at_epoch_end.push(ema);
        }
    }
    let history = report.history("cross_entropy_loss").to_vec();
    assert_eq!(history.iter().map(|h| h.0).collect::<Vec<_>>(), [4, 8]);
    for ((_, got), want) in history.iter().zip(&at_epoch_end) {
        assert!(close(*got, f64::from(*want), 1e-5), "{got} vs {want}");
    }
    for name in ["train_error", "wd_cost"] {
        assert_eq!(report.history(name).len(), 2, "{name}");
    }
    let id = report
        .session
        .graph()
        .find_variable("EMA/cross_entropy_loss")
        .expect("var");
    let var = report
        .session
        .as_mut()
        .read_variable(id)
        .expect("read")
        .scalar_value()
        .expect("s");
    assert!(close(var, f64::from(ema), 1e-5));
}

/// Collects histograms and scalars the monitors receive.
#[derive(Default)]
struct Collect {
    histograms: Vec<(String, u64, usize)>,
}

impl TrainingMonitor for Collect {
    fn process_histogram(
        &mut self,
        name: &str,
        values: &HostTensor,
        at: &monitors::StepStamp,
    ) -> Result<(), TrainError> {
        self.histograms
            .push((name.to_string(), at.global_step, values.len()));
        Ok(())
    }
}

#[test]
fn merge_all_summaries_emits_the_summaries_collection() {
    let inputs = mlp_model(0.1).inputs();
    let tower = |x: &[Tensor]| {
        let logits = FullyConnected("linear", &x[0]).units(10).build();
        add_tensor_summary(&logits.named("logits"));
        let loss = sparse_softmax_cross_entropy(&logits, &x[1]).named("cost");
        add_tensor_summary(&loss);
        loss
    };
    let model = ModelFn::new(inputs, tower, Optimizer::sgd(0.1));
    let c = bare(config(model, train_flow(96, 32, 1), None))
        .callback(MergeAllSummaries::with_period(2))
        .monitors(vec![Box::new(Collect::default())])
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    // Local steps 1 (every 2) and 2 (the last of the epoch) of each 3-step epoch.
    let steps: Vec<u64> = report.history("cost").iter().map(|h| h.0).collect();
    assert_eq!(steps, [2, 3, 5, 6]);
    let collect = report.monitors.backend::<Collect>().expect("monitor");
    let hist: Vec<(String, u64, usize)> = collect.histograms.clone();
    assert_eq!(hist.len(), 4);
    assert!(hist.iter().all(|(n, _, len)| n == "logits" && *len == 320));
}

#[test]
fn progress_bar_writes_plain_lines_with_the_loss() {
    let c = bare(config(mlp_model(0.1), train_flow(128, 32, 1), None))
        .callback(
            ProgressBar::new()
                .period(std::time::Duration::ZERO)
                .plain_to(std::io::sink()),
        )
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let bar = report.callback::<ProgressBar>().expect("bar");
    assert_eq!(bar.lines().len(), 8);
    assert!(
        bar.lines()[0].starts_with("Epoch 1 [1/4]"),
        "{}",
        bar.lines()[0]
    );
    assert!(
        bar.lines()[7].starts_with("Epoch 2 [4/4]"),
        "{}",
        bar.lines()[7]
    );
    assert!(bar.lines().iter().all(|l| l.contains("cost=")));
    let (name, loss) = &bar.postfix()[0];
    assert_eq!(name, "cost");
    assert!(loss.is_finite() && *loss > 0.0);

    // A long period prints only the last step of each epoch.
    let c = bare(config(mlp_model(0.1), train_flow(128, 32, 1), None))
        .callback(ProgressBar::new().plain_to(std::io::sink()))
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let lines = report
        .callback::<ProgressBar>()
        .expect("bar")
        .lines()
        .to_vec();
    assert_eq!(lines.len(), 2);
    assert!(lines[1].starts_with("Epoch 2 [4/4]"));
}

#[test]
fn progress_bar_fetches_the_loss_every_nth_step_and_the_last_of_each_epoch() {
    // 7 steps per epoch; a plain line after every step shows the last fetched cost.
    let costs = |every: u64| -> Vec<String> {
        let bar = ProgressBar::new()
            .fetch_every(every)
            .period(std::time::Duration::ZERO)
            .plain_to(std::io::sink());
        let c = bare(config(mlp_model(0.1), train_flow(224, 32, 1), None))
            .callback(bar)
            .max_epoch(1);
        let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
        let bar = report.callback::<ProgressBar>().expect("bar");
        bar.lines()
            .iter()
            .map(|l| l.split("cost=").nth(1).expect("a cost").to_string())
            .collect()
    };
    let each = costs(1);
    assert_eq!(each.len(), 7);
    // Every step's own cost: training moves it every step.
    assert!(each.windows(2).all(|w| w[0] != w[1]), "{each:?}");
    // Every 3rd: local steps 0, 3 and 6 (the last) fetch, the others show the last fetched.
    let third = costs(3);
    let shown: Vec<&str> = [0, 0, 0, 3, 3, 3, 6]
        .iter()
        .map(|&i| each[i].as_str())
        .collect();
    assert_eq!(third, shown);
}

#[test]
fn progress_bar_draws_an_indicatif_bar_per_epoch() {
    let bar = ProgressBar::new().bar_to(indicatif::ProgressDrawTarget::hidden);
    let c = bare(config(mlp_model(0.1), train_flow(128, 32, 1), None))
        .callback(bar)
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let bar = report.callback::<ProgressBar>().expect("bar");
    assert!(bar.lines().is_empty());
    let finished = bar.finished_bars();
    assert_eq!(
        finished.iter().map(|f| (f.0, f.1)).collect::<Vec<_>>(),
        [(1, 4), (2, 4)]
    );
    assert!(
        finished.iter().all(|f| f.2.starts_with("cost=")),
        "{finished:?}"
    );
}

#[test]
fn time_estimates_and_throughput_are_reported_per_epoch() {
    let c = bare(config(mlp_model(0.1), train_flow(128, 32, 1), None))
        .callback(EstimatedTimeLeft::new())
        .callback(ThroughputTracker::new())
        .callback(ThroughputTracker::new().samples_per_step(32))
        .max_epoch(3);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let eta = report
        .callback::<EstimatedTimeLeft>()
        .expect("eta")
        .estimates()
        .to_vec();
    // No estimate after the last epoch; epoch e estimates (3 - e) epochs.
    assert_eq!(eta.iter().map(|e| e.0).collect::<Vec<_>>(), [1, 2]);
    assert!(eta.iter().all(|e| e.1.as_secs_f64() > 0.0));
    let steps = report.history("Throughput (steps/sec)");
    let samples = report.history("Throughput (samples/sec)");
    assert_eq!(steps.len(), 3);
    assert_eq!(samples.len(), 3);
    for (s, x) in steps.iter().zip(samples) {
        assert!(s.1 > 0.0);
        assert!(
            x.1 > s.1,
            "samples/sec exceeds steps/sec with 32 samples per step"
        );
    }
}

/// `x` (ones or zeros) and a model whose loss or gradient becomes non-finite.
fn degenerate(loss_kind: bool, value: f32) -> (ModelFn, BatchData) {
    let inputs = vec![InputSpec::new("x", DType::F32, Shape::batched(&[1]))];
    let tower = move |x: &[Tensor]| {
        let w = get_variable("w", &VarSpec::new(&[1]));
        if loss_kind {
            // log(x + w) at x = w = 0 is -inf.
            (&x[0] + &w).log().mean().named("cost")
        } else {
            // sqrt(w) at w = 0 is finite (0), its gradient 0.5 / sqrt(w) is not.
            (w.sqrt() * x[0].mean()).sum().named("cost")
        }
    };
    let items = (0..8)
        .map(|_| vec![HostTensor::from_f32(&[1], vec![value]).expect("x")])
        .collect();
    let flow = BatchData::new(DataFromList::new(items), 4, false).expect("batch");
    (ModelFn::new(inputs, tower, Optimizer::sgd(0.1)), flow)
}

/// The tensor and step of the `NonFiniteGuard` error that `c` stops with.
fn non_finite_error(c: TrainConfig) -> (String, u64) {
    match launch_train_with_config(c, &mut SimpleTrainer::new()).err() {
        Some(TrainError::NonFinite {
            tensor,
            global_step,
        }) => (tensor, global_step),
        other => panic!("expected a non-finite loss or gradient, got {other:?}"),
    }
}

/// Counts the steps that finished (their `trigger_step`).
#[derive(Default)]
struct StepCount(Arc<Mutex<u64>>);

impl Callback for StepCount {
    fn trigger_step(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        *self.0.lock().expect("count") += 1;
        Ok(())
    }
}

/// `sqrt(w · x)`, `w` from 1, on 30 batches of `x = 1` but for batch `bad`, where `x = 0`: a
/// finite loss (0) whose gradient `x / (2·sqrt(w·x))` is 0/0 — step `bad + 1` has the first
/// non-finite gradient, and every later step a NaN loss.
fn nan_gradient_at(bad: usize) -> (ModelFn, BatchData) {
    let inputs = vec![InputSpec::new("x", DType::F32, Shape::batched(&[1]))];
    let tower = |x: &[Tensor]| {
        let w = get_variable("w", &VarSpec::new(&[1]).init(Initializer::Ones));
        (&w * &x[0]).sqrt().mean().named("cost")
    };
    let items = (0..30 * 4)
        .map(|i| {
            let x = if i / 4 == bad { 0.0 } else { 1.0 };
            vec![HostTensor::from_f32(&[1], vec![x]).expect("x")]
        })
        .collect();
    let flow = BatchData::new(DataFromList::new(items), 4, false).expect("batch");
    (ModelFn::new(inputs, tower, Optimizer::sgd(0.05)), flow)
}

/// The guard reads the device's record every 10th step (and the last of an epoch): a gradient
/// that goes non-finite in step 13 stops the run at the check of step 21 — 20 steps finished
/// — and the error names the tensor and step 13, not the NaN loss of steps 14 to 21. With
/// `check_every(1)` the run stops in step 13 itself.
#[test]
fn the_non_finite_guard_checks_now_and_then_and_names_the_first_bad_step() {
    for (every, finished) in [(None, 20), (Some(1), 12)] {
        let (model, flow) = nan_gradient_at(12);
        let steps = Arc::new(Mutex::new(0));
        let guard = match every {
            None => NonFiniteGuard::new(),
            Some(n) => NonFiniteGuard::new().check_every(n),
        };
        let c = bare(TrainConfig::new(model).dataflow(flow).backend(cpu()))
            .callback(StepCount(Arc::clone(&steps)))
            .callback(guard)
            .max_epoch(1);
        let (tensor, step) = non_finite_error(c);
        assert_eq!((tensor.as_str(), step), ("the gradient of `w`", 13));
        assert_eq!(
            *steps.lock().expect("count"),
            finished,
            "check every {every:?}"
        );
    }
}

#[test]
fn the_non_finite_guard_names_the_first_bad_tensor() {
    let (model, flow) = degenerate(true, 0.0);
    let c = bare(TrainConfig::new(model).dataflow(flow).backend(cpu()))
        .callback(NonFiniteGuard::new())
        .max_epoch(3);
    let (tensor, step) = non_finite_error(c);
    assert_eq!((tensor.as_str(), step), ("loss `cost`", 1));

    let (model, flow) = degenerate(false, 1.0);
    let c = bare(TrainConfig::new(model).dataflow(flow).backend(cpu()))
        .callback(NonFiniteGuard::new())
        .max_epoch(3);
    assert_eq!(non_finite_error(c).0, "the gradient of `w`");

    // Loss-only mode misses the gradient of step 1 and sees the NaN loss it caused in step 2.
    let (model, flow) = degenerate(false, 1.0);
    let c = bare(TrainConfig::new(model).dataflow(flow).backend(cpu()))
        .callback(NonFiniteGuard::loss_only())
        .max_epoch(1);
    let (tensor, step) = non_finite_error(c);
    assert_eq!((tensor.as_str(), step), ("loss `cost`", 2));
}

/// `ClassificationError` from logits and labels counts exactly what the model's own
/// `wrong_vector` counts; top-k error falls with k and is 0 at k = classes; a labels tensor that
/// is not `[N]` is an error naming it.
#[test]
fn classification_error_from_logits_matches_the_models_wrong_vector() {
    let inferencers: Vec<Box<dyn Inferencer>> = vec![
        Box::new(ClassificationError::default()),
        Box::new(
            ClassificationError::from_logits("linear/output", "label").summary_name("from_logits"),
        ),
        Box::new(ClassificationError::from_logits("linear/output", "label").top_k(2)),
        Box::new(ClassificationError::from_logits("linear/output", "label").top_k(10)),
    ];
    let c = config(mlp_model(0.1), train_flow(256, 32, 1), None)
        .callback(InferenceRunner::new(val_flow(150, 40), inferencers))
        .max_epoch(2);
    let report = launch_train_with_config(c, &mut SimpleTrainer::new()).expect("train");
    let last = |name: &str| {
        report
            .history(name)
            .last()
            .unwrap_or_else(|| panic!("no {name}"))
            .1
    };
    let (top1, logits, top2) = (
        last("validation_error"),
        last("from_logits"),
        last("validation_error_top2"),
    );
    assert_eq!(top1, logits, "wrong_vector vs arg-max of the logits");
    assert!(top1 > 0.0 && top1 < 0.5, "error {top1}");
    assert!(top2 <= top1, "top-2 {top2} above top-1 {top1}");
    assert_eq!(last("validation_error_top10"), 0.0);

    // The input image given as labels: its shape is named in the error.
    let bad: Vec<Box<dyn Inferencer>> = vec![Box::new(ClassificationError::from_logits(
        "linear/output",
        "input",
    ))];
    let c = config(mlp_model(0.1), train_flow(64, 32, 1), None)
        .callback(InferenceRunner::new(val_flow(40, 40), bad))
        .max_epoch(1);
    let err = launch_train_with_config(c, &mut SimpleTrainer::new())
        .err()
        .expect("images are not labels")
        .to_string();
    assert!(
        err.contains("labels `input` must be [40]") && err.contains("[40, 28, 28, 1]"),
        "{err}"
    );
}
