//! Batch-norm forward and softmax cross-entropy forward/backward from NVRTC, against f64
//! references. They use rsqrt.approx, libdevice expf/logf and division; tolerances are relative.

mod common;

use common::*;
use rand::Rng;
use towerpack_ptx::Device;

#[test]
fn batchnorm_forward_matches_f64() {
    let dev = Device::new(0);
    let m = fixture("batchnorm");
    let mut r = rng(40);
    let (rows, ch) = (300usize, 6usize);
    let eps = 1e-5f32;
    let x = uniform(&mut r, rows * ch, -2.0, 3.0);
    let gamma = uniform(&mut r, ch, 0.5, 1.5);
    let beta = uniform(&mut r, ch, -0.5, 0.5);
    let (px, pg, pb) = (upload(&dev, &x), upload(&dev, &gamma), upload(&dev, &beta));
    let (py, pm, ps) = (
        zeros::<f32>(&dev, rows * ch),
        zeros::<f32>(&dev, ch),
        zeros::<f32>(&dev, ch),
    );
    Args::default()
        .ptr(px)
        .ptr(pg)
        .ptr(pb)
        .ptr(py)
        .ptr(pm)
        .ptr(ps)
        .val(rows as i32)
        .val(ch as i32)
        .val(eps)
        .launch(
            &dev,
            &m,
            "batchnorm_forward",
            [ch as u32, 1, 1],
            [128, 1, 1],
            0,
        )
        .unwrap();
    let mut want_y = vec![0f64; rows * ch];
    let mut want_mean = vec![0f64; ch];
    let mut want_inv = vec![0f64; ch];
    for c in 0..ch {
        let col: Vec<f64> = (0..rows).map(|i| f64::from(x[i * ch + c])).collect();
        let mean = col.iter().sum::<f64>() / rows as f64;
        let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / rows as f64;
        let inv = 1.0 / (var + f64::from(eps)).sqrt();
        want_mean[c] = mean;
        want_inv[c] = inv;
        for i in 0..rows {
            want_y[i * ch + c] = f64::from(gamma[c]) * (col[i] - mean) * inv + f64::from(beta[c]);
        }
    }
    assert_close("mean", &download(&dev, pm, ch), &want_mean, 1e-6, 1e-5);
    assert_close("invstd", &download(&dev, ps, ch), &want_inv, 0.0, 1e-5);
    assert_close("y", &download(&dev, py, rows * ch), &want_y, 1e-5, 1e-5);
}

#[test]
fn softmax_cross_entropy_forward_and_backward_match_f64() {
    let dev = Device::new(0);
    let m = fixture("softmax_xent");
    let mut r = rng(41);
    let (rows, cols) = (13usize, 50usize);
    let logits = uniform(&mut r, rows * cols, -6.0, 6.0);
    let labels: Vec<i32> = (0..rows).map(|_| r.random_range(0..cols as i32)).collect();
    let (pl, plab) = (upload(&dev, &logits), upload(&dev, &labels));
    let (pp, ploss) = (zeros::<f32>(&dev, rows * cols), zeros::<f32>(&dev, rows));
    // 4 warps per block, one row per warp; the last block has idle warps that return at once.
    Args::default()
        .ptr(pl)
        .ptr(plab)
        .ptr(pp)
        .ptr(ploss)
        .val(rows as i32)
        .val(cols as i32)
        .launch(
            &dev,
            &m,
            "softmax_xent_forward",
            [(rows as u32).div_ceil(4), 1, 1],
            [128, 1, 1],
            0,
        )
        .unwrap();
    let mut want_p = vec![0f64; rows * cols];
    let mut want_loss = vec![0f64; rows];
    for i in 0..rows {
        let row: Vec<f64> = (0..cols).map(|j| f64::from(logits[i * cols + j])).collect();
        let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        for j in 0..cols {
            want_p[i * cols + j] = (row[j] - mx).exp() / s;
        }
        want_loss[i] = s.ln() + mx - row[labels[i] as usize];
    }
    let probs = download::<f32>(&dev, pp, rows * cols);
    assert_close("probs", &probs, &want_p, 1e-7, 1e-5);
    assert_close("loss", &download(&dev, ploss, rows), &want_loss, 1e-5, 1e-5);

    let d_loss = 2.0f32;
    let (pd, pg) = (upload(&dev, &[d_loss]), zeros::<f32>(&dev, rows * cols));
    Args::default()
        .ptr(pp)
        .ptr(plab)
        .ptr(pd)
        .ptr(pg)
        .val(rows as i32)
        .val(cols as i32)
        .launch(
            &dev,
            &m,
            "softmax_xent_backward",
            [(rows * cols) as u32 / 64 + 1, 1, 1],
            [64, 1, 1],
            0,
        )
        .unwrap();
    let want_g: Vec<f64> = (0..rows * cols)
        .map(|i| {
            let onehot = if labels[i / cols] as usize == i % cols {
                1.0
            } else {
                0.0
            };
            (f64::from(probs[i]) - onehot) * f64::from(d_loss) / rows as f64
        })
        .collect();
    assert_close(
        "d_logits",
        &download(&dev, pg, rows * cols),
        &want_g,
        1e-7,
        1e-6,
    );
}
