//! `sgemm` against a naive triple loop (f64 accumulation) on seeded random shapes, strides
//! (row-major, transposed, padded leading dimensions), `alpha` and `beta`: both the direct path for
//! tiny products and the crate path. Tolerance: 1e-4 absolute + 1e-4 relative (f32 sums of at most
//! a few hundred products of values in [-1, 1]).
//!
//! Every check runs at each SIMD level this machine allows (`SimdLevel::available`).

use crate::cpu_kernels_common;

use cpu_kernels_common::*;
use rand::Rng;
use towerpack::backend::cpu::kernels::{
    ChannelEpilogue, KernelError, MatRef, SimdLevel, sgemm, sgemm_with_epilogue,
};

/// A random `rows × cols` view: row-major or transposed storage, with a padded leading dimension.
fn random_view(
    rng: &mut rand_chacha::ChaCha8Rng,
    rows: usize,
    cols: usize,
) -> (Vec<f32>, usize, usize) {
    let transposed = rng.random_bool(0.5);
    let pad = rng.random_range(0..3);
    let (outer, inner) = if transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    let ld = inner + pad;
    let data = random_vec(rng, outer * ld);
    if transposed {
        (data, 1, ld)
    } else {
        (data, ld, 1)
    }
}

#[allow(clippy::too_many_arguments)]
fn naive(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &MatRef,
    b: &MatRef,
    beta: f32,
    c: &[f32],
    ldc: usize,
) -> Vec<f32> {
    let mut out = c.to_vec();
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k)
                .map(|p| {
                    f64::from(a.data[i * a.row_stride + p * a.col_stride])
                        * f64::from(b.data[p * b.row_stride + j * b.col_stride])
                })
                .sum();
            let old = if beta == 0.0 {
                0.0
            } else {
                f64::from(beta) * f64::from(c[i * ldc + j])
            };
            out[i * ldc + j] = (f64::from(alpha) * dot + old) as f32;
        }
    }
    out
}

#[test]
fn random_products_match_the_naive_loop() {
    at_every_level(|| {
        let mut r = rng(11);
        for case in 0..400 {
            // Half tiny (direct path), half up to 70 (crate path), some empty.
            let max = if case % 2 == 0 { 12 } else { 70 };
            let (m, n, k) = (
                r.random_range(0..max),
                r.random_range(0..max),
                r.random_range(0..max),
            );
            let (a_data, ars, acs) = random_view(&mut r, m, k);
            let (b_data, brs, bcs) = random_view(&mut r, k, n);
            let a = MatRef::new(&a_data, ars, acs);
            let b = MatRef::new(&b_data, brs, bcs);
            let ldc = n + r.random_range(0..3);
            let alpha = [1.0, -0.5, 2.0][case % 3];
            let beta = [0.0, 1.0, 0.25][(case / 3) % 3];
            let mut c = random_vec(&mut r, m * ldc);
            if beta == 0.0 {
                // With beta = 0 the old C must not be read: NaNs there must not leak out.
                for i in 0..m {
                    c[i * ldc..i * ldc + n].fill(f32::NAN);
                }
            }
            let want = naive(m, n, k, alpha, &a, &b, beta, &c, ldc);
            sgemm(m, n, k, alpha, a, b, beta, &mut c, ldc).unwrap();
            let what = format!(
                "case {case}: {m}x{n}x{k} a({ars},{acs}) b({brs},{bcs}) ldc {ldc} alpha {alpha} beta {beta}"
            );
            assert_close(&what, &c, &want, 1e-4, 1e-4);
        }
    });
}

#[test]
fn large_products_match_and_are_deterministic_on_two_threads() {
    at_every_level(|| {
        let mut r = rng(12);
        for (m, n, k) in [(256, 96, 130), (130, 300, 64), (33, 17, 2000)] {
            let a = random_vec(&mut r, m * k);
            let b = random_vec(&mut r, k * n);
            let (av, bv) = (MatRef::row_major(&a, k), MatRef::transposed(&b, k));
            let run = || {
                let mut c = vec![0.0; m * n];
                sgemm(m, n, k, 1.0, av, bv, 0.0, &mut c, n).unwrap();
                c
            };
            let first = with_threads(2, run);
            assert!(first == with_threads(2, run), "{m}x{n}x{k}: runs differ");
            let want = naive(m, n, k, 1.0, &av, &bv, 0.0, &vec![0.0; m * n], n);
            assert_close(&format!("{m}x{n}x{k}"), &first, &want, 1e-3, 1e-4);
        }
    });
}

