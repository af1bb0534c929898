//! `ModelDesc` (tensorpack's): an input signature plus a tower function form the model; the
//! optimizer (and gradient processors) say how to minimize its cost. [`ModelFn`] makes one from
//! closures, e.g. around [`crate::models::Mlp`].

use std::sync::Arc;

use crate::dsl::{InputSpec, Tensor};
use crate::optim::{GradientProcessor, Optimizer};

/// A single-cost model.
pub trait ModelDesc {
    /// The input signature (tensorpack's `inputs()`).
    fn inputs(&self) -> Vec<InputSpec>;

    /// The tower function: builds the model on `inputs` (one tensor per signature input) and
    /// returns the total cost (a float scalar) in training towers. It is called once per
    /// training tower and again for inference towers, so it must not have side effects.
    fn build_graph(&self, inputs: &[Tensor]) -> Tensor;

    /// The optimizer; called once per run. It creates `learning_rate`, which callbacks set.
    fn optimizer(&self) -> Optimizer;

    /// Gradient processors applied in order before the optimizer (default: none).
    fn gradient_processors(&self) -> Vec<GradientProcessor> {
        Vec::new()
    }
}

/// The tower function of a [`ModelFn`].
pub type TowerFn = Arc<dyn Fn(&[Tensor]) -> Tensor + Send + Sync>;

/// A [`ModelDesc`] made of a signature, a tower function and an optimizer.
#[derive(Clone)]
pub struct ModelFn {
    inputs: Vec<InputSpec>,
    tower: TowerFn,
    optimizer: Optimizer,
    processors: Vec<GradientProcessor>,
}

impl ModelFn {
    /// The model `tower` on `inputs`, minimized with `optimizer`.
    pub fn new(
        inputs: Vec<InputSpec>,
        tower: impl Fn(&[Tensor]) -> Tensor + Send + Sync + 'static,
        optimizer: Optimizer,
    ) -> ModelFn {
        ModelFn {
            inputs,
            tower: Arc::new(tower),
            optimizer,
            processors: Vec::new(),
        }
    }

    /// Adds gradient processors.
    pub fn with_processors(mut self, processors: Vec<GradientProcessor>) -> ModelFn {
        self.processors = processors;
        self
    }
}

impl ModelDesc for ModelFn {
    fn inputs(&self) -> Vec<InputSpec> {
        self.inputs.clone()
    }

    fn build_graph(&self, inputs: &[Tensor]) -> Tensor {
        (self.tower)(inputs)
    }

    fn optimizer(&self) -> Optimizer {
        self.optimizer.clone()
    }

    fn gradient_processors(&self) -> Vec<GradientProcessor> {
        self.processors.clone()
    }
}
