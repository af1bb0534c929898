//! Pooling kernels against naive per-window loops on seeded random geometries. Max pooling is
//! tested on tie-heavy inputs (small integers), so routing the gradient to the FIRST maximum in
//! row-major window order is exercised; those results are exact. Average pooling: 1e-5 tolerance.
//!
//! Every check runs at each SIMD level this machine allows (`SimdLevel::available`).

use crate::cpu_kernels_common;

use cpu_kernels_common::*;
use rand::Rng;
use towerpack::backend::cpu::kernels::Padding2d;
use towerpack::backend::cpu::kernels::pool::{
    Pool2dGeometry, avg_pool_backward, avg_pool_forward, global_avg_pool_backward,
    global_avg_pool_forward, max_pool_backward, max_pool_forward,
};

fn random_geometry(rng: &mut rand_chacha::ChaCha8Rng) -> Pool2dGeometry {
    loop {
        let window = [rng.random_range(1..=3), rng.random_range(1..=3)];
        let g = Pool2dGeometry {
            batch: rng.random_range(1..=3),
            in_hw: [rng.random_range(1..=8), rng.random_range(1..=8)],
            channels: rng.random_range(1..=5),
            window,
            strides: [rng.random_range(1..=3), rng.random_range(1..=3)],
            // Padding smaller than the window, as 'same' padding always is.
            padding: Padding2d {
                top: rng.random_range(0..window[0]),
                bottom: rng.random_range(0..window[0]),
                left: rng.random_range(0..window[1]),
                right: rng.random_range(0..window[1]),
            },
        };
        if g.validate().is_ok() {
            return g;
        }
    }
}

/// Calls `visit(out_index, in_indices_in_row_major_window_order)` per output element.
fn windows(g: &Pool2dGeometry, mut visit: impl FnMut(usize, Vec<usize>)) {
    let [oh_len, ow_len] = g.validate().unwrap();
    let ([h, w], c) = (g.in_hw, g.channels);
    for n in 0..g.batch {
        for oh in 0..oh_len {
            for ow in 0..ow_len {
                for ch in 0..c {
                    let mut cells = Vec::new();
                    for kh in 0..g.window[0] {
                        for kw in 0..g.window[1] {
                            let ih = (oh * g.strides[0] + kh) as isize - g.padding.top as isize;
                            let iw = (ow * g.strides[1] + kw) as isize - g.padding.left as isize;
                            if ih >= 0 && iw >= 0 && ih < h as isize && iw < w as isize {
                                cells.push(((n * h + ih as usize) * w + iw as usize) * c + ch);
                            }
                        }
                    }
                    visit(((n * oh_len + oh) * ow_len + ow) * c + ch, cells);
                }
            }
        }
    }
}

#[test]
fn max_pooling_matches_and_routes_to_the_first_maximum() {
    at_every_level(|| {
        let mut r = rng(21);
        for _ in 0..200 {
            let g = random_geometry(&mut r);
            let x = tie_heavy_vec(&mut r, g.input_len());
            let dy = random_vec(&mut r, g.output_len());
            let (mut want_y, mut want_dx) = (vec![0.0; g.output_len()], vec![0.0; g.input_len()]);
            windows(&g, |o, cells| {
                let mut best = cells[0];
                for &i in &cells[1..] {
                    if x[i] > x[best] {
                        best = i;
                    }
                }
                want_y[o] = x[best];
                want_dx[best] += dy[o];
            });
            let mut y = vec![f32::NAN; g.output_len()];
            max_pool_forward(&g, &x, &mut y).unwrap();
            assert_eq!(y, want_y, "max pool forward {g:?}");
            let mut dx = vec![f32::NAN; g.input_len()];
            max_pool_backward(&g, &x, &dy, &mut dx).unwrap();
            assert_close(
                &format!("max pool backward {g:?}"),
                &dx,
                &want_dx,
                1e-6,
                0.0,
            );
        }
    });
}

