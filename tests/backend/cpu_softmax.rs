//! Softmax, log-softmax and sparse softmax cross-entropy against naive f64 formulas on seeded
//! random rows (including large logits, which must not overflow). Tolerance 1e-5 absolute +
//! 1e-5 relative; gradients are also checked against central finite differences (f64 formulas).
//!
//! Every check runs at each SIMD level this machine allows (`SimdLevel::available`).

use crate::cpu_kernels_common;

use cpu_kernels_common::*;
use rand::Rng;
use towerpack::backend::cpu::kernels::softmax::{
    log_softmax, log_softmax_backward, softmax, softmax_backward, sparse_softmax_cross_entropy,
    sparse_softmax_cross_entropy_backward, sparse_softmax_cross_entropy_with_grad,
};

fn naive_log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&v| (v as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&v| v as f64 - lse).collect()
}

#[test]
fn softmax_and_log_softmax_match_with_their_gradients() {
    at_every_level(|| {
        let mut r = rng(41);
        for case in 0..200 {
            let (rows, cols) = (r.random_range(1..20), r.random_range(1..40));
            let scale = if case % 4 == 0 { 200.0 } else { 3.0 };
            let x: Vec<f32> = random_vec(&mut r, rows * cols)
                .iter()
                .map(|v| v * scale)
                .collect();
            let dy = random_vec(&mut r, rows * cols);
            let logp: Vec<f64> = x.chunks(cols).flat_map(naive_log_softmax).collect();
            let want_log: Vec<f32> = logp.iter().map(|&v| v as f32).collect();
            let want_p: Vec<f32> = logp.iter().map(|&v| v.exp() as f32).collect();

            let mut y = vec![0.0; x.len()];
            softmax(&x, cols, &mut y).unwrap();
            assert_close("softmax", &y, &want_p, 1e-5, 1e-5);
            let mut ly = vec![0.0; x.len()];
            log_softmax(&x, cols, &mut ly).unwrap();
            assert_close("log_softmax", &ly, &want_log, 1e-4, 1e-5);

            // dx_j = p_j (dy_j - Σ dy·p) and dx_j = dy_j - p_j Σ dy, from the f64 probabilities.
            let mut want_ds = vec![0.0; x.len()];
            let mut want_dls = vec![0.0; x.len()];
            for i in 0..rows {
                let span = i * cols..(i + 1) * cols;
                let p: Vec<f64> = logp[span.clone()].iter().map(|v| v.exp()).collect();
                let d: Vec<f64> = dy[span.clone()].iter().map(|&v| v as f64).collect();
                let dot: f64 = p.iter().zip(&d).map(|(a, b)| a * b).sum();
                let sum: f64 = d.iter().sum();
                for j in 0..cols {
                    want_ds[i * cols + j] = (p[j] * (d[j] - dot)) as f32;
                    want_dls[i * cols + j] = (d[j] - p[j] * sum) as f32;
                }
            }
            let mut dx = vec![0.0; x.len()];
            softmax_backward(&y, &dy, cols, &mut dx).unwrap();
            assert_close("softmax backward", &dx, &want_ds, 1e-5, 1e-4);
            log_softmax_backward(&ly, &dy, cols, &mut dx).unwrap();
            assert_close("log_softmax backward", &dx, &want_dls, 1e-5, 1e-4);
        }
    });
}

#[test]
fn cross_entropy_matches_and_its_gradient_matches_finite_differences() {
    at_every_level(|| {
        let mut r = rng(42);
        for case in 0..100 {
            let (rows, classes) = (r.random_range(1..12), r.random_range(1..15));
            let scale = if case % 5 == 0 { 100.0 } else { 2.0 };
            let logits: Vec<f32> = random_vec(&mut r, rows * classes)
                .iter()
                .map(|v| v * scale)
                .collect();
            let labels: Vec<i64> = (0..rows)
                .map(|_| r.random_range(0..classes as i64))
                .collect();
            let dloss = random_vec(&mut r, rows);
            let mut loss = vec![0.0; rows];
            sparse_softmax_cross_entropy(&logits, &labels, classes, &mut loss).unwrap();
            let want: Vec<f32> = logits
                .chunks(classes)
                .zip(&labels)
                .map(|(row, &l)| -naive_log_softmax(row)[l as usize] as f32)
                .collect();
            assert_close("cross-entropy", &loss, &want, 1e-4, 1e-5);

            let mut grad = vec![0.0; logits.len()];
            sparse_softmax_cross_entropy_backward(&logits, &labels, classes, &dloss, &mut grad)
                .unwrap();
            // Central differences of the f64 loss, weighted by dloss.
            let eps = 1e-3f64;
            for (j, &g) in grad.iter().enumerate() {
                let (i, c) = (j / classes, j % classes);
                let row_loss = |delta: f64| {
                    let row: Vec<f32> = (0..classes)
                        .map(|k| {
                            (logits[i * classes + k] as f64 + if k == c { delta } else { 0.0 })
                                as f32
                        })
                        .collect();
                    -naive_log_softmax(&row)[labels[i] as usize]
                };
                let fd = (row_loss(eps) - row_loss(-eps)) / (2.0 * eps) * dloss[i] as f64;
                assert!(
                    (g as f64 - fd).abs() < 2e-3,
                    "case {case} dlogits[{j}] = {g}, finite difference {fd}"
                );
            }
        }
    });
}

#[test]
fn out_of_range_labels_are_errors() {
    let logits = [0.0f32; 6];
    let mut loss = [0.0; 2];
    let err = sparse_softmax_cross_entropy(&logits, &[1i32, 3], 3, &mut loss).unwrap_err();
    assert!(err.to_string().contains("label 3 of row 1"), "{err}");
    let err = sparse_softmax_cross_entropy(&logits, &[-1i64, 0], 3, &mut loss).unwrap_err();
    assert!(err.to_string().contains("label -1 of row 0"), "{err}");
    assert!(softmax(&logits, 4, &mut [0.0; 6]).is_err());
}

#[test]
fn the_one_pass_loss_and_gradient_agree_with_the_separate_kernels() {
    at_every_level(|| {
        let mut r = rng(43);
        for _ in 0..50 {
            let (rows, classes) = (r.random_range(1..20), r.random_range(1..30));
            let logits: Vec<f32> = random_vec(&mut r, rows * classes)
                .iter()
                .map(|v| v * 5.0)
                .collect();
            let labels: Vec<i32> = (0..rows)
                .map(|_| r.random_range(0..classes as i32))
                .collect();
            let (mut loss, mut want_loss) = (vec![0.0; rows], vec![0.0; rows]);
            let (mut grad, mut want_grad) = (vec![0.0; rows * classes], vec![0.0; rows * classes]);
            sparse_softmax_cross_entropy_with_grad(
                &logits,
                &labels,
                classes,
                Some(&mut loss),
                &mut grad,
            )
            .unwrap();
            sparse_softmax_cross_entropy(&logits, &labels, classes, &mut want_loss).unwrap();
            let ones = vec![1.0; rows];
            sparse_softmax_cross_entropy_backward(&logits, &labels, classes, &ones, &mut want_grad)
                .unwrap();
            assert_close("one-pass loss", &loss, &want_loss, 1e-5, 1e-5);
            assert_close("one-pass gradient", &grad, &want_grad, 1e-6, 1e-5);
            // Each gradient row sums to zero (softmax sums to one, minus the one-hot).
            for row in grad.chunks(classes) {
                assert!(row.iter().sum::<f32>().abs() < 1e-5);
            }
        }
    });
}
