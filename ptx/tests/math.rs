//! libdevice math (expf relies on an exact fma.rm), integer/conversion helpers, and fp16/bf16
//! conversions and half2 fma — NVRTC output against Rust references.

mod common;

use common::*;
use rand::Rng;
use towerpack_ptx::Device;

fn run_math(fixture_name: &str, x: &[f32]) -> [Vec<f32>; 5] {
    let dev = Device::new(0);
    let m = fixture(fixture_name);
    let n = x.len();
    let px = upload(&dev, x);
    let outs: Vec<_> = (0..5).map(|_| zeros::<f32>(&dev, n)).collect();
    let mut args = Args::default().ptr(px);
    for &o in &outs {
        args = args.ptr(o);
    }
    args.val(n as i32)
        .launch(
            &dev,
            &m,
            "math_functions",
            [(n as u32).div_ceil(64), 1, 1],
            [64, 1, 1],
            0,
        )
        .unwrap();
    outs.iter()
        .map(|&o| download::<f32>(&dev, o, n))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap()
}

fn inputs(seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    let mut x = uniform(&mut r, 2000, -20.0, 20.0);
    x.extend(uniform(&mut r, 500, -87.0, 88.0));
    x.extend([
        0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 0.5, 88.5, -104.0, 100.0,
    ]);
    x
}

/// libdevice's documented bounds: expf 2 ulp, logf 1 ulp, tanhf 2 ulp; sqrtf is exact.
#[test]
fn libdevice_expf_logf_tanhf_within_documented_ulps() {
    let x = inputs(50);
    let [e, l, t, sig, sq] = run_math("math", &x);
    for (i, &v) in x.iter().enumerate() {
        let v64 = f64::from(v);
        let want_e = v64.exp() as f32;
        if want_e.is_finite() && want_e > f32::MIN_POSITIVE {
            assert!(
                ulps(e[i], want_e) <= 2,
                "expf({v}) = {}, want {want_e}",
                e[i]
            );
        } else if want_e.is_infinite() {
            assert!(e[i].is_infinite(), "expf({v}) overflow: {}", e[i]);
        }
        // The kernel adds in f32, then takes the log.
        let want_l = f64::from(v.abs() + 1e-3f32).ln() as f32;
        assert!(
            ulps(l[i], want_l) <= 1,
            "logf(|{v}| + 1e-3) = {}, want {want_l}",
            l[i]
        );
        let want_t = v64.tanh() as f32;
        assert!(
            ulps(t[i], want_t) <= 2,
            "tanhf({v}) = {}, want {want_t}",
            t[i]
        );
        let want_s = 1.0 / (1.0 + (-v64).exp());
        assert!(
            (f64::from(sig[i]) - want_s).abs() <= 3e-7 * want_s.max(1e-30) + 1e-38,
            "sigmoid({v}) = {}, want {want_s}",
            sig[i]
        );
        assert_eq!(sq[i].to_bits(), v.abs().sqrt().to_bits(), "sqrtf(|{v}|)");
    }
}