#[test]
fn average_pooling_divides_by_the_in_bounds_count() {
    at_every_level(|| {
        let mut r = rng(22);
        for _ in 0..200 {
            let g = random_geometry(&mut r);
            let x = random_vec(&mut r, g.input_len());
            let dy = random_vec(&mut r, g.output_len());
            let (mut want_y, mut want_dx) = (vec![0.0; g.output_len()], vec![0.0; g.input_len()]);
            windows(&g, |o, cells| {
                let count = cells.len() as f32;
                want_y[o] = cells.iter().map(|&i| x[i]).sum::<f32>() / count;
                cells.iter().for_each(|&i| want_dx[i] += dy[o] / count);
            });
            let mut y = vec![f32::NAN; g.output_len()];
            avg_pool_forward(&g, &x, &mut y).unwrap();
            assert_close(&format!("avg pool forward {g:?}"), &y, &want_y, 1e-5, 1e-5);
            let mut dx = vec![f32::NAN; g.input_len()];
            avg_pool_backward(&g, &dy, &mut dx).unwrap();
            assert_close(
                &format!("avg pool backward {g:?}"),
                &dx,
                &want_dx,
                1e-5,
                1e-5,
            );
        }
    });
}

#[test]
fn large_pooling_is_the_same_on_one_and_two_threads() {
    at_every_level(|| {
        // Rows of one image never depend on the pool size: results are bit-identical.
        let g = Pool2dGeometry {
            batch: 16,
            in_hw: [32, 32],
            channels: 16,
            window: [3, 3],
            strides: [2, 2],
            padding: Padding2d {
                top: 0,
                bottom: 1,
                left: 0,
                right: 1,
            },
        };
        let mut r = rng(23);
        let x = tie_heavy_vec(&mut r, g.input_len());
        let dy = random_vec(&mut r, g.output_len());
        let run = || {
            let (mut y, mut dx) = (vec![0.0; g.output_len()], vec![0.0; g.input_len()]);
            let (mut ya, mut dxa) = (y.clone(), dx.clone());
            max_pool_forward(&g, &x, &mut y).unwrap();
            max_pool_backward(&g, &x, &dy, &mut dx).unwrap();
            avg_pool_forward(&g, &x, &mut ya).unwrap();
            avg_pool_backward(&g, &dy, &mut dxa).unwrap();
            (y, dx, ya, dxa)
        };
        assert!(with_threads(1, run) == with_threads(2, run));
    });
}

#[test]
fn global_average_pooling_and_its_gradient() {
    at_every_level(|| {
        let mut r = rng(24);
        for _ in 0..50 {
            let (n, p, c) = (
                r.random_range(1..4),
                r.random_range(1..50),
                r.random_range(1..20),
            );
            let x = random_vec(&mut r, n * p * c);
            let mut y = vec![0.0; n * c];
            global_avg_pool_forward(n, p, c, &x, &mut y).unwrap();
            let mut want = vec![0.0; n * c];
            for i in 0..n {
                for ch in 0..c {
                    want[i * c + ch] =
                        (0..p).map(|q| x[(i * p + q) * c + ch]).sum::<f32>() / p as f32;
                }
            }
            assert_close("global avg pool", &y, &want, 1e-5, 1e-5);
            let dy = random_vec(&mut r, n * c);
            let mut dx = vec![f32::NAN; n * p * c];
            global_avg_pool_backward(n, p, c, &dy, &mut dx).unwrap();
            let want: Vec<f32> = (0..n * p * c)
                .map(|i| dy[(i / (p * c)) * c + i % c] / p as f32)
                .collect();
            assert_close("global avg pool backward", &dx, &want, 1e-6, 1e-6);
        }
        assert!(global_avg_pool_forward(2, 3, 4, &[0.0; 23], &mut [0.0; 8]).is_err());
    });
}
