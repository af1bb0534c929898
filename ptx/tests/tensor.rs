//! Tensor-core instructions (NVRTC output of `kernels/tensor.cu`) against values computed
//! independently here: `mma` (m16n8k16 bf16/f16, m16n8k8 bf16/f16/tf32) against f64 sums of
//! the products of the rounded inputs, with the fragments loaded in `tensor.cu` by the PTX
//! ISA's tables; `ldmatrix` against the ISA's description of each lane's elements; `cp.async`
//! groups; conversions to tf32/bf16/f16 against reference roundings written from their
//! definitions; and the faults (misaligned `ldmatrix` rows, misaligned `cp.async` destination
//! or source, an out-of-bounds source, `mma`/`ldmatrix` in divergent code or under a guard
//! false on some lanes), each with its kernel and PTX line.
//!
//! Bounds. Every product of f16/bf16/tf32 values is exact in f64, so the reference
//! `r = c + Σ a·b` summed in f64 is within `K·2⁻⁵³·(|c| + Σ|a·b|)` of the exact sum. The
//! emulator rounds the exact sum once to f32, so `|emulated − r| ≤ 2⁻²⁴·|r| + K·2⁻⁵³·Σ|terms|`
//! (half an ulp, plus the reference's own error); when the inputs make every f64 partial sum
//! exact (narrow exponent range), the emulated value equals `r as f32` bit for bit. A GPU
//! accumulates in its own order with truncation; its result would be within
//! `(K + 1)·2⁻²³·Σ|terms|` of `r` — the bound a test of GPU kernels must use.

mod common;

use common::*;
use rand::Rng;
use towerpack_ptx::{Device, Fault, Space};

fn bf16_bits(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}
fn bf16_val(b: u16) -> f64 {
    f64::from(half::bf16::from_bits(b).to_f32())
}
fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
fn f16_val(b: u16) -> f64 {
    f64::from(half::f16::from_bits(b).to_f32())
}

/// `c + A·B` in f64 from row-major A (m×k), B (k×n), C (m×n), and Σ|terms| per element.
fn reference(a: &[f64], b: &[f64], c: &[f32], (m, n, k): (usize, usize, usize)) -> Vec<(f64, f64)> {
    (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            let mut s = f64::from(c[idx]);
            let mut mag = s.abs();
            for p in 0..k {
                let t = a[i * k + p] * b[p * n + j];
                s += t;
                mag += t.abs();
            }
            (s, mag)
        })
        .collect()
}

/// Asserts the emulated result is the reference rounded once (module doc's bound).
fn assert_rounded_once(what: &str, got: &[f32], want: &[(f64, f64)], k: usize) {
    for (i, (&g, &(r, mag))) in got.iter().zip(want).enumerate() {
        let tol = 2f64.powi(-24) * r.abs() + k as f64 * 2f64.powi(-53) * mag;
        assert!(
            (f64::from(g) - r).abs() <= tol,
            "{what}[{i}]: got {g:e}, reference {r:e} (tolerance {tol:e})"
        );
    }
}

/// Random 16-bit multiplicands; `narrow` keeps exponents in [2⁻³, 2³) so every f64 partial
/// sum of 16 products is exact; otherwise exponents span 2⁻⁴⁰..2⁴⁰ (f64 sums round).
fn halves(rng: &mut impl Rng, n: usize, narrow: bool, to_bits: fn(f32) -> u16) -> Vec<u16> {
    (0..n)
        .map(|_| {
            let e = if narrow {
                rng.random_range(-3..3)
            } else {
                rng.random_range(-40..40)
            };
            let v = rng.random_range(1.0f32..2.0) * 2f32.powi(e);
            to_bits(if rng.random_bool(0.5) { -v } else { v })
        })
        .collect()
}

fn run_mma_16816(kernel: &str, a: &[u16], b: &[u16], c: &[f32]) -> Vec<f32> {
    run_mma_16bit(kernel, a, b, c)
}

/// Runs a one-warp 16-bit `mma` kernel: row-major A and B bits, row-major 16×8 C; D comes back.
fn run_mma_16bit(kernel: &str, a: &[u16], b: &[u16], c: &[f32]) -> Vec<f32> {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let (pa, pb, pc) = (upload(&dev, a), upload(&dev, b), upload(&dev, c));
    let pd = zeros::<f32>(&dev, 128);
    Args::default()
        .ptr(pa)
        .ptr(pb)
        .ptr(pc)
        .ptr(pd)
        .launch(&dev, &m, kernel, [1, 1, 1], [32, 1, 1], 0)
        .unwrap();
    download(&dev, pd, 128)
}

