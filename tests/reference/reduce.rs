//! Reduce, ArgMax and Moments against hand values and a direct formulation.

use crate::common::*;
use rand::Rng;
use towerpack::backend::reference::Precision;
use towerpack::ir::{Op, ReduceOp};
use towerpack::tensor::DType;

const P: Precision = Precision::F32;

fn reduce(op: ReduceOp, axes: &[usize], keep_dims: bool) -> Op {
    Op::Reduce {
        op,
        axes: axes.to_vec(),
        keep_dims,
    }
}

#[test]
fn reductions_match_hand_values() {
    // [[1, 5, 3], [4, 2, 6]]
    let x = f32s(&[2, 3], &[1.0, 5.0, 3.0, 4.0, 2.0, 6.0]);
    let cases: [(ReduceOp, &[usize], &[f64]); 8] = [
        (ReduceOp::Sum, &[0], &[5.0, 7.0, 9.0]),
        (ReduceOp::Sum, &[1], &[9.0, 12.0]),
        (ReduceOp::Sum, &[0, 1], &[21.0]),
        (ReduceOp::Mean, &[1], &[3.0, 4.0]),
        (ReduceOp::Max, &[0], &[4.0, 5.0, 6.0]),
        (ReduceOp::Min, &[1], &[1.0, 2.0]),
        (ReduceOp::Max, &[0, 1], &[6.0]),
        (ReduceOp::Sum, &[], &[1.0, 5.0, 3.0, 4.0, 2.0, 6.0]),
    ];
    for (op, axes, want) in cases {
        let got = run_op(reduce(op, axes, false), vec![x.clone()], P);
        assert_close(&got, want, 0.0);
        let kept = run_op(reduce(op, axes, true), vec![x.clone()], P);
        let shape: Vec<usize> = (0..2)
            .map(|a| if axes.contains(&a) { 1 } else { x.shape()[a] })
            .collect();
        assert_eq!(kept.shape(), shape.as_slice(), "{op:?} {axes:?}");
        assert_close(&kept, want, 0.0);
    }
    let ints = run_op(
        reduce(ReduceOp::Sum, &[1], false),
        vec![i32s(&[2, 2], &[i32::MAX, 1, -3, 4])],
        P,
    );
    assert_eq!(ints, i32s(&[2], &[i32::MIN, 1]));
    let nan = run_op(
        reduce(ReduceOp::Max, &[0], false),
        vec![f32s(&[2], &[f32::NAN, 1.0])],
        P,
    );
    assert_close(&nan, &[f64::NAN], 0.0);
    // Empty reductions give the identity of the fold: 0, -inf / lowest, +inf / highest.
    let empty = f32s(&[2, 0], &[]);
    let sum = run_op(reduce(ReduceOp::Sum, &[1], false), vec![empty.clone()], P);
    assert_close(&sum, &[0.0, 0.0], 0.0);
    let max = run_op(reduce(ReduceOp::Max, &[1], false), vec![empty.clone()], P);
    assert_close(&max, &[f64::NEG_INFINITY; 2], 0.0);
    let min = run_op(reduce(ReduceOp::Min, &[1], false), vec![empty], P);
    assert_close(&min, &[f64::INFINITY; 2], 0.0);
    let imax = run_op(reduce(ReduceOp::Max, &[0], false), vec![i32s(&[0], &[])], P);
    assert_eq!(imax, i32s(&[], &[i32::MIN]));
}

#[test]
fn random_reductions_match_a_direct_loop() {
    let mut r = rng(21);
    let shape = [3, 4, 2];
    for _ in 0..20 {
        let x = random(&mut r, DType::F64, &shape);
        let axes: Vec<usize> = (0..3).filter(|_| r.random_bool(0.5)).collect();
        let op =
            [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min][r.random_range(0..4)];
        let got = run_op(reduce(op, &axes, true), vec![x.clone()], Precision::F64);
        let kept: Vec<usize> = (0..3)
            .map(|a| if axes.contains(&a) { 1 } else { shape[a] })
            .collect();
        assert_eq!(got.shape(), kept.as_slice());
        let xv = x.to_f64_vec();
        let mut want = Vec::new();
        for i in 0..kept[0] {
            for j in 0..kept[1] {
                for k in 0..kept[2] {
                    let mut cell = Vec::new();
                    for a in 0..shape[0] {
                        for b in 0..shape[1] {
                            for c in 0..shape[2] {
                                let fixed = [(0, a, i), (1, b, j), (2, c, k)];
                                if fixed.iter().all(|&(ax, v, o)| axes.contains(&ax) || v == o) {
                                    cell.push(xv[(a * shape[1] + b) * shape[2] + c]);
                                }
                            }
                        }
                    }
                    let n = cell.len() as f64;
                    want.push(match op {
                        ReduceOp::Sum => cell.iter().sum(),
                        ReduceOp::Mean => cell.iter().sum::<f64>() / n,
                        ReduceOp::Max => cell.iter().copied().fold(f64::MIN, f64::max),
                        ReduceOp::Min => cell.iter().copied().fold(f64::MAX, f64::min),
                    });
                }
            }
        }
        assert_close(&got, &want, 1e-12);
    }
}

#[test]
fn argmax_picks_the_first_maximum() {
    let x = f32s(&[2, 3], &[1.0, 3.0, 3.0, 2.0, 2.0, 1.0]);
    assert_eq!(
        run_op(Op::ArgMax { axis: 1 }, vec![x.clone()], P),
        i64s(&[2], &[1, 0])
    );
    assert_eq!(
        run_op(Op::ArgMax { axis: 0 }, vec![x], P),
        i64s(&[3], &[1, 0, 0])
    );
    let ints = i64s(&[3], &[i64::MAX - 1, i64::MAX, i64::MAX]);
    assert_eq!(
        run_op(Op::ArgMax { axis: 0 }, vec![ints], P),
        i64s(&[], &[1])
    );
    // NaN counts as the largest value (first NaN wins).
    let nan = f32s(&[3], &[1.0, f32::NAN, f32::NAN]);
    assert_eq!(
        run_op(Op::ArgMax { axis: 0 }, vec![nan], P),
        i64s(&[], &[1])
    );
}

#[test]
fn moments_are_mean_and_biased_variance() {
    let x = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let op = Op::Moments {
        axes: vec![0, 1],
        keep_dims: false,
    };
    let outs = try_run_op(op, vec![x.clone()], P).expect("moments");
    assert_close(&outs[0], &[2.5], 0.0);
    assert_close(&outs[1], &[1.25], 0.0);
    let op = Op::Moments {
        axes: vec![0],
        keep_dims: true,
    };
    let outs = try_run_op(op, vec![x], P).expect("moments");
    assert_eq!(outs[0].shape(), &[1, 2]);
    assert_close(&outs[0], &[2.0, 3.0], 0.0);
    assert_close(&outs[1], &[1.0, 1.0], 0.0);
}
