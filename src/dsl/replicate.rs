//! Replication: one tower function, N training towers (tensorpack's variable strategies) plus
//! optional inference towers, each on its own inputs. Towers can be added incrementally to a
//! builder, including one re-opened from a finished graph (callbacks build predict towers late).

use super::builder::Builder;
use super::builder::Tensor;
use super::error::DslError;
use super::handle::{InputSpec, TowerHandle};
use crate::ir::Graph;
use crate::tower::TowerContext;

/// How training towers share variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// One tower with no name scope (`SimpleTrainer`).
    Single,
    /// Parameter-server style: towers `tower0..` share one set of variables (vs `""`, reuse for
    /// towers after the first).
    Shared,
    /// Each tower keeps a replica: tower 0 in vs `""`, tower `i > 0` in vs `tower{i}` with
    /// LOCAL (unsaved) variables.
    Replicated,
}

impl Strategy {
    /// The context of training tower `index` of `total`.
    pub fn tower_context(self, index: usize, total: usize) -> TowerContext {
        match self {
            Strategy::Single => TowerContext::training("", "", index, total),
            Strategy::Shared => TowerContext::training(&format!("tower{index}"), "", index, total)
                .with_reuse(index > 0),
            Strategy::Replicated => {
                let vs = if index == 0 {
                    String::new()
                } else {
                    format!("tower{index}")
                };
                TowerContext::training(&format!("tower{index}"), &vs, index, total)
            }
        }
    }
}

/// The default name scope of the inference tower of `InferenceRunner`.
pub const INFERENCE_TOWER: &str = "InferenceTower";

/// What to build: how many training towers, how they share variables, and which inference
/// towers to add.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replication {
    pub towers: usize,
    pub strategy: Strategy,
    /// Name scopes of inference towers (e.g. `["InferenceTower"]`).
    pub inference: Vec<String>,
    /// The graph seed (random ops derive their seeds from it).
    pub seed: u64,
}

impl Replication {
    /// One training tower without a name scope (`SimpleTrainer`).
    pub fn single() -> Replication {
        Replication {
            towers: 1,
            strategy: Strategy::Single,
            inference: Vec::new(),
            seed: 0,
        }
    }

    /// `towers` training towers with `strategy`.
    pub fn new(towers: usize, strategy: Strategy) -> Replication {
        Replication {
            towers,
            strategy,
            inference: Vec::new(),
            seed: 0,
        }
    }

    /// Adds an inference tower named `ns_name`.
    pub fn with_inference(mut self, ns_name: &str) -> Replication {
        self.inference.push(ns_name.to_string());
        self
    }

    /// Sets the graph seed.
    pub fn with_seed(mut self, seed: u64) -> Replication {
        self.seed = seed;
        self
    }
}

/// A replicated graph and the handles of its towers.
#[derive(Clone, Debug)]
pub struct Replicated {
    pub graph: Graph,
    pub training: Vec<TowerHandle>,
    pub inference: Vec<TowerHandle>,
}

/// Builds the training towers of `strategy` on `builder`, calling `f` once per tower.
pub fn build_training_towers<F>(
    builder: &Builder,
    signature: &[InputSpec],
    towers: usize,
    strategy: Strategy,
    f: &F,
) -> Result<Vec<TowerHandle>, DslError>
where
    F: Fn(&[Tensor]) -> Tensor,
{
    if towers == 0 || (strategy == Strategy::Single && towers != 1) {
        return Err(DslError::Signature {
            message: format!("{strategy:?} strategy cannot build {towers} training towers"),
        });
    }
    (0..towers)
        .map(|i| builder.build_tower(strategy.tower_context(i, towers), signature, f))
        .collect()
}

/// Builds an inference tower `ns_name` that reuses the variables of the training tower with
/// variable scope `vs_name` (`""` for tower 0). It may not create trainable variables.
pub fn build_inference_tower<F>(
    builder: &Builder,
    signature: &[InputSpec],
    ns_name: &str,
    vs_name: &str,
    f: &F,
) -> Result<TowerHandle, DslError>
where
    F: Fn(&[Tensor]) -> Tensor,
{
    let ctx = TowerContext::inference(ns_name, vs_name).with_reuse(true);
    builder.build_tower(ctx, signature, f)
}

/// Builds a whole replicated graph from one tower function.
pub fn replicate<F>(
    signature: &[InputSpec],
    plan: &Replication,
    f: F,
) -> Result<Replicated, DslError>
where
    F: Fn(&[Tensor]) -> Tensor,
{
    let builder = Builder::with_seed(plan.seed);
    let training = build_training_towers(&builder, signature, plan.towers, plan.strategy, &f)?;
    let inference = plan
        .inference
        .iter()
        .map(|ns| build_inference_tower(&builder, signature, ns, "", &f))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Replicated {
        graph: builder.finish()?,
        training,
        inference,
    })
}