#[test]
fn mma_m16n8k16_bf16_and_f16_match_the_exact_product() {
    let mut rng = rng(17);
    type Codec = (fn(f32) -> u16, fn(u16) -> f64);
    let codecs: [(&str, Codec); 2] = [
        ("mma_bf16", (bf16_bits, bf16_val)),
        ("mma_f16", (f16_bits, f16_val)),
    ];
    for (kernel, (to_bits, value)) in codecs {
        for narrow in [true, false] {
            // f16 has 5 exponent bits: keep its wide case inside its range.
            let wide_ok = kernel == "mma_bf16" || narrow;
            let a = halves(&mut rng, 256, !wide_ok || narrow, to_bits);
            let b = halves(&mut rng, 128, !wide_ok || narrow, to_bits);
            let c = uniform(&mut rng, 128, -4.0, 4.0);
            let got = run_mma_16816(kernel, &a, &b, &c);
            let av: Vec<f64> = a.iter().map(|&x| value(x)).collect();
            let bv: Vec<f64> = b.iter().map(|&x| value(x)).collect();
            let want = reference(&av, &bv, &c, (16, 8, 16));
            if narrow {
                let exact: Vec<f32> = want.iter().map(|&(r, _)| r as f32).collect();
                assert_bits(kernel, &got, &exact);
            } else {
                assert_rounded_once(kernel, &got, &want, 16);
            }
        }
    }
}

#[test]
fn mma_accumulator_holds_every_element_in_its_place() {
    // A = I (16×16), B = K×N with distinct entries, C distinct: D[i][j] = B[i][j] + C[i][j]
    // pins the position of every element of B, C and D, and each row of A.
    let a: Vec<u16> = (0..256)
        .map(|i| bf16_bits(if i / 16 == i % 16 { 1.0 } else { 0.0 }))
        .collect();
    let b: Vec<u16> = (0..128).map(|i| bf16_bits(i as f32)).collect();
    let c: Vec<f32> = (0..128).map(|i| 1000.0 * i as f32).collect();
    let got = run_mma_16816("mma_bf16", &a, &b, &c);
    let want: Vec<f32> = (0..128)
        .map(|idx| {
            let (i, j) = (idx / 8, idx % 8);
            // Row i of A picks row i of B (K = 16 = M).
            (i * 8 + j) as f32 + c[idx]
        })
        .collect();
    assert_bits("identity mma", &got, &want);
}

#[test]
fn mma_m16n8k8_bf16_and_f16_match_the_exact_product() {
    let mut rng = rng(22);
    type Codec = (fn(f32) -> u16, fn(u16) -> f64);
    let codecs: [(&str, Codec); 2] = [
        ("mma_k8_bf16", (bf16_bits, bf16_val)),
        ("mma_k8_f16", (f16_bits, f16_val)),
    ];
    for (kernel, (to_bits, value)) in codecs {
        for narrow in [true, false] {
            // f16 has 5 exponent bits: its inputs stay narrow.
            let narrow_in = narrow || kernel == "mma_k8_f16";
            let a = halves(&mut rng, 16 * 8, narrow_in, to_bits);
            let b = halves(&mut rng, 8 * 8, narrow_in, to_bits);
            let c = uniform(&mut rng, 128, -4.0, 4.0);
            let got = run_mma_16bit(kernel, &a, &b, &c);
            let av: Vec<f64> = a.iter().map(|&x| value(x)).collect();
            let bv: Vec<f64> = b.iter().map(|&x| value(x)).collect();
            let want = reference(&av, &bv, &c, (16, 8, 8));
            if narrow_in {
                let exact: Vec<f32> = want.iter().map(|&(r, _)| r as f32).collect();
                assert_bits(kernel, &got, &exact);
            } else {
                assert_rounded_once(kernel, &got, &want, 8);
            }
        }
    }
    // A = [I₈; I₈] (16×8), distinct B and C: D[i][j] = B[i mod 8][j] + C[i][j] pins every
    // register position of the k8 fragments.
    let a: Vec<u16> = (0..128)
        .map(|i| bf16_bits(if (i / 8) % 8 == i % 8 { 1.0 } else { 0.0 }))
        .collect();
    let b: Vec<u16> = (0..64).map(|i| bf16_bits(i as f32)).collect();
    let c: Vec<f32> = (0..128).map(|i| 1000.0 * i as f32).collect();
    let got = run_mma_16bit("mma_k8_bf16", &a, &b, &c);
    let want: Vec<f32> = (0..128)
        .map(|idx| ((idx / 8 % 8) * 8 + idx % 8) as f32 + c[idx])
        .collect();
    assert_bits("identity mma k8", &got, &want);
}

