//! Tower trainers: a [`TowerTrainer`] builds its graph with a [`TowerStrategy`] (how many
//! training towers, how they share variables, how their gradients combine into one train op)
//! and runs that train op once per step. [`SingleTower`] gives `SimpleTrainer` (one tower, no
//! name scope); the data-parallel strategies of [`super::data_parallel`] plug in the same way.
//! Also [`NoOpTrainer`].
//!
//! The helpers [`build_training_towers_on`], [`tower_gradients`] and [`apply_optimizer`] are the
//! pieces every strategy shares. [`build_training_graph`] is `SimpleTrainer`'s graph outside the
//! loop (the one way tests and benchmarks build a training graph).

use crate::autodiff::gradients;
use crate::data::DataFlow;
use crate::dsl::{Strategy, TowerHandle, build_training_towers};
use crate::ir::{Graph, NodeId, Step, Value, VarId};
use crate::optim::{
    DynamicLossScale, ProcessedGradients, TrainOp, add_step_counter, process_gradients, scale_loss,
    unscale,
};
use crate::tower::{REGULARIZATION_LOSSES, UPDATE_OPS};

use super::context::{inference_tower_on, with_builder_on};
use super::error::{SetupError, TrainError};
use super::input::{FeedInput, InputSource, QueueInput};
use super::model::ModelDesc;
use super::trainer::{BuiltGraph, GraphSetup, StepRunner, Trainer};

/// How a [`TowerTrainer`] builds its training graph.
pub trait TowerStrategy {
    /// The name used in logs.
    fn name(&self) -> String;

    /// Builds the training towers (registering each one's inputs with `setup.input`), their
    /// gradients and the train op.
    fn build(&self, setup: &mut GraphSetup<'_>) -> Result<TowerGraph, TrainError>;

    /// The input source for a data flow (default: [`QueueInput`]).
    fn default_input(&self, flow: Box<dyn DataFlow>) -> Box<dyn InputSource> {
        Box::new(QueueInput::from_boxed(flow))
    }
}

/// What a strategy built: the op one step runs, and what callbacks should know.
pub struct TowerGraph {
    pub train_op: NodeId,
    pub built: BuiltGraph,
}

/// A trainer whose graph comes from a [`TowerStrategy`] and whose step runs its train op.
pub struct TowerTrainer<S> {
    strategy: S,
    train_op: Option<NodeId>,
}

impl<S: TowerStrategy> TowerTrainer<S> {
    /// A trainer building its graph with `strategy`.
    pub fn with_strategy(strategy: S) -> TowerTrainer<S> {
        TowerTrainer {
            strategy,
            train_op: None,
        }
    }

    /// The strategy.
    pub fn strategy(&self) -> &S {
        &self.strategy
    }

    /// The strategy, to configure it before training.
    pub fn strategy_mut(&mut self) -> &mut S {
        &mut self.strategy
    }

    /// The train op, once the graph is built.
    pub fn train_op(&self) -> Option<NodeId> {
        self.train_op
    }
}

impl<S: TowerStrategy> Trainer for TowerTrainer<S> {
    fn name(&self) -> String {
        self.strategy.name()
    }

    fn setup_graph(&mut self, setup: &mut GraphSetup<'_>) -> Result<BuiltGraph, TrainError> {
        if self.train_op.is_some() {
            return Err(SetupError::AlreadyBuilt {
                trainer: self.strategy.name(),
            }
            .into());
        }
        let built = self.strategy.build(setup)?;
        self.train_op = Some(built.train_op);
        Ok(built.built)
    }

    fn run_step(&mut self, runner: &mut StepRunner<'_>) -> Result<(), TrainError> {
        let op = self.train_op.ok_or_else(|| {
            TrainError::from(SetupError::NotBuilt {
                trainer: self.strategy.name(),
            })
        })?;
        runner.hooked_run(&[], &[op])?;
        Ok(())
    }

    fn default_input(&self, flow: Box<dyn DataFlow>) -> Box<dyn InputSource> {
        self.strategy.default_input(flow)
    }
}

/// One training tower with no name scope: tensorpack's `SimpleTrainer`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleTower;

/// tensorpack's `SimpleTrainer`: one tower (name scope `""`), fed by a `FeedInput` when given a
/// data flow (tensorpack's choice; a `QueueInput` can be passed as `TrainConfig::data`).
///
/// A `FeedInput` prepares each batch on the training thread between steps. On a GPU, pass
/// `TrainConfig::data(QueueInput::new(flow))` so that a thread prepares them ahead, as the
/// examples do: for ResNet-20 at batch 128 the training thread's host time per step went from
/// 0.378 to 0.122 ms (measured with the host-only emulated device, docs/performance.md).
pub type SimpleTrainer = TowerTrainer<SingleTower>;

impl TowerTrainer<SingleTower> {
    /// A `SimpleTrainer`.
    pub fn new() -> SimpleTrainer {
        TowerTrainer::with_strategy(SingleTower)
    }
}

impl Default for TowerTrainer<SingleTower> {
    fn default() -> Self {
        SimpleTrainer::new()
    }
}

impl TowerStrategy for SingleTower {
    fn name(&self) -> String {
        "SimpleTrainer".into()
    }

