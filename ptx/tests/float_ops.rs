//! Per-instruction float semantics through real PTX: directed-rounding fma/add/mul/div against an
//! oracle independent of the emulator's softfloat (the host FPU's round-to-nearest result
//! corrected by the sign of an exact integer residual), `.ftz`/`.sat`, NaN and infinities.

mod common;

use common::*;
use rand::Rng;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Rn,
    Rz,
    Rm,
    Rp,
}

/// The `mode`-rounded result given the nearest one `r` and the sign of `exact − r`.
fn directed(r: f32, residual: i128, mode: Mode) -> f32 {
    match mode {
        Mode::Rn => r,
        Mode::Rp if residual > 0 => r.next_up(),
        Mode::Rm if residual < 0 => r.next_down(),
        Mode::Rz if residual > 0 && r < 0.0 => r.next_up(),
        Mode::Rz if residual < 0 && r > 0.0 => r.next_down(),
        _ => r,
    }
}

const MODES: [(Mode, &str); 4] = [
    (Mode::Rn, "rn"),
    (Mode::Rz, "rz"),
    (Mode::Rm, "rm"),
    (Mode::Rp, "rp"),
];

/// m × 2^e with a 24-bit m and e in [-40, -20]: products are exact multiples of 2^-80.
fn operands(seed: u64, n: usize) -> Vec<(f32, i128, i32)> {
    let mut r = rng(seed);
    (0..n)
        .map(|_| {
            let m: i32 = r.random_range(-(1 << 24)..(1 << 24));
            let e: i32 = r.random_range(-40..-20);
            (m as f32 * 2f32.powi(e), i128::from(m), e)
        })
        .collect()
}

fn fixed80(x: f32) -> i128 {
    let s = f64::from(x) * 2f64.powi(80);
    assert_eq!(s.fract(), 0.0, "{x:e} is not a multiple of 2^-80");
    s as i128
}

#[test]
fn fma_directed_rounding_is_exact() {
    let (a, b, c) = (operands(70, 3000), operands(71, 3000), operands(72, 3000));
    let bits = |v: &[(f32, i128, i32)]| {
        v.iter()
            .map(|t| u64::from(t.0.to_bits()))
            .collect::<Vec<_>>()
    };
    for (mode, name) in MODES {
        let got = run_op(
            &format!("fma.{name}.f32 %ro, %ra, %rb, %rc;"),
            32,
            &bits(&a),
            &bits(&b),
            &bits(&c),
        );
        for i in 0..a.len() {
            let ((x, mx, ex), (y, my, ey), (z, _, _)) = (a[i], b[i], c[i]);
            let exact = ((mx * my) << (ex + ey + 80)) + fixed80(z);
            let r = x.mul_add(y, z);
            let want = directed(r, exact - fixed80(r), mode);
            let g = f32::from_bits(got[i] as u32);
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "fma.{name}({x:e}, {y:e}, {z:e}) = {g:e}, want {want:e}"
            );
        }
    }
}

#[test]
fn add_and_mul_directed_rounding_are_exact() {
    let (a, b) = (operands(73, 3000), operands(74, 3000));
    let bits = |v: &[(f32, i128, i32)]| {
        v.iter()
            .map(|t| u64::from(t.0.to_bits()))
            .collect::<Vec<_>>()
    };
    let zero = vec![0u64; a.len()];
    for (mode, name) in MODES {
        let sum = run_op(
            &format!("add.{name}.f32 %ro, %ra, %rb;"),
            32,
            &bits(&a),
            &bits(&b),
            &zero,
        );
        let prod = run_op(
            &format!("mul.{name}.f32 %ro, %ra, %rb;"),
            32,
            &bits(&a),
            &bits(&b),
            &zero,
        );
        for i in 0..a.len() {
            let ((x, mx, ex), (y, my, ey)) = (a[i], b[i]);
            let r = x + y;
            let want = directed(r, fixed80(x) + fixed80(y) - fixed80(r), mode);
            assert_eq!(sum[i] as u32, want.to_bits(), "add.{name}({x:e}, {y:e})");
            let p = x * y;
            let exact = (mx * my) << (ex + ey + 80);
            // Products round below 2^-80 granularity only when tiny; scale both by 2^80 more.
            let p_fixed = (f64::from(p) * 2f64.powi(80)) as i128;
            let residual = if f64::from(p) * 2f64.powi(80) == p_fixed as f64 {
                exact - p_fixed
            } else {
                0
            };
            let want = directed(p, residual, mode);
            assert_eq!(prod[i] as u32, want.to_bits(), "mul.{name}({x:e}, {y:e})");
        }
    }
}

