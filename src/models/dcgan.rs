//! DCGAN on 28×28×1 images (the `gan` example's model): a generator from noise to images in
//! `[-1, 1]` and a discriminator that shares its variables between its call on real and on
//! generated images. The tower computes both losses (non-saturating GAN); a trainer minimizes
//! them with two optimizers, the discriminator's over `discrim/` and the generator's over `gen/`.

use crate::dsl::prelude::*;
use crate::graph;

/// The DCGAN of the `gan` example.
#[derive(Clone, Debug, PartialEq)]
pub struct Dcgan {
    /// Length of the generator's noise vector.
    pub z_dim: usize,
}

impl Default for Dcgan {
    fn default() -> Dcgan {
        Dcgan { z_dim: 64 }
    }
}

impl Dcgan {
    /// `real` (`f32 [N, 28, 28, 1]`, in `[-1, 1]`) and `z` (`f32 [N, z_dim]`).
    pub fn inputs(&self) -> Vec<InputSpec> {
        vec![
            InputSpec::new("real", DType::F32, Shape::batched(&[28, 28, 1])),
            InputSpec::new("z", DType::F32, Shape::batched(&[self.z_dim])),
        ]
    }

    /// The tower: the generator's loss, with the discriminator's named `d_loss`, the
    /// generator's `g_loss` and the generated images in `[0, 255]` `gen/samples`.
    pub fn build(&self, inputs: &[Tensor]) -> Tensor {
        let (real, z) = (&inputs[0], &inputs[1]);
        let fake = generator(z);
        ((&fake + 1.0) * 127.5).named("gen/samples");
        let real_logit = discriminator(real, false);
        let fake_logit = discriminator(&fake, true);
        let ones = real_logit.scalar_like(1.0);
        let zeros = real_logit.scalar_like(0.0);
        let d_loss = sigmoid_cross_entropy_with_logits(&real_logit, &ones).mean()
            + sigmoid_cross_entropy_with_logits(&fake_logit, &zeros).mean();
        d_loss.named("d_loss");
        sigmoid_cross_entropy_with_logits(&fake_logit, &ones)
            .mean()
            .named("g_loss")
    }
}

/// The generator: noise `[N, z]` → 7×7×64 → 14×14×32 → 28×28×1 in `[-1, 1]`, in scope `gen`.
pub fn generator(z: &Tensor) -> Tensor {
    graph! {
        scope "gen" {
            let l = FullyConnected("fc0", z, units = 7 * 7 * 64, use_bias = false);
            let l = BNReLU("bn0", l).reshape(Shape::batched(&[7, 7, 64]));
            argscope Conv2DTranspose(kernel_size = 4, strides = 2) {
                let l = Conv2DTranspose("deconv0", l, filters = 32, use_bias = false);
                let l = BNReLU("bn1", l);
                Conv2DTranspose("deconv1", l, filters = 1, activation = tanh)
            }
        }
    }
}

/// `BatchNorm("bn", x)` then leaky ReLU (0.2): DCGAN's activation of the discriminator's
/// inner layers (tensorpack's `BNLReLU`).
fn bn_leaky_relu(x: &Tensor) -> Tensor {
    BatchNorm("bn", x).build().leaky_relu(0.2)
}

/// The discriminator: 28×28×1 → 14×14×32 → 7×7×64 → one logit, in variable scope `discrim`
/// (with `reuse`, the variables of an earlier call).
pub fn discriminator(image: &Tensor, reuse: bool) -> Tensor {
    let _scope = variable_scope_with_reuse("discrim", reuse);
    graph! {
        argscope Conv2D(kernel_size = 4, strides = 2, activation = leaky_relu(0.2)) {
            let l = Conv2D("conv0", image, filters = 32);
            let l = Conv2D("conv1", l, filters = 64, activation = bn_leaky_relu);
            FullyConnected("fc", l, units = 1)
        }
    }
}
