//! Shared fixtures of the trainer tests: small MNIST flows, small models, a CPU backend with a
//! fixed thread count, and a callback that records every hook it sees.
#![allow(dead_code)]

use std::sync::{Arc, Mutex, OnceLock};

use towerpack::data::{BatchData, DataFlow, LabeledImages, mnist10k_split};
use towerpack::dsl::prelude::*;
use towerpack::graph;
use towerpack::models::{Mlp, classification_loss};
use towerpack::optim::Optimizer;
use towerpack::tensor::HostTensor;
use towerpack::train::{
    BackendChoice, Callback, ModelFn, RunArgs, TrainConfig, TrainContext, TrainError,
};

/// The embedded digits as f32 in [0, 1], parsed once.
fn digits() -> &'static (LabeledImages, LabeledImages) {
    static DIGITS: OnceLock<(LabeledImages, LabeledImages)> = OnceLock::new();
    DIGITS.get_or_init(|| {
        let split = mnist10k_split().expect("mnist10k");
        (
            split.train.to_f32(1.0 / 255.0),
            split.validation.to_f32(1.0 / 255.0),
        )
    })
}

/// `n` training digits from `offset`, shuffled every pass with `seed`, in batches.
pub fn train_flow(n: usize, batch: usize, seed: u64) -> BatchData {
    let data = digits().0.slice(0, n).expect("slice");
    BatchData::new(data.to_flow(Some(seed)).expect("flow"), batch, false).expect("batch")
}

/// `n` validation digits in order, the last batch smaller.
pub fn val_flow(n: usize, batch: usize) -> BatchData {
    let data = digits().1.slice(0, n).expect("slice");
    BatchData::new(data.to_flow(None).expect("flow"), batch, true).expect("batch")
}

/// A 784-32-10 MLP with momentum SGD.
pub fn mlp_model(lr: f64) -> ModelFn {
    let mlp = Mlp {
        input_shape: vec![28, 28, 1],
        hidden: vec![32],
        classes: 10,
        ..Mlp::default()
    };
    let inputs = mlp.inputs();
    ModelFn::new(inputs, move |x| mlp.build(x), Optimizer::momentum(lr, 0.9))
}

/// An MLP with BatchNorm (EMA updates in UPDATE_OPS) and Dropout (randomness per step).
pub fn bn_dropout_model(lr: f64) -> ModelFn {
    let inputs = vec![
        InputSpec::new("input", DType::F32, Shape::batched(&[28, 28, 1])),
        InputSpec::new("label", DType::I32, Shape::batched(&[])),
    ];
    let tower = |x: &[Tensor]| {
        let (image, label) = (&x[0], &x[1]);
        let logits = graph! {
            let l = FullyConnected("fc0", image, units = 32);
            let l = BNReLU("bn0", l);
            let l = Dropout("drop", l, rate = 0.25);
            FullyConnected("linear", l, units = 10)
        };
        classification_loss(&logits, label).named("cost")
    };
    ModelFn::new(inputs, tower, Optimizer::momentum(lr, 0.9))
}

/// The CPU backend with a fixed thread count (its results are deterministic for it).
pub fn cpu() -> BackendChoice {
    BackendChoice::Cpu { threads: 2 }
}

/// A config of `model` on `flow`, CPU backend, seed 7, files in `logdir` when given.
pub fn config(
    model: ModelFn,
    flow: impl DataFlow + 'static,
    logdir: Option<&std::path::Path>,
) -> TrainConfig {
    let mut c = TrainConfig::new(model)
        .dataflow(flow)
        .backend(cpu())
        .seed(7);
    if let Some(dir) = logdir {
        c = c.logdir(dir);
    }
    c
}

/// The events a [`Recorder`] saw.
pub type Log = Arc<Mutex<Vec<String>>>;

/// A fresh log.
pub fn log() -> Log {
    Arc::new(Mutex::new(Vec::new()))
}

/// The entries of `log`.
pub fn entries(log: &Log) -> Vec<String> {
    log.lock().expect("log").clone()
}

/// Records `"<tag> <hook> e=<epoch> l=<local_step> g=<global_step>"` for every hook.
pub struct Recorder {
    pub tag: String,
    pub log: Log,
    pub hooks: Vec<&'static str>,
}