/// tf32 rounding (ties away from zero), written from its definition in f64: 11 significant
/// bits, f32's exponent range.
fn tf32_rna(x: f32) -> f32 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let v = f64::from(x);
    let e = v.abs().log2().floor().max(-126.0) as i32;
    let q = 2f64.powi(e - 10);
    let r = (v / q).round() * q; // f64::round: half away from zero
    r as f32
}

#[test]
fn mma_m16n8k8_tf32_rounds_its_inputs_or_ignores_their_low_bits() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let mut rng = rng(18);
    let a = uniform(&mut rng, 128, -2.0, 2.0);
    let b = uniform(&mut rng, 64, -2.0, 2.0);
    let c = uniform(&mut rng, 128, -2.0, 2.0);
    for round in [1i32, 0] {
        let (pa, pb, pc) = (upload(&dev, &a), upload(&dev, &b), upload(&dev, &c));
        let pd = zeros::<f32>(&dev, 128);
        Args::default()
            .ptr(pa)
            .ptr(pb)
            .ptr(pc)
            .ptr(pd)
            .val(round)
            .launch(&dev, &m, "mma_tf32", [1, 1, 1], [32, 1, 1], 0)
            .unwrap();
        let got: Vec<f32> = download(&dev, pd, 128);
        let tf = |x: &f32| {
            f64::from(if round == 1 {
                tf32_rna(*x)
            } else {
                f32::from_bits(x.to_bits() & 0xffff_e000)
            })
        };
        let av: Vec<f64> = a.iter().map(tf).collect();
        let bv: Vec<f64> = b.iter().map(tf).collect();
        let want = reference(&av, &bv, &c, (16, 8, 8));
        assert_rounded_once("mma_tf32", &got, &want, 8);
    }
}

#[test]
fn ldmatrix_gives_each_lane_the_documented_elements() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let mut rng = rng(19);
    let src: Vec<u16> = (0..256).map(|_| rng.random()).collect();
    // A random row for every lane (rows of different matrices may repeat or interleave).
    let rows: Vec<i32> = (0..32).map(|_| rng.random_range(0..32)).collect();
    let elem = |row: i32, col: usize| u32::from(src[row as usize * 8 + col]);
    for (kernel, num, trans) in [
        ("ldmatrix_x1", 1, false),
        ("ldmatrix_x2", 2, false),
        ("ldmatrix_x4", 4, false),
        ("ldmatrix_x1_trans", 1, true),
        ("ldmatrix_x2_trans", 2, true),
        ("ldmatrix_x4_trans", 4, true),
    ] {
        let (ps, pr) = (upload(&dev, &src), upload(&dev, &rows));
        let po = zeros::<u32>(&dev, 128);
        Args::default()
            .ptr(ps)
            .ptr(pr)
            .ptr(po)
            .val(0i32)
            .launch(&dev, &m, kernel, [1, 1, 1], [32, 1, 1], 0)
            .unwrap();
        let got: Vec<u32> = download(&dev, po, 128);
        for lane in 0..32 {
            for i in 0..4 {
                // Matrix i's row r is at the address lane 8i + r supplied.
                let row = |r: usize| rows[8 * i + r];
                let want = if i >= num {
                    0
                } else if trans {
                    // Column lane/4, rows 2(lane%4) and 2(lane%4)+1.
                    let (col, r0) = (lane / 4, 2 * (lane % 4));
                    elem(row(r0), col) | (elem(row(r0 + 1), col) << 16)
                } else {
                    let (r, c0) = (lane / 4, 2 * (lane % 4));
                    elem(row(r), c0) | (elem(row(r), c0 + 1) << 16)
                };
                assert_eq!(
                    got[lane * 4 + i],
                    want,
                    "{kernel}: lane {lane}, register {i}"
                );
            }
        }
    }
}

