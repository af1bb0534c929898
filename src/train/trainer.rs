//! The [`Trainer`] trait (implementors build their graph and define `run_step`), what graph
//! building gets ([`GraphSetup`]) and reports ([`BuiltGraph`]), and [`StepRunner`], through which
//! `run_step` makes hooked runs: every callback's `before_run` additions join the SAME step, the
//! input source feeds one batch per tower when the step reads an input, and `after_run` gets the
//! values.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::backend::Placement;
use crate::backend::Session;
use crate::data::DataFlow;
use crate::dsl::{Builder, InputSpec, TowerHandle};
use crate::ir::{Graph, NodeId, Value, VarId};
use crate::optim::{DynamicLossScale, NumericCheck};
use crate::tensor::HostTensor;

use super::callback::Callback;
use super::context::TrainContext;
use super::dispatch::CallbackList;
use super::error::{SetupError, TrainError};
use super::input::{InputSource, QueueInput};
use super::model::ModelDesc;
use super::resume::FoundResume;

/// A trainer: builds the training graph once, then runs one iteration per `run_step`.
///
/// The loop around it is fixed: `for epoch in starting_epoch..=max_epoch { for local_step in
/// 0..steps_per_epoch { run_step } }`. Data-parallel trainers differ only in the graph they build
/// (see [`TowerTrainer`](super::TowerTrainer)); multi-loss trainers override `run_step`.
pub trait Trainer {
    /// The name used in logs.
    fn name(&self) -> String {
        super::any::short_type_name(std::any::type_name_of_val(self))
    }

    /// Builds the training towers and ops into `setup.graph`, registering each training tower's
    /// inputs with `setup.input`. Called once, before any callback's `setup_graph`.
    fn setup_graph(&mut self, setup: &mut GraphSetup<'_>) -> Result<BuiltGraph, TrainError>;

    /// One iteration: usually one [`StepRunner::hooked_run`] of the train op.
    fn run_step(&mut self, runner: &mut StepRunner<'_>) -> Result<(), TrainError>;

    /// Whether this worker is the chief (runs chief-only callbacks and the session init).
    fn is_chief(&self) -> bool {
        true
    }

    /// The input source for a `TrainConfig` given a data flow: a [`QueueInput`] by default
    /// (tensorpack's `apply_default_prefetch`; `SimpleTrainer` uses a `FeedInput`).
    fn default_input(&self, flow: Box<dyn DataFlow>) -> Box<dyn InputSource> {
        Box::new(QueueInput::from_boxed(flow))
    }

    /// Replaces the resume this worker found (in its logdir or config) by the one every worker
    /// of the job continues from. Called before the graph is built. Default: keep it.
    fn agree_on_resume(
        &mut self,
        found: Option<FoundResume>,
    ) -> Result<Option<FoundResume>, TrainError> {
        Ok(found)
    }

    /// Called once the session exists, its variables are initialized and the chief's session
    /// init has run, before the loop reads `global_step` (tensorpack's `initialize`):
    /// distributed trainers join the session to their collective engine and broadcast the
    /// chief's variables here. Default: nothing.
    fn initialize_session(&mut self, _session: &mut dyn Session) -> Result<(), TrainError> {
        Ok(())
    }

    /// Called when the loop has ended, with how it ended, before the callbacks' `after_train`
    /// (distributed trainers tell the other workers). Default: nothing.
    fn loop_ended(&mut self, _outcome: &Result<(), TrainError>) {}
}

/// What graph building gets: the graph, the run's seed, the input source and the model.
pub struct GraphSetup<'a> {
    pub graph: &'a mut Graph,
    pub seed: u64,
    /// Set up with the model's signature already (when there is a model).
    pub input: &'a mut dyn InputSource,
    pub model: Option<Arc<dyn ModelDesc>>,
    /// The dynamic loss scale the trainer differentiates and updates under (FP16 training,
    /// [`TrainConfig::loss_scale`](super::TrainConfig::loss_scale)); `None`: no scaling.
    pub loss_scale: Option<DynamicLossScale>,
}

impl GraphSetup<'_> {
    /// The model; errors when the configuration has none.
    pub fn model(&self) -> Result<Arc<dyn ModelDesc>, TrainError> {
        self.model.clone().ok_or_else(|| {
            SetupError::NoModel {
                what: "this trainer".into(),
            }
            .into()
        })
    }