impl Recorder {
    /// Records the `hooks` listed (all when empty).
    pub fn new(tag: &str, log: &Log, hooks: &[&'static str]) -> Recorder {
        Recorder {
            tag: tag.to_string(),
            log: Arc::clone(log),
            hooks: hooks.to_vec(),
        }
    }

    fn record(&self, hook: &'static str, ctx: &TrainContext) {
        if self.hooks.is_empty() || self.hooks.contains(&hook) {
            self.log.lock().expect("log").push(format!(
                "{} {hook} e={} l={} g={}",
                self.tag,
                ctx.epoch_num(),
                ctx.local_step(),
                ctx.global_step()
            ));
        }
    }
}

impl Callback for Recorder {
    fn name(&self) -> String {
        self.tag.clone()
    }
    fn chief_only(&self) -> bool {
        false
    }
    fn setup_graph(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.record("setup_graph", ctx);
        Ok(())
    }
    fn before_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.record("before_train", ctx);
        Ok(())
    }
    fn before_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.record("before_epoch", ctx);
        Ok(())
    }
    fn before_run(&mut self, ctx: &TrainContext) -> Result<RunArgs, TrainError> {
        self.record("before_run", ctx);
        Ok(RunArgs::none())
    }
    fn after_run(&mut self, ctx: &mut TrainContext, _: &[HostTensor]) -> Result<(), TrainError> {
        self.record("after_run", ctx);
        Ok(())
    }
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.record("trigger_step", ctx);
        Ok(())
    }
    fn after_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.record("after_epoch", ctx);
        Ok(())
    }
    fn trigger_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.record("trigger_epoch", ctx);
        self.trigger(ctx)
    }
    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.record("trigger", ctx);
        Ok(())
    }
    fn after_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.record("after_train", ctx);
        Ok(())
    }
}

/// No default callbacks and no monitors: only what a test adds.
pub fn bare(c: TrainConfig) -> TrainConfig {
    c.extra_callbacks(Vec::new()).monitors(Vec::new())
}

/// Puts `values[epoch - 1]` as scalar `name` at each epoch's trigger (a scripted statistic).
pub struct ScriptedStat {
    pub name: String,
    pub values: Vec<f64>,
}

impl ScriptedStat {
    pub fn new(name: &str, values: &[f64]) -> ScriptedStat {
        ScriptedStat {
            name: name.to_string(),
            values: values.to_vec(),
        }
    }
}

impl Callback for ScriptedStat {
    fn chief_only(&self) -> bool {
        false
    }
    fn trigger(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let i = ctx.epoch_num() as usize - 1;
        if let Some(&v) = self.values.get(i) {
            ctx.put_scalar(&self.name, v)?;
        }
        Ok(())
    }
}

/// `(epoch_num, value)` pairs recorded by a [`VariableProbe`].
pub type Seen = Arc<Mutex<Vec<(u64, f64)>>>;

/// Records `(epoch_num, value of variable name)` at every before_epoch and after training.
pub struct VariableProbe {
    pub name: String,
    pub seen: Arc<Mutex<Vec<(u64, f64)>>>,
}

impl VariableProbe {
    pub fn new(name: &str) -> (VariableProbe, Seen) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        (
            VariableProbe {
                name: name.to_string(),
                seen: Arc::clone(&seen),
            },
            seen,
        )
    }

    fn probe(&self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        let v = ctx
            .read_variable(&self.name)?
            .scalar_value()
            .expect("scalar");
        self.seen.lock().expect("seen").push((ctx.epoch_num(), v));
        Ok(())
    }
}

impl Callback for VariableProbe {
    fn chief_only(&self) -> bool {
        false
    }
    fn before_epoch(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.probe(ctx)
    }
    fn after_train(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        self.probe(ctx)
    }
}

/// Relative closeness of f32 results.
pub fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-12)
}

/// Every global variable of a finished run, by name, as little-endian bytes.
pub fn variable_bytes(session: &dyn towerpack::backend::Session) -> Vec<(String, Vec<u8>)> {
    map_global_variables(session, HostTensor::to_le_bytes)
}

/// Every global variable of a finished run, by name, as f64 values.
pub fn global_variable_values(
    session: &dyn towerpack::backend::Session,
) -> std::collections::BTreeMap<String, Vec<f64>> {
    map_global_variables(session, HostTensor::to_f64_vec)
}

/// `(name, f(value))` of every global variable of a finished run.
fn map_global_variables<T, C: FromIterator<(String, T)>>(
    session: &dyn towerpack::backend::Session,
    f: impl Fn(&HostTensor) -> T,
) -> C {
    let graph = session.graph();
    towerpack::tower::VarCollection::Global
        .variables(graph)
        .into_iter()
        .map(|id| {
            let value = session.read_variable(id).expect("read");
            (graph.variable(id).name.clone(), f(&value))
        })
        .collect()
}

/// Fails with an error (a simulated crash) in `trigger_step` at global step `at`.
pub struct Abort {
    pub at: u64,
}

impl Callback for Abort {
    fn chief_only(&self) -> bool {
        false
    }
    fn trigger_step(&mut self, ctx: &mut TrainContext) -> Result<(), TrainError> {
        if ctx.global_step() == self.at {
            return Err(TrainError::callback(
                "Abort",
                format!("simulated crash at {}", self.at),
            ));
        }
        Ok(())
    }
}

