//! Layers as tensorpack names them: each is called as `Layer("name", x)`, opens variable scope
//! `name`, takes keyword-style arguments as builder methods (`.filters(16)`), honours
//! [`argscope`](super::argscope) for every argument not given, and is added by `.build()`.
//! Each layer's result is an `Identity` named `<name>/output`.

mod act;
mod conv;
mod dense;
mod dropout;
mod losses;
mod norm;
mod pool;

pub use act::{Activation, LeakyReLU, bn_relu, identity, leaky_relu, relu, sigmoid, tanh};
pub use conv::{Conv2D, Conv2DTranspose};
pub use dense::FullyConnected;
pub use dropout::Dropout;
pub use losses::{
    add_moving_summary, add_regularization_loss, add_tensor_summary, regularize_cost,
    regularize_cost_from_collection, sigmoid_cross_entropy_with_logits,
    sparse_softmax_cross_entropy,
};
pub use norm::{BNReLU, BatchNorm};
pub use pool::{AvgPooling, GlobalAvgPooling, MaxPooling};

use super::builder::Builder;
use super::builder::Tensor;
use super::error::DslError;
use super::tensor::orphan;
use crate::ir::{Distribution, FanMode, Initializer};

/// A value a layer argument of type `T` accepts. Every type accepts itself; [`Pair`] also
/// accepts `3`, `[3, 1]` and `(3, 1)`; [`Activation`] accepts any `Fn(&Tensor) -> Tensor`.
/// (A trait rather than `Into`, so that `filters = 16` infers `usize`.)
pub trait IntoArg<T> {
    /// The argument value.
    fn into_arg(self) -> T;
}

impl<T> IntoArg<T> for T {
    fn into_arg(self) -> T {
        self
    }
}

/// A pair of sizes (kernel, strides, dilation), from `3`, `[3, 1]` or `(3, 1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair(pub [usize; 2]);

impl IntoArg<Pair> for usize {
    fn into_arg(self) -> Pair {
        Pair([self, self])
    }
}

impl IntoArg<Pair> for [usize; 2] {
    fn into_arg(self) -> Pair {
        Pair(self)
    }
}

impl IntoArg<Pair> for (usize, usize) {
    fn into_arg(self) -> Pair {
        Pair([self.0, self.1])
    }
}

/// `VarianceScaling(scale, mode, untruncated normal)`: tensorpack's default kernel initializer
/// is `variance_scaling(2.0, FanMode::FanIn)` (He).
pub fn variance_scaling(scale: f64, mode: FanMode) -> Initializer {
    Initializer::VarianceScaling {
        scale,
        mode,
        distribution: Distribution::Normal,
    }
}

/// Declares a layer: the argument struct (every argument optional, filled from argscope), its
/// keyword setters, and the function of the same name that starts a call.
macro_rules! layer {
    (
        $(#[$doc:meta])*
        $Layer:ident {
            $( $(#[$fdoc:meta])* $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone, Default)]
        #[must_use = "call .build() to add the layer to the graph"]
        pub struct $Layer {
            name: String,
            input: Option<$crate::dsl::Tensor>,
            $( $field: Option<$ty>, )*
        }

        impl $Layer {
            /// An empty argument set: the starting point of an argscope.
            pub fn defaults() -> Self {
                Self::default()
            }

            $(
                $(#[$fdoc])*
                pub fn $field(mut self, value: impl $crate::dsl::layers::IntoArg<$ty>) -> Self {
                    self.$field = Some(value.into_arg());
                    self
                }
            )*
        }

        impl $crate::dsl::LayerDefaults for $Layer {
            fn fill_from(&mut self, defaults: &Self) {
                let _ = defaults;
                $(
                    if self.$field.is_none() {
                        self.$field = defaults.$field.clone();
                    }
                )*
            }
        }

        #[doc = concat!("Starts a [`", stringify!($Layer), "`](struct@", stringify!($Layer), ") layer named `name` on `input`; ",
                        "set arguments with its methods and add it with `.build()`.")]
        #[allow(non_snake_case)]
        pub fn $Layer(name: impl AsRef<str>, input: impl Into<$crate::dsl::Tensor>) -> $Layer {
            let mut layer = $Layer::default();
            layer.name = name.as_ref().to_string();
            layer.input = Some(input.into());
            layer
        }
    };
}
pub(crate) use layer;

/// Runs the body of layer `kind` named `name` inside its variable scope; a body error becomes a
/// [`DslError::Layer`] naming the scoped layer, and poisons the result.
pub(crate) fn run_layer(
    kind: &'static str,
    name: &str,
    input: Option<Tensor>,
    body: impl FnOnce(&Builder, &Tensor) -> Result<Tensor, String>,
) -> Tensor {
    let Some(x) = input else {
        return orphan(kind);
    };
    let b = x.builder().clone();
    if x.is_poisoned() || b.is_poisoned() {
        return b.poisoned();
    }
    let _scope = b.variable_scope(name);
    if b.is_poisoned() {
        return b.poisoned();
    }
    match body(&b, &x) {
        Ok(y) => y.named("output"),
        Err(message) => {
            let layer = b.name_scope_name();
            b.fail(DslError::Layer {
                layer,
                kind,
                message,
            })
        }
    }
}

/// `Err` naming a required argument that neither the call nor an argscope gave.
pub(crate) fn required<T>(value: Option<T>, arg: &str) -> Result<T, String> {
    value.ok_or_else(|| format!("missing required argument `{arg}`"))
}

/// `Err` naming size argument `arg` when it is 0: a layer with no units, filters or window
/// would train a model that ignores its input.
pub(crate) fn nonzero(value: usize, arg: &str) -> Result<usize, String> {
    if value == 0 {
        return Err(format!(
            "`{arg}` must be at least 1, got 0 (a layer of size 0 ignores its input)"
        ));
    }
    Ok(value)
}

/// [`nonzero`] for both sizes of a pair (kernel, strides, dilation, pooling window).
pub(crate) fn nonzero_pair(value: Pair, arg: &str) -> Result<Pair, String> {
    if value.0.contains(&0) {
        return Err(format!(
            "`{arg}` must be at least 1 in both dimensions, got {:?}",
            value.0
        ));
    }
    Ok(value)
}

/// The fixed `[N, H, W, C]` dimensions `(H, W, C)` of an NHWC input; none may be 0.
pub(crate) fn nhwc(x: &Tensor) -> Result<[usize; 3], String> {
    let shape = x.shape().ok_or("poisoned input")?;
    let dims = shape.dims();
    let fixed = |i: usize| dims.get(i).and_then(|d| d.fixed());
    match (shape.rank(), fixed(1), fixed(2), fixed(3)) {
        (4, Some(h), Some(w), Some(c)) if h > 0 && w > 0 && c > 0 => Ok([h, w, c]),
        (4, Some(_), Some(_), Some(_)) => Err(format!(
            "input {shape} is empty: H, W and C must be at least 1"
        )),
        _ => Err(format!(
            "input must be NHWC with fixed H, W, C; got {shape}"
        )),
    }
}