    /// The model's input signature.
    pub fn signature(&self) -> Result<Vec<InputSpec>, TrainError> {
        Ok(self.model()?.inputs())
    }

    /// Runs `f` with a DSL [`Builder`] over the graph (seeded with the run's seed), then puts
    /// the graph back. Errors with the first DSL error.
    pub fn with_builder<R>(&mut self, f: impl FnOnce(&Builder) -> R) -> Result<R, TrainError> {
        super::context::with_builder_on(self.graph, self.seed, f)
    }

    /// Registers `tower`'s inputs with the input source.
    pub fn register_tower(&mut self, tower: &TowerHandle) -> Result<(), TrainError> {
        self.input.register_tower(&tower.inputs)
    }
}

/// What a trainer's graph setup built, for the callbacks.
#[derive(Default)]
pub struct BuiltGraph {
    /// The training towers, tower 0 first.
    pub towers: Vec<TowerHandle>,
    /// Named scalar losses (shown by `ProgressBar`, checked by `NonFiniteGuard`).
    pub losses: Vec<(String, Value)>,
    /// Every `(variable, gradient)` applied (checked by `NonFiniteGuard`).
    pub gradients: Vec<(VarId, Value)>,
    /// `CheckGradient` checks of the gradient processors, recorded by `NonFiniteGuard`.
    pub numeric_checks: Vec<NumericCheck>,
    /// Callbacks the trainer needs (registered after the input source's, before the user's).
    pub callbacks: Vec<Box<dyn Callback>>,
    /// Where the graph's logical devices run (training tower `i` is logical device `i`);
    /// the default places logical device `i` on the backend's `i`-th device.
    pub placement: Placement,
    /// The bucket size of fused updates, if the trainer sets one.
    pub bucket_bytes: Option<usize>,
}

/// Makes hooked runs for `run_step`.
pub struct StepRunner<'a> {
    pub(crate) ctx: &'a mut TrainContext,
    /// The run's input source (owned by the engine, not the context).
    pub(crate) input: &'a mut dyn InputSource,
    pub(crate) callbacks: &'a mut CallbackList,
    pub(crate) reads_input: &'a mut HashMap<crate::backend::Step, bool>,
}

impl StepRunner<'_> {
    /// The trainer's context (counters, graph, ...).
    pub fn context(&self) -> &TrainContext {
        self.ctx
    }

    /// The current global step.
    pub fn global_step(&self) -> u64 {
        self.ctx.global_step()
    }

    /// One hooked run (tensorpack's `hooked_sess.run`): fetches `fetches` and runs `targets`
    /// together with every callback's additions in ONE step; returns the values of `fetches`.
    /// Counts as one global step.
    pub fn hooked_run(
        &mut self,
        fetches: &[Value],
        targets: &[NodeId],
    ) -> Result<Vec<HostTensor>, TrainError> {
        let merged = self.callbacks.before_run(self.ctx, fetches, targets)?;
        let mut feeds = merged.feeds.clone();
        if self.step_reads_input(&merged.step) {
            let next = self.input.next_feeds();
            self.ctx.input_position = self.input.consumed_state();
            feeds.extend(next?);
        }
        let values = self.ctx.session("hooked run")?.run(&merged.step, &feeds)?;
        self.callbacks.after_run(self.ctx, &values, &merged)?;
        Ok(merged.base.iter().map(|&i| values[i].clone()).collect())
    }

    /// Whether `step` depends on any input node of the input source (cached per step).
    fn step_reads_input(&mut self, step: &crate::backend::Step) -> bool {
        if let Some(&r) = self.reads_input.get(step) {
            return r;
        }
        let inputs: HashSet<NodeId> = self.input.input_nodes().into_iter().collect();
        let graph = self.ctx.graph();
        let mut seen: HashSet<NodeId> = HashSet::new();
        let mut stack = step.roots();
        let mut found = false;
        while let Some(id) = stack.pop() {
            if !seen.insert(id) {
                continue;
            }
            if inputs.contains(&id) {
                found = true;
                break;
            }
            stack.extend(graph.inputs(id).iter().map(|v| v.node));
            stack.extend(graph.control_inputs(id));
        }
        self.reads_input.insert(step.clone(), found);
        found
    }
}
