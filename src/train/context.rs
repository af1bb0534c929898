//! `TrainContext`: what every callback hook sees of the trainer (tensorpack's `self.trainer`):
//! the loop counters, the graph (editable until the session exists), the session, the monitors,
//! the model and its training towers, predictors, and checkpoint requests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::{Feed, Session, Step};
use crate::data::FlowState;
use crate::dsl::{Builder, TowerHandle, build_inference_tower};
use crate::ir::{Graph, Value, VarId};
use crate::optim::NumericCheck;
use crate::tensor::HostTensor;

use super::checkpoint::{CheckpointManager, RetentionPolicy};
use super::counters::{LoopCounters, ResumePoint};
use super::error::{ConfigError, SetupError, TrainError};
use super::model::ModelDesc;
use super::monitors::Monitors;
use super::predict::OnlinePredictor;
use super::summary::proto::Event;

/// The tower name of predictors made by [`TrainContext::get_predictor`].
pub const PREDICT_TOWER: &str = "tower-pred-0";

/// Where a resumed run came from.
#[derive(Clone, Debug, PartialEq)]
pub struct ResumeInfo {
    /// The checkpoint restored.
    pub checkpoint: PathBuf,
    /// The global step it was saved at.
    pub global_step: u64,
    /// Where the loop continues.
    pub point: ResumePoint,
    /// True when the checkpoint carried the full resume state (loop, data and callback
    /// state); false for tensorpack-style resumes (variables, and the epoch from stats.json).
    pub exact: bool,
}

pub(crate) enum Phase {
    /// The graph, still editable.
    Building(Graph),
    /// The session, which owns the finalized graph.
    Running(Box<dyn Session>),
}

/// Checkpoint directories opened by savers and the saves asked for in the current round.
#[derive(Default)]
pub(crate) struct CheckpointDirs {
    pub(crate) managers: BTreeMap<PathBuf, CheckpointManager>,
    pub(crate) pending: Vec<PathBuf>,
}

/// What the training towers built (set once by the trainer's graph setup).
#[derive(Default)]
pub(crate) struct TrainingGraphInfo {
    pub(crate) towers: Vec<TowerHandle>,
    pub(crate) losses: Vec<(String, Value)>,
    pub(crate) gradients: Vec<(VarId, Value)>,
    pub(crate) numeric_checks: Vec<NumericCheck>,
}

/// The trainer as callbacks see it.
pub struct TrainContext {
    pub(crate) counters: LoopCounters,
    pub(crate) phase: Phase,
    pub(crate) seed: u64,
    pub(crate) monitors: Monitors,
    pub(crate) model: Option<Arc<dyn ModelDesc>>,
    pub(crate) info: TrainingGraphInfo,
    /// The input source's consumed position, as of its last operation (the engine owns the
    /// source and records its position here after every call that can move it).
    pub(crate) input_position: Option<FlowState>,
    pub(crate) logdir: Option<PathBuf>,
    pub(crate) is_chief: bool,
    pub(crate) resumed: Option<ResumeInfo>,
    pub(crate) checkpoints: CheckpointDirs,
    predict_towers: BTreeMap<String, TowerHandle>,
}

impl TrainContext {
    pub(crate) fn new(graph: Graph, seed: u64, model: Option<Arc<dyn ModelDesc>>) -> TrainContext {
        TrainContext {
            counters: LoopCounters::new(0, 1, 1),
            phase: Phase::Building(graph),
            seed,
            monitors: Monitors::default(),
            model,
            info: TrainingGraphInfo::default(),
            input_position: None,
            logdir: None,
            is_chief: true,
            resumed: None,
            checkpoints: CheckpointDirs::default(),
            predict_towers: BTreeMap::new(),
        }
    }

    // ---- counters ------------------------------------------------------------------------

    /// The loop counters.
    pub fn counters(&self) -> &LoopCounters {
        &self.counters
    }

    /// The current epoch (1-based; `starting_epoch - 1` before training).
    pub fn epoch_num(&self) -> u64 {
        self.counters.epoch_num
    }

    /// The index of the current step in its epoch (-1 before the first).
    pub fn local_step(&self) -> i64 {
        self.counters.local_step
    }

    /// Hooked runs finished so far.
    pub fn global_step(&self) -> u64 {
        self.counters.global_step
    }

