//! Warp-level behaviour of NVRTC output (`kernels/warp.cu`): shuffles with sub-warp widths
//! against the CUDA programming guide's definitions, votes and `__activemask` in divergent code,
//! reconvergence after lane-dependent loops, barriers inside loops, atomics under contention
//! from CTAs running in parallel, and per-thread local arrays.

mod common;

use common::*;
use rand::Rng;
use towerpack_ptx::Device;

#[test]
fn shuffles_follow_the_cuda_definitions_for_every_width() {
    let dev = Device::new(0);
    let m = fixture("warp");
    let n = 64usize;
    let input: Vec<i32> = (0..n as i32).map(|i| i * 10 + 1).collect();
    let pin = upload(&dev, &input);
    for width in [32, 16, 8, 4, 2, 1] {
        for (delta, src) in [(1, 0), (3, 5), (5, 31), (16, 2)] {
            let po = zeros::<i32>(&dev, 4 * n);
            Args::default()
                .ptr(pin)
                .ptr(po)
                .val(delta)
                .val(src)
                .val(width)
                .launch(&dev, &m, "shuffles", [2, 1, 1], [32, 1, 1], 0)
                .unwrap();
            let out = download::<i32>(&dev, po, 4 * n);
            let (w, d) = (width as usize, delta as usize);
            for t in 0..n {
                let (lane, warp_base) = (t % 32, t - t % 32);
                let seg = warp_base + lane / w * w;
                let own = input[t];
                let up = if lane % w >= d { input[t - d] } else { own };
                let down = if lane % w + d < w { input[t + d] } else { own };
                let x = lane ^ d;
                let xor = if x < 32 && x / w <= lane / w {
                    input[warp_base + x]
                } else {
                    own
                };
                let idx = input[seg + src as usize % w];
                let ctx = format!("width {width} delta {delta} src {src} thread {t}");
                assert_eq!(&out[4 * t..4 * t + 4], &[up, down, xor, idx], "{ctx}");
            }
        }
    }
}

#[test]
fn votes_and_activemask() {
    let dev = Device::new(0);
    let m = fixture("warp");
    let mut r = rng(90);
    for _ in 0..10 {
        let input: Vec<i32> = (0..32).map(|_| r.random_range(0..4)).collect();
        let (pin, po) = (upload(&dev, &input), zeros::<u32>(&dev, 6 * 32));
        Args::default()
            .ptr(pin)
            .ptr(po)
            .launch(&dev, &m, "votes", [1, 1, 1], [32, 1, 1], 0)
            .unwrap();
        let out = download::<u32>(&dev, po, 6 * 32);
        let ballot = (0..32)
            .filter(|&l| input[l] != 0)
            .fold(0u32, |b, l| b | 1 << l);
        let big = (0..32)
            .filter(|&l| input[l] > 1)
            .fold(0u32, |b, l| b | 1 << l);
        for l in 0..32 {
            let want = [
                ballot,
                u32::from(ballot != 0),
                u32::from(ballot == u32::MAX),
                u32::from(ballot == 0 || ballot == u32::MAX),
                if input[l] > 1 { big } else { 0 },
                big.count_ones(),
            ];
            assert_eq!(&out[6 * l..6 * l + 6], &want, "lane {l} of {input:?}");
        }
    }
}

#[test]
fn lanes_reconverge_after_divergent_loops() {
    let dev = Device::new(0);
    let m = fixture("warp");
    let mut r = rng(91);
    let n = 128usize;
    let trips: Vec<i32> = (0..n).map(|_| r.random_range(0..40)).collect();
    let (pt, po) = (upload(&dev, &trips), zeros::<i32>(&dev, 2 * n));
    Args::default()
        .ptr(pt)
        .ptr(po)
        .launch(&dev, &m, "reconverge", [2, 1, 1], [64, 1, 1], 0)
        .unwrap();
    let out = download::<i32>(&dev, po, 2 * n);
    let mut acc = vec![0i32; n];
    for t in 0..n {
        let lane = (t % 64 % 32) as i32;
        let mut a = 0i32;
        for i in 0..trips[t] {
            if (i + lane) % 3 == 0 {
                a += i;
            } else if (i ^ lane) & 1 != 0 {
                a -= 1;
                if a < -50 {
                    break;
                }
            } else {
                a = (a * 2) % 1000;
            }
        }
        acc[t] = a;
    }
    for t in 0..n {
        let warp: i32 = acc[t - t % 32..t - t % 32 + 32].iter().sum();
        assert_eq!((out[2 * t], out[2 * t + 1]), (acc[t], warp), "thread {t}");
    }
}