#[test]
fn misaligned_ldmatrix_row_address_faults_at_its_line() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let src = vec![0u16; 256];
    let rows: Vec<i32> = (0..32).collect();
    let run = |skew: i32| {
        Args::default()
            .ptr(upload(&dev, &src))
            .ptr(upload(&dev, &rows))
            .ptr(zeros::<u32>(&dev, 128))
            .val(skew)
            .launch(&dev, &m, "ldmatrix_x4", [1, 1, 1], [32, 1, 1], 0)
    };
    run(16).expect("16-byte aligned rows are fine");
    let err = run(4).unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(e.kernel, "ldmatrix_x4");
    assert_eq!(
        e.line,
        line_of("tensor", "ldmatrix.sync", ".entry ldmatrix_x4("),
        "{msg}"
    );
    assert!(
        matches!(e.fault, Fault::Misaligned { bytes: 16, .. }),
        "{msg}"
    );
    assert_eq!(e.thread, Some([0, 0, 0]), "{msg}");
}

#[test]
fn mma_in_divergent_code_is_a_fault_naming_the_missing_lanes() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let run = |limit: i32| {
        Args::default()
            .ptr(zeros::<f32>(&dev, 32))
            .val(limit)
            .launch(&dev, &m, "mma_divergent", [1, 1, 1], [32, 1, 1], 0)
    };
    run(32).expect("the whole warp executes it");
    let err = run(16).unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(
        e.line,
        line_of("tensor", "mma.sync", ".entry mma_divergent"),
        "{msg}"
    );
    let Fault::NotWarpUniform {
        active, missing, ..
    } = e.fault
    else {
        panic!("{msg}")
    };
    assert_eq!((active, missing), (0xffff, 0xffff_0000), "{msg}");
    assert!(e.text.starts_with("mma.sync"), "{msg}");
    assert!(msg.contains("lanes 16-31"), "{msg}");
}

#[test]
fn mma_with_a_false_guard_on_some_lanes_is_a_fault() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let run = |limit: i32| {
        Args::default()
            .ptr(zeros::<f32>(&dev, 32))
            .val(limit)
            .launch(&dev, &m, "mma_guarded", [1, 1, 1], [32, 1, 1], 0)
    };
    run(32).expect("a guard true on every lane");
    let err = run(4).unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(
        e.line,
        line_of("tensor", "mma.sync", ".entry mma_guarded"),
        "{msg}"
    );
    let Fault::NotWarpUniform {
        active, missing, ..
    } = e.fault
    else {
        panic!("{msg}")
    };
    assert_eq!((active, missing), (0xf, 0xffff_fff0), "{msg}");
    assert!(msg.contains("lanes 4-31 have a false guard"), "{msg}");
}

#[test]
fn ldmatrix_in_divergent_code_is_a_fault_naming_the_missing_lanes() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let run = |limit: i32| {
        Args::default()
            .ptr(zeros::<u32>(&dev, 32))
            .val(limit)
            .launch(&dev, &m, "ldmatrix_divergent", [1, 1, 1], [32, 1, 1], 0)
    };
    run(32).expect("the whole warp executes it");
    // Even with x1, whose addresses come from lanes 0-7 only, every lane must take part.
    let err = run(8).unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(e.kernel, "ldmatrix_divergent");
    assert_eq!(
        e.line,
        line_of("tensor", "ldmatrix.sync", ".entry ldmatrix_divergent"),
        "{msg}"
    );
    let Fault::NotWarpUniform {
        active, missing, ..
    } = e.fault
    else {
        panic!("{msg}")
    };
    assert_eq!((active, missing), (0xff, 0xffff_ff00), "{msg}");
    assert!(msg.contains("lanes 8-31"), "{msg}");
}

