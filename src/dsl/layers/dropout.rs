//! `Dropout` with a drop *rate* (not tensorpack's historical keep_prob): identity when not
//! training; otherwise keeps each element with probability `1 - rate`, scaled by `1/(1-rate)`.
//!
//! The mask comes from `Op::RandomUniform` with a seed derived from the graph seed and the
//! layer's scoped name (tower included), and the `global_step` read as the counter, so every
//! step, layer and tower draws a different mask, reproducibly.

use super::{layer, run_layer};
use crate::dsl::Tensor;
use crate::dsl::argscope::apply_argscope;
use crate::ir::init::stable_hash;
use crate::ir::rng::mix64;

layer! {
    /// Dropout. Defaults: rate 0.5, `training` from the tower.
    Dropout {
        /// Probability of dropping an element, in `[0, 1)`.
        rate: f64,
        /// Drop elements (default: the tower's `is_training`).
        training: bool,
    }
}

impl Dropout {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        let (rate, training) = (self.rate.unwrap_or(0.5), self.training);
        run_layer("Dropout", &self.name, self.input, |b, x| {
            if !(0.0..1.0).contains(&rate) {
                return Err(format!("rate must be in [0, 1), got {rate}"));
            }
            let training = match (training, b.tower_context()) {
                (Some(t), _) => t,
                (None, Some(ctx)) => ctx.is_training(),
                (None, None) => {
                    return Err("needs a tower context or an explicit `training`".into());
                }
            };
            if !training || rate == 0.0 {
                return Ok(x.clone());
            }
            let seed = mix64(b.seed() ^ stable_hash(&b.name_scope_name()));
            let step = b.global_step();
            let uniform = x.random_uniform_like(seed, &step);
            let keep = uniform.greater_equal(uniform.scalar_like_f64(rate));
            let scaled = x * x.scalar_like_f64(1.0 / (1.0 - rate));
            Ok(keep.select(&scaled, &x.scalar_like(0.0)))
        })
    }
}