#[test]
fn division_sqrt_and_reciprocal_with_directed_rounding() {
    let mut r = rng(75);
    let x: Vec<f32> = (0..2000).map(|_| r.random_range(0.1f32..100.0)).collect();
    let y: Vec<f32> = (0..2000).map(|_| r.random_range(-100.0f32..-0.1)).collect();
    let zero = vec![0u64; x.len()];
    for (mode, name) in MODES {
        let q = run_op(
            &format!("div.{name}.f32 %ro, %ra, %rb;"),
            32,
            &f32s(&x),
            &f32s(&y),
            &zero,
        );
        let s = run_op(
            &format!("sqrt.{name}.f32 %ro, %ra;"),
            32,
            &f32s(&x),
            &zero,
            &zero,
        );
        let rc = run_op(
            &format!("rcp.{name}.f32 %ro, %rb;"),
            32,
            &zero,
            &f32s(&y),
            &zero,
        );
        for i in 0..x.len() {
            let (a, b) = (x[i], y[i]);
            // a − q·b and a − s² are exact in f64 for f32 operands; its sign orders q and a/b.
            let qn = a / b;
            let rho = f64::from(a) - f64::from(qn) * f64::from(b);
            let want = directed(
                qn,
                if rho == 0.0 {
                    0
                } else if (rho > 0.0) == (b > 0.0) {
                    1
                } else {
                    -1
                },
                mode,
            );
            assert_eq!(q[i] as u32, want.to_bits(), "div.{name}({a}, {b})");
            let sn = a.sqrt();
            let rho = f64::from(a) - f64::from(sn) * f64::from(sn);
            let want = directed(
                sn,
                if rho > 0.0 {
                    1
                } else if rho < 0.0 {
                    -1
                } else {
                    0
                },
                mode,
            );
            assert_eq!(s[i] as u32, want.to_bits(), "sqrt.{name}({a})");
            let rn = 1.0 / b;
            let rho = 1.0 - f64::from(rn) * f64::from(b);
            let want = directed(
                rn,
                if rho == 0.0 {
                    0
                } else if rho < 0.0 {
                    1
                } else {
                    -1
                },
                mode,
            );
            assert_eq!(rc[i] as u32, want.to_bits(), "rcp.{name}({b})");
        }
    }
}