    fn build(&self, setup: &mut GraphSetup<'_>) -> Result<TowerGraph, TrainError> {
        let model = setup.model()?;
        let built = single_tower_graph(
            setup.graph,
            setup.seed,
            model.as_ref(),
            setup.loss_scale.as_ref(),
        )?;
        for t in &built.built.towers {
            setup.register_tower(t)?;
        }
        Ok(built)
    }

    fn default_input(&self, flow: Box<dyn DataFlow>) -> Box<dyn InputSource> {
        Box::new(FeedInput::from_boxed(flow))
    }
}

/// `SimpleTrainer`'s graph on `graph`: one training tower of `model` (no name scope), its
/// gradients, the model's gradient processors and its optimizer's train op. The towers are not
/// registered with any input source.
fn single_tower_graph(
    graph: &mut Graph,
    seed: u64,
    model: &dyn ModelDesc,
    loss_scale: Option<&DynamicLossScale>,
) -> Result<TowerGraph, TrainError> {
    let towers = training_towers_on_graph(graph, seed, model, 1, Strategy::Single)?;
    let tower = towers.first().ok_or_else(|| SetupError::NoTrainingTower {
        trainer: SingleTower.name(),
    })?;
    let grads = tower_gradients(graph, tower, "gradients", loss_scale)?;
    let (train, processed) = apply_optimizer(graph, model, &grads, "train_op", loss_scale)?;
    let cost = tower.cost.ok_or_else(|| SetupError::NoCost {
        tower: tower.ns_name.clone(),
    })?;
    Ok(TowerGraph {
        train_op: train.train_op,
        built: BuiltGraph {
            losses: vec![(graph.value_name(cost), cost)],
            gradients: processed.grads,
            numeric_checks: processed.checks,
            towers,
            ..BuiltGraph::default()
        },
    })
}

/// The graph a [`SimpleTrainer`] trains and the step one of its iterations runs, built by the
/// trainer's own code outside the training loop: for benchmarks, snapshot tests and drivers
/// that run steps on a [`Session`](crate::backend::Session) themselves.
pub struct TrainingGraph {
    pub graph: Graph,
    /// The graph seed it was built with.
    pub seed: u64,
    /// The training tower (name scope `""`).
    pub tower: TowerHandle,
    /// The optimizer's train op.
    pub train_op: NodeId,
    /// One iteration as a `SimpleTrainer` with the default callbacks runs it: fetches the cost,
    /// runs the train op, the step counter (`MaintainStepCounter`) and `UPDATE_OPS`
    /// (`RunUpdateOps`, BatchNorm's moving averages).
    pub step: Step,
    /// What the trainer reports to callbacks (losses, processed gradients, checks).
    pub built: BuiltGraph,
}

/// Builds [`TrainingGraph`]: `SimpleTrainer`'s graph of `model` (what [`SingleTower`] builds,
/// gradient processors included), graph seed `seed`, plus the step counter
/// `MaintainStepCounter` adds.
pub fn build_training_graph(model: &dyn ModelDesc, seed: u64) -> Result<TrainingGraph, TrainError> {
    let mut graph = Graph::new();
    let built = single_tower_graph(&mut graph, seed, model, None)?;
    let counter = add_step_counter(&mut graph)?;
    let tower = built
        .built
        .towers
        .first()
        .cloned()
        .ok_or_else(|| SetupError::NoTrainingTower {
            trainer: SingleTower.name(),
        })?;
    let cost = tower.cost.ok_or_else(|| SetupError::NoCost {
        tower: tower.ns_name.clone(),
    })?;
    let mut targets = vec![built.train_op, counter];
    targets.extend(graph.collection(UPDATE_OPS).iter().map(|v| v.node));
    Ok(TrainingGraph {
        graph,
        seed,
        tower,
        train_op: built.train_op,
        step: Step::new(vec![cost], targets),
        built: built.built,
    })
}

impl TrainingGraph {
    /// Adds an inference tower `ns_name` of `model` sharing the training tower's variables
    /// (what `TrainContext::build_inference_tower` adds for a callback).
    pub fn add_inference_tower(
        &mut self,
        model: &dyn ModelDesc,
        ns_name: &str,
    ) -> Result<TowerHandle, TrainError> {
        let vs_name = self.tower.vs_name.clone();
        inference_tower_on(&mut self.graph, self.seed, model, ns_name, &vs_name)
    }
}

/// Builds `count` training towers of the model with `strategy` and registers each one's inputs
/// with the input source, in tower order.
pub fn build_training_towers_on(
    setup: &mut GraphSetup<'_>,
    count: usize,
    strategy: Strategy,
) -> Result<Vec<TowerHandle>, TrainError> {
    let model = setup.model()?;
    let towers =
        training_towers_on_graph(setup.graph, setup.seed, model.as_ref(), count, strategy)?;
    for t in &towers {
        setup.register_tower(t)?;
    }
    Ok(towers)
}

/// Builds `count` training towers of `model` with `strategy` on `graph` (DSL builder seeded
/// with `seed`) and warns about unused regularization losses.
fn training_towers_on_graph(
    graph: &mut Graph,
    seed: u64,
    model: &dyn ModelDesc,
    count: usize,
    strategy: Strategy,
) -> Result<Vec<TowerHandle>, TrainError> {
    let signature = model.inputs();
    let towers = with_builder_on(graph, seed, |b| {
        build_training_towers(b, &signature, count, strategy, &|x| model.build_graph(x))
    })??;
    warn_unused_regularization(graph);
    Ok(towers)
}

/// The gradients of `tower`'s cost with respect to its gradient variables (its own trainables,
/// or all trainables when it shares them), named under `prefix`. Variables the cost does not
/// reach are dropped with tensorpack's warning. Under a `loss_scale`, the scaled cost is
/// differentiated and the gradients returned are unscaled again ([`crate::optim::unscale`]).
pub fn tower_gradients(
    graph: &mut Graph,
    tower: &TowerHandle,
    prefix: &str,
    loss_scale: Option<&DynamicLossScale>,
) -> Result<Vec<(VarId, Value)>, TrainError> {
    let cost = tower.cost.ok_or_else(|| {
        TrainError::from(SetupError::NoCost {
            tower: tower.ns_name.clone(),
        })
    })?;
    let vars = tower.gradient_variables(graph);
    let differentiated = match loss_scale {
        Some(config) => scale_loss(graph, config, cost)?,
        None => cost,
    };
    let mut set = gradients(graph, differentiated, &vars, prefix)?;
    if let Some(config) = loss_scale {
        set.grads = unscale(graph, config, &set.grads)?;
    }
    if !set.unreached.is_empty() {
        let names: Vec<&str> = set
            .unreached
            .iter()
            .map(|&v| graph.variable(v).name.as_str())
            .collect();
        log::warn!(
            target: "towerpack",
            "No gradient w.r.t {} trainable variables: {}",
            names.len(),
            names.join(", ")
        );
    }
    Ok(set.grads)
}

/// Runs the model's gradient processors on `grads`, then its optimizer; the train op is a group
/// named `train_op_name`. Processor warnings are logged. Under a `loss_scale` the updates apply
/// only when every processed gradient is finite ([`crate::optim::Optimizer::apply_gradients_scaled`]).
pub fn apply_optimizer(
    graph: &mut Graph,
    model: &dyn ModelDesc,
    grads: &[(VarId, Value)],
    train_op_name: &str,
    loss_scale: Option<&DynamicLossScale>,
) -> Result<(TrainOp, ProcessedGradients), TrainError> {
    let processed = process_gradients(graph, grads, &model.gradient_processors())?;
    for w in &processed.warnings {
        log::warn!(target: "towerpack", "{w}");
    }
    let train = model.optimizer().apply_gradients_scaled(
        graph,
        &processed.grads,
        train_op_name,
        loss_scale,
    )?;
    Ok((train, processed))
}

/// tensorpack's warning: REGULARIZATION_LOSSES entries nothing consumes were probably meant to be
/// added to the cost.
fn warn_unused_regularization(graph: &Graph) {
    let unused: Vec<String> = graph
        .collection(REGULARIZATION_LOSSES)
        .iter()
        .filter(|v| graph.uses(**v).is_empty())
        .map(|v| graph.value_name(*v))
        .collect();
    if !unused.is_empty() {
        log::warn!(
            target: "towerpack",
            "Regularization losses {} are not used by the cost; did you forget \
             regularize_cost_from_collection()?",
            unused.join(", ")
        );
    }
}

/// A trainer that only runs hooks (tensorpack's `NoOpTrainer`): the model's tower is built if
/// there is a model, and each step is an empty hooked run, which still counts as a global step.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoOpTrainer;

impl Trainer for NoOpTrainer {
    fn setup_graph(&mut self, setup: &mut GraphSetup<'_>) -> Result<BuiltGraph, TrainError> {
        if setup.model.is_none() {
            return Ok(BuiltGraph::default());
        }
        let towers = build_training_towers_on(setup, 1, Strategy::Single)?;
        Ok(BuiltGraph {
            towers,
            ..BuiltGraph::default()
        })
    }

    fn run_step(&mut self, runner: &mut StepRunner<'_>) -> Result<(), TrainError> {
        runner.hooked_run(&[], &[])?;
        Ok(())
    }

    fn default_input(&self, flow: Box<dyn DataFlow>) -> Box<dyn InputSource> {
        Box::new(FeedInput::from_boxed(flow))
    }
}