#[test]
fn barriers_inside_loops() {
    let dev = Device::new(0);
    let m = fixture("warp");
    let mut r = rng(92);
    let (block, grid, rounds) = (96usize, 3usize, 5);
    let input = uniform(&mut r, block * grid, -1.0, 1.0);
    let (pin, po) = (upload(&dev, &input), zeros::<f32>(&dev, block * grid));
    Args::default()
        .ptr(pin)
        .ptr(po)
        .val(rounds)
        .launch(
            &dev,
            &m,
            "barrier_rounds",
            [grid as u32, 1, 1],
            [block as u32, 1, 1],
            0,
        )
        .unwrap();
    let mut want = input.clone();
    for b in 0..grid {
        let mut v: Vec<f32> = input[b * block..(b + 1) * block].to_vec();
        for _ in 0..rounds {
            let prev = v.clone();
            for t in 0..block {
                let mut left = prev[(t + block - 1) % block];
                if (t >> 5) & 1 == 1 {
                    for _ in 0..(t & 7) {
                        left *= 0.5;
                    }
                }
                v[t] = 0.5f32.mul_add(prev[t], left);
            }
        }
        want[b * block..(b + 1) * block].copy_from_slice(&v);
    }
    assert_bits("barrier_rounds", &download(&dev, po, block * grid), &want);
}

#[test]
fn atomics_under_contention_from_parallel_ctas() {
    let dev = Device::new(0);
    let m = fixture("warp");
    let (grid, block) = (16u32, 128u32);
    let threads = (grid * block) as u64;
    let counters = zeros::<u32>(&dev, 6);
    let extremes = upload(&dev, &[i32::MIN, i32::MAX, 0]);
    let wide = zeros::<u64>(&dev, 1);
    let fsum = zeros::<f32>(&dev, 1);
    let ring = upload(&dev, &[0u32, 0, 0, 0]);
    Args::default()
        .ptr(counters)
        .ptr(extremes)
        .ptr(wide)
        .ptr(fsum)
        .ptr(ring)
        .launch(&dev, &m, "contention", [grid, 1, 1], [block, 1, 1], 0)
        .unwrap();
    let c = download::<u32>(&dev, counters, 6);
    assert_eq!(c[0] as u64, threads);
    for k in 0..4u64 {
        let want: u64 = (0..threads).filter(|t| t & 3 == k).sum();
        assert_eq!(c[1 + k as usize] as u64, want, "counter {k}");
    }
    assert_eq!(c[5], 1, "exactly one CAS from 0 succeeds");
    let e = download::<i32>(&dev, extremes, 3);
    assert_eq!(
        e[0],
        (0..threads as i32).map(|t| t * 7 % 1009).max().unwrap()
    );
    assert_eq!(
        e[1],
        (0..threads as i32).map(|t| -(t * 13 % 1013)).min().unwrap()
    );
    assert!(e[2] >= 1 && e[2] as u64 <= threads);
    assert_eq!(download::<u64>(&dev, wide, 1)[0], threads << 32);
    // 0.25 × 2048 is exact in f32 whatever the order.
    assert_eq!(download::<f32>(&dev, fsum, 1)[0], 0.25 * threads as f32);
    let ring = download::<u32>(&dev, ring, 4);
    // inc wraps at 99 → 100 distinct values; dec from 0 jumps to 99 and counts down.
    assert_eq!(ring[0] as u64, threads % 100);
    assert_eq!(ring[1] as u64, (100 - threads % 100) % 100);
    assert_eq!(ring[2], u32::MAX);
    assert_eq!(ring[3], 7);
}

#[test]
fn local_arrays_are_per_thread() {
    let dev = Device::new(0);
    let m = fixture("warp");
    let mut r = rng(93);
    let n = 96usize;
    let idx: Vec<i32> = (0..4 * n).map(|_| r.random_range(0..64)).collect();
    let (pi, po) = (upload(&dev, &idx), zeros::<i32>(&dev, n));
    Args::default()
        .ptr(pi)
        .ptr(po)
        .launch(&dev, &m, "local_array", [3, 1, 1], [32, 1, 1], 0)
        .unwrap();
    let out = download::<i32>(&dev, po, n);
    for t in 0..n {
        let mut a: Vec<i32> = (0..16).map(|i| t as i32 * 100 + i).collect();
        for i in 0..4 {
            a[(idx[4 * t + i] & 15) as usize] += i as i32 + 1;
        }
        let s: i32 = (0..4)
            .map(|i| a[(idx[4 * t + 3 - i] & 15) as usize] * (i as i32 + 1))
            .sum();
        assert_eq!(out[t], s, "thread {t}");
    }
}
