//! Shared by the `cpu_kernels_*` tests: seeded random inputs, naive reference implementations
//! written straight from the definitions (f64 accumulation), and tolerance checks.

#![allow(dead_code)] // Each test file uses a different subset.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use towerpack::backend::cpu::kernels::{Conv2dGeometry, Padding2d, SimdLevel};

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `len` values uniform in `[-1, 1)`.
pub fn random_vec(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// `len` values from a small set of integers, so that ties are common.
pub fn tie_heavy_vec(rng: &mut ChaCha8Rng, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| rng.random_range(-3i32..3) as f32)
        .collect()
}

/// Asserts `|got - want| <= atol + rtol·|want|` element by element, naming the first miss and
/// the SIMD level in force.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    let level = SimdLevel::current();
    assert_eq!(got.len(), want.len(), "{what} [{level}]: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = g == w || (g - w).abs() <= atol + rtol * w.abs() || (g.is_nan() && w.is_nan());
        assert!(ok, "{what} [{level}]: element {i} is {g}, expected {w}");
    }
}

/// Runs `f` inside a rayon pool of `threads` threads, at the SIMD level in force here (a closure
/// moved to another thread does not inherit it by itself).
pub fn with_threads<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    let level = SimdLevel::current();
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a test thread pool")
        .install(|| level.run(f))
}

/// Runs `f` at every SIMD level this machine (and `TOWERPACK_SIMD`) allows, narrowest first.
pub fn at_every_level(f: impl Fn()) {
    for level in SimdLevel::available() {
        level.run(&f);
    }
}

/// Visits every (output index, input index, filter index) triple of a convolution that
/// contributes a product `x[input] * w[filter]` to `y[output]`.
fn conv_taps(g: &Conv2dGeometry, mut visit: impl FnMut(usize, usize, usize)) {
    let [oh_len, ow_len] = g.validate().expect("valid geometry");
    let [h, w] = g.in_hw;
    let (c, o) = (g.in_channels, g.out_channels);
    let (cg, og) = (c / g.groups, o / g.groups);
    for n in 0..g.batch {
        for oh in 0..oh_len {
            for ow in 0..ow_len {
                for oc in 0..o {
                    let group = oc / og;
                    for kh in 0..g.kernel_hw[0] {
                        for kw in 0..g.kernel_hw[1] {
                            let ih = (oh * g.strides[0] + kh * g.dilations[0]) as isize
                                - g.padding.top as isize;
                            let iw = (ow * g.strides[1] + kw * g.dilations[1]) as isize
                                - g.padding.left as isize;
                            if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                continue;
                            }
                            for cl in 0..cg {
                                let out = ((n * oh_len + oh) * ow_len + ow) * o + oc;
                                let input =
                                    ((n * h + ih as usize) * w + iw as usize) * c + group * cg + cl;
                                let filter = ((kh * g.kernel_hw[1] + kw) * cg + cl) * o + oc;
                                visit(out, input, filter);
                            }
                        }
                    }
                }
            }
        }
    }
}

pub fn naive_conv_forward(g: &Conv2dGeometry, x: &[f32], w: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0f64; g.output_len()];
    conv_taps(g, |o, i, f| y[o] += f64::from(x[i]) * f64::from(w[f]));
    y.into_iter().map(|v| v as f32).collect()
}

pub fn naive_conv_backward_input(g: &Conv2dGeometry, dy: &[f32], w: &[f32]) -> Vec<f32> {
    let mut dx = vec![0.0f64; g.input_len()];
    conv_taps(g, |o, i, f| dx[i] += f64::from(dy[o]) * f64::from(w[f]));
    dx.into_iter().map(|v| v as f32).collect()
}

pub fn naive_conv_backward_filter(g: &Conv2dGeometry, x: &[f32], dy: &[f32]) -> Vec<f32> {
    let mut dw = vec![0.0f64; g.filter_len()];
    conv_taps(g, |o, i, f| dw[f] += f64::from(dy[o]) * f64::from(x[i]));
    dw.into_iter().map(|v| v as f32).collect()
}

/// Dilations of 1 or 2 along each axis.
pub fn random_dilations(rng: &mut ChaCha8Rng) -> [usize; 2] {
    [rng.random_range(1..=2), rng.random_range(1..=2)]
}

/// Asymmetric padding of 0–2 on each side (drawn top, bottom, left, right).
pub fn random_padding(rng: &mut ChaCha8Rng) -> Padding2d {
    Padding2d {
        top: rng.random_range(0..=2),
        bottom: rng.random_range(0..=2),
        left: rng.random_range(0..=2),
        right: rng.random_range(0..=2),
    }
}

/// Upper bounds of [`random_one_group_geometry`].
pub struct GeometryLimits {
    pub hw: usize,
    pub in_channels: usize,
    pub out_channels: usize,
    pub stride: usize,
}

/// A random valid one-group geometry: batch 1–3, sizes up to `limits.hw`, channels and strides
/// up to their limits, 1–3 taps, dilations 1–2, asymmetric padding 0–2.
pub fn random_one_group_geometry(rng: &mut ChaCha8Rng, limits: &GeometryLimits) -> Conv2dGeometry {
    loop {
        let g = Conv2dGeometry {
            batch: rng.random_range(1..=3),
            in_hw: [
                rng.random_range(1..=limits.hw),
                rng.random_range(1..=limits.hw),
            ],
            in_channels: rng.random_range(1..=limits.in_channels),
            out_channels: rng.random_range(1..=limits.out_channels),
            kernel_hw: [rng.random_range(1..=3), rng.random_range(1..=3)],
            strides: [
                rng.random_range(1..=limits.stride),
                rng.random_range(1..=limits.stride),
            ],
            dilations: random_dilations(rng),
            padding: random_padding(rng),
            groups: 1,
        };
        if g.validate().is_ok() {
            return g;
        }
    }
}