    /// Steps per epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        self.counters.steps_per_epoch
    }

    /// The last epoch.
    pub fn max_epoch(&self) -> u64 {
        self.counters.max_epoch
    }

    /// Whether this worker is the chief.
    pub fn is_chief(&self) -> bool {
        self.is_chief
    }

    /// The run's seed (graph randomness and variable initialization).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The logger directory of the run, if any.
    pub fn logdir(&self) -> Option<&Path> {
        self.logdir.as_deref()
    }

    /// The consumed position of the training input (what a checkpoint stores).
    pub fn input_state(&self) -> Option<FlowState> {
        self.input_position.clone()
    }

    /// Where this run was resumed from (`None` for a fresh run).
    pub fn resumed(&self) -> Option<&ResumeInfo> {
        self.resumed.as_ref()
    }

    // ---- graph ---------------------------------------------------------------------------

    /// The graph (the session's once it exists).
    pub fn graph(&self) -> &Graph {
        match &self.phase {
            Phase::Building(g) => g,
            Phase::Running(s) => s.graph(),
        }
    }

    /// The graph for editing; errors once the session exists. `what` names the caller.
    pub fn graph_mut(&mut self, what: &str) -> Result<&mut Graph, TrainError> {
        match &mut self.phase {
            Phase::Building(g) => Ok(g),
            Phase::Running(_) => Err(TrainError::GraphFinalized { what: what.into() }),
        }
    }

    /// Runs `f` with a DSL [`Builder`] over the graph (re-opened with the run's seed), then puts
    /// the graph back. Errors with the first DSL error `f` caused.
    pub fn with_builder<R>(
        &mut self,
        what: &str,
        f: impl FnOnce(&Builder) -> R,
    ) -> Result<R, TrainError> {
        let seed = self.seed;
        with_builder_on(self.graph_mut(what)?, seed, f)
    }

    /// tensorpack's `get_tensors_maybe_in_tower`: `name` in the graph, else inside training
    /// tower 0 (`tower0/name`), else the tower's input of that signature name.
    pub fn get_tensor(&self, name: &str) -> Result<Value, TrainError> {
        let graph = self.graph();
        if let Some(v) = graph.find_value(name) {
            return Ok(v);
        }
        let tower = self.info.towers.first();
        if let Some(v) = tower.and_then(|t| t.get_tensor(graph, name)) {
            return Ok(v);
        }
        Err(TrainError::TensorNotFound {
            name: name.to_string(),
            hint: tower
                .filter(|t| !t.ns_name.is_empty())
                .map_or(String::new(), |t| {
                    format!(" (nor `{}/{name}` in training tower 0)", t.ns_name)
                }),
        })
    }

    /// The variable named `name`.
    pub fn find_variable(&self, name: &str) -> Result<VarId, TrainError> {
        self.graph()
            .find_variable(name)
            .ok_or_else(|| TrainError::UnknownVariable {
                name: name.to_string(),
            })
    }

    /// The model, when the run has one.
    pub fn model(&self) -> Option<&Arc<dyn ModelDesc>> {
        self.model.as_ref()
    }

    /// The training towers, tower 0 first.
    pub fn training_towers(&self) -> &[TowerHandle] {
        &self.info.towers
    }

    /// The named scalar losses the trainer minimizes (for progress bars and guards).
    pub fn losses(&self) -> &[(String, Value)] {
        &self.info.losses
    }

    /// Every `(variable, gradient)` the trainer applies.
    pub fn gradients(&self) -> &[(VarId, Value)] {
        &self.info.gradients
    }

    /// The `CheckGradient` checks of the model's gradient processors.
    pub fn numeric_checks(&self) -> &[NumericCheck] {
        &self.info.numeric_checks
    }

    /// Builds an inference tower `ns_name` of the model, sharing the variables of training
    /// tower 0 (setup_graph only). Errors when the run has no model.
    pub fn build_inference_tower(&mut self, ns_name: &str) -> Result<TowerHandle, TrainError> {
        let model = self.model.clone().ok_or_else(|| {
            TrainError::from(SetupError::NoModel {
                what: format!("inference tower `{ns_name}`"),
            })
        })?;
        let vs_name = self
            .info
            .towers
            .first()
            .map_or(String::new(), |t| t.vs_name.clone());
        let what = format!("building inference tower `{ns_name}`");
        let seed = self.seed;
        let graph = self.graph_mut(&what)?;
        inference_tower_on(graph, seed, model.as_ref(), ns_name, &vs_name)
    }

    /// A predictor on tower `tower-pred-0` (built on first use, setup_graph only), tensorpack's
    /// `trainer.get_predictor`: run it later with [`OnlinePredictor::run`] on
    /// [`TrainContext::session`].
    pub fn get_predictor(
        &mut self,
        input_names: &[&str],
        output_names: &[&str],
    ) -> Result<OnlinePredictor, TrainError> {
        let tower = match self.predict_towers.get(PREDICT_TOWER) {
            Some(t) => t.clone(),
            None => {
                let t = self.build_inference_tower(PREDICT_TOWER)?;
                self.predict_towers.insert(PREDICT_TOWER.into(), t.clone());
                t
            }
        };
        OnlinePredictor::from_tower(self.graph(), &tower, input_names, output_names)
    }

    // ---- session -------------------------------------------------------------------------

    /// The session; errors before `before_train`. `what` names the caller.
    pub fn session(&mut self, what: &str) -> Result<&mut dyn Session, TrainError> {
        match &mut self.phase {
            Phase::Running(s) => Ok(s.as_mut()),
            Phase::Building(_) => Err(TrainError::NoSession { what: what.into() }),
        }
    }

    /// Runs `step` outside the hooks (tensorpack's `trainer.sess.run`): no callback sees it and
    /// it does not count as a training step. Do not run input-dependent values this way.
    pub fn run(&mut self, step: &Step, feeds: &[Feed]) -> Result<Vec<HostTensor>, TrainError> {
        Ok(self.session("TrainContext::run")?.run(step, feeds)?)
    }

    /// The current value of variable `name`.
    pub fn read_variable(&mut self, name: &str) -> Result<HostTensor, TrainError> {
        let id = self.find_variable(name)?;
        let what = format!("reading variable `{name}`");
        Ok(self.session(&what)?.read_variable(id)?)
    }

    /// Overwrites variable `name` (dtype and shape must match).
    pub fn write_variable(&mut self, name: &str, value: &HostTensor) -> Result<(), TrainError> {
        let id = self.find_variable(name)?;
        let what = format!("writing variable `{name}`");
        Ok(self.session(&what)?.write_variable(id, value)?)
    }

    // ---- monitors ------------------------------------------------------------------------

    /// The monitors (history: `get_latest`, `get_history`).
    pub fn monitors(&self) -> &Monitors {
        &self.monitors
    }

    /// Puts a scalar, stamped with the current counters.
    pub fn put_scalar(&mut self, name: &str, value: f64) -> Result<(), TrainError> {
        let at = self.counters;
        self.monitors.put_scalar(name, value, &at)
    }

    /// Puts a histogram of `values`.
    pub fn put_histogram(&mut self, name: &str, values: &HostTensor) -> Result<(), TrainError> {
        let at = self.counters;
        self.monitors.put_histogram(name, values, &at)
    }

    /// Puts an image (HW, HWC, NHW or NHWC, values in `[0, 255]`).
    pub fn put_image(&mut self, name: &str, image: &HostTensor) -> Result<(), TrainError> {
        let at = self.counters;
        self.monitors.put_image(name, image, &at)
    }

    /// Puts a raw TensorBoard event (stamped with the global step).
    pub fn put_event(&mut self, event: Event) -> Result<(), TrainError> {
        let at = self.counters;
        self.monitors.put_event(event, &at)
    }

    // ---- checkpoints ---------------------------------------------------------------------

    /// Opens checkpoint directory `dir` with a retention policy (a saver's `before_train`).
    pub fn open_checkpoint_dir(
        &mut self,
        dir: &Path,
        policy: RetentionPolicy,
    ) -> Result<(), TrainError> {
        let manager = CheckpointManager::open(dir, policy, wall_seconds())?;
        self.checkpoints.managers.insert(dir.to_path_buf(), manager);
        Ok(())
    }

    /// Asks for a checkpoint in `dir` (opened before). The trainer writes it at the end of the
    /// current trigger round (`before_train`, a step's `trigger_step`s, or an epoch's
    /// `trigger_epoch`s), once every callback of the round ran, so that it holds one consistent
    /// state of the loop; then it calls every callback's `on_checkpoint_saved`.
    pub fn request_checkpoint(&mut self, dir: &Path) -> Result<(), TrainError> {
        if !self.checkpoints.managers.contains_key(dir) {
            return Err(ConfigError::CheckpointDirNotOpen {
                dir: dir.to_path_buf(),
            }
            .into());
        }
        if !self.checkpoints.pending.iter().any(|d| d == dir) {
            self.checkpoints.pending.push(dir.to_path_buf());
        }
        Ok(())
    }
}

