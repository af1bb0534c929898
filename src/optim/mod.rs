//! Optimizers (SGD, Momentum, Adam, gradient accumulation, user-defined [`UpdateRule`]s,
//! FP16's dynamic loss scale) and
//! gradient processors, built as
//! graph ops on `(variable, gradient)` pairs: slot variables (`conv0/W/Momentum`, ...), the
//! `learning_rate` and `global_step` variables, and `Assign` nodes grouped into a `train_op`.
//!
//! Conventions: per-variable update nodes are named `{Optimizer}/update/{var}/...` and placed
//! on the device of the variable's gradient; step-wide scalars (the learning-rate read, Adam's
//! bias correction, the accumulation counter, the global norm) have no device. Optimizers never
//! increment `global_step`: the trainer's step counter does, with [`increment_global_step`].
//! Weight decay belongs in the cost, as in tensorpack. This stage only adds nodes and variables
//! to a [`Graph`](crate::ir::Graph); it never runs anything.

mod accum;
mod adam;
mod builder;
mod finiteness;
mod loss_scale;
mod optimizer;
mod process;
mod rule;
mod state;

pub use accum::ACCUM_COUNTER;
pub use finiteness::{
    CheckedRows, FiniteRecord, Finiteness, ROW as FINITENESS_ROW, failed_checks, finiteness,
    first_non_finite, gradient_finiteness, record_first_non_finite,
};
pub use loss_scale::{
    DynamicLossScale, LOSS_SCALE, LOSS_SCALE_COLLECTION, LOSS_SCALE_GOOD_STEPS,
    LOSS_SCALE_SKIPPED_STEPS, UNSCALED_GRADIENTS_COLLECTION, gate as gate_on_finite, scale_loss,
    unscale,
};
pub use optimizer::{CustomRule, Optimizer, TrainOp};
pub use process::{
    GradientFn, GradientProcessor, NumericCheck, ProcessedGradients, check_numerics,
    process_gradients,
};
pub use rule::{UpdateRule, VariableUpdate};
pub use state::{
    GLOBAL_STEP, LEARNING_RATE, add_step_counter, create_slot, get_or_create, global_step,
    increment_global_step, learning_rate, read as read_variable,
};

use crate::ir::IrError;

/// Errors of building optimizers and gradient processors, and of numeric checks.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimError {
    #[error(transparent)]
    Ir(#[from] IrError),
    /// A variable that should be get-or-created exists with another type.
    #[error("variable `{name}` exists as {got}, but {expected} is needed")]
    VariableType {
        name: String,
        expected: String,
        got: String,
    },
    #[error("slot variable `{slot}` already exists: gradients of `{variable}` were applied twice")]
    SlotExists { slot: String, variable: String },
    #[error(
        "variable `{variable}` is already assigned in this graph: apply the optimizer once, \
         with every (variable, gradient) pair"
    )]
    AlreadyAssigned { variable: String },
    #[error("variable `{variable}` has two gradients")]
    DuplicateGradient { variable: String },
    #[error("gradient of `{variable}` is {gradient_ty}, but the variable is {variable_ty}")]
    GradientType {
        variable: String,
        variable_ty: String,
        gradient_ty: String,
    },
    #[error("the gradient of `{variable}` does not exist in the graph")]
    UnknownGradient { variable: String },
    #[error("variable `{variable}` is {ty}: only floating-point variables can be optimized")]
    NotFloat { variable: String, ty: String },
    #[error("variable #{0} is not declared in the graph")]
    UnknownVariable(u32),
    #[error("invalid regex `{pattern}`: {message}")]
    InvalidRegex { pattern: String, message: String },
    #[error("{optimizer}: invalid {what} {value}")]
    InvalidSetting {
        optimizer: String,
        what: String,
        value: String,
    },
    /// Loss scaling multiplies an `f32` scalar cost.
    #[error("loss scaling needs an f32 scalar cost, but `{cost}` is {ty}")]
    LossScaleCost { cost: String, ty: String },
    /// A `CheckGradient` check failed.
    #[error("the gradient of `{variable}` is not finite (NaN or infinity)")]
    NonFiniteGradient { variable: String },
    #[error("{got} numeric-check values fetched for {expected} checks")]
    CheckFetch { expected: usize, got: usize },
}