/// With --use_fast_math: ex2.approx.ftz, lg2.approx.ftz, rcp.approx, tanh.approx, sqrt.approx.
/// Tolerances are the CUDA programming guide's bounds for the intrinsics: `__expf` 2 + ⌊1.173·|x|⌋
/// ulp, `__logf` 2^-21.41 absolute on [0.5, 2] else 3 ulp, tanh.approx 2^-10.987 relative.
#[test]
fn fast_math_variant_within_documented_approximation_error() {
    let x: Vec<f32> = inputs(51).into_iter().filter(|v| v.abs() < 80.0).collect();
    let [e, l, t, sig, sq] = run_math("math_fast", &x);
    for (i, &v) in x.iter().enumerate() {
        let v64 = f64::from(v);
        let want_e = v64.exp() as f32;
        if want_e > f32::MIN_POSITIVE {
            let bound = 2 + (1.173 * v.abs()) as u32;
            assert!(
                ulps(e[i], want_e) <= bound,
                "__expf({v}) = {}, want {want_e}",
                e[i]
            );
        }
        let s = v.abs() + 1e-3f32;
        let want_l = f64::from(s).ln();
        if (0.5..=2.0).contains(&s) {
            assert!(
                (f64::from(l[i]) - want_l).abs() <= 2f64.powf(-21.41),
                "__logf({s}) = {}",
                l[i]
            );
        } else {
            assert!(
                ulps(l[i], want_l as f32) <= 3,
                "__logf({s}) = {}, want {want_l}",
                l[i]
            );
        }
        let want_t = v64.tanh();
        assert!(
            (f64::from(t[i]) - want_t).abs() <= 2f64.powf(-10.987) * want_t.abs(),
            "tanh({v})"
        );
        let want_s = 1.0 / (1.0 + (-v64).exp());
        let bound = f64::from(3 + (1.173 * v.abs()) as u32) * f64::from(f32::EPSILON);
        assert!(
            (f64::from(sig[i]) - want_s).abs() <= bound * want_s,
            "sigmoid({v}) = {}",
            sig[i]
        );
        assert!(
            (f64::from(sq[i]) - v64.abs().sqrt()).abs() <= 2e-7 * v64.abs().sqrt(),
            "sqrt({v})"
        );
    }
}

#[test]
fn integer_and_rounding_helpers_are_exact() {
    let dev = Device::new(0);
    let m = fixture("math");
    let mut r = rng(52);
    let mut x = uniform(&mut r, 300, -1e4, 1e4);
    x.extend([
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        -2.7,
        3e9,
        -3e9,
        f32::NAN,
        1e-40,
        -0.0,
    ]);
    let n = x.len();
    let w: Vec<i64> = (0..n)
        .map(|_| r.random::<i64>() >> r.random_range(0..40))
        .collect();
    let (px, pw) = (upload(&dev, &x), upload(&dev, &w));
    let (pr, pwide, pbits) = (
        zeros::<i32>(&dev, 4 * n),
        zeros::<i64>(&dev, 3 * n),
        zeros::<u32>(&dev, 3 * n),
    );
    Args::default()
        .ptr(px)
        .ptr(pw)
        .ptr(pr)
        .ptr(pwide)
        .ptr(pbits)
        .val(n as i32)
        .launch(
            &dev,
            &m,
            "int_ops",
            [(n as u32).div_ceil(64), 1, 1],
            [64, 1, 1],
            0,
        )
        .unwrap();
    let rounded = download::<i32>(&dev, pr, 4 * n);
    let wide = download::<i64>(&dev, pwide, 3 * n);
    let bits = download::<u32>(&dev, pbits, 3 * n);
    for i in 0..n {
        let v = x[i];
        // CUDA float→int conversions saturate and map NaN to 0, as Rust's `as` does.
        let want = [
            v.round_ties_even() as i32,
            v.trunc() as i32,
            v.floor() as i32,
            v.ceil() as i32,
        ];
        assert_eq!(&rounded[4 * i..4 * i + 4], &want, "roundings of {v}");
        let a = w[i];
        let want_w = [
            a.wrapping_mul(2654435761).wrapping_add(a >> 7),
            a / 1000003 - a % 97,
            ((v * 1024.0).round_ties_even() as i64) ^ (a << 3),
        ];
        assert_eq!(&wide[3 * i..3 * i + 3], &want_w, "64-bit ops on {a}, {v}");
        let u = v.to_bits();
        let want_b = [
            u.count_ones() + (u.leading_zeros() << 8),
            u.reverse_bits(),
            (((u64::from(u) * 0x9e37_79b9) >> 32) as u32)
                .wrapping_add((u as i32).max(-5) as u32)
                .wrapping_add(u.min(77)),
        ];
        let got_b = [bits[3 * i], bits[3 * i + 1], bits[3 * i + 2]];
        assert_eq!(got_b, want_b, "bit ops on {u:#x}");
    }
}

