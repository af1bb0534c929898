//! Elementwise and broadcast kernels from NVRTC, bit-exact against f32 Rust (only round-to-nearest
//! operations are involved: fma.rn, div.rn, max, mul, add).

mod common;

use common::*;
use towerpack_ptx::Device;

#[test]
fn fused_axpy_relu_is_bit_exact_with_float4_body_and_tail() {
    let dev = Device::new(0);
    let m = fixture("elementwise");
    let mut r = rng(10);
    for n in [1usize, 7, 1000, 4099] {
        let x = uniform(&mut r, n, -3.0, 3.0);
        let y = uniform(&mut r, n, -3.0, 3.0);
        let alpha = 0.75f32;
        let (px, py, po) = (upload(&dev, &x), upload(&dev, &y), zeros::<f32>(&dev, n));
        let threads = n.div_ceil(4).max(1) as u32;
        let grid = threads.div_ceil(128);
        Args::default()
            .ptr(px)
            .ptr(py)
            .ptr(po)
            .val(alpha)
            .val(n as i32)
            .launch(&dev, &m, "fused_axpy_relu", [grid, 1, 1], [128, 1, 1], 0)
            .unwrap();
        let want: Vec<f32> = x
            .iter()
            .zip(&y)
            .map(|(&a, &b)| a.mul_add(alpha, b).max(0.0))
            .collect();
        assert_bits(&format!("axpy_relu n={n}"), &download(&dev, po, n), &want);
    }
}

#[test]
fn grid_stride_select_div_is_bit_exact() {
    let dev = Device::new(0);
    let m = fixture("elementwise");
    let mut r = rng(11);
    let n = 5000usize;
    let x = uniform(&mut r, n, -2.0, 2.0);
    let y = uniform(&mut r, n, -5.0, 5.0);
    let (px, py, po) = (upload(&dev, &x), upload(&dev, &y), zeros::<f32>(&dev, n));
    // A grid smaller than the data: each thread loops.
    Args::default()
        .ptr(px)
        .ptr(py)
        .ptr(po)
        .val(n as i64)
        .launch(&dev, &m, "select_div", [3, 1, 1], [256, 1, 1], 0)
        .unwrap();
    let want: Vec<f32> = x
        .iter()
        .zip(&y)
        .map(|(&a, &b)| {
            if a > 0.0 {
                a / (1.0 + b.abs())
            } else {
                b * 0.5
            }
        })
        .collect();
    assert_bits("select_div", &download(&dev, po, n), &want);
}

#[test]
fn broadcast_mul_with_struct_parameter_is_bit_exact() {
    let dev = Device::new(0);
    let m = fixture("broadcast");
    let k = m.kernel("broadcast_mul").unwrap();
    assert_eq!(k.params()[3].size, 48, "Broadcast4 is passed by value");
    let mut r = rng(12);
    // out[n,h,w,c] = a[n,h,w,c] * b[1,1,w,c]
    let dims = [2i32, 3, 5, 7];
    let total: i32 = dims.iter().product();
    let sa = [3 * 5 * 7, 5 * 7, 7, 1];
    let sb = [0, 0, 7, 1];
    let a = uniform(&mut r, total as usize, -1.0, 1.0);
    let b = uniform(&mut r, 5 * 7, -1.0, 1.0);
    let (pa, pb, po) = (
        upload(&dev, &a),
        upload(&dev, &b),
        zeros::<f32>(&dev, total as usize),
    );
    let shape: Vec<i32> = dims.iter().chain(&sa).chain(&sb).copied().collect();
    Args::default()
        .ptr(pa)
        .ptr(pb)
        .ptr(po)
        .raw(bytes_of(&shape))
        .val(total)
        .launch(
            &dev,
            &m,
            "broadcast_mul",
            [(total as u32).div_ceil(64), 1, 1],
            [64, 1, 1],
            0,
        )
        .unwrap();
    let mut want = vec![0f32; total as usize];
    for (i, w) in want.iter_mut().enumerate() {
        let (wc, c) = ((i / 7) % 5, i % 7);
        *w = a[i] * b[wc * 7 + c];
    }
    assert_bits("broadcast_mul", &download(&dev, po, total as usize), &want);
}

#[test]
fn bias_add_on_a_2d_grid_is_bit_exact() {
    let dev = Device::new(0);
    let m = fixture("broadcast");
    let mut r = rng(13);
    let (rows, ch) = (37usize, 19usize);
    let x = uniform(&mut r, rows * ch, -1.0, 1.0);
    let bias = uniform(&mut r, ch, -1.0, 1.0);
    let (px, pb, po) = (
        upload(&dev, &x),
        upload(&dev, &bias),
        zeros::<f32>(&dev, rows * ch),
    );
    Args::default()
        .ptr(px)
        .ptr(pb)
        .ptr(po)
        .val(rows as i32)
        .val(ch as i32)
        .launch(&dev, &m, "bias_add_nhwc", [2, 5, 1], [16, 8, 1], 0)
        .unwrap();
    let want: Vec<f32> = (0..rows * ch).map(|i| x[i] + bias[i % ch]).collect();
    assert_bits("bias_add", &download(&dev, po, rows * ch), &want);
}
