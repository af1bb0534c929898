//! A minimal single-tower training driver: enough for tests and a first example.
//!
//! It builds one training tower (name scope `""`) and an inference tower (`InferenceTower`,
//! sharing the variables) from a tower function, differentiates the cost, applies an optimizer,
//! and runs steps on a [`Session`] — the compiled CPU backend by default. Every step also runs
//! the tower's UPDATE_OPS (BatchNorm's moving averages) and increments `global_step` (the
//! dropout counter). Callbacks, monitors, checkpoints and resume belong to the full trainer.

use crate::autodiff::{AutodiffError, gradients};
use crate::backend::cpu::{CpuOptions, CpuSession};
use crate::backend::reference::ReferenceSession;
use crate::backend::{BackendError, Feed, Session, Step};
use crate::data::{DataError, DataFlow};
use crate::dsl::{DslError, InputSpec, Replication, Tensor, TowerHandle, replicate};
use crate::ir::{Graph, NodeId, Value};
use crate::optim::{OptimError, Optimizer, increment_global_step};
use crate::tensor::HostTensor;
use crate::tower::UPDATE_OPS;

/// Errors of the minimal driver.
#[derive(Debug, thiserror::Error)]
pub enum MinimalError {
    #[error(transparent)]
    Dsl(#[from] DslError),
    #[error(transparent)]
    Autodiff(#[from] AutodiffError),
    #[error(transparent)]
    Optim(#[from] OptimError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("the inference tower has no tensor named `{0}`")]
    MissingTensor(String),
    #[error("a datapoint has {got} components, the model takes {expected} inputs")]
    Arity { expected: usize, got: usize },
}

/// Which executor runs the steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Executor {
    /// The compiled CPU backend with this many threads (0: one per core).
    #[default]
    Cpu,
    /// The reference executor (slow; the oracle).
    Reference,
}

/// Options of the minimal driver.
#[derive(Clone, Copy, Debug)]
pub struct MinimalOptions {
    pub executor: Executor,
    pub threads: usize,
    /// Seed of variable initialisation and of dropout masks.
    pub seed: u64,
    /// Also build the inference tower used by [`MinimalTrainer::error_rate`].
    pub inference: bool,
}

impl Default for MinimalOptions {
    fn default() -> Self {
        MinimalOptions {
            executor: Executor::Cpu,
            threads: 0,
            seed: 0,
            inference: true,
        }
    }
}

/// One training tower, an optional inference tower and a session running them.
pub struct MinimalTrainer {
    session: Box<dyn Session>,
    train_step: Step,
    train: TowerHandle,
    inference: Option<TowerHandle>,
}

fn feeds(
    tower: &TowerHandle,
    signature_len: usize,
    batch: &[HostTensor],
) -> Result<Vec<Feed>, MinimalError> {
    if batch.len() != signature_len || tower.inputs.len() != signature_len {
        return Err(MinimalError::Arity {
            expected: tower.inputs.len(),
            got: batch.len(),
        });
    }
    Ok(tower
        .inputs
        .iter()
        .zip(batch)
        .map(|((_, id), t)| (*id, t.clone()))
        .collect())
}

/// The graph a [`MinimalTrainer`] runs, before it is bound to a session: benchmarks and
/// snapshot tests lower exactly this step.
pub struct TrainingGraph {
    pub graph: Graph,
    /// The cost; the optimizer's update, the step counter and the tower's UPDATE_OPS.
    pub step: Step,
    pub train: TowerHandle,
    pub inference: Option<TowerHandle>,
}

impl TrainingGraph {
    /// One training tower of `tower` over `signature` (and the inference tower when
    /// `options.inference`), its gradients and `optimizer`'s update.
    pub fn build(
        signature: &[InputSpec],
        tower: impl Fn(&[Tensor]) -> Tensor,
        optimizer: &Optimizer,
        options: &MinimalOptions,
    ) -> Result<TrainingGraph, MinimalError> {
        let mut plan = Replication::single().with_seed(options.seed);
        if options.inference {
            plan = plan.with_inference("InferenceTower");
        }
        let built = replicate(signature, &plan, tower)?;
        let mut graph = built.graph;
        let train = built
            .training
            .into_iter()
            .next()
            .ok_or(MinimalError::MissingTensor("cost".into()))?;
        let cost = train
            .cost
            .ok_or(MinimalError::MissingTensor("cost".into()))?;
        let vars = train.gradient_variables(&graph);
        let grads = gradients(&mut graph, cost, &vars, "gradients")?;
        let op = optimizer.apply_gradients(&mut graph, &grads.grads, "train_op")?;
        let mut targets: Vec<NodeId> = vec![
            op.train_op,
            increment_global_step(&mut graph, "global_step/increment")?,
        ];
        targets.extend(train.collection(UPDATE_OPS).iter().map(|v| v.node));
        Ok(TrainingGraph {
            graph,
            step: Step::new(vec![cost], targets),
            train,
            inference: built.inference.into_iter().next(),
        })
    }
}

impl MinimalTrainer {
    /// Builds the graph of `tower` over `signature`, trained by `optimizer`.
    pub fn new(
        signature: &[InputSpec],
        tower: impl Fn(&[Tensor]) -> Tensor,
        optimizer: &Optimizer,
        options: MinimalOptions,
    ) -> Result<MinimalTrainer, MinimalError> {
        let built = TrainingGraph::build(signature, tower, optimizer, &options)?;
        let session: Box<dyn Session> = match options.executor {
            Executor::Cpu => Box::new(CpuSession::new(
                built.graph,
                CpuOptions {
                    threads: options.threads,
                    ..CpuOptions::default()
                },
            )?),
            Executor::Reference => Box::new(ReferenceSession::new(built.graph)?),
        };
        let mut t = MinimalTrainer {
            session,
            train_step: built.step,
            train: built.train,
            inference: built.inference,
        };
        t.session.initialize_variables(options.seed)?;
        Ok(t)
    }

    /// The graph being trained.
    pub fn graph(&self) -> &Graph {
        self.session.graph()
    }

    /// The training step: the cost, the optimizer's update, the update ops and the step counter.
    pub fn train_step(&self) -> &Step {
        &self.train_step
    }

    /// The session (to read or write variables).
    pub fn session(&mut self) -> &mut dyn Session {
        self.session.as_mut()
    }

    /// Sets the optimizer's `learning_rate` variable (what a schedule callback does).
    pub fn set_learning_rate(&mut self, lr: f64) -> Result<(), MinimalError> {
        let var = self
            .session
            .graph()
            .find_variable(crate::optim::LEARNING_RATE)
            .ok_or_else(|| MinimalError::MissingTensor(crate::optim::LEARNING_RATE.into()))?;
        self.session
            .write_variable(var, &HostTensor::scalar_f32(lr as f32))?;
        Ok(())
    }

    /// Runs one training step on a batch (one tensor per input) and returns the cost.
    pub fn train_batch(&mut self, batch: &[HostTensor]) -> Result<f64, MinimalError> {
        let f = feeds(&self.train, self.train.inputs.len(), batch)?;
        let out = self.session.run(&self.train_step, &f)?;
        Ok(out
            .first()
            .map_or(Ok(f64::NAN), |t| t.scalar_value())
            .unwrap_or(f64::NAN))
    }

    /// Runs one pass of `flow` (batched datapoints) and returns the mean cost.
    pub fn train_epoch(&mut self, flow: &mut dyn DataFlow) -> Result<f64, MinimalError> {
        let (mut sum, mut n) = (0.0, 0usize);
        while let Some(batch) = flow.next_datapoint()? {
            sum += self.train_batch(&batch)?;
            n += 1;
        }
        Ok(sum / n.max(1) as f64)
    }

    /// The fraction of examples of one pass of `flow` whose inference-tower `wrong_vector` is
    /// set: the exact error rate, whatever the last batch's size.
    pub fn error_rate(&mut self, flow: &mut dyn DataFlow) -> Result<f64, MinimalError> {
        let tower = self
            .inference
            .as_ref()
            .ok_or_else(|| MinimalError::MissingTensor("InferenceTower".into()))?;
        let wrong: Value = tower
            .get_tensor(self.session.graph(), "wrong_vector")
            .ok_or_else(|| MinimalError::MissingTensor("wrong_vector".into()))?;
        let step = Step::fetch(vec![wrong]);
        let (mut wrong_sum, mut count) = (0.0, 0usize);
        while let Some(batch) = flow.next_datapoint()? {
            let f = feeds(tower, tower.inputs.len(), &batch)?;
            let out = self.session.run(&step, &f)?;
            if let Some(w) = out.first() {
                wrong_sum += w.to_f64_vec().iter().sum::<f64>();
                count += w.len();
            }
        }
        Ok(wrong_sum / count.max(1) as f64)
    }
}
