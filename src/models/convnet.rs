//! A small convnet: twice (3×3 Conv2D without bias, BatchNorm + ReLU, 2×2 max pooling), then a
//! hidden `FullyConnected` with dropout and the `linear` classifier.

use super::{classification_loss, with_weight_decay};
use crate::dsl::prelude::*;
use crate::graph;

/// A two-stage convnet classifier; the default fits `[N, 28, 28, 1]` MNIST images.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvNet {
    /// `[H, W, C]` of one image.
    pub image_shape: [usize; 3],
    /// Output channels of `conv0` and `conv1`.
    pub channels: [usize; 2],
    /// Width of the hidden dense layer `fc0`.
    pub hidden: usize,
    pub classes: usize,
    /// Drop rate of the dropout after `fc0`.
    pub dropout_rate: f64,
    pub weight_decay: f32,
}

impl Default for ConvNet {
    fn default() -> ConvNet {
        ConvNet {
            image_shape: [28, 28, 1],
            channels: [32, 64],
            hidden: 128,
            classes: 10,
            dropout_rate: 0.5,
            weight_decay: 1e-5,
        }
    }
}

impl ConvNet {
    /// `input` (`f32 [N, H, W, C]`) and `label` (`i32 [N]`).
    pub fn inputs(&self) -> Vec<InputSpec> {
        vec![
            InputSpec::new("input", DType::F32, Shape::batched(&self.image_shape)),
            InputSpec::new("label", DType::I32, Shape::batched(&[])),
        ]
    }

    /// The tower function: returns the cost.
    pub fn build(&self, inputs: &[Tensor]) -> Tensor {
        let (image, label) = (&inputs[0], &inputs[1]);
        let [c0, c1] = self.channels;
        let logits = graph! {
            argscope Conv2D(kernel_size = 3, use_bias = false) {
                let l = Conv2D("conv0", image, filters = c0);
                let l = BNReLU("bn0", l);
                let l = MaxPooling("pool0", l, pool_size = 2);
                let l = Conv2D("conv1", l, filters = c1);
                let l = BNReLU("bn1", l);
                MaxPooling("pool1", l, pool_size = 2)
            }
        };
        let logits = graph! {
            let l = FullyConnected("fc0", logits, units = self.hidden, activation = relu);
            let l = Dropout("dropout", l, rate = self.dropout_rate);
            FullyConnected("linear", l, units = self.classes)
        };
        let loss = classification_loss(&logits, label);
        with_weight_decay(&loss, ".*/W", self.weight_decay)
    }
}