#[test]
fn special_values_subnormals_ftz_and_sat() {
    let tiny = f32::from_bits(1); // 2^-149
    let rows: Vec<(&str, [f32; 3], f32)> = vec![
        ("fma.rn.f32", [f32::INFINITY, 0.0, 1.0], f32::NAN),
        (
            "fma.rn.f32",
            [f32::MAX, 2.0, f32::NEG_INFINITY],
            f32::NEG_INFINITY,
        ),
        ("fma.rm.f32", [1.0, 1.0, -1.0], -0.0),
        ("fma.rn.f32", [1.0, 1.0, -1.0], 0.0),
        ("fma.rz.f32", [f32::MAX, 2.0, 0.0], f32::MAX),
        ("fma.rn.f32", [f32::MAX, 2.0, 0.0], f32::INFINITY),
        ("fma.rm.f32", [-f32::MAX, 2.0, 0.0], f32::NEG_INFINITY),
        ("fma.rp.f32", [-f32::MAX, 2.0, 0.0], -f32::MAX),
        // 1.5 × 2^-75 × 2^-75 = 0.75 × 2^-149: rn/rp → 2^-149, rz/rm → 0.
        (
            "fma.rn.f32",
            [1.5 * 2f32.powi(-75), 2f32.powi(-75), 0.0],
            tiny,
        ),
        (
            "fma.rp.f32",
            [1.5 * 2f32.powi(-75), 2f32.powi(-75), 0.0],
            tiny,
        ),
        (
            "fma.rz.f32",
            [1.5 * 2f32.powi(-75), 2f32.powi(-75), 0.0],
            0.0,
        ),
        (
            "fma.rm.f32",
            [-1.5 * 2f32.powi(-75), 2f32.powi(-75), 0.0],
            -tiny,
        ),
        // ftz: subnormal inputs and results become signed zeros.
        ("fma.rn.ftz.f32", [tiny, 1e30, 1.0], 1.0),
        (
            "fma.rn.ftz.f32",
            [-(2f32.powi(-70)), 2f32.powi(-70), 0.0],
            -0.0,
        ),
        (
            "fma.rn.f32",
            [-(2f32.powi(-70)), 2f32.powi(-70), 0.0],
            -(2f32.powi(-140)),
        ),
        ("add.ftz.f32", [tiny, tiny, 0.0], 0.0),
        ("add.f32", [tiny, tiny, 0.0], 2.0 * tiny),
        ("mul.ftz.f32", [-tiny, 1e30, 0.0], -0.0),
        ("fma.rn.sat.f32", [2.0, 3.0, -1.0], 1.0),
        ("fma.rn.sat.f32", [2.0, -3.0, 1.0], 0.0),
        ("add.sat.f32", [f32::NAN, 1.0, 0.0], 0.0),
        ("mul.f32", [f32::INFINITY, 0.0, 0.0], f32::NAN),
        ("sub.f32", [f32::INFINITY, f32::INFINITY, 0.0], f32::NAN),
        ("div.rn.f32", [1.0, 0.0, 0.0], f32::INFINITY),
        ("div.rn.f32", [0.0, 0.0, 0.0], f32::NAN),
        ("min.f32", [f32::NAN, 2.0, 0.0], 2.0),
        ("max.f32", [-0.0, 0.0, 0.0], 0.0),
        ("min.f32", [0.0, -0.0, 0.0], -0.0),
        ("sqrt.rn.f32", [-1.0, 0.0, 0.0], f32::NAN),
        ("sqrt.rn.f32", [-0.0, 0.0, 0.0], -0.0),
        ("rcp.rn.f32", [-0.0, 0.0, 0.0], f32::NEG_INFINITY),
        ("copysign.f32", [-1.0, 2.5, 0.0], -2.5),
        ("abs.f32", [-0.0, 0.0, 0.0], 0.0),
        ("neg.f32", [0.0, 0.0, 0.0], -0.0),
        ("ex2.approx.ftz.f32", [f32::NEG_INFINITY, 0.0, 0.0], 0.0),
        ("lg2.approx.ftz.f32", [0.0, 0.0, 0.0], f32::NEG_INFINITY),
        ("rsqrt.approx.f32", [4.0, 0.0, 0.0], 0.5),
    ];
    for (op, [x, y, z], want) in rows {
        let operands = match op.split('.').next() {
            Some("fma") => "%ro, %ra, %rb, %rc",
            Some("add" | "sub" | "mul" | "div" | "min" | "max" | "copysign") => "%ro, %ra, %rb",
            _ => "%ro, %ra",
        };
        let got = run_op(
            &format!("{op} {operands};"),
            32,
            &f32s(&[x]),
            &f32s(&[y]),
            &f32s(&[z]),
        )[0] as u32;
        let want_bits = if want.is_nan() {
            0x7fff_ffff
        } else {
            want.to_bits()
        };
        assert_eq!(
            got,
            want_bits,
            "{op}({x:e}, {y:e}, {z:e}) = {:e}, want {want:e}",
            f32::from_bits(got)
        );
    }
}

#[test]
fn f64_fma_directed_rounding_with_an_exact_two_sum_oracle() {
    let mut r = rng(76);
    // 26-bit significands: a·b is exact in f64, so a·b + c = s + e exactly (TwoSum).
    let pick = |r: &mut rand_chacha::ChaCha8Rng| {
        let m: i64 = r.random_range(-(1 << 26)..(1 << 26));
        m as f64 * 2f64.powi(r.random_range(-30..30))
    };
    let n = 2000;
    let (a, b, c): (Vec<f64>, Vec<f64>, Vec<f64>) = (0..n)
        .map(|_| (pick(&mut r), pick(&mut r), pick(&mut r)))
        .fold(
            (vec![], vec![], vec![]),
            |(mut a, mut b, mut c), (x, y, z)| {
                a.push(x);
                b.push(y);
                c.push(z);
                (a, b, c)
            },
        );
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (mode, name) in MODES {
        let got = run_op(
            &format!("fma.{name}.f64 %xo, %xa, %xb, %xc;"),
            64,
            &bits(&a),
            &bits(&b),
            &bits(&c),
        );
        for i in 0..n {
            let p = a[i] * b[i];
            let s = p + c[i];
            let bv = s - p;
            let e = (p - (s - bv)) + (c[i] - bv);
            let want = match mode {
                Mode::Rn => s,
                Mode::Rp if e > 0.0 => s.next_up(),
                Mode::Rm if e < 0.0 => s.next_down(),
                Mode::Rz if e > 0.0 && s < 0.0 => s.next_up(),
                Mode::Rz if e < 0.0 && s > 0.0 => s.next_down(),
                _ => s,
            };
            assert_eq!(
                got[i],
                want.to_bits(),
                "fma.{name}.f64({}, {}, {})",
                a[i],
                b[i],
                c[i]
            );
        }
    }
}
