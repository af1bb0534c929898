//! tensorpack's ImageNet ResNet (`examples/ResNet/imagenet-resnet.py`, the non-preact variant)
//! in NHWC: `conv0` 7×7/2 with BNReLU, 3×3/2 max pooling, four groups of bottleneck blocks
//! (`group{i}/block{j}/conv1..conv3`, a `convshortcut` projection where the shape changes),
//! global average pooling and `linear` to 1000 classes. ResNet-50 has `[3, 4, 6, 3]` blocks.

use super::{classification_loss, with_weight_decay};
use crate::dsl::prelude::*;
use crate::graph;

/// An ImageNet bottleneck ResNet.
#[derive(Clone, Debug, PartialEq)]
pub struct ImagenetResNet {
    /// Bottleneck blocks per group.
    pub blocks: [usize; 4],
    /// Side of the square input image.
    pub image_side: usize,
    pub classes: usize,
    pub weight_decay: f32,
}

impl ImagenetResNet {
    /// ResNet-50 on 224×224 images.
    pub fn resnet50() -> ImagenetResNet {
        ImagenetResNet {
            blocks: [3, 4, 6, 3],
            image_side: 224,
            classes: 1000,
            weight_decay: 1e-4,
        }
    }

    /// `input` (`f32 [N, side, side, 3]`) and `label` (`i32 [N]`).
    pub fn inputs(&self) -> Vec<InputSpec> {
        let s = self.image_side;
        vec![
            InputSpec::new("input", DType::F32, Shape::batched(&[s, s, 3])),
            InputSpec::new("label", DType::I32, Shape::batched(&[])),
        ]
    }

    /// The tower function: returns the cost.
    pub fn build(&self, inputs: &[Tensor]) -> Tensor {
        let (image, label) = (&inputs[0], &inputs[1]);
        let logits = graph! {
            argscope Conv2D(use_bias = false) {
                let l = Conv2D("conv0", image, filters = 64, kernel_size = 7, strides = 2, activation = bn_relu);
                let mut l = MaxPooling("pool0", l, pool_size = 3, strides = 2, padding = Padding::Same);
                for (g, &n) in self.blocks.iter().enumerate() {
                    let channels = 64 << g;
                    for b in 0..n {
                        let stride = if g > 0 && b == 0 { 2 } else { 1 };
                        l = bottleneck(&format!("group{g}/block{b}"), l, channels, stride);
                    }
                }
                let l = GlobalAvgPooling("gap", l);
                FullyConnected("linear", l, units = self.classes)
            }
        };
        let loss = classification_loss(&logits, label);
        with_weight_decay(&loss, ".*/W", self.weight_decay)
    }
}

/// A bottleneck block in variable scope `name`: 1×1 conv to `channels`, 3×3 conv (`stride`),
/// 1×1 conv to `4·channels` (BN, no ReLU), plus the shortcut (a 1×1 `convshortcut` with BN
/// when the shape changes), then ReLU.
pub fn bottleneck(name: &str, l: Tensor, channels: usize, stride: usize) -> Tensor {
    let in_channel = l
        .shape()
        .and_then(|s| s.dims().get(3).copied())
        .and_then(|d| d.fixed())
        .unwrap_or(0);
    let out = channels * 4;
    graph! {
        scope name {
            let shortcut = if in_channel != out {
                let s = Conv2D("convshortcut", l.clone(), filters = out, kernel_size = 1, strides = stride);
                BatchNorm("bnshortcut", s)
            } else {
                l.clone()
            };
            let c = Conv2D("conv1", l, filters = channels, kernel_size = 1, activation = bn_relu);
            let c = Conv2D("conv2", c, filters = channels, kernel_size = 3, strides = stride, activation = bn_relu);
            let c = Conv2D("conv3", c, filters = out, kernel_size = 1);
            let c = BatchNorm("bn", c);
            relu(&(c + shortcut))
        }
    }
}
