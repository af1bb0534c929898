//! Reusable tower functions written with `graph!`: an MLP, a small convnet, tensorpack's
//! CIFAR pre-activation ResNet and its ImageNet bottleneck ResNet, and the DCGAN of the `gan`
//! example. Each model has an input signature (`inputs()`) and a tower
//! function (`build(&inputs) -> cost`), and names `cross_entropy_loss` and `wrong_vector` for
//! callbacks (`ScalarStats`, `ClassificationError`).

mod convnet;
mod dcgan;
mod imagenet_resnet;
mod mlp;
mod resnet;

pub use convnet::ConvNet;
pub use dcgan::{Dcgan, discriminator, generator};
pub use imagenet_resnet::{ImagenetResNet, bottleneck};
pub use mlp::Mlp;
pub use resnet::{CifarResNet, residual};

use crate::dsl::prelude::*;

/// The classification bookkeeping shared by the models: the mean sparse cross-entropy named
/// `cross_entropy_loss`, the per-example error `wrong_vector` (`!in_top_k(logits, label, 1)`
/// as `f32`), and moving summaries of `train_error` and the loss. Returns the loss.
pub fn classification_loss(logits: &Tensor, label: &Tensor) -> Tensor {
    let loss = sparse_softmax_cross_entropy(logits, label).named("cross_entropy_loss");
    let wrong = logits
        .in_top_k(label, 1)
        .logical_not()
        .cast(DType::F32)
        .named("wrong_vector");
    add_moving_summary(&wrong.mean().named("train_error"));
    add_moving_summary(&loss);
    loss
}

/// `loss + regularize_cost(regex, l2)` named `cost`, with `wd_cost` summarized.
pub fn with_weight_decay(loss: &Tensor, regex: &str, l2_scale: f32) -> Tensor {
    let wd = regularize_cost(regex, l2_scale).named("wd_cost");
    add_moving_summary(&wd);
    (loss + wd).named("cost")
}
