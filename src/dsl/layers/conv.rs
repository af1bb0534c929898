//! `Conv2D` and `Conv2DTranspose`: NHWC inputs, HWIO filters `W`, optional bias `b`.
//! The default kernel initializer is He (`VarianceScaling(2.0, fan_in, normal)`), as tensorpack.

use super::{
    Activation, Pair, layer, nhwc, nonzero, nonzero_pair, required, run_layer, variance_scaling,
};
use crate::dsl::Tensor;
use crate::dsl::argscope::apply_argscope;
use crate::ir::{Conv2dAttrs, FanMode, Initializer, Padding, window_output};
use crate::tower::VarSpec;

layer! {
    /// 2-D convolution (tensorpack `Conv2D`): variables `W` `[kh, kw, C/split, filters]` and
    /// `b` `[filters]`. Defaults: strides 1, padding same, dilation 1, split 1, bias on.
    Conv2D {
        /// Number of output channels (required).
        filters: usize,
        /// Kernel height and width (required).
        kernel_size: Pair,
        strides: Pair,
        padding: Padding,
        dilation_rate: Pair,
        /// Number of groups (group convolution).
        split: usize,
        activation: Activation,
        use_bias: bool,
        kernel_initializer: Initializer,
        bias_initializer: Initializer,
    }
}

fn he_fan_in() -> Initializer {
    variance_scaling(2.0, FanMode::FanIn)
}

fn bias_and_activation(
    b: &crate::dsl::Builder,
    y: Tensor,
    filters: usize,
    use_bias: bool,
    bias_init: Option<Initializer>,
    activation: Option<Activation>,
) -> Tensor {
    let y = if use_bias {
        let init = bias_init.unwrap_or(Initializer::Zeros);
        let bias = b.get_variable("b", &VarSpec::new(&[filters]).init(init));
        y.binary(crate::ir::BinaryOp::Add, &bias, "BiasAdd")
    } else {
        y
    };
    match activation {
        Some(act) => act.apply(&y),
        None => y,
    }
}

impl Conv2D {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        let this = self;
        run_layer("Conv2D", &this.name, this.input.clone(), |b, x| {
            let filters = nonzero(required(this.filters, "filters")?, "filters")?;
            let Pair([kh, kw]) =
                nonzero_pair(required(this.kernel_size, "kernel_size")?, "kernel_size")?;
            let strides = nonzero_pair(this.strides.unwrap_or(Pair([1, 1])), "strides")?;
            let dilations =
                nonzero_pair(this.dilation_rate.unwrap_or(Pair([1, 1])), "dilation_rate")?;
            let [_, _, c] = nhwc(x)?;
            let groups = this.split.unwrap_or(1);
            if groups == 0 || c % groups != 0 || filters % groups != 0 {
                return Err(format!(
                    "split {groups} must divide the input channels {c} and filters {filters}"
                ));
            }
            let attrs = Conv2dAttrs {
                strides: strides.0,
                padding: this.padding.unwrap_or(Padding::Same),
                dilations: dilations.0,
                groups,
            };
            let init = this.kernel_initializer.clone().unwrap_or_else(he_fan_in);
            let w = b.get_variable(
                "W",
                &VarSpec::new(&[kh, kw, c / groups, filters]).init(init),
            );
            let y = x.conv2d(&w, attrs);
            Ok(bias_and_activation(
                b,
                y,
                filters,
                this.use_bias.unwrap_or(true),
                this.bias_initializer.clone(),
                this.activation.clone(),
            ))
        })
    }
}

layer! {
    /// Transposed convolution (tensorpack `Conv2DTranspose`, the generator layer of DCGAN):
    /// variables `W` `[kh, kw, filters, C]` and `b` `[filters]`; output `H·s` (same) or
    /// `(H-1)·s + k` (valid). Defaults: strides 1, padding same, bias on.
    Conv2DTranspose {
        /// Number of output channels (required).
        filters: usize,
        /// Kernel height and width (required).
        kernel_size: Pair,
        strides: Pair,
        padding: Padding,
        activation: Activation,
        use_bias: bool,
        kernel_initializer: Initializer,
        bias_initializer: Initializer,
    }
}

fn transposed_size(input: usize, k: usize, s: usize, padding: Padding) -> Result<usize, String> {
    match padding {
        Padding::Same => Ok(input * s),
        Padding::Valid => Ok((input - 1) * s + k),
        Padding::Explicit(_) => Err("explicit padding is not supported here".into()),
    }
}

impl Conv2DTranspose {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        apply_argscope(&mut self);
        let this = self;
        run_layer("Conv2DTranspose", &this.name, this.input.clone(), |b, x| {
            let filters = nonzero(required(this.filters, "filters")?, "filters")?;
            let Pair([kh, kw]) =
                nonzero_pair(required(this.kernel_size, "kernel_size")?, "kernel_size")?;
            let [h, w, c] = nhwc(x)?;
            let Pair([sh, sw]) = nonzero_pair(this.strides.unwrap_or(Pair([1, 1])), "strides")?;
            let padding = this.padding.unwrap_or(Padding::Same);
            let out_hw = [
                transposed_size(h, kh, sh, padding)?,
                transposed_size(w, kw, sw, padding)?,
            ];
            // The forward convolution of the output must give back the input size.
            for (axis, (&o, (&i, (&k, &s)))) in out_hw
                .iter()
                .zip([h, w].iter().zip([kh, kw].iter().zip([sh, sw].iter())))
                .enumerate()
            {
                let (back, _, _) = window_output(o, k, s, 1, padding, axis)?;
                if back != i {
                    return Err(format!("output size {o} does not convolve back to {i}"));
                }
            }
            let attrs = Conv2dAttrs {
                strides: [sh, sw],
                padding,
                dilations: [1, 1],
                groups: 1,
            };
            let init = this.kernel_initializer.clone().unwrap_or_else(he_fan_in);
            let wt = b.get_variable("W", &VarSpec::new(&[kh, kw, filters, c]).init(init));
            let y = x.conv2d_transpose(&wt, attrs, out_hw);
            Ok(bias_and_activation(
                b,
                y,
                filters,
                this.use_bias.unwrap_or(true),
                this.bias_initializer.clone(),
                this.activation.clone(),
            ))
        })
    }
}