#[test]
fn half_and_bfloat16_conversions_round_to_nearest_even() {
    let dev = Device::new(0);
    let m = fixture("half");
    let mut r = rng(53);
    let mut x: Vec<f32> = (0..3000)
        .map(|_| f32::from_bits(r.random::<u32>()))
        .filter(|v| !v.is_nan())
        .collect();
    x.extend(uniform(&mut r, 1000, -70000.0, 70000.0));
    x.extend([
        65504.0,
        65520.0,
        6e-8,
        3e-8,
        1.0 + 2f32.powi(-11),
        f32::NAN,
        f32::INFINITY,
        -0.0,
    ]);
    let n = x.len();
    let px = upload(&dev, &x);
    let (ph, pb, phb, pbb) = (
        zeros::<u16>(&dev, n),
        zeros::<u16>(&dev, n),
        zeros::<f32>(&dev, n),
        zeros::<f32>(&dev, n),
    );
    Args::default()
        .ptr(px)
        .ptr(ph)
        .ptr(pb)
        .ptr(phb)
        .ptr(pbb)
        .val(n as i32)
        .launch(
            &dev,
            &m,
            "half_convert",
            [(n as u32).div_ceil(128), 1, 1],
            [128, 1, 1],
            0,
        )
        .unwrap();
    let (h, b) = (download::<u16>(&dev, ph, n), download::<u16>(&dev, pb, n));
    let (hb, bb) = (download::<f32>(&dev, phb, n), download::<f32>(&dev, pbb, n));
    for i in 0..n {
        let v = x[i];
        let (wh, wb) = (half::f16::from_f32(v), half::bf16::from_f32(v));
        if v.is_nan() {
            assert_eq!((h[i], b[i]), (0x7fff, 0x7fff), "canonical NaN");
            assert!(hb[i].is_nan() && bb[i].is_nan());
            continue;
        }
        assert_eq!(h[i], wh.to_bits(), "f16 of {v:e}");
        assert_eq!(b[i], wb.to_bits(), "bf16 of {v:e}");
        assert_eq!(hb[i].to_bits(), wh.to_f32().to_bits(), "f16 → f32 of {v:e}");
        assert_eq!(
            bb[i].to_bits(),
            wb.to_f32().to_bits(),
            "bf16 → f32 of {v:e}"
        );
    }
}

#[test]
fn half2_fma_rounds_once() {
    let dev = Device::new(0);
    let m = fixture("half");
    let mut r = rng(54);
    let n = 2000usize;
    let halves = |r: &mut rand_chacha::ChaCha8Rng| -> Vec<u16> {
        (0..2 * n)
            .map(|_| half::f16::from_f32(r.random_range(-8.0..8.0)).to_bits())
            .collect()
    };
    let (a, b, c) = (halves(&mut r), halves(&mut r), halves(&mut r));
    let (pa, pb, pc, po) = (
        upload(&dev, &a),
        upload(&dev, &b),
        upload(&dev, &c),
        zeros::<u16>(&dev, 2 * n),
    );
    Args::default()
        .ptr(pa)
        .ptr(pb)
        .ptr(pc)
        .ptr(po)
        .val(n as i32)
        .launch(
            &dev,
            &m,
            "half2_fma",
            [(n as u32).div_ceil(128), 1, 1],
            [128, 1, 1],
            0,
        )
        .unwrap();
    let out = download::<u16>(&dev, po, 2 * n);
    let f = |h: u16| f64::from(half::f16::from_bits(h).to_f32());
    for i in 0..2 * n {
        // With operands in [-8, 8] the exact a·b + c fits an f64: one rounding to f16.
        let want = half::f16::from_f64(f(a[i]).mul_add(f(b[i]), f(c[i])));
        assert_eq!(
            out[i],
            want.to_bits(),
            "fma({}, {}, {})",
            f(a[i]),
            f(b[i]),
            f(c[i])
        );
    }
}