#[test]
fn cp_async_lands_at_the_wait_of_its_group_with_zero_fill() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let src: Vec<f32> = (0..448).map(|i| 1.0 + i as f32).collect();
    for src_bytes in [16i32, 8, 0] {
        let out = zeros::<f32>(&dev, 64 * 8);
        let stats = Args::default()
            .ptr(upload(&dev, &src))
            .ptr(out)
            .val(src_bytes)
            .launch(&dev, &m, "cp_async_groups", [1, 1, 1], [64, 1, 1], 0)
            .unwrap();
        // Each of the 2 warps waits for memory twice: wait_group 1 lands group 0 (read from
        // global), wait_all the rest (the third copy reads global on even threads): one load
        // epoch per landing wait, none per copy.
        assert_eq!(stats.load_epochs, 2 * 2, "src-size {src_bytes}");
        assert!(stats.global_loads >= 2 && stats.global_bytes >= 64 * 4);
        let got: Vec<f32> = download(&dev, out, 64 * 8);
        for tid in 0..64usize {
            let o = 63 - tid;
            let row = &got[tid * 8..tid * 8 + 8];
            assert_eq!(row[0], src[tid], "group 0 is complete after wait_group 1");
            assert_eq!(
                row[1], 0.0,
                "group 1 is still in flight after wait_group 1 (lands at its wait)"
            );
            assert_eq!(row[2], src[o], "after wait_all and a barrier");
            for i in 0..4 {
                let want = if 4 * i < src_bytes as usize {
                    src[64 + 4 * o + i]
                } else {
                    0.0
                };
                assert_eq!(
                    row[3 + i],
                    want,
                    "src-size {src_bytes}, thread {tid}, float {i}"
                );
            }
            let ignored = o % 2 == 1;
            let want = if ignored {
                0.0
            } else {
                src[320 + 2 * o] + src[320 + 2 * o + 1]
            };
            assert_eq!(row[7], want, "ignore-src on odd threads, thread {tid}");
        }
    }
}

#[test]
fn misaligned_or_out_of_bounds_cp_async_faults() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let src = upload(&dev, &[0f32; 16]);
    let run = |skew: i32, src_skew: i32| {
        Args::default().ptr(src).val(skew).val(src_skew).launch(
            &dev,
            &m,
            "cp_async_misaligned",
            [1, 1, 1],
            [32, 1, 1],
            0,
        )
    };
    run(16, 16).expect("aligned");
    let err = run(8, 0).unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(
        e.line,
        line_of("tensor", "cp.async.cg", ".entry cp_async_misaligned"),
        "{msg}"
    );
    assert!(
        matches!(
            e.fault,
            Fault::Misaligned {
                space: Space::Shared,
                bytes: 16,
                ..
            }
        ),
        "{msg}"
    );
    // A global source 8 bytes off a 16-byte boundary: the same fault, in global memory, at the
    // copy (not at the wait).
    let err = run(0, 8).unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(e.kernel, "cp_async_misaligned");
    assert_eq!(
        e.line,
        line_of("tensor", "cp.async.cg", ".entry cp_async_misaligned"),
        "{msg}"
    );
    assert!(
        matches!(
            e.fault,
            Fault::Misaligned {
                space: Space::Global,
                bytes: 16,
                ..
            }
        ),
        "{msg}"
    );
    // A source past the end of its allocation: out of bounds, at the copy.
    let err = run(0, 64).unwrap_err();
    let msg = err.to_string();
    let e = exec_error(err);
    assert_eq!(
        e.line,
        line_of("tensor", "cp.async.cg", ".entry cp_async_misaligned"),
        "{msg}"
    );
    assert!(
        matches!(
            e.fault,
            Fault::OutOfBounds {
                space: Space::Global,
                ..
            }
        ),
        "{msg}"
    );
}

#[test]
fn pipelined_gemm_through_cp_async_ldmatrix_and_mma() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let mut rng = rng(20);
    let k = 64;
    let a = halves(&mut rng, 16 * k, true, bf16_bits);
    let b = halves(&mut rng, k * 8, true, bf16_bits);
    let c = zeros::<f32>(&dev, 128);
    Args::default()
        .ptr(upload(&dev, &a))
        .ptr(upload(&dev, &b))
        .ptr(c)
        .val(k as i32)
        .launch(&dev, &m, "gemm_pipeline", [1, 1, 1], [32, 1, 1], 0)
        .unwrap();
    let got: Vec<f32> = download(&dev, c, 128);
    // One mma per 16-deep slice, each rounding its sum to f32 once; with narrow inputs every
    // f64 partial sum is exact, so the reference rounds the same way.
    let want: Vec<f32> = (0..128)
        .map(|idx| {
            let (i, j) = (idx / 8, idx % 8);
            let mut acc = 0f32;
            for s in 0..k / 16 {
                let mut sum = f64::from(acc);
                for p in s * 16..s * 16 + 16 {
                    sum += bf16_val(a[i * k + p]) * bf16_val(b[p * 8 + j]);
                }
                acc = sum as f32;
            }
            acc
        })
        .collect();
    assert_bits("gemm_pipeline", &got, &want);
}

