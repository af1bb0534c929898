//! The 64×64 shared-memory-tiled SGEMM and the direct NHWC convolution from NVRTC, against f64
//! references. Tolerance: k products of values in [-1, 1] accumulated in f32 (fma.rn) — error
//! at most about k · 2^-24 · Σ|a·b| ≤ k² · 6e-8; we allow 1e-5 · k absolute.

mod common;

use common::*;
use towerpack_ptx::Device;

fn sgemm(dev: &Device, m: usize, n: usize, k: usize, alpha: f32, beta: f32, seed: u64) {
    let module = fixture("sgemm");
    let mut r = rng(seed);
    let a = uniform(&mut r, m * k, -1.0, 1.0);
    let b = uniform(&mut r, k * n, -1.0, 1.0);
    let c0 = uniform(&mut r, m * n, -1.0, 1.0);
    let (pa, pb, pc) = (upload(dev, &a), upload(dev, &b), upload(dev, &c0));
    Args::default()
        .ptr(pa)
        .ptr(pb)
        .ptr(pc)
        .val(m as i32)
        .val(n as i32)
        .val(k as i32)
        .val(alpha)
        .val(beta)
        .launch(
            dev,
            &module,
            "sgemm_64x64",
            [(n as u32).div_ceil(64), (m as u32).div_ceil(64), 1],
            [256, 1, 1],
            0,
        )
        .unwrap();
    let mut want = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                .sum();
            let prior = if beta == 0.0 {
                0.0
            } else {
                f64::from(beta) * f64::from(c0[i * n + j])
            };
            want[i * n + j] = f64::from(alpha) * dot + prior;
        }
    }
    let got = download::<f32>(dev, pc, m * n);
    assert_close(
        &format!("sgemm {m}x{n}x{k}"),
        &got,
        &want,
        1e-5 * k as f64,
        1e-6,
    );
}

#[test]
fn sgemm_exact_tiles() {
    sgemm(&Device::new(0), 128, 64, 32, 1.0, 0.0, 30);
}

#[test]
fn sgemm_ragged_edges_alpha_beta() {
    sgemm(&Device::new(0), 70, 45, 37, 0.5, 2.0, 31);
}

#[test]
fn conv2d_nhwc_with_padding_and_stride() {
    let dev = Device::new(0);
    let module = fixture("conv");
    let mut r = rng(32);
    let (n, h, w, c, kh, kw, k) = (2usize, 9usize, 7usize, 3usize, 3usize, 3usize, 5usize);
    let (sh, sw, ph, pw) = (2usize, 1usize, 1usize, 1usize);
    let oh = (h + 2 * ph - kh) / sh + 1;
    let ow = (w + 2 * pw - kw) / sw + 1;
    let input = uniform(&mut r, n * h * w * c, -1.0, 1.0);
    let filt = uniform(&mut r, kh * kw * c * k, -1.0, 1.0);
    let bias = uniform(&mut r, k, -1.0, 1.0);
    let total = n * oh * ow * k;
    let (pi, pf, pb, po) = (
        upload(&dev, &input),
        upload(&dev, &filt),
        upload(&dev, &bias),
        zeros::<f32>(&dev, total),
    );
    let shape: Vec<i32> = [n, h, w, c, kh, kw, k, oh, ow, sh, sw, ph, pw]
        .iter()
        .map(|&v| v as i32)
        .collect();
    Args::default()
        .ptr(pi)
        .ptr(pf)
        .ptr(pb)
        .ptr(po)
        .raw(bytes_of(&shape))
        .launch(
            &dev,
            &module,
            "conv2d_nhwc",
            [(total as u32).div_ceil(128), 1, 1],
            [128, 1, 1],
            0,
        )
        .unwrap();
    let mut want = vec![0f64; total];
    for b in 0..n {
        for oy in 0..oh {
            for ox in 0..ow {
                for kk in 0..k {
                    let mut acc = f64::from(bias[kk]);
                    for fy in 0..kh {
                        for fx in 0..kw {
                            let iy = (oy * sh + fy) as isize - ph as isize;
                            let ix = (ox * sw + fx) as isize - pw as isize;
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            for ci in 0..c {
                                let iv = input[((b * h + iy as usize) * w + ix as usize) * c + ci];
                                let fv = filt[((fy * kw + fx) * c + ci) * k + kk];
                                acc += f64::from(iv) * f64::from(fv);
                            }
                        }
                    }
                    want[((b * oh + oy) * ow + ox) * k + kk] = acc;
                }
            }
        }
    }
    assert_close(
        "conv2d_nhwc",
        &download(&dev, po, total),
        &want,
        1e-5 * (kh * kw * c) as f64,
        1e-6,
    );
}

#[test]
fn conv2d_without_bias_pointer() {
    // `bias ? bias[k] : 0` with a null pointer: the emulator must not touch address 0.
    let dev = Device::new(0);
    let module = fixture("conv");
    let input = vec![1.0f32; 4 * 4 * 2];
    let filt = vec![0.5f32; 2 * 2 * 2 * 3];
    let (pi, pf, po) = (
        upload(&dev, &input),
        upload(&dev, &filt),
        zeros::<f32>(&dev, 3 * 3 * 3),
    );
    let shape: Vec<i32> = vec![1, 4, 4, 2, 2, 2, 3, 3, 3, 1, 1, 0, 0];
    Args::default()
        .ptr(pi)
        .ptr(pf)
        .val(0u64)
        .ptr(po)
        .raw(bytes_of(&shape))
        .launch(&dev, &module, "conv2d_nhwc", [1, 1, 1], [32, 1, 1], 0)
        .unwrap();
    assert_eq!(download::<f32>(&dev, po, 27), vec![4.0f32; 27]);
}
