//! tensorpack's CIFAR-10 pre-activation ResNet (`examples/ResNet/cifar10-resnet.py`), depth
//! `6n + 2`, in NHWC:
//!
//! * `conv0`: 3×3, 16 channels, BNReLU;
//! * three stages of `n` residual blocks at 16, 32 and 64 channels (`res1.0` .. `res3.{n-1}`);
//! * `bnlast` BNReLU, `gap` global average pooling, `linear` to 10 classes.
//!
//! Convolutions have no bias and use `VarianceScaling(2.0, fan_out)`. The cost is the mean
//! cross-entropy plus `2e-4 · Σ ||W||²/2` over every `.*/W` (constant: the paper's schedule
//! decays it only after 480k steps).

use super::{classification_loss, with_weight_decay};
use crate::dsl::prelude::*;
use crate::graph;

/// The CIFAR pre-activation ResNet of depth `6n + 2` (ResNet-20 for `n = 3`).
#[derive(Clone, Debug, PartialEq)]
pub struct CifarResNet {
    /// Residual blocks per stage.
    pub n: usize,
    pub classes: usize,
    pub weight_decay: f32,
}

impl CifarResNet {
    /// Depth `6n + 2` with tensorpack's settings.
    pub fn new(n: usize) -> CifarResNet {
        CifarResNet {
            n,
            classes: 10,
            weight_decay: 2e-4,
        }
    }

    /// `input` (`f32 [N, 32, 32, 3]`, mean-subtracted pixels) and `label` (`i32 [N]`).
    pub fn inputs(&self) -> Vec<InputSpec> {
        vec![
            InputSpec::new("input", DType::F32, Shape::batched(&[32, 32, 3])),
            InputSpec::new("label", DType::I32, Shape::batched(&[])),
        ]
    }

    /// The tower function: returns the cost.
    pub fn build(&self, inputs: &[Tensor]) -> Tensor {
        let (image, label) = (&inputs[0], &inputs[1]);
        let logits = graph! {
            let image = image / 128.0;
            let fan_out = variance_scaling(2.0, FanMode::FanOut);
            argscope Conv2D(use_bias = false, kernel_size = 3, kernel_initializer = fan_out) {
                let mut l = Conv2D("conv0", image, filters = 16, activation = bn_relu);
                for stage in 1..=3 {
                    for k in 0..self.n {
                        let increase_dim = stage > 1 && k == 0;
                        let first = stage == 1 && k == 0;
                        l = residual(&format!("res{stage}.{k}"), l, increase_dim, first);
                    }
                }
                let l = BNReLU("bnlast", l);
                let l = GlobalAvgPooling("gap", l);
                FullyConnected("linear", l, units = self.classes)
            }
        };
        let loss = classification_loss(&logits, label);
        with_weight_decay(&loss, ".*/W", self.weight_decay)
    }
}

/// One pre-activation residual block in variable scope `name`: BNReLU (skipped for the very
/// first block), conv 3×3 (stride 2 when `increase_dim`) with BNReLU, conv 3×3, plus the
/// shortcut (2×2 average pooling and zero channel padding when `increase_dim`).
pub fn residual(name: &str, l: Tensor, increase_dim: bool, first: bool) -> Tensor {
    let in_channel = l
        .shape()
        .and_then(|s| s.dims().get(3).copied())
        .and_then(|d| d.fixed())
        .unwrap_or(0);
    let (out_channel, stride) = if increase_dim {
        (in_channel * 2, 2)
    } else {
        (in_channel, 1)
    };
    graph! {
        scope name {
            let b1 = if first { l.clone() } else { bn_relu(&l) };
            let c1 = Conv2D("conv1", b1, filters = out_channel, strides = stride,
                            activation = bn_relu);
            let c2 = Conv2D("conv2", c1, filters = out_channel);
            let shortcut = if increase_dim {
                let pooled = AvgPooling("pool", &l, pool_size = 2);
                pooled.pad(&[(0, 0), (0, 0), (0, 0), (in_channel / 2, in_channel / 2)])
            } else {
                l.clone()
            };
            c2 + shortcut
        }
    }
}