/// Runs `f` with a DSL [`Builder`] re-opened over `graph` (seeded with `seed`), then puts the
/// graph back; on a DSL error, the partial graph stays and the error is returned.
pub(crate) fn with_builder_on<R>(
    graph: &mut Graph,
    seed: u64,
    f: impl FnOnce(&Builder) -> R,
) -> Result<R, TrainError> {
    let builder = Builder::from_graph(std::mem::take(graph), seed);
    let out = f(&builder);
    let result = match builder.check() {
        Ok(()) => builder.finish(),
        Err(e) => Err(e),
    };
    match result {
        Ok(finished) => {
            *graph = finished;
            Ok(out)
        }
        Err(e) => {
            *graph = builder.with_graph(Graph::clone);
            Err(e.into())
        }
    }
}

/// Builds an inference tower `ns_name` of `model` on `graph`, sharing the variables of the
/// training tower with variable scope `vs_name` (what [`TrainContext::build_inference_tower`]
/// and [`TrainingGraph::add_inference_tower`](super::tower_trainer::TrainingGraph) build).
pub(crate) fn inference_tower_on(
    graph: &mut Graph,
    seed: u64,
    model: &dyn ModelDesc,
    ns_name: &str,
    vs_name: &str,
) -> Result<TowerHandle, TrainError> {
    let signature = model.inputs();
    let built = with_builder_on(graph, seed, |b| {
        build_inference_tower(b, &signature, ns_name, vs_name, &|x| model.build_graph(x))
    })?;
    Ok(built?)
}

/// Seconds since the Unix epoch.
pub(crate) fn wall_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