#[test]
fn conversions_to_tf32_bf16_and_f16_round_and_saturate() {
    let dev = Device::new(0);
    let m = fixture("tensor");
    let mut x: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.5,
        f32::from_bits(0x3f80_1000), // tf32 tie: away from zero
        f32::from_bits(0xbf80_1000),
        f32::from_bits(0x3f80_3000), // tf32 tie from an odd neighbour
        f32::from_bits(0x3f80_8000), // bf16 tie to even (down)
        f32::from_bits(0x3f81_8000), // bf16 tie to even (up)
        f32::MAX,                    // rounds to infinity in tf32/bf16, saturates
        -f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        65504.0,
        65519.0,
        65520.0, // f16 overflow
        -1e5,
        1e-40,                       // f32 subnormal
        f32::from_bits(0x0000_1000), // subnormal tf32 tie
        6e-8,                        // f16 subnormal
    ];
    let mut rng = rng(21);
    x.extend(uniform(&mut rng, 43, -1e4, 1e4));
    let n = x.len();
    let out = zeros::<u32>(&dev, 8 * n);
    Args::default()
        .ptr(upload(&dev, &x))
        .ptr(out)
        .val(n as i32)
        .launch(&dev, &m, "convert_narrow", [1, 1, 1], [64, 1, 1], 0)
        .unwrap();
    let got: Vec<u32> = download(&dev, out, 8 * n);
    let tf32_sat = |v: f32| {
        let r = tf32_rna(v);
        if r.is_infinite() {
            f32::from_bits(0x7f7f_e000).copysign(r)
        } else {
            r
        }
    };
    let bf16_rz = |v: f32| (v.to_bits() >> 16) as u16;
    let sat16 = |h: u16, max: u16| {
        if h & 0x7fff == max + 1 {
            (h & 0x8000) | max
        } else {
            h
        }
    };
    for (i, &v) in x.iter().enumerate() {
        let r = &got[8 * i..8 * i + 8];
        let f = |b: u32| f32::from_bits(b);
        let same = |g: f32, w: f32| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(same(f(r[0]), tf32_rna(v)), "tf32 rna of {v:e}: {:#x}", r[0]);
        assert_eq!(r[0] & 0x1fff, 0, "tf32 low bits of {v:e}");
        assert!(
            same(f(r[1]), tf32_sat(v)),
            "tf32 rna.satfinite of {v:e}: {:#x}",
            r[1]
        );
        let bf = bf16_bits(v);
        let h = f16_bits(v);
        // (got, want, what, the exponent mask its NaN shows)
        let halfs = [
            (r[2], bf, "bf16 rn", 0x7f80),
            (r[3], bf16_rz(v), "bf16 rz", 0x7f80),
            (r[4], sat16(bf, 0x7f7f), "bf16 rn.satfinite", 0x7f80),
            (r[5], h, "f16 rn", 0x7c00),
            (r[6], sat16(h, 0x7bff), "f16 rn.satfinite", 0x7c00),
        ];
        for (g, w, what, exp) in halfs {
            if v.is_nan() {
                assert!(g & 0x7fff > exp, "{what} of NaN: {g:#x}");
            } else {
                assert_eq!(g, u32::from(w), "{what} of {v:e}");
            }
        }
        // relu.satfinite.f16x2 of (v, -v): v in the high half, −v in the low.
        let relu = |y: f32| {
            if y > 0.0 {
                sat16(f16_bits(y), 0x7bff)
            } else {
                0
            }
        };
        if !v.is_nan() {
            let want = (u32::from(relu(v)) << 16) | u32::from(relu(-v));
            assert_eq!(r[7], want, "relu.satfinite f16x2 of {v:e}");
        }
    }
}
