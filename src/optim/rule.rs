//! The extension point of optimizers: an [`UpdateRule`] turns `(variable, gradient)` pairs and
//! the step's learning rate into [`VariableUpdate`]s — the new value of each variable and of
//! each slot it keeps. SGD, Momentum and Adam are the built-in rules behind
//! [`Optimizer`](super::Optimizer)'s constructors; a rule of one's own (AdamW, LARS, ...) is
//! wrapped by [`Optimizer::custom`](super::Optimizer::custom) and then gets everything the
//! built-ins get: gradient accumulation, the `learning_rate` variable and its schedules,
//! checkpointed slots and exact resume.
//!
//! A rule only adds nodes and slot variables to the graph, with the helpers re-exported by
//! [`crate::optim`]: [`create_slot`](super::create_slot) declares `{var}/{suffix}` (zeros of the
//! variable's type, saved in checkpoints), [`read_variable`](super::read_variable) reads a
//! variable as the step began, and `Graph::add_node_on` adds the arithmetic. Every value a rule
//! returns must be computed from reads at the start of the step: assigns happen at its end.

use std::fmt::Debug;

use super::OptimError;
use crate::ir::{Graph, Value, VarId};

/// The new value of one variable (or slot) at the end of the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VariableUpdate {
    pub var: VarId,
    /// A read of the variable's value at the start of the step.
    pub current: Value,
    /// Its value at the end of the step.
    pub new: Value,
}

/// How one optimizer turns gradients into updates.
pub trait UpdateRule: Debug + Send + Sync {
    /// The scope of its update nodes (`{name}/update/{var}/...`).
    fn name(&self) -> &str;

    /// The learning rate the `learning_rate` variable starts at (when no earlier optimizer of
    /// the graph created it).
    fn initial_learning_rate(&self) -> f64;

    /// The suffixes of the slots it creates per variable (`{var}/{suffix}`): applying it to a
    /// variable whose slot exists already is an error caught before anything is built.
    fn slot_suffixes(&self) -> Vec<String>;

    /// Errors for settings it cannot run with (checked before anything is built).
    fn check_settings(&self) -> Result<(), OptimError> {
        Ok(())
    }

    /// The updates of every variable of `grads` and of its slots. `learning_rate` is a scalar
    /// `f32` read of the step's learning rate (cast it to a variable's dtype where they differ).
    /// The gradients were checked: each has its variable's type and no variable appears twice.
    fn updates(
        &self,
        graph: &mut Graph,
        grads: &[(VarId, Value)],
        learning_rate: Value,
    ) -> Result<Vec<VariableUpdate>, OptimError>;
}
