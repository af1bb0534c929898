//! `FullyConnected`: flattens its input to `[N, in]`, then `x·W + b` with `W` `[in, units]`.

use super::{Activation, layer, nonzero, required, run_layer, variance_scaling};
use crate::dsl::Tensor;
use crate::dsl::argscope::apply_argscope;
use crate::ir::{BinaryOp, FanMode, Initializer};
use crate::tower::VarSpec;

layer! {
    /// Dense layer (tensorpack `FullyConnected`): variables `W` `[in, units]` (He init) and
    /// `b` `[units]`. Inputs of rank > 2 are flattened.
    FullyConnected {
        /// Number of outputs (required).
        units: usize,
        activation: Activation,
        use_bias: bool,
        kernel_initializer: Initializer,
        bias_initializer: Initializer,
    }
}

impl FullyConnected {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        let this = self;
        run_layer("FullyConnected", &this.name, this.input.clone(), |b, x| {
            let units = nonzero(required(this.units, "units")?, "units")?;
            let rank = x.rank().unwrap_or(0);
            if rank < 2 {
                return Err(format!("input must have rank >= 2, got rank {rank}"));
            }
            let x = if rank > 2 { x.flatten() } else { x.clone() };
            let fan_in = x
                .shape()
                .and_then(|s| s.dims().last().copied())
                .and_then(|d| d.fixed())
                .ok_or("the input's last dimension must be fixed")?;
            if fan_in == 0 {
                return Err(format!(
                    "the input has 0 features per example (shape {})",
                    x.shape().map_or_else(|| "?".to_string(), |s| s.to_string())
                ));
            }
            let init = this
                .kernel_initializer
                .clone()
                .unwrap_or_else(|| variance_scaling(2.0, FanMode::FanIn));
            let w = b.get_variable("W", &VarSpec::new(&[fan_in, units]).init(init));
            let mut y = x.matmul(&w);
            if this.use_bias.unwrap_or(true) {
                let init = this.bias_initializer.clone().unwrap_or(Initializer::Zeros);
                let bias = b.get_variable("b", &VarSpec::new(&[units]).init(init));
                y = y.binary(BinaryOp::Add, &bias, "BiasAdd");
            }
            Ok(match &this.activation {
                Some(act) => act.apply(&y),
                None => y,
            })
        })
    }
}
