//! Reductions from NVRTC: warp shuffles (down and butterfly), shared memory across warps, global
//! atomics (f32 add, CAS loop for a float max, u32/u64 add) and shared-memory atomics.

mod common;

use common::*;
use rand::Rng;
use towerpack_ptx::Device;

#[test]
fn block_sum_matches_f64_within_tolerance() {
    let dev = Device::new(0);
    let m = fixture("reduce");
    let mut r = rng(20);
    for (n, grid, block) in [(10_000usize, 8u32, 256u32), (1000, 1, 96), (33, 2, 64)] {
        let x = uniform(&mut r, n, -1.0, 1.0);
        let (px, po) = (upload(&dev, &x), zeros::<f32>(&dev, 1));
        Args::default()
            .ptr(px)
            .ptr(po)
            .val(n as i32)
            .launch(&dev, &m, "block_sum", [grid, 1, 1], [block, 1, 1], 0)
            .unwrap();
        let want: f64 = x.iter().map(|&v| f64::from(v)).sum();
        // f32 partial sums of n values in [-1, 1]: error ≤ n · 2^-24 · max partial sum.
        assert_close(
            &format!("block_sum n={n}"),
            &download(&dev, po, 1),
            &[want],
            1e-6 * n as f64,
            0.0,
        );
    }
}

#[test]
fn block_max_with_cas_loop_is_exact() {
    let dev = Device::new(0);
    let m = fixture("reduce");
    let mut r = rng(21);
    let n = 7777usize;
    let x = uniform(&mut r, n, -100.0, 100.0);
    let px = upload(&dev, &x);
    let po = upload(&dev, &[f32::NEG_INFINITY]);
    Args::default()
        .ptr(px)
        .ptr(po)
        .val(n as i32)
        .launch(&dev, &m, "block_max", [6, 1, 1], [128, 1, 1], 0)
        .unwrap();
    let want = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    assert_bits("block_max", &download(&dev, po, 1), &[want]);
}

#[test]
fn histogram_with_shared_and_global_atomics_is_exact() {
    let dev = Device::new(0);
    let m = fixture("reduce");
    let mut r = rng(22);
    let (n, nbins) = (5000usize, 37usize);
    let keys: Vec<u32> = (0..n).map(|_| r.random_range(0..1000)).collect();
    let pk = upload(&dev, &keys);
    let pbins = zeros::<u32>(&dev, nbins);
    let ptotal = zeros::<u64>(&dev, 1);
    Args::default()
        .ptr(pk)
        .ptr(pbins)
        .ptr(ptotal)
        .val(n as i32)
        .val(nbins as i32)
        .launch(
            &dev,
            &m,
            "histogram",
            [(n as u32).div_ceil(128), 1, 1],
            [128, 1, 1],
            (nbins * 4) as u32,
        )
        .unwrap();
    let mut want = vec![0u32; nbins];
    keys.iter().for_each(|&k| want[k as usize % nbins] += 1);
    assert_eq!(download::<u32>(&dev, pbins, nbins), want);
    assert_eq!(download::<u64>(&dev, ptotal, 1), vec![n as u64]);
}