/// At `avx2` the blocked GEMM runs: products crossing its block boundaries (several and uneven
/// depth blocks, row blocks, column panels, edge tiles, every operand layout) match the naive
/// loop, and the bits do not depend on the thread count (it splits the output only).
#[test]
fn blocked_products_cross_every_block_boundary_and_ignore_the_thread_count() {
    if !SimdLevel::available().contains(&SimdLevel::Avx2) {
        return;
    }
    SimdLevel::Avx2.run(|| {
        let mut r = rng(14);
        let shapes = [
            (200, 50, 784), // 4 depth blocks of 196, 3 row blocks, edge columns
            (97, 33, 513),  // 3 uneven depth blocks, edge rows and columns
            (7, 2100, 40),  // two column panels, one partial tile row
            (256, 10, 512), // narrower than one tile
            (130, 257, 9),  // shallow
        ];
        for (case, (m, n, k)) in shapes.into_iter().enumerate() {
            let (a_data, ars, acs) = random_view(&mut r, m, k);
            let (b_data, brs, bcs) = random_view(&mut r, k, n);
            let a = MatRef::new(&a_data, ars, acs);
            let b = MatRef::new(&b_data, brs, bcs);
            let ldc = n + case % 2;
            let (alpha, beta) = ([1.0, -0.5][case % 2], [0.0, 0.5][(case / 2) % 2]);
            let c0 = random_vec(&mut r, m * ldc);
            let run = |threads| {
                with_threads(threads, || {
                    let mut c = c0.clone();
                    sgemm(m, n, k, alpha, a, b, beta, &mut c, ldc).unwrap();
                    c
                })
            };
            let one = run(1);
            let what = format!("{m}x{n}x{k} a({ars},{acs}) b({brs},{bcs}) beta {beta}");
            assert!(one == run(2), "{what}: one and two threads differ");
            let want = naive(m, n, k, alpha, &a, &b, beta, &c0, ldc);
            assert_close(&what, &one, &want, 1e-3, 1e-4);
        }
    });
}

#[test]
fn the_epilogue_runs_on_the_product() {
    at_every_level(|| {
        let mut r = rng(13);
        for (m, n, k) in [(8, 10, 10), (300, 40, 50)] {
            let a = random_vec(&mut r, m * k);
            let b = random_vec(&mut r, k * n);
            let bias = random_vec(&mut r, n);
            let epilogue = ChannelEpilogue {
                shift: Some(&bias),
                relu: true,
                ..Default::default()
            };
            let mut c = vec![0.0; m * n];
            let (av, bv) = (MatRef::row_major(&a, k), MatRef::row_major(&b, n));
            sgemm_with_epilogue(m, n, k, 1.0, av, bv, 0.0, &mut c, &epilogue).unwrap();
            let mut want = naive(m, n, k, 1.0, &av, &bv, 0.0, &vec![0.0; m * n], n);
            for (i, v) in want.iter_mut().enumerate() {
                *v = (*v + bias[i % n]).max(0.0);
            }
            assert_close(&format!("{m}x{n}x{k} + bias, relu"), &c, &want, 1e-4, 1e-4);
        }
    });
}

#[test]
fn views_outside_their_slices_are_errors() {
    let a = vec![0.0; 6];
    let b = vec![0.0; 6];
    let mut c = vec![0.0; 4];
    // A claims 3×2 row-major over 6 elements: fine; 3×3 is not.
    let err = sgemm(
        3,
        2,
        3,
        1.0,
        MatRef::row_major(&a, 3),
        MatRef::row_major(&b, 2),
        0.0,
        &mut c,
        2,
    )
    .unwrap_err();
    assert!(matches!(err, KernelError::Shape { .. }), "{err}");
    let err = sgemm(
        2,
        2,
        3,
        1.0,
        MatRef::row_major(&a, 3),
        MatRef::row_major(&b, 2),
        0.0,
        &mut c,
        3,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            KernelError::BufferLength {
                operand: "c",
                expected: 5,
                got: 4,
                ..
            }
        ),
        "{err}"
    );
    let err = sgemm(
        2,
        2,
        3,
        1.0,
        MatRef::row_major(&a, 3),
        MatRef::row_major(&b, 2),
        0.0,
        &mut c,
        1,
    )
    .unwrap_err();
    assert!(err.to_string().contains("ldc 1 < n 2"), "{err}");
}
