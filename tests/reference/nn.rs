//! Softmax, log-softmax, cross-entropy, one-hot, in-top-k and the counter-based RandomUniform.

use crate::common::*;
use towerpack::backend::BackendError;
use towerpack::backend::reference::Precision;
use towerpack::ir::rng::{step_key, uniform_at};
use towerpack::ir::{Op, Shape};
use towerpack::tensor::DType;

const P32: Precision = Precision::F32;
const P64: Precision = Precision::F64;

#[test]
fn softmax_and_log_softmax_match_hand_values_and_are_stable() {
    let ln3 = 3f64.ln();
    // Rows [0, ln 3] and [1000, 1000 + ln 3] both give [1/4, 3/4]: the max is subtracted first.
    let x = f64s(&[2, 2], &[0.0, ln3, 1000.0, 1000.0 + ln3]);
    let got = run_op(Op::Softmax { axis: 1 }, vec![x.clone()], P64);
    assert_close(&got, &[0.25, 0.75, 0.25, 0.75], 1e-12);
    let got = run_op(Op::LogSoftmax { axis: 1 }, vec![x], P64);
    let (a, b) = (0.25f64.ln(), 0.75f64.ln());
    assert_close(&got, &[a, b, a, b], 1e-12);
    // Along axis 0 of [[0, 5], [ln 3, 5]]: column 1 is uniform.
    let x = f64s(&[2, 2], &[0.0, 5.0, ln3, 5.0]);
    let got = run_op(Op::Softmax { axis: 0 }, vec![x], P64);
    assert_close(&got, &[0.25, 0.5, 0.75, 0.5], 1e-12);
    let got = run_op(
        Op::Softmax { axis: 0 },
        vec![f32s(&[2], &[-1000.0, 1000.0])],
        P32,
    );
    assert_close(&got, &[0.0, 1.0], 0.0);
}

#[test]
fn sparse_softmax_cross_entropy_is_minus_log_softmax_at_the_label() {
    let ln3 = 3f64.ln();
    let logits = f64s(&[2, 2], &[0.0, ln3, 2.0, 2.0]);
    let got = run_op(
        Op::SparseSoftmaxCrossEntropy,
        vec![logits.clone(), i64s(&[2], &[1, 0])],
        P64,
    );
    assert_close(&got, &[-(0.75f64.ln()), 2f64.ln()], 1e-12);
    let got = run_op(
        Op::SparseSoftmaxCrossEntropy,
        vec![logits.clone(), i32s(&[2], &[0, 1])],
        P64,
    );
    assert_close(&got, &[-(0.25f64.ln()), 2f64.ln()], 1e-12);
    for bad in [2, -1] {
        let err = try_run_op(
            Op::SparseSoftmaxCrossEntropy,
            vec![logits.clone(), i64s(&[2], &[0, bad])],
            P64,
        )
        .unwrap_err();
        match err {
            BackendError::Kernel { node, op, message } => {
                assert_eq!(
                    (node.as_str(), op.as_str()),
                    ("n2", "sparse_softmax_cross_entropy")
                );
                assert!(
                    message.contains(&format!("label value of {bad}"))
                        && message.contains("[0, 2)"),
                    "{message}"
                );
            }
            other => panic!("expected a kernel error, got {other}"),
        }
    }
}

#[test]
fn one_hot_gives_zero_rows_out_of_range() {
    let got = run_op(
        Op::OneHot { depth: 3 },
        vec![i64s(&[2, 2], &[0, 2, 3, -1])],
        P32,
    );
    assert_eq!(got.dtype(), DType::F32);
    assert_eq!(got.shape(), &[2, 2, 3]);
    assert_close(
        &got,
        &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        0.0,
    );
}

#[test]
fn in_top_k_counts_strictly_greater_predictions_as_tensorflow() {
    #[rustfmt::skip]
    let preds = f32s(&[5, 4], &[
        0.1, 0.5, 0.5, 0.2, // ties with the target at the boundary count as in
        0.1, 0.5, 0.5, 0.2,
        0.1, 0.5, 0.5, 0.2,
        0.1, f32::NAN, 0.9, 0.2, // a non-finite score anywhere gives false
        0.1, 0.5, 0.5, f32::INFINITY,
    ]);
    let targets = i64s(&[5], &[2, 3, 1, 2, 0]);
    let k1 = run_op(
        Op::InTopK { k: 1 },
        vec![preds.clone(), targets.clone()],
        P32,
    );
    assert_eq!(k1, bools(&[5], &[true, false, true, false, false]));
    let k3 = run_op(Op::InTopK { k: 3 }, vec![preds.clone(), targets], P32);
    assert_eq!(k3, bools(&[5], &[true, true, true, false, false]));
    // Targets out of range are never in the top k.
    let out = run_op(
        Op::InTopK { k: 4 },
        vec![preds, i32s(&[5], &[4, -1, 0, 0, 0])],
        P32,
    );
    assert_eq!(out, bools(&[5], &[false, false, true, false, false]));
}

#[test]
fn random_uniform_reproduces_the_ir_generator_bit_for_bit() {
    let seed = 1234;
    let mut b = Builder::new();
    let like = b.constant(f32s(&[2, 3], &[0.0; 6]));
    let step = b.input("step", DType::I64, Shape::scalar());
    let step32 = b.constant(i32s(&[], &[7]));
    let u = b.op(Op::RandomUniform { seed }, &[like, step]);
    let u32 = b.op(Op::RandomUniform { seed }, &[like, step32]);
    for counter in [0i64, 7, -3] {
        let feeds = [(step.node, i64s(&[], &[counter]))];
        let outs = eval(&b.g, &feeds, &[u, u32], P32).expect("random");
        let key = step_key(seed, counter);
        let want: Vec<f32> = (0..6).map(|i| uniform_at(key, i)).collect();
        assert_eq!(outs[0], f32s(&[2, 3], &want), "counter {counter}");
        if counter == 7 {
            assert_eq!(outs[1], outs[0], "an i32 counter gives the same key");
        }
    }
    let a = eval(&b.g, &[(step.node, i64s(&[], &[1]))], &[u], P32).expect("step 1");
    let c = eval(&b.g, &[(step.node, i64s(&[], &[2]))], &[u], P32).expect("step 2");
    assert_ne!(a, c);
}