/// `stats.json` records without the statistics that depend on timing.
pub fn deterministic_stats(dir: &std::path::Path) -> Vec<String> {
    towerpack::train::summary::load_existing_json(dir)
        .expect("stats")
        .expect("exists")
        .into_iter()
        .map(|mut r| {
            r.scalars
                .retain(|k, _| !k.starts_with("QueueInput") && !k.starts_with("Throughput"));
            format!("{} {} {:?}", r.epoch_num, r.global_step, r.scalars)
        })
        .collect()
}

/// A run exercising every kind of state: BatchNorm EMAs and dropout (RNG by global step), a
/// prefetching input, momentum slots, moving averages, a shuffled validation set, a schedule,
/// a plateau setter, a min saver and early stopping; checkpoints every 4 steps.
pub fn full_config(dir: &std::path::Path) -> TrainConfig {
    use towerpack::train::callbacks::*;
    let infs: Vec<Box<dyn Inferencer>> = vec![
        Box::new(ScalarStats::new(&["cross_entropy_loss"])),
        Box::new(ClassificationError::default()),
    ];
    let val = {
        let data = mnist10k_split()
            .expect("mnist")
            .validation
            .slice(0, 48)
            .expect("slice");
        BatchData::new(
            data.to_f32(1.0 / 255.0).to_flow(Some(5)).expect("flow"),
            20,
            true,
        )
        .expect("batch")
    };
    TrainConfig::new(bn_dropout_model(0.05))
        .data(towerpack::train::QueueInput::new(train_flow(192, 32, 9)).capacity(4))
        .callback(PeriodicTrigger::new(ModelSaver::new()).every_k_steps(4))
        .callback(InferenceRunner::new(val, infs))
        .callback(ScheduledHyperParamSetter::new("learning_rate", &[(0, 0.05), (4, 0.01)]).linear())
        .callback(StatMonitorParamSetter::new(
            "learning_rate",
            "validation_error",
            |v| v * 0.7,
            0.5,
            1,
        ))
        .callback(MinSaver::new("validation_error"))
        .callback(EarlyStopping::new("validation_error", 100, Mode::Min))
        .callback(ProgressBar::new().plain_to(std::io::sink()))
        .backend(cpu())
        .seed(11)
        .logdir(dir)
        .max_epoch(4)
}

/// Sleeps after every step (no fetches: the steps the backend runs are unchanged), so a parent
/// process has time to kill or interrupt a child run in the middle.
pub struct SlowSteps;

impl Callback for SlowSteps {
    fn chief_only(&self) -> bool {
        false
    }
    fn trigger_step(&mut self, _: &mut TrainContext) -> Result<(), TrainError> {
        std::thread::sleep(std::time::Duration::from_millis(40));
        Ok(())
    }
}

/// The global step of the latest checkpoint in `dir`, if any.
pub fn latest_step(dir: &std::path::Path) -> Option<u64> {
    let path = towerpack::train::checkpoint::latest_checkpoint(dir).ok()??;
    towerpack::train::checkpoint::step_of_file_name(path.file_name()?.to_str()?)
}

/// Returns once `child` wrote a checkpoint of step `at_least` or later in `dir` (fails the
/// test when the child ends first or nothing appears within two minutes).
pub fn wait_for_checkpoint(child: &mut std::process::Child, dir: &std::path::Path, at_least: u64) {
    let started = std::time::Instant::now();
    while latest_step(dir).is_none_or(|s| s < at_least) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "no checkpoint appeared"
        );
        if let Some(status) = child.try_wait().expect("poll") {
            panic!("the child ended before it was stopped: {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// A pause of 0..`max_ms` milliseconds that depends on the clock, so a kill lands at varying
/// moments within a step.
pub fn jitter(max_ms: u32) {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() % max_ms.max(1));
    std::thread::sleep(std::time::Duration::from_millis(u64::from(ms)));
}

/// Resumes `full_config` in `dir`, stopped at `stopped_at` (`how`: what stopped it), and checks
/// that it ends at step 24 with the variables and statistics of the uninterrupted run in
/// `reference_dir` (`reference_vars`), bit for bit.
pub fn assert_resumes_bit_identically(
    dir: &std::path::Path,
    reference_dir: &std::path::Path,
    reference_vars: &[(String, Vec<u8>)],
    stopped_at: u64,
    how: &str,
) {
    let c = full_config(dir).auto_resume(true);
    let report =
        towerpack::train::launch_train_with_config(c, &mut towerpack::train::SimpleTrainer::new())
            .expect("resumed run");
    assert_eq!(
        report.resumed.as_ref().expect("resumed").global_step,
        stopped_at
    );
    assert_eq!(report.counters.global_step, 24);
    let vars = variable_bytes(report.session.as_ref());
    assert_eq!(vars.len(), reference_vars.len());
    for ((name, a), (_, b)) in reference_vars.iter().zip(&vars) {
        assert!(
            a == b,
            "variable {name} differs after the {how} at step {stopped_at}"
        );
    }
    assert_eq!(deterministic_stats(dir), deterministic_stats(reference_dir));
}
