//! Activations: plain functions usable as a layer's `activation` argument, the [`Activation`]
//! type that holds one, and the `LeakyReLU` layer.

use super::norm::BatchNorm;
use super::{layer, required, run_layer};
use crate::dsl::Tensor;
use std::rc::Rc;

/// An activation function applied by a layer after its linear part.
#[derive(Clone)]
pub struct Activation(Rc<dyn Fn(&Tensor) -> Tensor>);

impl<F: Fn(&Tensor) -> Tensor + 'static> super::IntoArg<Activation> for F {
    fn into_arg(self) -> Activation {
        Activation(Rc::new(self))
    }
}

impl Activation {
    /// An activation from a function.
    pub fn new(f: impl Fn(&Tensor) -> Tensor + 'static) -> Activation {
        Activation(Rc::new(f))
    }

    /// Applies the activation.
    pub fn apply(&self, x: &Tensor) -> Tensor {
        (self.0)(x)
    }
}

/// `max(x, 0)`.
pub fn relu(x: &Tensor) -> Tensor {
    x.relu()
}

/// The logistic sigmoid.
pub fn sigmoid(x: &Tensor) -> Tensor {
    x.sigmoid()
}

/// Hyperbolic tangent.
pub fn tanh(x: &Tensor) -> Tensor {
    x.tanh()
}

/// No activation.
pub fn identity(x: &Tensor) -> Tensor {
    x.clone()
}

/// `BatchNorm("bn", x)` then ReLU, in the current scope (tensorpack's `BNReLU` without a name,
/// as used for `activation=BNReLU`: variables `<layer>/bn/gamma`, ...).
pub fn bn_relu(x: &Tensor) -> Tensor {
    BatchNorm("bn", x).build().relu()
}

/// `max(x, alpha·x)` as an activation argument.
pub fn leaky_relu(alpha: f32) -> Activation {
    Activation::new(move |x: &Tensor| x.leaky_relu(alpha))
}

layer! {
    /// Leaky ReLU: `max(x, alpha·x)`; `alpha` is required.
    LeakyReLU {
        /// The slope for negative inputs.
        alpha: f32,
    }
}

impl LeakyReLU {
    /// Adds the layer.
    pub fn build(mut self) -> Tensor {
        crate::dsl::argscope::apply_argscope(&mut self);
        let alpha = self.alpha;
        run_layer("LeakyReLU", &self.name, self.input, |_, x| {
            Ok(x.leaky_relu(required(alpha, "alpha")?))
        })
    }
}
