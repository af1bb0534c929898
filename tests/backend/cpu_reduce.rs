//! Reductions against naive f64 loops on seeded random shapes. Sums and means: 1e-4 absolute +
//! 1e-5 relative (f32 lanes over at most a few thousand values in [-1, 1]); max/min are exact;
//! column statistics accumulate in f64 and match to 1e-5.
//!
//! Every check runs at each SIMD level this machine allows (`SimdLevel::available`).

use crate::cpu_kernels_common;

use cpu_kernels_common::*;
use rand::Rng;
use towerpack::backend::cpu::kernels::reduce::{
    ColumnMoments, ReduceKind, ShiftedColumnMoments, column_moments, column_sums,
    column_sums_dy_xhat, reduce_all, reduce_axis,
};

fn naive_reduce(values: impl Iterator<Item = f32>, kind: ReduceKind) -> f32 {
    let v: Vec<f64> = values.map(f64::from).collect();
    match kind {
        ReduceKind::Sum => v.iter().sum::<f64>() as f32,
        ReduceKind::Mean => (v.iter().sum::<f64>() / v.len() as f64) as f32,
        ReduceKind::Max => v.iter().cloned().fold(f64::NEG_INFINITY, f64::max) as f32,
        ReduceKind::Min => v.iter().cloned().fold(f64::INFINITY, f64::min) as f32,
    }
}

const KINDS: [ReduceKind; 4] = [
    ReduceKind::Sum,
    ReduceKind::Mean,
    ReduceKind::Max,
    ReduceKind::Min,
];

#[test]
fn axis_reductions_match_for_rows_columns_and_middle_axes() {
    at_every_level(|| {
        let mut r = rng(31);
        for case in 0..300 {
            let outer = r.random_range(1..6);
            let len = r.random_range(1..70);
            let inner = if case % 3 == 0 {
                1
            } else {
                r.random_range(1..9)
            };
            let kind = KINDS[case % 4];
            let x = random_vec(&mut r, outer * len * inner);
            let mut out = vec![f32::NAN; outer * inner];
            reduce_axis(&x, outer, len, inner, kind, &mut out).unwrap();
            let want: Vec<f32> = (0..outer * inner)
                .map(|oi| {
                    let (o, i) = (oi / inner, oi % inner);
                    naive_reduce((0..len).map(|l| x[(o * len + l) * inner + i]), kind)
                })
                .collect();
            assert_close(
                &format!("{kind:?} over [{outer}, {len}, {inner}]"),
                &out,
                &want,
                1e-4,
                1e-5,
            );
        }
    });
}

#[test]
fn full_reductions_match_on_one_and_two_threads() {
    at_every_level(|| {
        let mut r = rng(32);
        for len in [0, 1, 15, 16, 17, 1000, 300_001] {
            let x = random_vec(&mut r, len);
            for kind in KINDS {
                let want = naive_reduce(x.iter().cloned(), kind);
                for threads in [1, 2] {
                    let got = with_threads(threads, || reduce_all(&x, kind));
                    let what = format!("{kind:?} of {len} on {threads} threads");
                    assert_close(
                        &what,
                        &[got],
                        &[want],
                        1e-4 * (len as f32).sqrt().max(1.0),
                        1e-5,
                    );
                }
                let twice = with_threads(2, || (reduce_all(&x, kind), reduce_all(&x, kind)));
                assert!(twice.0.to_bits() == twice.1.to_bits() || twice.0.is_nan());
            }
        }
    });
}

