//! A multi-layer perceptron for MNIST-sized inputs: flatten, hidden `FullyConnected` layers with
//! ReLU (`fc0`, `fc1`, ...), then `linear` to the classes.

use super::{classification_loss, with_weight_decay};
use crate::dsl::prelude::*;
use crate::graph;

/// An MLP classifier; the default is 784-512-512-10 on `[N, 28, 28]` images.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    /// Shape of one input example (flattened by the first layer).
    pub input_shape: Vec<usize>,
    /// Widths of the hidden layers.
    pub hidden: Vec<usize>,
    pub classes: usize,
    /// L2 scale on the hidden and output weights (`.*/W`).
    pub weight_decay: f32,
    /// Drop rate after each hidden layer (`drop0`, `drop1`, ...); 0 adds no dropout.
    pub dropout_rate: f64,
}

impl Default for Mlp {
    fn default() -> Mlp {
        Mlp {
            input_shape: vec![28, 28],
            hidden: vec![512, 512],
            classes: 10,
            weight_decay: 1e-5,
            dropout_rate: 0.0,
        }
    }
}

impl Mlp {
    /// `input` (`f32 [N, input_shape..]`) and `label` (`i32 [N]`).
    pub fn inputs(&self) -> Vec<InputSpec> {
        vec![
            InputSpec::new("input", DType::F32, Shape::batched(&self.input_shape)),
            InputSpec::new("label", DType::I32, Shape::batched(&[])),
        ]
    }

    /// The tower function: returns the cost.
    pub fn build(&self, inputs: &[Tensor]) -> Tensor {
        let (image, label) = (&inputs[0], &inputs[1]);
        let logits = graph! {
            let mut l = image.clone();
            for (i, &units) in self.hidden.iter().enumerate() {
                l = FullyConnected(format!("fc{i}"), l, units = units, activation = relu);
                if self.dropout_rate > 0.0 {
                    l = Dropout(format!("drop{i}"), l, rate = self.dropout_rate);
                }
            }
            FullyConnected("linear", l, units = self.classes)
        };
        let loss = classification_loss(&logits, label);
        with_weight_decay(&loss, ".*/W", self.weight_decay)
    }
}
