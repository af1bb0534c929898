//! Materialises variable initializers into host tensors, deterministically.
//!
//! The stream of random numbers of a variable depends only on the run's seed and the variable's
//! full name, so initial values do not change when unrelated variables are added or reordered.

use super::op::{Distribution, FanMode, Initializer};
use super::variable::VariableDef;
use crate::tensor::HostTensor;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution as _, Normal, Uniform};

/// FNV-1a: a stable 64-bit hash of a string (the std hasher is not stable across releases).
pub fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `(fan_in, fan_out)` of a shape, as Keras computes them (HWIO filters, `[in, out]` matrices).
pub fn fans(shape: &[usize]) -> (f64, f64) {
    match shape.len() {
        0 => (1.0, 1.0),
        1 => (shape[0] as f64, shape[0] as f64),
        2 => (shape[0] as f64, shape[1] as f64),
        r => {
            let receptive: usize = shape[..r - 2].iter().product();
            (
                (receptive * shape[r - 2]) as f64,
                (receptive * shape[r - 1]) as f64,
            )
        }
    }
}

fn normal(rng: &mut ChaCha8Rng, n: usize, mean: f64, stddev: f64, truncated: bool) -> Vec<f64> {
    let Ok(dist) = Normal::new(0.0, 1.0) else {
        return vec![mean; n];
    };
    (0..n)
        .map(|_| {
            loop {
                let z: f64 = dist.sample(rng);
                if !truncated || z.abs() <= 2.0 {
                    break mean + stddev * z;
                }
            }
        })
        .collect()
}

fn uniform(rng: &mut ChaCha8Rng, n: usize, low: f64, high: f64) -> Vec<f64> {
    match Uniform::new(low, high) {
        Ok(d) => (0..n).map(|_| d.sample(rng)).collect(),
        Err(_) => vec![low; n],
    }
}

/// The initial value of `def` for the run seeded with `seed`.
pub fn initial_value(def: &VariableDef, seed: u64) -> HostTensor {
    let shape = def.ty.shape.to_static().unwrap_or_default();
    let n: usize = shape.iter().product();
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ stable_hash(&def.name));
    let values: Vec<f64> = match &def.init {
        Initializer::Value(v) => return v.cast(def.ty.dtype),
        Initializer::Zeros => vec![0.0; n],
        Initializer::Ones => vec![1.0; n],
        Initializer::Constant(c) => vec![*c; n],
        Initializer::Uniform { low, high } => uniform(&mut rng, n, *low, *high),
        Initializer::Normal { mean, stddev } => normal(&mut rng, n, *mean, *stddev, false),
        Initializer::TruncatedNormal { mean, stddev } => normal(&mut rng, n, *mean, *stddev, true),
        Initializer::VarianceScaling {
            scale,
            mode,
            distribution,
        } => {
            let (fan_in, fan_out) = fans(&shape);
            let fan = match mode {
                FanMode::FanIn => fan_in,
                FanMode::FanOut => fan_out,
                FanMode::FanAvg => (fan_in + fan_out) / 2.0,
            }
            .max(1.0);
            let var = scale / fan;
            match distribution {
                Distribution::Normal => normal(&mut rng, n, 0.0, var.sqrt(), false),
                // The stddev of a standard normal truncated to ±2 is 0.87962566...
                Distribution::TruncatedNormal => {
                    normal(&mut rng, n, 0.0, var.sqrt() / 0.879_625_661_034_239_8, true)
                }
                Distribution::Uniform => {
                    let limit = (3.0 * var).sqrt();
                    uniform(&mut rng, n, -limit, limit)
                }
            }
        }
    };
    // The element count matches the static shape by construction.
    HostTensor::from_f64_values(def.ty.dtype, &shape, values)
        .unwrap_or_else(|_| HostTensor::zeros(def.ty.dtype, &shape))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Shape, TensorType, VarFlags};

    fn def(name: &str, shape: &[usize], init: Initializer) -> VariableDef {
        VariableDef {
            name: name.into(),
            ty: TensorType::f32(Shape::fixed(shape)),
            init,
            flags: VarFlags::default(),
        }
    }

    #[test]
    fn he_init_has_the_requested_spread_and_is_deterministic() {
        let init = Initializer::VarianceScaling {
            scale: 2.0,
            mode: FanMode::FanIn,
            distribution: Distribution::Normal,
        };
        let d = def("conv0/W", &[3, 3, 64, 64], init);
        let a = initial_value(&d, 7).to_f64_vec();
        assert_eq!(a, initial_value(&d, 7).to_f64_vec());
        assert_ne!(a, initial_value(&d, 8).to_f64_vec());
        let var = a.iter().map(|x| x * x).sum::<f64>() / a.len() as f64;
        let expected = 2.0 / (3.0 * 3.0 * 64.0);
        assert!(
            (var / expected - 1.0).abs() < 0.05,
            "variance {var} vs {expected}"
        );
    }
}
