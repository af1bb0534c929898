//! Reshape, transpose, broadcast, slice, concat and pad against hand values and coordinate loops.

use crate::common::*;
use rand::Rng;
use towerpack::backend::reference::Precision;
use towerpack::ir::{Op, Shape};
use towerpack::tensor::DType;

const P: Precision = Precision::F32;

#[test]
fn reshape_keeps_row_major_order() {
    let x = i64s(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let got = run_op(
        Op::Reshape {
            shape: Shape::fixed(&[3, 1, 2]),
        },
        vec![x],
        P,
    );
    assert_eq!(got, i64s(&[3, 1, 2], &[1, 2, 3, 4, 5, 6]));
}

#[test]
fn transpose_matches_hand_values_and_a_coordinate_loop() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let got = run_op(Op::Transpose { perm: vec![1, 0] }, vec![x], P);
    assert_eq!(got, f32s(&[3, 2], &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));

    let mut r = rng(3);
    let (a, b, c) = (2, 3, 4);
    let x = random(&mut r, DType::F32, &[a, b, c]);
    let got = run_op(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        vec![x.clone()],
        P,
    );
    assert_eq!(got.shape(), &[c, a, b]);
    let xv = x.to_f64_vec();
    let mut want = Vec::new();
    for k in 0..c {
        for i in 0..a {
            for j in 0..b {
                want.push(xv[(i * b + j) * c + k]);
            }
        }
    }
    assert_close(&got, &want, 0.0);
}

#[test]
fn broadcast_stretches_unit_and_missing_axes() {
    let row = run_op(
        Op::Broadcast {
            shape: Shape::fixed(&[2, 3]),
        },
        vec![i32s(&[3], &[1, 2, 3])],
        P,
    );
    assert_eq!(row, i32s(&[2, 3], &[1, 2, 3, 1, 2, 3]));
    let col = run_op(
        Op::Broadcast {
            shape: Shape::fixed(&[2, 3]),
        },
        vec![i32s(&[2, 1], &[7, 8])],
        P,
    );
    assert_eq!(col, i32s(&[2, 3], &[7, 7, 7, 8, 8, 8]));
}

#[test]
fn slice_takes_a_range_of_one_axis() {
    let x = i64s(&[2, 4], &[0, 1, 2, 3, 4, 5, 6, 7]);
    let got = run_op(
        Op::Slice {
            axis: 1,
            start: 1,
            end: 3,
        },
        vec![x.clone()],
        P,
    );
    assert_eq!(got, i64s(&[2, 2], &[1, 2, 5, 6]));
    let got = run_op(
        Op::Slice {
            axis: 0,
            start: 1,
            end: 2,
        },
        vec![x],
        P,
    );
    assert_eq!(got, i64s(&[1, 4], &[4, 5, 6, 7]));
}

#[test]
fn concat_joins_along_any_axis() {
    let a = i64s(&[2, 1], &[1, 2]);
    let b = i64s(&[2, 2], &[3, 4, 5, 6]);
    let c = i64s(&[2, 1], &[7, 8]);
    let got = run_op(Op::Concat { axis: 1 }, vec![a.clone(), b, c], P);
    assert_eq!(got, i64s(&[2, 4], &[1, 3, 4, 7, 2, 5, 6, 8]));
    let got = run_op(Op::Concat { axis: 0 }, vec![a.clone(), a], P);
    assert_eq!(got, i64s(&[4, 1], &[1, 2, 1, 2]));
    let flags = run_op(
        Op::Concat { axis: 0 },
        vec![bools(&[1], &[true]), bools(&[2], &[false, true])],
        P,
    );
    assert_eq!(flags, bools(&[3], &[true, false, true]));
}

#[test]
fn concat_matches_a_coordinate_loop_on_random_shapes() {
    let mut r = rng(5);
    for _ in 0..10 {
        let (rows, w1, w2) = (
            r.random_range(1..4),
            r.random_range(1..4),
            r.random_range(1..4),
        );
        let a = random(&mut r, DType::F32, &[rows, w1, 2]);
        let b = random(&mut r, DType::F32, &[rows, w2, 2]);
        let got = run_op(Op::Concat { axis: 1 }, vec![a.clone(), b.clone()], P);
        let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
        let mut want = Vec::new();
        for i in 0..rows {
            want.extend_from_slice(&av[i * w1 * 2..(i + 1) * w1 * 2]);
            want.extend_from_slice(&bv[i * w2 * 2..(i + 1) * w2 * 2]);
        }
        assert_close(&got, &want, 0.0);
    }
}

#[test]
fn pad_surrounds_with_zeros() {
    let x = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let got = run_op(
        Op::Pad {
            pads: vec![(1, 0), (0, 2)],
        },
        vec![x],
        P,
    );
    #[rustfmt::skip]
    let want = [
        0.0, 0.0, 0.0, 0.0,
        1.0, 2.0, 0.0, 0.0,
        3.0, 4.0, 0.0, 0.0,
    ];
    assert_eq!(got.shape(), &[3, 4]);
    assert_close(&got, &want, 0.0);
    let flags = run_op(
        Op::Pad { pads: vec![(1, 1)] },
        vec![bools(&[1], &[true])],
        P,
    );
    assert_eq!(flags, bools(&[3], &[false, true, false]));
}