/// An epilogue variance's per-block sums (`ShiftedColumnMoments`: about each block's first row,
/// merged re-centred in block order) give the two-pass variance, in f64, of data whose mean is
/// ~10⁵ of its standard deviations from zero, in blocks of uneven sizes (empty ones too) — where
/// sums about zero, even in f64, would be off by ~10⁻⁵.
#[test]
fn shifted_column_moments_merge_blocks_to_the_two_pass_variance() {
    let mut r = rng(34);
    for _ in 0..20 {
        let cols = r.random_range(1..20);
        let rows = r.random_range(1..400);
        let offset = r.random_range(-1e5..1e5);
        let x: Vec<f32> = random_vec(&mut r, rows * cols)
            .iter()
            .map(|v| (f64::from(*v) * 0.5 + offset) as f32)
            .collect();
        let mut total = ShiftedColumnMoments::of_rows(&[], cols);
        let mut at = 0;
        while at < rows {
            let n = r.random_range(0..=(rows - at).min(37));
            total.merge(&ShiftedColumnMoments::of_rows(
                &x[at * cols..(at + n) * cols],
                cols,
            ));
            at += n;
        }
        let got = total.variances();
        for (c, got) in got.iter().enumerate() {
            let column: Vec<f64> = (0..rows).map(|i| f64::from(x[i * cols + c])).collect();
            let mean = column.iter().sum::<f64>() / rows as f64;
            let want = column.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / rows as f64;
            let err = (got - want).abs() / want.max(1e-30);
            assert!(
                err < 1e-9,
                "column {c} of {rows} rows about {offset:.0}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn column_statistics_match_and_merge_in_blocks() {
    at_every_level(|| {
        let mut r = rng(33);
        for case in 0..60 {
            let rows = if case < 5 {
                40_000
            } else {
                r.random_range(0..200)
            };
            let cols = r.random_range(1..40);
            // An offset mean makes E[x²] - E[x]² cancel: f64 accumulation must keep it accurate.
            let x: Vec<f32> = random_vec(&mut r, rows * cols)
                .iter()
                .map(|v| v + 30.0)
                .collect();
            let dy = random_vec(&mut r, rows * cols);
            let col = |c: usize| (0..rows).map(move |i| i * cols + c);
            let want_sum: Vec<f32> = (0..cols)
                .map(|c| naive_reduce(col(c).map(|i| x[i]), ReduceKind::Sum))
                .collect();
            let want_mean: Vec<f32> = (0..cols)
                .map(|c| {
                    if rows == 0 {
                        0.0
                    } else {
                        naive_reduce(col(c).map(|i| x[i]), ReduceKind::Mean)
                    }
                })
                .collect();
            let want_var: Vec<f32> = (0..cols)
                .map(|c| {
                    let m = f64::from(want_mean[c]);
                    let ss: f64 = col(c).map(|i| (f64::from(x[i]) - m).powi(2)).sum();
                    (ss / rows.max(1) as f64) as f32
                })
                .collect();
            let mut sums = vec![0.0; cols];
            column_sums(&x, cols, &mut sums).unwrap();
            assert_close("column sums", &sums, &want_sum, 1e-5, 1e-6);
            let (mut mean, mut var) = (vec![0.0; cols], vec![0.0; cols]);
            column_moments(&x, cols, &mut mean, &mut var).unwrap();
            assert_close("column means", &mean, &want_mean, 1e-5, 1e-6);
            assert_close("column variances", &var, &want_var, 1e-5, 1e-4);

            // The same statistics accumulated block by block, as a convolution epilogue would.
            let mut merged = ColumnMoments::new(cols);
            for block in x.chunks(cols * 7) {
                let mut part = ColumnMoments::new(cols);
                part.add_rows(block);
                merged.merge(&part);
            }
            let (mut m2, mut v2) = (vec![0.0; cols], vec![0.0; cols]);
            merged.mean_variance(&mut m2, &mut v2).unwrap();
            assert_eq!(merged.rows(), rows);
            assert_close("merged means", &m2, &want_mean, 1e-5, 1e-6);
            assert_close("merged variances", &v2, &want_var, 1e-5, 1e-4);

            let inv_std: Vec<f32> = var.iter().map(|v| 1.0 / (v + 1e-3).sqrt()).collect();
            let (mut sdy, mut sdyx) = (vec![0.0; cols], vec![0.0; cols]);
            column_sums_dy_xhat(&dy, &x, &mean, &inv_std, &mut sdy, &mut sdyx).unwrap();
            let want_sdy: Vec<f32> = (0..cols)
                .map(|c| naive_reduce(col(c).map(|i| dy[i]), ReduceKind::Sum))
                .collect();
            let want_sdyx: Vec<f32> = (0..cols)
                .map(|c| {
                    col(c)
                        .map(|i| f64::from(dy[i]) * f64::from((x[i] - mean[c]) * inv_std[c]))
                        .sum::<f64>() as f32
                })
                .collect();
            assert_close("sum dy", &sdy, &want_sdy, 1e-5, 1e-6);
            assert_close("sum dy·x̂", &sdyx, &want_sdyx, 1e-4, 1e-5);
        }
    });
}

#[test]
fn column_statistics_are_deterministic_on_two_threads() {
    at_every_level(|| {
        let mut r = rng(34);
        let x = random_vec(&mut r, 50_000 * 16);
        let run = || {
            let (mut m, mut v, mut s) = (vec![0.0; 16], vec![0.0; 16], vec![0.0; 16]);
            column_moments(&x, 16, &mut m, &mut v).unwrap();
            column_sums(&x, 16, &mut s).unwrap();
            (m, v, s)
        };
        assert!(with_threads(2, run) == with_threads(2, run));
    });
}

#[test]
fn ragged_inputs_are_errors() {
    let mut out = [0.0; 3];
    assert!(column_sums(&[0.0; 10], 3, &mut out).is_err());
    assert!(reduce_axis(&[0.0; 10], 2, 2, 2, ReduceKind::Sum, &mut [0.0; 4]).is_err());
    let err = column_moments(&[0.0; 9], 3, &mut [0.0; 2], &mut [0.0; 3]).unwrap_err();
    assert!(err.to_string().contains("mean"), "{err}");
}
