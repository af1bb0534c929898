//! MatMul against hand values, a triple loop, and explicit transposes.

use crate::common::*;
use towerpack::backend::reference::Precision;
use towerpack::ir::{Op, Value};
use towerpack::tensor::DType;

const P64: Precision = Precision::F64;

fn matmul(transpose_a: bool, transpose_b: bool) -> Op {
    Op::MatMul {
        transpose_a,
        transpose_b,
    }
}

#[test]
fn matmul_matches_hand_values() {
    let a = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f32s(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    let got = run_op(
        matmul(false, false),
        vec![a.clone(), b.clone()],
        Precision::F32,
    );
    assert_eq!(got, f32s(&[2, 2], &[19.0, 22.0, 43.0, 50.0]));
    // a^T b = [[1,3],[2,4]] x [[5,6],[7,8]]
    let got = run_op(
        matmul(true, false),
        vec![a.clone(), b.clone()],
        Precision::F32,
    );
    assert_eq!(got, f32s(&[2, 2], &[26.0, 30.0, 38.0, 44.0]));
    // a b^T = [[1,2],[3,4]] x [[5,7],[6,8]]
    let got = run_op(matmul(false, true), vec![a, b], Precision::F32);
    assert_eq!(got, f32s(&[2, 2], &[17.0, 23.0, 39.0, 53.0]));
}

#[test]
fn batched_matmul_matches_a_triple_loop() {
    let mut r = rng(31);
    let (batch, m, k, n) = (3, 2, 4, 3);
    let a = random(&mut r, DType::F64, &[batch, m, k]);
    let b = random(&mut r, DType::F64, &[batch, k, n]);
    let got = run_op(matmul(false, false), vec![a.clone(), b.clone()], P64);
    assert_eq!(got.shape(), &[batch, m, n]);
    let (av, bv) = (a.to_f64_vec(), b.to_f64_vec());
    let mut want = Vec::new();
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                want.push(
                    (0..k)
                        .map(|kk| av[(t * m + i) * k + kk] * bv[(t * k + kk) * n + j])
                        .sum(),
                );
            }
        }
    }
    assert_close(&got, &want, 1e-14);

    // A rank-2 right operand is shared by every batch.
    let shared = random(&mut r, DType::F64, &[k, n]);
    let got = run_op(matmul(false, false), vec![a.clone(), shared.clone()], P64);
    let sv = shared.to_f64_vec();
    let mut want = Vec::new();
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                want.push(
                    (0..k)
                        .map(|kk| av[(t * m + i) * k + kk] * sv[kk * n + j])
                        .sum(),
                );
            }
        }
    }
    assert_close(&got, &want, 1e-14);
}

#[test]
fn transpose_flags_equal_explicit_transposes() {
    let mut r = rng(32);
    for (ta, tb) in [(true, false), (false, true), (true, true)] {
        let a_shape = if ta { [2, 4, 3] } else { [2, 3, 4] };
        let b_shape = if tb { [2, 5, 4] } else { [2, 4, 5] };
        let mut bld = Builder::new();
        let a = bld.constant(random(&mut r, DType::F64, &a_shape));
        let b = bld.constant(random(&mut r, DType::F64, &b_shape));
        let fused = bld.op(matmul(ta, tb), &[a, b]);
        let swap = |bld: &mut Builder, v: Value, t: bool| {
            if t {
                bld.op(
                    Op::Transpose {
                        perm: vec![0, 2, 1],
                    },
                    &[v],
                )
            } else {
                v
            }
        };
        let (at, bt) = (swap(&mut bld, a, ta), swap(&mut bld, b, tb));
        let plain = bld.op(matmul(false, false), &[at, bt]);
        let outs = eval(&bld.g, &[], &[fused, plain], P64).expect("matmuls");
        assert_eq!(outs[0].shape(), &[2, 3, 5]);
        assert_close(&outs[0], &outs[1].to_f64_vec(), 1e-14);
    }
}
