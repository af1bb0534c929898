//! `BatchNorm` (tower-aware, tensorpack semantics) and `BNReLU`.
//!
//! Variables: `beta`, `gamma` (trainable), `mean/EMA`, `variance/EMA` (non-trainable, in
//! MODEL_VARIABLES). Training normalizes with the batch moments and, in the main training tower
//! only, adds the EMA `Assign`s to UPDATE_OPS; inference (or `training = false`) uses the EMAs.
//! A call under variable reuse (a layer applied a second time in the same tower, as a GAN's
//! discriminator on real and on generated images) normalizes with its own batch's moments but
//! adds no second EMA update: the first call's updates the EMAs (one assign per variable and
//! step).

use super::{layer, run_layer};
use crate::dsl::Tensor;
use crate::dsl::argscope::apply_argscope;
use crate::ir::Initializer;
use crate::tower::{UPDATE_OPS, VarSpec};

layer! {
    /// Batch normalization over the last axis of an `[N, C]` or NHWC input.
    /// Defaults: momentum 0.9, epsilon 1e-5, center and scale on, `training` from the tower.
    BatchNorm {
        /// EMA decay: `ema = ema·momentum + batch·(1 - momentum)`.
        momentum: f64,
        epsilon: f64,
        /// Learn a shift `beta`.
        center: bool,
        /// Learn a scale `gamma`.
        scale: bool,
        /// Normalize with batch statistics (default: the tower's `is_training`).
        training: bool,
        gamma_initializer: Initializer,
        beta_initializer: Initializer,
    }
}

impl BatchNorm {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        let this = self;
        run_layer("BatchNorm", &this.name, this.input.clone(), |b, x| {
            let shape = x.shape().ok_or("poisoned input")?.clone();
            let axes: Vec<usize> = match shape.rank() {
                2 => vec![0],
                4 => vec![0, 1, 2],
                r => return Err(format!("input must be [N, C] or NHWC, got rank {r}")),
            };
            let channels = shape
                .dims()
                .last()
                .and_then(|d| d.fixed())
                .ok_or("the channel dimension must be fixed")?;
            let ctx = b.tower_context();
            let training = match (this.training, &ctx) {
                (Some(t), _) => t,
                (None, Some(c)) => c.is_training(),
                (None, None) => {
                    return Err("needs a tower context or an explicit `training`".into());
                }
            };
            let momentum = this.momentum.unwrap_or(0.9);
            let epsilon = this.epsilon.unwrap_or(1e-5);
            let param = |name: &str, init: Initializer, trainable: bool| {
                let spec = VarSpec::new(&[channels])
                    .init(init)
                    .trainable(trainable)
                    .model(!trainable);
                b.get_variable(name, &spec)
            };
            let beta = this.center.unwrap_or(true).then(|| {
                let init = this.beta_initializer.clone().unwrap_or(Initializer::Zeros);
                param("beta", init, true)
            });
            let gamma = this.scale.unwrap_or(true).then(|| {
                let init = this.gamma_initializer.clone().unwrap_or(Initializer::Ones);
                param("gamma", init, true)
            });
            let ema_mean = param("mean/EMA", Initializer::Zeros, false);
            let ema_var = param("variance/EMA", Initializer::Ones, false);
            let (mean, var) = if training {
                let (mean, var) = x.moments(&axes);
                let updates_ema = ctx.as_ref().is_none_or(|c| c.is_main_training_tower());
                if updates_ema && !b.reuse() {
                    for (ema, batch, op) in [
                        (&ema_mean, &mean, "AssignMovingAvg"),
                        (&ema_var, &var, "AssignMovingAvg_1"),
                    ] {
                        let decay = ema.scalar_like_f64(momentum);
                        let rest = ema.scalar_like_f64(1.0 - momentum);
                        let updated = ema * decay + batch * rest;
                        if let Some(assign) = b.assign_as(op, ema, &updated) {
                            b.add_node_to_collection(UPDATE_OPS, assign);
                        }
                    }
                }
                (mean, var)
            } else {
                (ema_mean, ema_var)
            };
            let mut y = (x - &mean) * (&var + var.scalar_like_f64(epsilon)).rsqrt();
            if let Some(gamma) = gamma {
                y = y * gamma;
            }
            if let Some(beta) = beta {
                y = y + beta;
            }
            Ok(y)
        })
    }
}

layer! {
    /// `BatchNorm("bn")` then ReLU inside scope `name` (variables `<name>/bn/gamma`, ...).
    /// BatchNorm arguments come from an argscope on [`struct@BatchNorm`].
    BNReLU {}
}

impl BNReLU {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        run_layer("BNReLU", &self.name, self.input, |_, x| {
            Ok(super::bn_relu(x))
        })
    }
}
